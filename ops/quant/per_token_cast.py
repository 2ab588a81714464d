"""Per-token (row-wise) casts to FP8 e4m3 or packed FP4 e2m1 with fp32 or UE8M0 scale factors.

The public API follows TileKernels' ``tile_kernels.quant.per_token_cast``,
``per_token_cast_with_sf_only`` and ``per_token_cast_with_precomputed_sf``; this build covers
plain-tensor inputs whose rows may be strided (x[:, :hidden] of a wider tensor, row stride a
multiple of the arch's vector width), any hidden that is a multiple of 64 with npc in
{16, 32, 64, 128} (G = ceil(hidden / npc) groups, the last one partial where npc does not divide
hidden, as TileKernels), npc = hidden (one scale per row, grid value npc = 0, built per hidden),
and the three scale layouts of KERNELS.md: (a) row-major fp32,
(b) ``use_tma_aligned_col_major_sf`` (fp32, column-major, token dimension padded to a multiple
of 4) and (c) ``use_packed_ue8m0`` (int32 words of four UE8M0 exponents, laid out as (b)). The
launcher checks the tensors, this module the other arguments, each error naming the argument.

A quantized (data, sf) pair x is re-quantized in one launch of the fused kernel
(``per_token_cast_requant``) where the package holds a variant for the pair's format, scale block and
scale layout and the call's format, npc and layout (kernel_specs/quant.yaml lists TileKernels' tests'
combinations); any other pair, and the sf-only and given-sf forms, dequantize with per_token_cast_back
into an fp32 tensor that the fp32 variant then casts. Both give the same bits: the fused kernel keeps
that fp32 tensor in registers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._args import column_storage, matrix, not_built, one_of, out_tensors, positive_int
from .._build_info import ALIGNMENT, KERNELS
from .._op import Empty, Plan, Result, empty, launch, op, result, size, stride_multiple
from .._op import out as output  # the plans take a parameter named out
from .._runtime import dtype_name, get_kernel
from ..errors import KernelArgumentError
from ._scales import ColumnMajor, check_scales, given_scales, scale_layout, storage_view, stored_codes, word_bytes

__all__ = ["per_token_cast", "per_token_cast_with_precomputed_sf", "per_token_cast_with_sf_only"]

_kernel = get_kernel("per_token_cast")
# The fused re-quantization of (data, sf) pairs; a package built without it re-quantizes in two launches.
_requant = get_kernel("per_token_cast_requant") if "per_token_cast_requant" in KERNELS else None

_FORMATS = ("e4m3", "e2m1", "e5m6")
_KERNEL_FORMATS = _FORMATS[:2]  # what this module's kernel casts; e5m6 has its own op
_GROUPS = (16, 32, 64, 128)  # npc of the grouped casts (TileKernels' domain), besides one scale per row
# The kernel's runtime ``mode`` (kernels/quant/per_token_cast.py.j2).
_MODE_CAST, _MODE_SF_ONLY, _MODE_GIVEN_SF = 0, 1, 2
# Packages built from a spec without the sf_layout grid key hold the row-major layout only.
_HAS_LAYOUTS = "sf_layout" in _kernel.keys
# dtype of a pair's codes -> their format (int8: FP4 two to a byte, element 2i in the low nibble)
_CODE_FORMATS = {torch.float8_e4m3fn: "e4m3", torch.int8: "e2m1"}


def _codes(x: torch.Tensor, fmt: str) -> Empty:
    """q for x: e4m3 codes, or e2m1 ones two to an int8."""
    e4m3 = fmt == "e4m3"
    return empty(torch.float8_e4m3fn if e4m3 else torch.int8, size(x, 0), int(x.shape[1]) // (1 if e4m3 else 2))


def _dequantized(x: object, x_block_size: object) -> object:
    """x, or for a quantized (data, sf) pair with x_block_size its fp32 dequantization.

    KERNELS.md: the input is dequantized (decode(data) * sf, one fp32 multiply) first; here by
    cast_back into an fp32 (T, H) tensor that the fp32 variant then casts, so the result is
    bit-identical to casting that tensor (two launches and an fp32 round trip through memory,
    where TileKernels fuses both). Any scale block cast_back is built for is accepted.
    """
    if not (isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, torch.Tensor) for t in x)):
        if x_block_size is not None:  # a tensor, or anything else, which the tensor check refuses naming x
            raise ValueError("x_block_size: only a quantized (data, sf) pair x has a scale block; pass None")
        return x
    if x_block_size is None:
        raise ValueError("x_block_size: a quantized (data, sf) pair x needs its scale block (num_per_tokens, "
                         "num_per_channels)")
    try:
        from ._per_token_cast_back import cast_back
    except ImportError:
        raise not_built("x_block_size", "re-quantization (it dequantizes with per_token_cast_back)",
                        "per_token_cast") from None
    return cast_back(tuple(x), "fp32", x_block_size)  # type: ignore[arg-type]


def _requant_plan(x: object, fmt: str, num_per_channels: object, x_block_size: object, col_major: bool,
                  round_sf: bool, packed: bool) -> Plan | None:
    """The one launch of the fused kernel for a quantized pair x, or None where the package has no variant for it
    or anything about it is not what that variant reads (the two-launch path then casts it, or names what is
    wrong as it always has).

    The variant is keyed by the pair's code format, scale block (x_block_size) and scale layout, and the call's
    fmt, npc, round_sf and scale layout. The pair's scales are fp32 (ceil(T / bm), ceil(H / bk)), contiguous
    (row_major), or their UE8M0 int32 words (ceil(T / bm), ceil(ceil(H / bk) / 4)) in any layout (ue8m0: the
    kernel reads the bytes of a column-major storage, which per_token_cast and TileKernels return; other layouts
    are copied into one, a small tensor).
    """
    if _requant is None or fmt not in _KERNEL_FORMATS or not isinstance(num_per_channels, int):
        return None
    if not (isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, torch.Tensor) for t in x)):
        return None
    if not (isinstance(x_block_size, (tuple, list)) and len(x_block_size) == 2
            and all(type(b) is int and b > 0 for b in x_block_size)):
        return None
    codes, x_sf = stored_codes(x[0]), x[1]
    x_fmt = _CODE_FORMATS.get(codes.dtype)
    if x_fmt is None or codes.dim() != 2 or not codes.is_contiguous() or x_sf.dim() != 2:
        return None
    block_m, block_k = x_block_size
    shape = (int(codes.shape[0]), int(codes.shape[1]) * (2 if x_fmt == "e2m1" else 1))  # (num_tokens, hidden)
    if shape[1] % 64 != 0:
        return None
    x_sf_layout = "ue8m0" if x_sf.dtype == torch.int32 else "row_major" if x_sf.is_contiguous() else None
    if x_sf_layout is None:
        return None
    try:
        check_scales(x_sf, shape, block_k, x_sf_layout, block_m=block_m, name="x[1] (sf)")
        sf_layout = scale_layout(col_major, round_sf, packed)
    except (KernelArgumentError, ValueError):
        return None  # the two-launch path raises it, naming the argument
    key = (x_fmt, block_m, block_k, x_sf_layout, fmt, num_per_channels, bool(round_sf), sf_layout)
    if not _requant.has(*key):
        return None
    launcher = _requant.variant(*key)
    if x_sf_layout == "ue8m0":
        storage = column_storage(x_sf)
        if storage is None:  # words in another layout (or none to read): a (columns, R) copy, fresh strides
            storage = x_sf.new_empty((x_sf.shape[1], x_sf.shape[0])).copy_(x_sf.t())
        x_sf = word_bytes(storage)
    if sf_layout == "row_major":
        hidden = shape[1]
        outputs = (empty(torch.float8_e4m3fn if fmt == "e4m3" else torch.int8, size(codes, 0),
                         hidden // (1 if fmt == "e4m3" else 2)),
                   empty(torch.float32, size(codes, 0), -(-hidden // num_per_channels)))
        return launch(launcher, codes, x_sf, output(0), output(1), outputs=outputs)
    return launch(launcher, codes, x_sf, output(0), output(1, view=storage_view(sf_layout)),
                  outputs=ColumnMajor(fmt, num_per_channels, sf_layout, fp4_x=x_fmt == "e2m1"))  # type: ignore[arg-type]


def _check_options(x: object, fmt: str, num_per_channels: int, x_block_size: object, col_major: bool,
                   round_sf: bool, packed: bool) -> tuple[torch.Tensor, int, str]:
    """(x, npc, sf_layout: the grid value of the three flags) after the checks the forms share; errors name
    the argument. UE8M0 needs both of the other flags (KERNELS.md)."""
    one_of("fmt", fmt, _KERNEL_FORMATS)
    npc = positive_int("num_per_channels", num_per_channels)
    sf_layout = scale_layout(col_major, round_sf, packed)
    if sf_layout != "row_major" and not _HAS_LAYOUTS:
        if sf_layout == "ue8m0":
            raise not_built("use_packed_ue8m0", "the packed UE8M0 scale layout", "per_token_cast")
        raise not_built("use_tma_aligned_col_major_sf", "the column-major TMA-aligned scale layout",
                        "per_token_cast")
    x = matrix("x", _dequantized(x, x_block_size))  # the options are checked before any launch
    if npc not in _GROUPS and npc != x.shape[1]:
        raise ValueError(f"num_per_channels: groups of {', '.join(map(str, _GROUPS))} channels, or one scale per "
                         f"row (num_per_channels = hidden = {x.shape[1]}); got {npc}")
    # The row stride keeps every row on a vector boundary (the launcher cannot see rows; a rule re-checks it).
    row_stride, column_stride = x.stride()
    if (row_stride * x.element_size()) % ALIGNMENT != 0 and column_stride == 1 and x.shape[0] > 1:
        raise KernelArgumentError(
            f"x: the row stride ({row_stride} elements) must be a multiple of {ALIGNMENT} bytes "
            f"({ALIGNMENT // x.element_size()} elements) for the kernel's vector loads; pass x.contiguous()")
    return x, npc, sf_layout


def _select(x: torch.Tensor, fmt: str, npc: int, round_sf: bool, sf_layout: str) -> Callable[..., None]:
    """The launcher of the variant, by its grid values in grid order (sf_layout last, where the spec has
    the key). npc == hidden is the grid's npc = 0 (one scale per row, built per hidden); groups of npc
    channels take the variant built for this hidden where there is one, else the one for any hidden
    (the grid's hidden = 0, which the launcher requires to be a multiple of 64)."""
    hidden = int(x.shape[1])
    dtype = dtype_name(x.dtype)
    layout = (sf_layout,) if _HAS_LAYOUTS else ()
    # npc == hidden of a group size (hidden 64 or 128) is one group per row either way.
    launcher = (_kernel.find(dtype, hidden, fmt, 0 if npc == hidden else npc, round_sf, *layout)
                or _kernel.find(dtype, 0, fmt, npc, round_sf, *layout))
    # Neither: the error names the hidden asked for and lists what the build has.
    return launcher or _kernel.variant(dtype, hidden, fmt, 0 if npc == hidden else npc, round_sf, *layout)


def _scales_only(q: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    return sf


def _cast(x: object, fmt: str, num_per_channels: int, x_block_size: object, col_major: bool, round_sf: bool,
          packed: bool, mode: int, out: object = None) -> Plan:
    """The launch of per_token_cast (in mode sf-only: per_token_cast_with_sf_only) into (q, sf).

    Row-major scales are plain outputs; the column-major layouts are views of a padded storage,
    which the kernel takes as that storage (or its bytes). x's row stride is a rule.
    """
    x, npc, sf_layout = _check_options(x, fmt, num_per_channels, x_block_size, col_major, round_sf, packed)
    launcher = _select(x, fmt, npc, bool(round_sf), sf_layout)
    rules = (stride_multiple("x", x, 0, ALIGNMENT),)
    then = _scales_only if mode == _MODE_SF_ONLY else None
    if sf_layout == "row_major":
        outputs = (_codes(x, fmt), empty(torch.float32, size(x, 0), -(-int(x.shape[1]) // npc)))
        return launch(launcher, x, output(0), output(1), mode, outputs=outputs, rules=rules, then=then)
    if out is not None:  # the kernel's view of out's sf (the launcher checks that view) assumes its shape
        check_scales(out_tensors(out, ("q", "sf"))[1], x.shape, npc, sf_layout)
    return launch(launcher, x, output(0), output(1, view=storage_view(sf_layout)), mode,
                  outputs=ColumnMajor(fmt, npc, sf_layout),  # type: ignore[arg-type]  # a callable value
                  rules=rules, then=then)


def _e5m6(x: object, num_per_channels: int, **flags: Any) -> Result:
    """Route fmt 'e5m6' to the E5M6 op module, when this package was built with it."""
    try:
        from ._e5m6 import per_token_cast_e5m6  # type: ignore[import-not-found]
    except ImportError:
        raise not_built("fmt", "the E5M6 format ('e5m6')", "per_token_cast") from None
    return result(per_token_cast_e5m6(x, num_per_channels, **flags))


@op(outputs=("q", "sf"), inputs={"x": (1,)})
def per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    x_block_size: tuple[int, int] | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Plan | Result:
    """Cast x (num_tokens, hidden) to FP8/FP4 with one scale per token and npc channels.

    Args:
        x: bf16 or fp32 CUDA tensor of shape (num_tokens, hidden), unit column stride; rows may
            be strided (a row stride that is a multiple of 16 bytes, 32 on sm100); or a
            quantized (data, sf) pair with x_block_size.
        fmt: ``'e4m3'`` (FP8), ``'e2m1'`` (FP4, two codes per int8), or ``'e5m6'`` (routed to
            ``per_token_cast_e5m6`` when the package holds it).
        num_per_channels: channels sharing one scale factor (npc): 16, 32, 64, 128 (any hidden that is a
            multiple of 64; the last group is partial where npc does not divide hidden) or hidden.
        x_block_size: for a quantized input x = (data, sf) (fp8 e4m3 or packed e2m1 codes with
            scales as per_token_cast returns them, or per-block ones as per_block_cast and TileKernels'
            torch.cast make them), its scale block (1, npc_in) or (bm, bk); the pair is dequantized to
            fp32 first (KERNELS.md), then cast, in one launch where the package has the fused variant
            for the combination. None for a plain tensor.
        use_tma_aligned_col_major_sf: return sf column-major with the token dimension padded to
            a multiple of 4 (TMA-aligned), strides (1, align(num_tokens, 4)).
        round_sf: round each scale up to a power of two.
        use_packed_ue8m0: return the scales' UE8M0 exponents, four per int32 word; needs
            use_tma_aligned_col_major_sf and round_sf (ValueError otherwise).
        out: ``(q, sf)`` to write into instead of allocating, each exactly as this call would
            return it (dtype, shape, and layout: contiguous q; sf row-major, or for the
            column-major flags the (T, G) view with strides (1, P), P >= T, over its storage);
            they must not overlap x. Returned as given. Not for a quantized pair x; for e5m6 as
            ``per_token_cast_e5m6`` takes it.

    Returns:
        ``(q, sf)``: q is float8_e4m3fn (num_tokens, hidden) for e4m3, or int8
        (num_tokens, hidden / 2) for e2m1 (element 2i in the low nibble, 2i + 1 in the high
        one). With G = ceil(hidden / num_per_channels), sf is float32 (num_tokens, G), row-major by
        default, so that ``decode(q) * sf`` (per group) approximates x; with
        use_tma_aligned_col_major_sf the same values column-major; with use_packed_ue8m0 int32
        (num_tokens, ceil(G / 4)), column-major, byte g % 4 of word g / 4 holding the biased exponent
        of group g's scale (scale = float with bits byte << 23). The padding behind the
        column-major views (tokens num_tokens .. align(num_tokens, 4) - 1) is uninitialised.
        A group holding a NaN or an Inf gets the scale NaN (UE8M0 byte 0xFF) and the codes
        0x7F (the e4m3 NaN) or 0 (e2m1), so it dequantizes to NaN.
    """
    if fmt not in _KERNEL_FORMATS:  # e5m6 goes to its own op; anything else is refused naming fmt
        one_of("fmt", fmt, _FORMATS)
        if x_block_size is not None:
            raise ValueError("x_block_size: fmt 'e5m6' casts plain bf16 / fp32 tensors only (must be None)")
        return _e5m6(x, num_per_channels, use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
                     round_sf=round_sf, use_packed_ue8m0=use_packed_ue8m0, out=out)
    if out is not None and x_block_size is not None:
        raise ValueError("out: not for a quantized (data, sf) pair x (which may be cast through an fp32 copy); "
                         "pass None")
    fused = _requant_plan(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                          use_packed_ue8m0)
    if fused is not None:
        return fused
    return _cast(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                 _MODE_CAST, out)


@op(outputs=("q", "sf"), inputs={"x": (1,)}, out=False)
def per_token_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    x_block_size: tuple[int, int] | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> Plan:
    """The scale factors ``per_token_cast`` returns, without writing the codes (same arguments)."""
    return _cast(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                 _MODE_SF_ONLY)


@op(outputs=("q",), inputs={"x": (1,), "sf": ()})
def per_token_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    sf: torch.Tensor,
    x_block_size: tuple[int, int] | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> Plan:
    """The codes of x cast with the given scales: q = cast(x_f32 * (1 / sf)), 1 / sf an IEEE division.

    sf is laid out as the flags say (as ``per_token_cast`` returns it with the same flags);
    round_sf only matters for use_packed_ue8m0 (which needs it), the scales being given. out: a
    q to write into (as this call would return it; not overlapping x or sf), returned as given.
    """
    x, npc, sf_layout = _check_options(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                                       round_sf, use_packed_ue8m0)
    sf_arg = given_scales(sf, x.shape, npc, sf_layout)
    # round_sf only names the UE8M0 layout here (the scales are given): fp32 scales take the round_sf=False variant.
    launcher = _select(x, fmt, npc, sf_layout == "ue8m0", sf_layout)
    return launch(launcher, x, output(0), sf_arg, _MODE_GIVEN_SF, outputs=(_codes(x, fmt),),
                  rules=(stride_multiple("x", x, 0, ALIGNMENT),))
