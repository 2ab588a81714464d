"""Exact re-cast of FP4 e2m1 codes with 1 x 32 power-of-two scales to FP8 e4m3 with coarser blocks.

The public API follows TileKernels' ``tile_kernels.quant.per_block_cast_lossless``: 1 x 32 input blocks with
power-of-two scales as ``per_token_cast(..., round_sf=True)`` makes them, fp32 row-major or packed UE8M0; output
scales in every layout ``per_block_cast`` returns; any hidden TileKernels takes (a multiple of 64: variants
built for the common ones, one for any size and every layout). The launcher validates the
tensors (dtype, device, shape, strides, alignment) and names the argument in its errors; this
module checks the non-tensor arguments and the options the build does not cover.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from .._args import matrix, one_of, out_tensors
from .._op import Plan, empty, launch, op, size
from .._op import out as output  # the plan takes a parameter named out
from .._runtime import get_kernel
from ._scales import ColumnMajor, check_scales, given_scales, scale_layout, storage_view

__all__ = ["per_block_cast_lossless"]

_kernel = get_kernel("per_block_cast_lossless")

IN_BLOCK = (1, 32)
OUT_BLOCKS = ((1, 128), (32, 32), (128, 128))


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
    *,
    out: object = None,
) -> Plan:
    """Re-quantize an FP4 (e2m1) pair to FP8 (e4m3) with larger scale blocks, exactly.

    Args:
        x: ``(data, sf)``: data int8 (num_tokens, hidden / 2), two e2m1 codes per byte
            (element 2i in the low nibble), hidden % 64 == 0; sf float32 (num_tokens, hidden / 32),
            contiguous, powers of two (only their exponent bits are read), or int32
            (num_tokens, ceil(hidden / 128)) packed UE8M0 exponents as ``per_token_cast(...,
            use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)`` returns them
            (read in place when column-major over whole storage, else copied).
        fmt: ``'e4m3'``.
        x_block_size: the input's scale block: (1, 32).
        out_block_size: (1, 128), (32, 32) or (128, 128).
        use_tma_aligned_col_major_sf: output scales column-major over a (G, align(ceil(T / block_m), 4))
            storage, as ``per_block_cast`` returns them.
        round_sf: has no effect: the output scales are powers of two by construction.
        use_packed_ue8m0: output scales as int32 words of four UE8M0 exponents, column-major as above
            (needs use_tma_aligned_col_major_sf; round_sf is implied).
        out: ``(q, sf)`` to write into instead of allocating, each exactly as this call would
            return it (dtype, shape, layout; e.g. the pair of an earlier call), not
            overlapping x. Every element is written (not a column-major storage's padding). Returned as given.

    Returns:
        ``(q, sf)``: q float8_e4m3fn (num_tokens, hidden); sf float32
        (ceil(num_tokens / block_m), G = ceil(hidden / block_k)), row- or column-major, or int32 UE8M0
        words (ceil(num_tokens / block_m), ceil(G / 4)); each scale a power of two
        2^(e_max - 6) (or 0.0 when the block's largest input exponent field is below 6), so that
        ``q * sf`` equals the input's ``fp4 * x_sf`` exactly whenever the input scales of an
        output block span at most 2^14 (smaller ones are rounded to e4m3's 2^-9 steps).
    """
    if not isinstance(x, tuple) or len(x) != 2:
        raise TypeError(f"x: expected a (data, sf) pair of tensors, got {type(x).__name__}")
    data, x_sf = matrix("x", x[0], "(num_tokens, hidden / 2)"), matrix("x_sf", x[1], "(num_tokens, hidden / 32)")
    if data.dtype != torch.int8:
        raise TypeError(f"x: the data must be int8 packed FP4 (e2m1) codes, got {data.dtype}")
    one_of("fmt", fmt, ("e4m3",))
    if _pair_of_ints("x_block_size", x_block_size) != IN_BLOCK:
        raise ValueError(f"x_block_size: only {IN_BLOCK} input blocks are supported, got {x_block_size!r}")
    block_m, block_k = _pair_of_ints("out_block_size", out_block_size)
    if (block_m, block_k) not in OUT_BLOCKS:
        raise ValueError(f"out_block_size: expected one of {OUT_BLOCKS}, got {out_block_size!r}")
    # The output's power-of-two scales are what round_sf asks for: UE8M0 needs no round_sf here.
    sf_layout = scale_layout(bool(use_tma_aligned_col_major_sf), True, bool(use_packed_ue8m0))
    if x_sf.shape[0] != data.shape[0]:
        raise ValueError(f"x_sf: expected {data.shape[0]} rows (one per token of x), got {x_sf.shape[0]}")
    hidden = 2 * int(data.shape[1])
    if hidden % 64 != 0:
        raise ValueError(f"x: hidden ({hidden}, twice the data's width) must be a multiple of 64")
    shape = (int(data.shape[0]), hidden)
    in_sf_layout = "ue8m0" if x_sf.dtype == torch.int32 else "row_major"
    if in_sf_layout == "ue8m0":
        x_sf = given_scales(x_sf, shape, IN_BLOCK[1], "ue8m0", name="x_sf")
    # Grid order: hidden, block_m, block_k, in_sf_layout, sf_layout: the variant built for this hidden where there
    # is one, else the one for any hidden (grid value 0). The launcher checks every tensor (out's too, overlaps).
    options = (block_m, block_k, in_sf_layout, sf_layout)
    launcher = _kernel.find(hidden, *options) or _kernel.variant(0, *options)
    if sf_layout == "row_major":
        return launch(launcher, data, x_sf, output(0), output(1),
                      outputs=(empty(torch.float8_e4m3fn, size(data, 0), hidden),
                               empty(torch.float32, size(data, 0, plus=block_m - 1, per=block_m),
                                     -(-hidden // block_k))))
    if out is not None:  # the kernel's view of out's sf (the launcher checks that view) assumes its shape
        check_scales(out_tensors(out, ("q", "sf"))[1], shape, block_k, sf_layout, block_m)
    return launch(launcher, data, x_sf, output(0), output(1, view=storage_view(sf_layout)),
                  outputs=ColumnMajor("e4m3", block_k, sf_layout, block_m=block_m, fp4_x=True))  # type: ignore[arg-type]
