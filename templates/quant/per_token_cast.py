"""Per-token (row-wise) casts to FP8 e4m3 or packed FP4 e2m1 with fp32 scale factors.

The public API follows TileKernels' ``tile_kernels.quant.per_token_cast``; this build covers
the plain-tensor input and the row-major fp32 scale layout. The launcher validates the tensors
(dtype, device, shape, strides, alignment) and names the argument in its errors; this module
checks the non-tensor arguments and the options the build does not cover.
"""

from __future__ import annotations

import operator

import torch

from .._runtime import custom_op, dtype_name, get_kernel

__all__ = ["per_token_cast"]

_kernel = get_kernel("per_token_cast")

_FORMATS = ("e4m3", "e2m1")


def _not_built(flag: str, layout: str) -> NotImplementedError:
    return NotImplementedError(
        f"{flag}: {layout} is not built into this package; the kernel spec (kernel per_token_cast) "
        "must add that layout before it can be used"
    )


def _outputs(x: torch.Tensor, fmt: str, npc: int, round_sf: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf) for x; also the fake (meta) kernel that torch.compile traces with."""
    num_tokens, hidden = x.shape
    if fmt == "e4m3":
        q = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    else:
        q = x.new_empty((num_tokens, hidden // 2), dtype=torch.int8)
    return q, x.new_empty((num_tokens, hidden // npc), dtype=torch.float32)


def _cast(x: torch.Tensor, fmt: str, npc: int, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the variant and launch it; the launcher checks every tensor and names it in errors."""
    launch = _kernel.select(in_dtype=dtype_name(x.dtype), hidden=int(x.shape[1]), fmt=fmt, npc=npc,
                            round_sf=round_sf)
    q, sf = _outputs(x, fmt, npc)
    launch(x, q, sf)
    return q, sf


# What torch.compile sees: one opaque op, torch.ops.<package>.per_token_cast, with a fixed schema.
_per_token_cast_op = custom_op("per_token_cast", fake=_outputs)(_cast)


def per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    x_block_size: tuple[int, int] | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast x (num_tokens, hidden) to FP8/FP4 with one scale per token and npc channels.

    Args:
        x: bf16 or fp32 CUDA tensor of shape (num_tokens, hidden), contiguous.
        fmt: ``'e4m3'`` (FP8) or ``'e2m1'`` (FP4, two codes per int8).
        num_per_channels: channels sharing one scale factor (npc).
        x_block_size: scale block of a quantized (data, sf) input; not built (must be None).
        use_tma_aligned_col_major_sf: column-major, TMA-aligned scales; not built (must be False).
        round_sf: round each scale up to a power of two.
        use_packed_ue8m0: UE8M0 exponents packed into int32; not built (must be False).

    Returns:
        ``(q, sf)``: q is float8_e4m3fn (num_tokens, hidden) for e4m3, or int8
        (num_tokens, hidden / 2) for e2m1 (element 2i in the low nibble, 2i + 1 in the high
        one); sf is float32 (num_tokens, hidden / num_per_channels), row-major, so that
        ``decode(q) * sf`` (per group) approximates x.
    """
    if isinstance(x, tuple):
        raise _not_built("x", "re-quantization of a (data, sf) pair (x_block_size)")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor of shape (num_tokens, hidden), got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor (num_tokens, hidden), got shape {tuple(x.shape)}")
    if fmt not in _FORMATS:
        raise ValueError(f"fmt: expected one of {', '.join(repr(f) for f in _FORMATS)}, got {fmt!r}")
    try:
        npc = operator.index(num_per_channels)
    except TypeError:
        raise TypeError(f"num_per_channels: expected an int, got {type(num_per_channels).__name__}") from None
    if npc <= 0 or isinstance(num_per_channels, bool):
        raise ValueError(f"num_per_channels: expected a positive int, got {num_per_channels!r}")
    if x_block_size is not None:
        raise _not_built("x_block_size", "re-quantization of a (data, sf) pair")
    if use_tma_aligned_col_major_sf:
        raise _not_built("use_tma_aligned_col_major_sf", "the column-major TMA-aligned scale layout")
    if use_packed_ue8m0:
        raise _not_built("use_packed_ue8m0", "the packed UE8M0 scale layout")

    hidden = int(x.shape[1])
    if hidden % npc != 0:
        raise ValueError(f"num_per_channels: hidden ({hidden}) must be a multiple of num_per_channels ({npc})")

    if torch.compiler.is_compiling():
        return _per_token_cast_op(x, fmt, npc, bool(round_sf))
    return _cast(x, fmt, npc, bool(round_sf))
