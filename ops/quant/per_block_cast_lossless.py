"""Exact re-cast of FP4 e2m1 codes with 1 x 32 power-of-two scales to FP8 e4m3 with coarser blocks.

The public API follows TileKernels' ``tile_kernels.quant.per_block_cast_lossless``; this build
covers fp32 row-major input scales (1 x 32 blocks, powers of two as ``per_token_cast(...,
round_sf=True)`` makes them) and fp32 row-major output scales. The launcher validates the
tensors (dtype, device, shape, strides, alignment) and names the argument in its errors; this
module checks the non-tensor arguments and the options the build does not cover.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from .._args import matrix, not_built, one_of
from .._op import Plan, empty, launch, op, out, size
from .._runtime import get_kernel

__all__ = ["per_block_cast_lossless"]

_kernel = get_kernel("per_block_cast_lossless")

IN_BLOCK = (1, 32)
OUT_BLOCKS = ((1, 128), (32, 32), (128, 128))


def _not_built(argument: str, what: str) -> NotImplementedError:
    return not_built(argument, what, "per_block_cast_lossless")


def _pair_of_ints(name: str, value: object) -> tuple[int, int]:
    try:
        pair: tuple[Any, ...] = tuple(value)  # type: ignore[arg-type]  # not iterable: TypeError
        a, b = pair
        if isinstance(a, bool) or isinstance(b, bool):
            raise TypeError
        return operator.index(a), operator.index(b)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a pair of ints, got {value!r}") from None


# x is a (data, sf) pair, which dispatch() does not key: the op keeps its Python path.
@op(outputs=("q", "sf"))
def per_block_cast_lossless(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str,
    x_block_size: tuple[int, int],
    out_block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> Plan:
    """Re-quantize an FP4 (e2m1) pair to FP8 (e4m3) with larger scale blocks, exactly.

    Args:
        x: ``(data, sf)``: data int8 (num_tokens, hidden / 2), two e2m1 codes per byte
            (element 2i in the low nibble); sf float32 (num_tokens, hidden / 32), contiguous,
            powers of two (only their exponent bits are read).
        fmt: ``'e4m3'``.
        x_block_size: the input's scale block: (1, 32).
        out_block_size: (1, 128), (32, 32) or (128, 128).
        use_tma_aligned_col_major_sf: column-major output scales; not built (must be False).
        round_sf: has no effect: the output scales are powers of two by construction.
        use_packed_ue8m0: UE8M0 output scales; not built (must be False).
        out: ``(q, sf)`` to write into instead of allocating, each exactly as this call would
            return it (dtype, shape, contiguous; e.g. the pair of an earlier call), not
            overlapping x. Every element is written. Returned as given.

    Returns:
        ``(q, sf)``: q float8_e4m3fn (num_tokens, hidden); sf float32
        (ceil(num_tokens / block_m), hidden / block_k), row-major, each a power of two
        2^(e_max - 6) (or 0.0 when the block's largest input exponent field is below 6), so that
        ``q * sf`` equals the input's ``fp4 * x_sf`` exactly whenever the input scales of an
        output block span at most 2^14 (smaller ones are rounded to e4m3's 2^-9 steps).
    """
    if not isinstance(x, tuple) or len(x) != 2:
        raise TypeError(f"x: expected a (data, sf) pair of tensors, got {type(x).__name__}")
    data, x_sf = matrix("x", x[0], "(num_tokens, hidden / 2)"), matrix("x_sf", x[1], "(num_tokens, hidden / 32)")
    if data.dtype != torch.int8:
        raise TypeError(f"x: the data must be int8 packed FP4 (e2m1) codes, got {data.dtype}")
    if x_sf.dtype == torch.int32:
        raise _not_built("x", "packed UE8M0 input scales")
    one_of("fmt", fmt, ("e4m3",))
    if _pair_of_ints("x_block_size", x_block_size) != IN_BLOCK:
        raise ValueError(f"x_block_size: only {IN_BLOCK} input blocks are supported, got {x_block_size!r}")
    block_m, block_k = _pair_of_ints("out_block_size", out_block_size)
    if (block_m, block_k) not in OUT_BLOCKS:
        raise ValueError(f"out_block_size: expected one of {OUT_BLOCKS}, got {out_block_size!r}")
    if use_tma_aligned_col_major_sf:
        raise _not_built("use_tma_aligned_col_major_sf", "the column-major TMA-aligned scale layout")
    if use_packed_ue8m0:
        raise _not_built("use_packed_ue8m0", "the packed UE8M0 scale layout")
    if x_sf.shape[0] != data.shape[0]:
        raise ValueError(f"x_sf: expected {data.shape[0]} rows (one per token of x), got {x_sf.shape[0]}")
    hidden = 2 * int(data.shape[1])
    # Grid order: hidden, block_m, block_k; the launcher checks every tensor (out's too, overlaps included).
    return launch(_kernel.variant(hidden, block_m, block_k), data, x_sf, out(0), out(1),
                  outputs=(empty(torch.float8_e4m3fn, size(data, 0), hidden),
                           empty(torch.float32, size(data, 0, plus=block_m - 1, per=block_m), hidden // block_k)))
