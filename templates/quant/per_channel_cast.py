"""Per-channel casts to FP8 e4m3: one fp32 scale per channel and group of 128 tokens.

The public API follows TileKernels' ``tile_kernels.quant.per_channel_cast`` and
``per_channel_cast_fused`` (one kernel serves both). The fused form adds a gather of the rows
through ``pos_to_token`` (-1: a zero row) and accepts an FP8 input as a ``(q, sf)`` pair with
1 x 128 fp32 scales, dequantized before the cast. The launcher validates the tensors (dtype,
device, shape, strides, alignment) and names the argument in its errors; this module checks the
non-tensor arguments and the sizes TileKernels requires.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._args import copied_into, matrix, one_of, out_tensors, positive_int
from .._runtime import (
    custom_op,
    dispatch,
    dtype_name,
    fast_path,
    from_input,
    from_out,
    get_kernel,
    output,
    remember,
    size_multiple,
    size_of,
)
from ..errors import KernelArgumentError

__all__ = ["per_channel_cast", "per_channel_cast_fused"]

_kernel = get_kernel("per_channel_cast_fused")

NUM_PER_TOKENS = 128  # tokens per scale: the only group size TileKernels builds
IN_SF_BLOCK = 128  # channels per scale of an FP8 (q, sf) input
_PLAIN_DTYPES = (torch.bfloat16, torch.float32)
GATHER_MULTIPLE = 16  # pos_to_token's length must be a multiple of it


def _outputs(
    x: torch.Tensor, x_sf: torch.Tensor | None, pos_to_token: torch.Tensor | None, round_sf: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf); also the fake (meta) kernel that torch.compile traces with."""
    num_out = x.shape[0] if pos_to_token is None else pos_to_token.shape[0]
    hidden = x.shape[1]
    q = x.new_empty((num_out, hidden), dtype=torch.float8_e4m3fn)
    sf = x.new_empty(((num_out + NUM_PER_TOKENS - 1) // NUM_PER_TOKENS, hidden), dtype=torch.float32)
    return q, sf


def _cast(
    x: torch.Tensor, x_sf: torch.Tensor | None, pos_to_token: torch.Tensor | None, round_sf: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The custom op's body: a launch into fresh outputs."""
    return _launch(x, x_sf, pos_to_token, round_sf, None)


def _launch(
    x: torch.Tensor, x_sf: torch.Tensor | None, pos_to_token: torch.Tensor | None, round_sf: bool, out: object,
    key: tuple[object, ...] | None = None, options: tuple[object, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the variant and launch it into fresh (q, sf), or into out's; the launcher checks every
    tensor (out's too, overlaps included) and names it in errors. The launcher is then stored
    under key (None: a call not cached) and remembered for dispatch() under the call's options as
    given (None: not remembered)."""
    launch = _kernel.select(in_dtype=dtype_name(x.dtype), hidden=int(x.shape[1]), expand=pos_to_token is not None,
                            round_sf=round_sf)
    q, sf = _outputs(x, x_sf, pos_to_token, round_sf) if out is None else out_tensors(out, ("q", "sf"))
    args = [x] + [t for t in (x_sf, pos_to_token) if t is not None]
    launch(*args, q, sf)
    if key is not None:  # the launcher accepted the call: later ones of its signature may skip the checks
        _LAUNCHERS[key] = launch
    if options is not None:
        _remember_fast(launch, (q, sf), x, x_sf, pos_to_token, out, *options)
    return q, sf


def _remember_fast(launch: Callable[..., None], result: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
                   x_sf: torch.Tensor | None, pos_to_token: torch.Tensor | None, out: object,
                   *options: object) -> None:
    """Let dispatch() take later calls like this one (x, x_sf, pos_to_token, out, options; see _FAST),
    which returned ``result``.

    The launcher takes the given inputs in that order, then q and sf. Beyond the contract (and
    the key, which holds which inputs are given) the checks require of a size: without a gather
    num_tokens % 128 (the contract only reads it), with one pos_to_token's length % 16. An
    allocating call (out None) allocates (q, sf) as _outputs does: q has a row per output token
    (x's rows, or pos_to_token's length: input 2), sf one per 128 of them; both are hidden (keyed) wide.
    """
    given = [i for i, t in enumerate((x, x_sf, pos_to_token)) if t is not None]
    rule = size_multiple(0, 0, NUM_PER_TOKENS) if pos_to_token is None else \
        size_multiple(len(given) - 1, 0, GATHER_MULTIPLE)
    rows = 0 if pos_to_token is None else 2  # the dispatch call's input that sets the output tokens
    q, sf = result
    remember(_FAST, launch, (*map(from_input, given), from_out(0), from_out(1)), (rule,),
             x, x_sf, pos_to_token, out, *options,
             outputs=(output(q.dtype, size_of(rows, 0), q.shape[1]),
                      output(sf.dtype, size_of(rows, 0, plus=NUM_PER_TOKENS - 1, per=NUM_PER_TOKENS), sf.shape[1])))


# What torch.compile sees: one opaque op, torch.ops.<package>.per_channel_cast_fused.
_per_channel_cast_op = custom_op("per_channel_cast_fused", fake=_outputs)(_cast)


def _run(
    x: torch.Tensor, x_sf: torch.Tensor | None, pos_to_token: torch.Tensor | None, round_sf: bool, out: object,
    key: tuple[object, ...] | None = None, options: tuple[object, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eagerly the launch (into out, if given; see _launch for key and options); while compiling
    the custom op, whose result is copied into out (torch.compile sees a pure op)."""
    if torch.compiler.is_compiling():
        result = _per_channel_cast_op(x, x_sf, pos_to_token, bool(round_sf))
        return result if out is None else copied_into(out, ("q", "sf"), result)
    return _launch(x, x_sf, pos_to_token, bool(round_sf), out, key, options)


# per_channel_cast's eager calls on a 2-D x, keyed by what its checks and select read: (x.dtype,
# hidden, fmt, num_per_tokens, round_sf) -> the launcher. A key is stored only after the checks
# passed and the launcher accepted the call, so a hit skips both; the launcher checks every
# tensor on every call (the contract ties q's and sf's sizes to x's), and where it refuses one
# the checks run, to name it. That num_tokens is a multiple of 128, which the launcher cannot
# see, is checked on every hit. Only options of exactly the types str, int and bool are keyed:
# 128.0 == 128 and True == 1 hash alike, but positive_int refuses the float and the bool.
_LAUNCHERS: dict[tuple[object, ...], Callable[..., None]] = {}
# per_channel_cast_fused(..., out=(q, sf)) in one C call (_runtime.dispatch), called as
# dispatch(_FAST, x, x_sf, pos_to_token, out, fmt, num_per_tokens, round_sf, num_per_channels) with
# a (q, sf) pair x unpacked (x_sf None for a plain x): keyed by x's dtype and width, x_sf's and
# pos_to_token's dtype and rank (or None) and the options as given; checked by the launcher's
# contract and the token count rule (see _remember_fast). per_channel_cast is the fused op's plain
# form (the same checks and launch), so it shares the table with x_sf, pos_to_token and
# num_per_channels None. Allocating calls (out None) are remembered too: dispatch() allocates (q, sf).
_FAST = fast_path(inputs=((1,), (), ()), outputs=2)


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


def per_channel_cast(
    x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False, *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast x (num_tokens, hidden) to FP8 with one scale per channel and 128 tokens.

    Args:
        x: bf16 or fp32 CUDA tensor (num_tokens, hidden), contiguous; num_tokens % 128 == 0.
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
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        done = dispatch(_FAST, x, None, None, out, fmt, num_per_tokens, round_sf, None)
        if done is not None:
            return done  # type: ignore[no-any-return]
    key = None
    if not torch.compiler.is_compiling() and isinstance(x, torch.Tensor) and x.dim() == 2 and type(fmt) is str \
            and type(num_per_tokens) is int and type(round_sf) is bool:
        key = (x.dtype, x.shape[1], fmt, num_per_tokens, round_sf)
        launch = _LAUNCHERS.get(key)
        if launch is not None and x.shape[0] % NUM_PER_TOKENS == 0:
            q, sf = _outputs(x, None, None, round_sf) if out is None else out_tensors(out, ("q", "sf"))
            try:
                launch(x, q, sf)
            except KernelArgumentError:
                pass  # the checks below name what is wrong
            else:  # dispatch() had not seen it, or declined
                _remember_fast(launch, (q, sf), x, None, None, out, fmt, num_per_tokens, round_sf, None)
                return q, sf
    x = _plain("x", x)
    _check_common(fmt, num_per_tokens)
    _tokens_multiple_of_128("x", int(x.shape[0]))
    return _run(x, None, None, round_sf, out, key, (fmt, num_per_tokens, round_sf, None))


def per_channel_cast_fused(
    x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    fmt: str,
    num_per_tokens: int,
    round_sf: bool = False,
    num_per_channels: int | None = None,
    pos_to_token: torch.Tensor | None = None,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel cast with an optional row gather and an optional FP8 input.

    Args:
        x: bf16 or fp32 (num_tokens, hidden), or a pair ``(q, sf)`` of float8_e4m3fn
            (num_tokens, hidden) codes and their float32 (num_tokens, hidden / 128) scales,
            dequantized as ``q * sf`` first.
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
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        done = None
        if type(x) is not tuple:  # a plain x (anything else is no tensor: declined)
            done = dispatch(_FAST, x, None, pos_to_token, out, fmt, num_per_tokens, round_sf, num_per_channels)
        elif len(x) == 2 and x[1] is not None:  # a (q, sf) pair; (q, None) would key as a plain q
            done = dispatch(_FAST, x[0], x[1], pos_to_token, out, fmt, num_per_tokens, round_sf, num_per_channels)
        if done is not None:
            return done  # type: ignore[no-any-return]
    x_sf = None
    if isinstance(x, tuple):
        if len(x) != 2:
            raise ValueError(f"x: expected a (q, sf) pair, got a tuple of {len(x)}")
        x, x_sf = matrix("x", x[0]), matrix("x_sf", x[1], "(num_tokens, hidden / 128)")
        if x.dtype != torch.float8_e4m3fn:
            raise TypeError(f"x: the data of a (q, sf) pair must be float8_e4m3fn, got {x.dtype}")
        if num_per_channels is None or positive_int("num_per_channels", num_per_channels) != IN_SF_BLOCK:
            raise ValueError(f"num_per_channels: a (q, sf) input needs {IN_SF_BLOCK} channels per scale, "
                             f"got {num_per_channels!r}")
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
    return _run(x, x_sf, pos_to_token, round_sf, out, None, (fmt, num_per_tokens, round_sf, num_per_channels))
