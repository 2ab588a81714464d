"""Per-channel casts to FP8 e4m3: one fp32 scale per channel and group of 128 tokens.

The public API follows TileKernels' ``tile_kernels.quant.per_channel_cast`` and
``per_channel_cast_fused`` (one kernel serves both). The fused form adds a gather of the rows
through ``pos_to_token`` (-1: a zero row) and accepts an FP8 input as a ``(q, sf)`` pair with
1 x 128 fp32 scales, dequantized before the cast. The launcher validates the tensors (dtype,
device, shape, strides, alignment) and names the argument in its errors; this module checks the
non-tensor arguments and the sizes TileKernels requires. That num_tokens is a multiple of 128
(without a gather) or pos_to_token's length a multiple of 16 (with one), which the launcher's
contract only reads, is a rule of the launch: dispatch() checks it on every call it replays.
"""

from __future__ import annotations

import torch

from .._args import matrix, one_of, positive_int
from .._op import Plan, empty, launch, multiple, op, out, pair, size
from .._runtime import dtype_name, get_kernel

__all__ = ["per_channel_cast", "per_channel_cast_fused"]

_kernel = get_kernel("per_channel_cast_fused")

NUM_PER_TOKENS = 128  # tokens per scale: the only group size TileKernels builds
IN_SF_BLOCK = 128  # channels per scale of an FP8 (q, sf) input
_PLAIN_DTYPES = (torch.bfloat16, torch.float32)
GATHER_MULTIPLE = 16  # pos_to_token's length must be a multiple of it


def _check_common(fmt: str, num_per_tokens: int) -> None:
    one_of("fmt", fmt, ("e4m3",))
    if positive_int("num_per_tokens", num_per_tokens) != NUM_PER_TOKENS:
        raise ValueError(f"num_per_tokens: only {NUM_PER_TOKENS} tokens per scale are supported, got {num_per_tokens}")


def _plain(name: str, x: object) -> torch.Tensor:
    x = matrix(name, x)
    if x.dtype not in _PLAIN_DTYPES:
        raise TypeError(f"{name}: expected bfloat16 or float32, got {x.dtype} (pass an FP8 input as a (q, sf) pair)")
    return x


def _tokens_multiple_of_128(name: str, num_tokens: int) -> None:
    if num_tokens % NUM_PER_TOKENS != 0:
        raise ValueError(f"{name}: num_tokens ({num_tokens}) must be a multiple of {NUM_PER_TOKENS}")


def _cast(x: torch.Tensor, x_sf: torch.Tensor | None, pos_to_token: torch.Tensor | None, round_sf: bool) -> Plan:
    """The launch: the given inputs in prim_func order, then q and sf. q has a row per output token
    (x's rows, or pos_to_token's length), sf one per 128 of them; both are hidden wide."""
    rows = x if pos_to_token is None else pos_to_token
    rule = multiple("x", x, 0, NUM_PER_TOKENS) if pos_to_token is None else \
        multiple("pos_to_token", pos_to_token, 0, GATHER_MULTIPLE)
    hidden = int(x.shape[1])
    # The variants take any hidden (grid value 0: the tiles do not depend on it).
    launcher = _kernel.variant(dtype_name(x.dtype), 0, pos_to_token is not None, bool(round_sf))
    given = [t for t in (x, x_sf, pos_to_token) if t is not None]
    return launch(launcher, *given, out(0), out(1),
                  outputs=(empty(torch.float8_e4m3fn, size(rows, 0), hidden),
                           empty(torch.float32, size(rows, 0, plus=NUM_PER_TOKENS - 1, per=NUM_PER_TOKENS), hidden)),
                  rules=(rule,))


@op(outputs=("q", "sf"), inputs={"x": (1,)})
def per_channel_cast(x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False) -> Plan:
    """Cast x (num_tokens, hidden) to FP8 with one scale per channel and 128 tokens.

    Args:
        x: bf16 or fp32 CUDA tensor (num_tokens, hidden), contiguous; num_tokens % 128 == 0,
            hidden % 64 == 0.
        fmt: ``'e4m3'``.
        num_per_tokens: tokens sharing one scale; 128.
        round_sf: round each scale up to a power of two.
        out: ``(q, sf)`` to write into instead of allocating, each exactly as this call would
            return it (dtype, shape, contiguous; e.g. the pair of an earlier call), not
            overlapping x. Every element is written. Returned as given.

    Returns:
        ``(q, sf)``: q float8_e4m3fn (num_tokens, hidden); sf float32 (num_tokens / 128, hidden),
        so that ``q[t, h] * sf[t // 128, h]`` approximates x. NaN inputs are left out of the
        scales and give NaN codes.
    """
    x = _plain("x", x)
    _check_common(fmt, num_per_tokens)
    _tokens_multiple_of_128("x", int(x.shape[0]))
    return _cast(x, None, None, round_sf)


# dispatch() keys a (q, sf) pair as its two tensors, q by hidden, with pos_to_token by whether it is given.
@op(outputs=("q", "sf"), inputs={"x": pair((1,), ()), "pos_to_token": ()})
def per_channel_cast_fused(
    x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    fmt: str,
    num_per_tokens: int,
    round_sf: bool = False,
    num_per_channels: int | None = None,
    pos_to_token: torch.Tensor | None = None,
) -> Plan:
    """Per-channel cast with an optional row gather and an optional FP8 input.

    Args:
        x: bf16 or fp32 (num_tokens, hidden) with hidden % 64 == 0, or a pair ``(q, sf)`` of
            float8_e4m3fn (num_tokens, hidden) codes and their float32 (num_tokens, hidden / 128)
            scales (hidden % 128 == 0), dequantized as ``q * sf`` first.
        fmt: ``'e4m3'``.
        num_per_tokens: tokens sharing one output scale; 128.
        round_sf: round each output scale up to a power of two.
        num_per_channels: channels per input scale of a ``(q, sf)`` pair: 128; None for a plain x.
        pos_to_token: optional int32 (num_tokens_out,) with num_tokens_out % 16 == 0: output row
            i is x row pos_to_token[i]; -1 (or any index outside [0, num_tokens), which is not
            checked on the host: that would need a device sync) gives a zero row.
        out: ``(q, sf)`` to write into instead of allocating, each exactly as this call would
            return it (dtype, shape, contiguous), not overlapping the inputs. Every element is
            written (zero rows included). Returned as given.

    Returns:
        ``(q, sf)``: q float8_e4m3fn (num_tokens_out, hidden); sf float32
        (ceil(num_tokens_out / 128), hidden). Without pos_to_token num_tokens_out = num_tokens,
        which must then be a multiple of 128.
    """
    x_sf = None
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ValueError(f"x: expected a (q, sf) pair, got a sequence of {len(x)}")
        x, x_sf = x
        if x_sf is None:
            raise TypeError("x_sf: a (q, sf) pair needs its float32 scales, got None (a plain x is a tensor)")
    if x_sf is not None:
        x, x_sf = matrix("x", x), matrix("x_sf", x_sf, "(num_tokens, hidden / 128)")
        if x.dtype != torch.float8_e4m3fn:
            raise TypeError(f"x: the data of a (q, sf) pair must be float8_e4m3fn, got {x.dtype}")
        if num_per_channels is None or positive_int("num_per_channels", num_per_channels) != IN_SF_BLOCK:
            raise ValueError(f"num_per_channels: a (q, sf) input needs {IN_SF_BLOCK} channels per scale, "
                             f"got {num_per_channels!r}")
        if x.shape[1] % IN_SF_BLOCK != 0:  # TileKernels' rule: whole 1 x 128 input blocks
            raise ValueError(f"x: the hidden of a (q, sf) pair ({x.shape[1]}) must be a multiple of {IN_SF_BLOCK}, "
                             f"one input scale per {IN_SF_BLOCK} channels")
    else:
        x = _plain("x", x)
        if num_per_channels is not None:
            raise ValueError("num_per_channels: only a (q, sf) input has input scales; pass None for a plain x")
    _check_common(fmt, num_per_tokens)
    if pos_to_token is None:
        _tokens_multiple_of_128("x", int(x.shape[0]))
    else:
        if not isinstance(pos_to_token, torch.Tensor) or pos_to_token.dim() != 1:
            raise ValueError("pos_to_token: expected a 1-D int32 tensor (num_tokens_out,)")
        if pos_to_token.shape[0] % GATHER_MULTIPLE != 0:
            raise ValueError(f"pos_to_token: its length ({pos_to_token.shape[0]}) must be a multiple of "
                             f"{GATHER_MULTIPLE}")
    return _cast(x, x_sf, pos_to_token, round_sf)


