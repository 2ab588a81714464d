"""Per-token (row-wise) casts to FP8 e4m3 or packed FP4 e2m1 with fp32 or UE8M0 scale factors.

The public API follows TileKernels' ``tile_kernels.quant.per_token_cast``; this build covers
the plain-tensor input and the three scale layouts of KERNELS.md: (a) row-major fp32,
(b) ``use_tma_aligned_col_major_sf`` (fp32, column-major, token dimension padded to a multiple
of 4) and (c) ``use_packed_ue8m0`` (int32 words of four UE8M0 exponents, laid out as (b)). The
launcher validates the tensors (dtype, device, shape, strides, alignment) and names the argument
in its errors; this module checks the non-tensor arguments and the options the build does not
cover.
"""

from __future__ import annotations

import torch

from .._args import matrix, not_built, one_of, positive_int
from .._runtime import custom_op, dtype_name, get_kernel

__all__ = ["per_token_cast"]

_kernel = get_kernel("per_token_cast")

_FORMATS = ("e4m3", "e2m1")
# Packages built from a spec without the sf_layout grid key hold the row-major layout only.
_HAS_LAYOUTS = "sf_layout" in _kernel.keys


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
    num_tokens, hidden = x.shape
    if fmt == "e4m3":
        q = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    else:
        q = x.new_empty((num_tokens, hidden // 2), dtype=torch.int8)
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


def _outputs(
    x: torch.Tensor, fmt: str, npc: int, round_sf: bool = False, sf_layout: str = "row_major"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf) for x; also the fake (meta) kernel that torch.compile traces with."""
    q, sf, _ = _allocate(x, fmt, npc, sf_layout)
    return q, sf


def _cast(
    x: torch.Tensor, fmt: str, npc: int, round_sf: bool, sf_layout: str = "row_major"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the variant and launch it; the launcher checks every tensor and names it in errors."""
    launch = _kernel.select(in_dtype=dtype_name(x.dtype), hidden=int(x.shape[1]), fmt=fmt, npc=npc,
                            round_sf=round_sf, sf_layout=sf_layout)
    q, sf, sf_arg = _allocate(x, fmt, npc, sf_layout)
    launch(x, q, sf_arg)
    return q, sf


# What torch.compile sees: one opaque op, torch.ops.<package>.per_token_cast, with a fixed schema.
_per_token_cast_op = custom_op("per_token_cast", fake=_outputs)(_cast)


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
        use_tma_aligned_col_major_sf: return sf column-major with the token dimension padded to
            a multiple of 4 (TMA-aligned), strides (1, align(num_tokens, 4)).
        round_sf: round each scale up to a power of two.
        use_packed_ue8m0: return the scales' UE8M0 exponents, four per int32 word; needs
            use_tma_aligned_col_major_sf and round_sf (ValueError otherwise).

    Returns:
        ``(q, sf)``: q is float8_e4m3fn (num_tokens, hidden) for e4m3, or int8
        (num_tokens, hidden / 2) for e2m1 (element 2i in the low nibble, 2i + 1 in the high
        one). With G = hidden / num_per_channels, sf is float32 (num_tokens, G), row-major by
        default, so that ``decode(q) * sf`` (per group) approximates x; with
        use_tma_aligned_col_major_sf the same values column-major; with use_packed_ue8m0 int32
        (num_tokens, G / 4), column-major, byte g % 4 of word g / 4 holding the biased exponent
        of group g's scale (scale = float with bits byte << 23). The padding behind the
        column-major views (tokens num_tokens .. align(num_tokens, 4) - 1) is uninitialised.
    """
    if isinstance(x, tuple):
        raise _not_built("x", "re-quantization of a (data, sf) pair (x_block_size)")
    x = matrix("x", x)
    one_of("fmt", fmt, _FORMATS)
    npc = positive_int("num_per_channels", num_per_channels)
    if x_block_size is not None:
        raise _not_built("x_block_size", "re-quantization of a (data, sf) pair")
    sf_layout = _sf_layout(bool(use_tma_aligned_col_major_sf), bool(round_sf), bool(use_packed_ue8m0))
    if sf_layout != "row_major" and not _HAS_LAYOUTS:
        if sf_layout == "ue8m0":
            raise _not_built("use_packed_ue8m0", "the packed UE8M0 scale layout")
        raise _not_built("use_tma_aligned_col_major_sf", "the column-major TMA-aligned scale layout")

    hidden = int(x.shape[1])
    if hidden % npc != 0:
        raise ValueError(f"num_per_channels: hidden ({hidden}) must be a multiple of num_per_channels ({npc})")

    if torch.compiler.is_compiling():
        return _per_token_cast_op(x, fmt, npc, bool(round_sf), sf_layout)
    return _cast(x, fmt, npc, bool(round_sf), sf_layout)
