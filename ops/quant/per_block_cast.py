"""Per-block casts to FP8 e4m3 or packed FP4 e2m1 with one fp32 scale per (bm x bk) block.

The public API follows TileKernels' ``tile_kernels.quant.per_block_cast`` (and its
``_with_sf_only`` and ``_with_precomputed_sf`` forms); this build covers plain bf16 and fp32 inputs of
any hidden TileKernels takes (one variant for any multiple of 64; bf16 -> e2m1 also built per hidden for the
common ones),
the row-major fp32 scale layout, and for 128 x 128 and 32 x 32 blocks the column-major TMA-aligned
and packed UE8M0 layouts of per_token_cast (rows of blocks in the place of tokens). The
launcher validates the tensors (dtype, device, shape,
strides, alignment) and names the argument in its errors; this module checks the non-tensor
arguments and the options the build does not cover.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from .._args import matrix, not_built, one_of, out_tensors
from .._op import Empty, Plan, empty, launch, op, size
from .._op import out as output  # the plans take a parameter named out
from .._runtime import dtype_name, get_kernel
from ._scales import ColumnMajor, check_scales, scale_layout, storage_view

__all__ = ["per_block_cast", "per_block_cast_with_precomputed_sf", "per_block_cast_with_sf_only"]

_kernel = get_kernel("per_block_cast")

_FORMATS = ("e4m3", "e2m1")


def _not_built(argument: str, what: str) -> NotImplementedError:
    return not_built(argument, what, "per_block_cast")


def _codes(x: torch.Tensor, fmt: str) -> Empty:
    """q for x: e4m3 codes (T, hidden), or e2m1 ones two to an int8 (T, hidden / 2)."""
    hidden = int(x.shape[1])
    if fmt == "e4m3":
        return empty(torch.float8_e4m3fn, size(x, 0), hidden)
    return empty(torch.int8, size(x, 0), hidden // 2)


def _variant(x: torch.Tensor, fmt: str, block_m: int, block_k: int, round_sf: bool,
             precomputed_sf: bool, sf_layout: str = "row_major") -> Callable[..., None]:
    """The launcher: the one built for x's hidden where there is one, else the one for any hidden (grid value 0).
    Grid order: in_dtype, hidden, fmt, block_m, block_k, round_sf, precomputed_sf, sf_layout."""
    dtype, options = dtype_name(x.dtype), (fmt, block_m, block_k, round_sf, precomputed_sf, sf_layout)
    return _kernel.find(dtype, int(x.shape[1]), *options) or _kernel.variant(dtype, 0, *options)


def _block_size(block_size: object) -> tuple[int, int]:
    try:
        pair: tuple[Any, ...] = tuple(block_size)  # type: ignore[arg-type]  # not iterable: TypeError
        m, k = pair
        if isinstance(m, bool) or isinstance(k, bool):
            raise TypeError
        block_m, block_k = operator.index(m), operator.index(k)
    except (TypeError, ValueError):
        raise TypeError(f"block_size: expected a pair of ints (block_m, block_k), got {block_size!r}") from None
    if block_m <= 0 or block_k <= 0:
        raise ValueError(f"block_size: expected positive sizes, got {block_size!r}")
    return block_m, block_k


def _checked(x: object, fmt: str, block_size: object) -> tuple[int, int]:
    """Check the arguments every form shares; returns (block_m, block_k)."""
    if isinstance(x, tuple):
        raise _not_built("x", "re-quantization of a (data, sf) pair")
    x = matrix("x", x)
    one_of("fmt", fmt, _FORMATS)
    block_m, block_k = _block_size(block_size)
    hidden = int(x.shape[1])
    if hidden % 64 != 0:
        raise ValueError(f"x: hidden ({hidden}) must be a multiple of 64")
    return block_m, block_k


# dispatch() keys a call by x's dtype and width (and sf's dtype and rank) and the options as given,
# which is all the checks read; the launcher's contract ties every size to x's tokens and the
# variant's hidden (sf, an input of the precomputed form, included), so no rule is left to state.
@op(outputs=("q", "sf"), inputs={"x": (1,)})
def per_block_cast(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    *,
    out: object = None,
) -> Plan:
    """Cast x (num_tokens, hidden) to FP8/FP4 with one scale per (block_m, block_k) block.

    Args:
        x: bf16 or fp32 CUDA tensor of shape (num_tokens, hidden), contiguous; hidden % 64 == 0
            (the last block of a row partial where block_k does not divide hidden: its scale is over
            the channels there are); num_tokens at most 65535 * block_m (the row tiles are the
            grid's y dimension; beyond, the launcher raises naming the grid).
        fmt: ``'e4m3'`` (FP8) or ``'e2m1'`` (FP4, two codes per int8).
        block_size: ``(block_m, block_k)``: tokens and channels sharing one scale factor,
            each 32 or 128.
        use_tma_aligned_col_major_sf: sf column-major over a (G, align(ceil(T / block_m), 4))
            storage, as TileKernels returns it (128 x 128 and 32 x 32 blocks).
        round_sf: round each scale up to a power of two.
        use_packed_ue8m0: sf as int32 words of four UE8M0 exponents, column-major as above (needs
            use_tma_aligned_col_major_sf and round_sf).
        out: ``(q, sf)`` to write into instead of allocating, each exactly as this call would
            return it (dtype, shape, layout; e.g. the pair of an earlier call), not
            overlapping x. Every element is written (not a column-major storage's padding). Returned as given.

    Returns:
        ``(q, sf)``: q is float8_e4m3fn (num_tokens, hidden) for e4m3, or int8
        (num_tokens, hidden / 2) for e2m1 (element 2i in the low nibble, 2i + 1 in the high
        one); sf is float32 (ceil(num_tokens / block_m), G = ceil(hidden / block_k)), row- or column-major,
        or int32 UE8M0 words (ceil(num_tokens / block_m), ceil(G / 4)), so that
        ``decode(q) * sf`` (per block) approximates x.
    """
    block_m, block_k = _checked(x, fmt, block_size)
    sf_layout = scale_layout(use_tma_aligned_col_major_sf, bool(round_sf), use_packed_ue8m0)
    launcher = _variant(x, fmt, block_m, block_k, bool(round_sf), False, sf_layout)
    if sf_layout == "row_major":
        sf_rows = size(x, 0, plus=block_m - 1, per=block_m)  # ceil(T / block_m)
        return launch(launcher, x, output(0), output(1),
                      outputs=(_codes(x, fmt), empty(torch.float32, sf_rows, -(-int(x.shape[1]) // block_k))))
    if out is not None:  # the kernel's view of out's sf (the launcher checks that view) assumes its shape
        check_scales(out_tensors(out, ("q", "sf"))[1], x.shape, block_k, sf_layout, block_m)
    return launch(launcher, x, output(0), output(1, view=storage_view(sf_layout)),
                  outputs=ColumnMajor(fmt, block_k, sf_layout, block_m=block_m))  # type: ignore[arg-type]


def per_block_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> torch.Tensor:
    """The scale factors of ``per_block_cast(x, fmt, block_size, ...)`` alone (same arguments).

    This build runs the full cast and drops the codes (no sf-only kernel variant yet).
    """
    return per_block_cast(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)[1]  # type: ignore[no-any-return]


@op(outputs=("q",), inputs={"x": (1,), "sf": ()})
def per_block_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    sf: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> Plan:
    """Cast x with given per-block scales: q = x_f32 * (1 / sf) per block (1 / sf an IEEE division).

    Args:
        x: bf16 or fp32 CUDA tensor of shape (num_tokens, hidden), contiguous; hidden % 64 == 0;
            num_tokens at most 65535 * block_m, as for ``per_block_cast``.
        fmt: ``'e4m3'`` (FP8) or ``'e2m1'`` (FP4, two codes per int8).
        block_size: ``(block_m, block_k)``, each 32 or 128.
        sf: float32 (ceil(num_tokens / block_m), ceil(hidden / block_k)), contiguous, e.g. from
            ``per_block_cast_with_sf_only``; used as given.
        use_tma_aligned_col_major_sf: given scales column-major; not built (must be False).
        round_sf: has no effect: sf is used as given (as in TileKernels).
        use_packed_ue8m0: given UE8M0 scales; not built (must be False).
        out: a contiguous q of this call's dtype and shape to write into instead of allocating
            (not overlapping x or sf), returned as given.

    Returns:
        q: float8_e4m3fn (num_tokens, hidden) or packed FP4 int8 (num_tokens, hidden / 2).
    """
    block_m, block_k = _checked(x, fmt, block_size)
    if use_tma_aligned_col_major_sf:
        raise _not_built("use_tma_aligned_col_major_sf", "given scales in the column-major layout")
    if use_packed_ue8m0:
        raise _not_built("use_packed_ue8m0", "given scales in the packed UE8M0 layout")
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"sf: expected a float32 torch.Tensor of per-block scales, got {type(sf).__name__}")
    # The launcher checks sf's dtype, shape and layout (an input here) and out's as q's.
    return launch(_variant(x, fmt, block_m, block_k, False, True), x, output(0), sf, outputs=(_codes(x, fmt),))
