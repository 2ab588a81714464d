"""Per-token (row-wise) casts to FP8 e4m3 or packed FP4 e2m1 with fp32 or UE8M0 scale factors.

The public API follows TileKernels' ``tile_kernels.quant.per_token_cast``,
``per_token_cast_with_sf_only`` and ``per_token_cast_with_precomputed_sf``; this build covers
plain-tensor inputs whose rows may be strided (x[:, :hidden] of a wider tensor, row stride a
multiple of the arch's vector width), npc in {16, 32, 64, 128} or npc = hidden (one scale per
row, grid value npc = 0), and the three scale layouts of KERNELS.md: (a) row-major fp32,
(b) ``use_tma_aligned_col_major_sf`` (fp32, column-major, token dimension padded to a multiple
of 4) and (c) ``use_packed_ue8m0`` (int32 words of four UE8M0 exponents, laid out as (b)). The
launcher validates the tensors (dtype, device, shape, strides, alignment) and names the argument
in its errors; this module checks the non-tensor arguments and the options the build does not
cover.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .._args import column_storage, copied_into, matrix, not_built, one_of, out_tensors, positive_int
from .._build_info import ALIGNMENT
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
    size_of,
    stride_bytes_multiple,
)
from ..errors import KernelArgumentError

__all__ = ["per_token_cast", "per_token_cast_with_precomputed_sf", "per_token_cast_with_sf_only"]

_kernel = get_kernel("per_token_cast")

_FORMATS = ("e4m3", "e2m1", "e5m6")
_KERNEL_FORMATS = _FORMATS[:2]  # what this module's kernel casts; e5m6 has its own op
# The kernel's runtime ``mode`` (templates/quant/per_token_cast.py.j2).
_MODE_CAST, _MODE_SF_ONLY, _MODE_GIVEN_SF = 0, 1, 2
# Packages built from a spec without the sf_layout grid key hold the row-major layout only.
_HAS_LAYOUTS = "sf_layout" in _kernel.keys


class _Variant(NamedTuple):
    """What a call signature resolved to: the launcher and the checked options it launches with."""

    launch: Callable[..., None]
    fmt: str
    npc: int
    sf_layout: str


# Eager calls on a 2-D tensor, keyed by everything the option checks and the variant choice
# read: (x.dtype, hidden, fmt, num_per_channels, the three flags). A key is stored only after
# the full checks passed and select found the variant, so a hit may skip them; what depends on
# x beyond its dtype and width (its row stride) is checked on every call. Only arguments of
# exactly the types str, int and bool are keyed: 128.0 == 128 and 1 == True hash alike, but
# positive_int refuses the float and the bool. Bounded by the distinct signatures a program uses.
_VARIANTS: dict[tuple[object, ...], _Variant] = {}
# The same for per_token_cast_with_precomputed_sf, whose variant ignores round_sf unless UE8M0.
_GIVEN_VARIANTS: dict[tuple[object, ...], _Variant] = {}
# per_token_cast(x, ..., out=(q, sf)) with row-major scales, in one C call (_runtime.dispatch): keyed
# by x's dtype and width and the options as given, checked by the launcher's contract and x's row
# stride rule (what _check_row_stride tests).
_FAST = fast_path(inputs=((1,),), outputs=2)


def _key(x: object, fmt: object, num_per_channels: object, x_block_size: object,
         use_tma_aligned_col_major_sf: object, round_sf: object, use_packed_ue8m0: object) -> tuple[object, ...] | None:
    """The cache key of an eager call on a 2-D tensor x with plainly typed options; None for anything else
    (a quantized pair, a call while compiling, options of other types)."""
    if not (x_block_size is None and isinstance(x, torch.Tensor) and type(fmt) is str
            and type(num_per_channels) is int and type(use_tma_aligned_col_major_sf) is bool
            and type(round_sf) is bool and type(use_packed_ue8m0) is bool) or torch.compiler.is_compiling():
        return None
    shape = x.shape  # once: each read builds a torch.Size
    if len(shape) != 2:
        return None
    return (x.dtype, shape[1], fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


def _remember(key: tuple[object, ...] | None, variant: _Variant,
              cache: dict[tuple[object, ...], _Variant] = _VARIANTS) -> _Variant:
    """variant, stored under key (None: a call that is not cached) once its checks have passed."""
    if key is not None:
        cache[key] = variant
    return variant


def _not_built(argument: str, what: str) -> NotImplementedError:
    return not_built(argument, what, "per_token_cast")


def _align4(n: int) -> int:
    return (n + 3) // 4 * 4


def _allocate(x: torch.Tensor, fmt: str, npc: int, sf_layout: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf, sf_arg): sf is what the op returns, sf_arg what the kernel writes.

    col_major: storage float32 (G, align(T, 4)); sf = storage.T[:T], (T, G) with strides
    (1, align(T, 4)), as TileKernels allocates it. ue8m0: storage int32 (ceil(G/4), align(T, 4)),
    sf = storage.T[:T]; the kernel writes its bytes, uint8 (ceil(G/4), align(T, 4), 4). The
    padding columns (tokens T .. align(T, 4) - 1) are never written.
    """
    q = _codes(x, fmt)
    num_tokens, hidden = x.shape
    groups = hidden // npc
    if sf_layout == "row_major":
        sf = x.new_empty((num_tokens, groups), dtype=torch.float32)
        return q, sf, sf
    padded = _align4(num_tokens)
    # as_strided spells out the strides the launcher checks; they are the contiguous ones, which
    # torch reports differently for an empty storage (num_tokens == 0).
    if sf_layout == "col_major":
        storage = x.new_empty((groups, padded), dtype=torch.float32)
        return q, storage.T[:num_tokens], storage.as_strided((groups, padded), (padded, 1))
    words = (groups + 3) // 4
    storage = x.new_empty((words, padded), dtype=torch.int32)
    sf_bytes = storage.view(torch.uint8).as_strided((words, padded, 4), (4 * padded, 4, 1))
    return q, storage.T[:num_tokens], sf_bytes


def _codes(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Uninitialised q for x: e4m3 codes, or e2m1 ones two to an int8."""
    num_tokens, hidden = x.shape
    if fmt == "e4m3":
        return x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    return x.new_empty((num_tokens, hidden // 2), dtype=torch.int8)


def _outputs(
    x: torch.Tensor, fmt: str, npc: int, round_sf: bool = False, sf_layout: str = "row_major"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf) for x; also the fake (meta) kernel that torch.compile traces with."""
    q, sf, _ = _allocate(x, fmt, npc, sf_layout)
    return q, sf


def _select(x: torch.Tensor, fmt: str, npc: int, round_sf: bool, sf_layout: str) -> Callable[..., None]:
    """The launcher of the variant; npc == hidden is the grid's npc = 0 (one scale per row)."""
    hidden = int(x.shape[1])
    return _kernel.select(in_dtype=dtype_name(x.dtype), hidden=hidden, fmt=fmt, npc=0 if npc == hidden else npc,
                          round_sf=round_sf, sf_layout=sf_layout)


def _run(launch: Callable[..., None], x: torch.Tensor, fmt: str, npc: int, sf_layout: str,
         mode: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate (q, sf) and launch in ``mode`` (cast or scales only); the launcher checks every tensor."""
    q, sf, sf_arg = _allocate(x, fmt, npc, sf_layout)
    launch(x, q, sf_arg, mode)
    return q, sf


def _run_into(launch: Callable[..., None], x: torch.Tensor, out: object, npc: int,
              sf_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast into the caller's (q, sf), laid out as the op returns them; returns them.

    The launcher checks q and the kernel's view of sf against the contract under those names,
    and that neither overlaps x or the other.
    """
    q, sf = out_tensors(out, ("q", "sf"))
    sf_arg = sf if sf_layout == "row_major" else _out_scales(sf, x, npc, sf_layout)
    launch(x, q, sf_arg, _MODE_CAST)
    return q, sf


def _cast(
    x: torch.Tensor, fmt: str, npc: int, round_sf: bool, sf_layout: str = "row_major", sf_only: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the variant and launch it; the launcher checks every tensor and names it in errors.

    With sf_only the kernel writes sf only and q stays uninitialised (it is dropped by the caller).
    """
    launch = _select(x, fmt, npc, round_sf, sf_layout)
    return _run(launch, x, fmt, npc, sf_layout, _MODE_SF_ONLY if sf_only else _MODE_CAST)


def _cast_outputs(
    x: torch.Tensor, fmt: str, npc: int, round_sf: bool, sf_layout: str = "row_major", sf_only: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    return _outputs(x, fmt, npc, round_sf, sf_layout)


# What torch.compile sees: one opaque op, torch.ops.<package>.per_token_cast, with a fixed schema.
_per_token_cast_op = custom_op("per_token_cast", fake=_cast_outputs)(_cast)


def _select_given(x: torch.Tensor, fmt: str, npc: int, sf_layout: str) -> Callable[..., None]:
    """The variant that reads given scales: round_sf only names the UE8M0 layout here (the scales are given)."""
    return _select(x, fmt, npc, sf_layout == "ue8m0", sf_layout)


def _run_given(launch: Callable[..., None], x: torch.Tensor, sf_arg: torch.Tensor, fmt: str, npc: int,
               out: object = None) -> torch.Tensor:
    """Launch with the given scales into a fresh q, or into out (checked by the launcher as q)."""
    q = _codes(x, fmt) if out is None else out_tensors(out, ("q",))[0]
    launch(x, q, sf_arg, _MODE_GIVEN_SF)
    return q


def _cast_given(x: torch.Tensor, sf_arg: torch.Tensor, fmt: str, npc: int, sf_layout: str) -> torch.Tensor:
    """Launch with the given scales (sf_arg: what the kernel reads, see _given_scales); returns q."""
    return _run_given(_select_given(x, fmt, npc, sf_layout), x, sf_arg, fmt, npc)


def _given_outputs(x: torch.Tensor, sf_arg: torch.Tensor, fmt: str, npc: int, sf_layout: str) -> torch.Tensor:
    return _codes(x, fmt)


_per_token_cast_given_op = custom_op("per_token_cast_with_precomputed_sf", fake=_given_outputs)(_cast_given)


def _sf_layout(use_tma_aligned_col_major_sf: bool, round_sf: bool, use_packed_ue8m0: bool) -> str:
    """The sf_layout grid value of the three flags; UE8M0 needs both of the others (KERNELS.md)."""
    if use_packed_ue8m0:
        if not use_tma_aligned_col_major_sf:
            raise ValueError("use_packed_ue8m0: packed UE8M0 scales are stored column-major; pass "
                             "use_tma_aligned_col_major_sf=True with it")
        if not round_sf:
            raise ValueError("use_packed_ue8m0: a UE8M0 byte holds a power-of-two scale; pass round_sf=True with it")
        return "ue8m0"
    return "col_major" if use_tma_aligned_col_major_sf else "row_major"


def _check_x(x: object) -> torch.Tensor:
    """x as a 2-D tensor whose row stride keeps every row on a vector boundary (the kernel's loads)."""
    return _check_row_stride(matrix("x", x))


def _check_row_stride(x: torch.Tensor) -> torch.Tensor:
    """x, unless its row stride leaves rows off a vector boundary (the launcher cannot see rows)."""
    row_stride, column_stride = x.stride()  # one call: stride(i) parses its argument each time
    # The usual aligned stride first: it decides alone, without reading x.shape (a new torch.Size).
    if (row_stride * x.element_size()) % ALIGNMENT != 0 and column_stride == 1 and x.shape[0] > 1:
        raise KernelArgumentError(
            f"x: the row stride ({row_stride} elements) must be a multiple of {ALIGNMENT} bytes "
            f"({ALIGNMENT // x.element_size()} elements) for the kernel's vector loads; pass x.contiguous()"
        )
    return x


def _dequantized(x: object, x_block_size: object) -> object:
    """x, or for a quantized (data, sf) pair with x_block_size its fp32 dequantization.

    KERNELS.md: the input is dequantized (decode(data) * sf, one fp32 multiply) first; here by
    cast_back into an fp32 (T, H) tensor that the fp32 variant then casts, so the result is
    bit-identical to casting that tensor (two launches and an fp32 round trip through memory,
    where TileKernels fuses both). Any scale block cast_back is built for is accepted.
    """
    is_pair = isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, torch.Tensor) for t in x)
    if not is_pair:  # a tensor, or anything else, which the tensor check refuses naming x
        if x_block_size is not None:
            raise ValueError("x_block_size: only a quantized (data, sf) pair x has a scale block; pass None")
        return x
    if x_block_size is None:
        raise ValueError("x_block_size: a quantized (data, sf) pair x needs its scale block (num_per_tokens, "
                         "num_per_channels)")
    try:
        from ._per_token_cast_back import cast_back
    except ImportError:
        raise _not_built("x_block_size", "re-quantization (it dequantizes with per_token_cast_back)") from None
    return cast_back(tuple(x), "fp32", x_block_size)  # type: ignore[arg-type]


def _check_options(
    x: object, fmt: str, num_per_channels: int, x_block_size: object,
    use_tma_aligned_col_major_sf: bool, round_sf: bool, use_packed_ue8m0: bool,
) -> tuple[torch.Tensor, int, str]:
    """(x, npc, sf_layout) after the checks the forms share; errors name the argument."""
    one_of("fmt", fmt, _KERNEL_FORMATS)
    npc = positive_int("num_per_channels", num_per_channels)
    sf_layout = _sf_layout(bool(use_tma_aligned_col_major_sf), bool(round_sf), bool(use_packed_ue8m0))
    if sf_layout != "row_major" and not _HAS_LAYOUTS:
        if sf_layout == "ue8m0":
            raise _not_built("use_packed_ue8m0", "the packed UE8M0 scale layout")
        raise _not_built("use_tma_aligned_col_major_sf", "the column-major TMA-aligned scale layout")
    x = _check_x(_dequantized(x, x_block_size))  # the options are checked before any launch
    hidden = int(x.shape[1])
    if hidden % npc != 0:
        raise ValueError(f"num_per_channels: hidden ({hidden}) must be a multiple of num_per_channels ({npc})")
    return x, npc, sf_layout


def _e5m6(x: torch.Tensor, num_per_channels: int, **flags: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Route fmt 'e5m6' to the E5M6 op module, when this package was built with it."""
    try:
        from ._e5m6 import per_token_cast_e5m6  # type: ignore[import-not-found]
    except ImportError:
        raise _not_built("fmt", "the E5M6 format ('e5m6')") from None
    return per_token_cast_e5m6(x, num_per_channels, **flags)  # type: ignore[no-any-return]


def _cast_form(
    x: object, fmt: str, num_per_channels: int, x_block_size: object, use_tma_aligned_col_major_sf: bool,
    round_sf: bool, use_packed_ue8m0: bool, sf_only: bool, out: object = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_cast and per_token_cast_with_sf_only: one variant (the mode is a runtime argument), one cache.

    A signature seen before (see _VARIANTS) skips the option checks and select; while compiling,
    the custom op (whose result is copied into out, if given: torch.compile sees a pure op).
    """
    mode = _MODE_SF_ONLY if sf_only else _MODE_CAST
    key = _key(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    variant = _VARIANTS.get(key)  # a None key is never stored
    if variant is not None:
        x = _check_row_stride(x)  # type: ignore[arg-type]
        if out is not None:
            result = _run_into(variant.launch, x, out, variant.npc, variant.sf_layout)
        else:
            result = _run(variant.launch, x, variant.fmt, variant.npc, variant.sf_layout, mode)
        if not sf_only and variant.sf_layout == "row_major" and x_block_size is None:  # dispatch() had not seen it
            _remember_fast(variant.launch, result, x, out, fmt, num_per_channels, x_block_size,
                           use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
        return result
    x, npc, sf_layout = _check_options(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                                       round_sf, use_packed_ue8m0)
    if torch.compiler.is_compiling():
        result = _per_token_cast_op(x, fmt, npc, bool(round_sf), sf_layout, sf_only)
        return result if out is None else copied_into(out, ("q", "sf"), result)  # type: ignore[no-any-return]
    variant = _remember(key, _Variant(_select(x, fmt, npc, bool(round_sf), sf_layout), fmt, npc, sf_layout))
    result = _run_into(variant.launch, x, out, npc, sf_layout) if out is not None else \
        _run(variant.launch, x, fmt, npc, sf_layout, mode)
    if not sf_only and sf_layout == "row_major" and x_block_size is None:  # a pair x is dequantized first
        _remember_fast(variant.launch, result, x, out, fmt, num_per_channels, x_block_size,
                       use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    return result


def _remember_fast(launch: Callable[..., None], result: tuple[torch.Tensor, torch.Tensor], *call: object) -> None:
    """Let dispatch() take later per_token_cast calls like ``call`` (x, out, options; row-major sf), which
    returned ``result``; an allocating call (out None) allocates (q, sf) as it did: T rows each."""
    q, sf = result
    remember(_FAST, launch, (from_input(0), from_out(0), from_out(1), _MODE_CAST),
             (stride_bytes_multiple(0, 0, ALIGNMENT),), *call,
             outputs=(output(q.dtype, size_of(0, 0), q.shape[1]), output(sf.dtype, size_of(0, 0), sf.shape[1])))


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast x (num_tokens, hidden) to FP8/FP4 with one scale per token and npc channels.

    Args:
        x: bf16 or fp32 CUDA tensor of shape (num_tokens, hidden), unit column stride; rows may
            be strided (a row stride that is a multiple of 16 bytes, 32 on sm100); or a
            quantized (data, sf) pair with x_block_size.
        fmt: ``'e4m3'`` (FP8), ``'e2m1'`` (FP4, two codes per int8), or ``'e5m6'`` (routed to
            ``per_token_cast_e5m6`` when the package holds it).
        num_per_channels: channels sharing one scale factor (npc): 16..128 or hidden.
        x_block_size: for a quantized input x = (data, sf) (fp8 e4m3 or packed e2m1 codes with
            scales as per_token_cast returns them), its scale block (1, npc_in); the pair is
            dequantized to fp32 first (KERNELS.md), then cast. None for a plain tensor.
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
        one). With G = hidden / num_per_channels, sf is float32 (num_tokens, G), row-major by
        default, so that ``decode(q) * sf`` (per group) approximates x; with
        use_tma_aligned_col_major_sf the same values column-major; with use_packed_ue8m0 int32
        (num_tokens, G / 4), column-major, byte g % 4 of word g / 4 holding the biased exponent
        of group g's scale (scale = float with bits byte << 23). The padding behind the
        column-major views (tokens num_tokens .. align(num_tokens, 4) - 1) is uninitialised.
        A group holding a NaN or an Inf gets the scale NaN (UE8M0 byte 0xFF) and the codes
        0x7F (the e4m3 NaN) or 0 (e2m1), so it dequantizes to NaN.
    """
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        done = dispatch(_FAST, x, out, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                        use_packed_ue8m0)
        if done is not None:
            return done  # type: ignore[no-any-return]
    if fmt not in _KERNEL_FORMATS:  # e5m6 goes to its own op; anything else is refused naming fmt
        one_of("fmt", fmt, _FORMATS)
        if x_block_size is not None:
            raise ValueError("x_block_size: fmt 'e5m6' casts plain bf16 / fp32 tensors only (must be None)")
        return _e5m6(x, num_per_channels, use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
                     round_sf=round_sf, use_packed_ue8m0=use_packed_ue8m0, out=out)
    if out is not None and x_block_size is not None:
        raise ValueError("out: a quantized (data, sf) pair x is cast through an fp32 copy; pass None")
    return _cast_form(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                      use_packed_ue8m0, sf_only=False, out=out)


def per_token_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    x_block_size: tuple[int, int] | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> torch.Tensor:
    """The scale factors ``per_token_cast`` returns, without writing the codes (same arguments)."""
    return _cast_form(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                      use_packed_ue8m0, sf_only=True)[1]


def _given_scales(sf: object, x: torch.Tensor, npc: int, sf_layout: str) -> torch.Tensor:
    """The tensor the kernel reads for user scales in ``sf_layout``; errors name sf.

    row_major: float32 (T, G) as given (the launcher checks it is contiguous). col_major: the
    float32 (T, G) values as the (G, P) storage, read in place when sf is a view with strides
    (1, P) over whole storage (what per_token_cast returns), else copied. ue8m0: int32 (T, G / 4)
    words, the same way, seen as bytes (G / 4, P, 4).
    """
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"sf: expected a torch.Tensor of scale factors, got {type(sf).__name__}")
    num_tokens, hidden = x.shape
    width, dtype = _scale_width(hidden, npc, sf_layout)
    if sf.dtype != dtype or tuple(sf.shape) != (num_tokens, width):
        raise KernelArgumentError(f"sf: expected {dtype} of shape {(num_tokens, width)} for this layout, "
                                  f"got {sf.dtype} of shape {tuple(sf.shape)}")
    if sf_layout == "row_major":
        return sf
    storage = column_storage(sf)
    if storage is None:
        storage = sf.new_empty((width, num_tokens)).copy_(sf.t())  # fresh: standard strides
    return _kernel_view(storage, sf_layout)


def _scale_width(hidden: int, npc: int, sf_layout: str) -> tuple[int, torch.dtype]:
    """(columns, dtype) of the (T, columns) scale tensor the op returns in sf_layout."""
    groups = hidden // npc
    return ((groups + 3) // 4, torch.int32) if sf_layout == "ue8m0" else (groups, torch.float32)


def _kernel_view(storage: torch.Tensor, sf_layout: str) -> torch.Tensor:
    """What the kernel takes for a (width, P) scale storage: itself, or for UE8M0 its bytes (width, P, 4)."""
    if sf_layout == "col_major":
        return storage
    return storage.view(torch.uint8).view(storage.shape[0], storage.shape[1], 4)


def _out_scales(sf: torch.Tensor, x: torch.Tensor, npc: int, sf_layout: str) -> torch.Tensor:
    """The kernel's view of a column-major out sf (the layout per_token_cast returns), or an error naming sf."""
    num_tokens, hidden = x.shape
    width, dtype = _scale_width(hidden, npc, sf_layout)
    if sf.dtype != dtype or tuple(sf.shape) != (num_tokens, width):
        raise KernelArgumentError(f"sf: expected {dtype} of shape {(num_tokens, width)} for this layout, "
                                  f"got {sf.dtype} of shape {tuple(sf.shape)}")
    if num_tokens == 0:  # nothing is written: any storage of the right rank will do
        return _kernel_view(sf.new_empty((width, 0)), sf_layout)
    storage = column_storage(sf)
    if storage is None:
        raise KernelArgumentError(
            f"sf: expected the column-major layout per_token_cast returns with these flags, strides (1, P) "
            f"with P >= {num_tokens} over whole storage, got strides {tuple(sf.stride())}; pass the sf of an "
            "earlier call with the same flags, or torch.empty((G, align(T, 4)), ...).T[:T]")
    return _kernel_view(storage, sf_layout)


def per_token_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    sf: torch.Tensor,
    x_block_size: tuple[int, int] | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The codes of x cast with the given scales: q = cast(x_f32 * (1 / sf)), 1 / sf an IEEE division.

    sf is laid out as the flags say (as ``per_token_cast`` returns it with the same flags);
    round_sf only matters for use_packed_ue8m0 (which needs it), the scales being given. out: a
    q to write into (as this call would return it; not overlapping x or sf), returned as given.
    """
    # Its own cache: the variant differs from per_token_cast's for round_sf with fp32 scales.
    key = _key(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    variant = _GIVEN_VARIANTS.get(key)  # a None key is never stored
    if variant is not None:
        x = _check_row_stride(x)  # type: ignore[arg-type]
        sf_arg = _given_scales(sf, x, variant.npc, variant.sf_layout)
        return _run_given(variant.launch, x, sf_arg, variant.fmt, variant.npc, out)
    x, npc, sf_layout = _check_options(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                                       round_sf, use_packed_ue8m0)
    sf_arg = _given_scales(sf, x, npc, sf_layout)
    if torch.compiler.is_compiling():
        q = _per_token_cast_given_op(x, sf_arg, fmt, npc, sf_layout)
        return q if out is None else out_tensors(out, ("q",))[0].copy_(q)
    variant = _remember(key, _Variant(_select_given(x, fmt, npc, sf_layout), fmt, npc, sf_layout), _GIVEN_VARIANTS)
    return _run_given(variant.launch, x, sf_arg, fmt, npc, out)
