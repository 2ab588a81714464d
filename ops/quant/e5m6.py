"""E5M6 per-token cast and cast back: 12-bit codes (the top 12 bits of an fp16), one scale per token.

The public API follows TileKernels' ``per_token_cast_to_e5m6`` and ``cast_back_e5m6``; the
generic ``per_token_cast(x, 'e5m6', ...)`` and ``cast_back(..., x_special_fmt='e5m6')`` forward
here. Codes are uint8 (num_tokens, 1.5 hidden): eight 12-bit codes per three little-endian
uint32 words (KERNELS.md, "Quantization": E5M6). Scales are float32 (num_tokens, 1), row-major or,
with ``use_tma_aligned_col_major_sf``, column-major with the token dimension padded to a multiple
of 4; with one scale per token both put token t at element t, so one kernel serves both and
reads or writes the (num_tokens,) view; ``use_packed_ue8m0`` makes them int32 UE8M0 words (T, 1), column-major
likewise, the power-of-two scale's biased exponent in byte 0 of each word. The
launchers validate the tensors (dtype, device, shape, strides, alignment) and name the
argument in their errors; this module checks the rest.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch

from .._args import matrix, not_built, out_tensors, output_dtype, positive_int
from .._op import Plan, empty, launch, op, size
from .._op import out as output  # the cast's plan takes a parameter named out
from .._runtime import dtype_name, get_kernel
from ..errors import KernelArgumentError
from ._scales import scale_layout

__all__ = ["cast_back_e5m6", "per_token_cast_e5m6", "per_token_cast_to_e5m6"]

_cast_kernel = get_kernel("per_token_cast_e5m6")
_cast_back_kernel = get_kernel("cast_back_e5m6")

_GROUP_BYTES = 12  # eight 12-bit codes in three 4-byte words


def _column_major(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf) with sf column-major: storage (1, align(T, 4)) of fp32 scales (or int32 UE8M0 words),
    sf strides (1, align(T, 4)), as TileKernels allocates it. The padding tokens T .. align(T, 4) - 1 are never
    written."""
    num_tokens, hidden = x.shape
    padded = (num_tokens + 3) // 4 * 4
    q = x.new_empty((num_tokens, hidden // 8 * _GROUP_BYTES), dtype=torch.uint8)
    # as_strided spells out the strides; torch reports other ones for size-1 and empty dims.
    return q, x.new_empty((1, padded), dtype=dtype).as_strided((num_tokens, 1), (1, padded))


def _column_major_words(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _column_major(x, torch.int32)


def _words(q: torch.Tensor) -> torch.Tensor:
    """The kernel's view of q: its int32 words (the kernel stores whole words)."""
    return q.view(torch.int32)


def _tokens(sf: torch.Tensor) -> torch.Tensor:
    """The kernel's view of sf (T, 1), row- or column-major: token t is element t in both, so (T,) with stride 1."""
    return sf.as_strided((sf.shape[0],), (1,))


def _check_out(out: object, num_tokens: int, sf_dtype: torch.dtype) -> None:
    """The caller's (q, sf), where the kernel's views of them hide what the launcher would check; errors name them.

    The launcher sees q's int32 words and sf's (T,) view: q's dtype and rows of whole words, sf's
    (T, 1) shape and unit token stride are checked here.
    """
    q, sf = out_tensors(out, ("q", "sf"))
    if q.dtype != torch.uint8:
        raise KernelArgumentError(f"q: expected uint8 packed E5M6 codes, got {q.dtype}")
    try:
        q.view(torch.int32)
    except RuntimeError:
        raise KernelArgumentError(f"q: expected rows of whole 4-byte words (unit column stride, a width that is a "
                                  f"multiple of 4), got shape {tuple(q.shape)} and strides {tuple(q.stride())}; "
                                  "pass the q of an earlier call") from None
    if sf.dtype != sf_dtype:
        raise KernelArgumentError(f"sf: expected {sf_dtype} scales for these flags, got {sf.dtype}")
    if tuple(sf.shape) != (num_tokens, 1) or (num_tokens > 1 and sf.stride(0) != 1):
        raise KernelArgumentError(f"sf: expected shape ({num_tokens}, 1) with token stride 1 (row- or column-major), "
                                  f"got shape {tuple(sf.shape)} and strides {tuple(sf.stride())}")


def _cast(x: object, num_per_channels: int | None, round_sf: bool, use_tma_aligned_col_major_sf: bool,
          use_packed_ue8m0: bool, out: tuple[torch.Tensor, torch.Tensor] | None) -> Plan:
    """The launch of the E5M6 cast, shared by both spellings of the op."""
    x = matrix("x", x)
    hidden = int(x.shape[1])
    if num_per_channels is not None:
        npc = positive_int("num_per_channels", num_per_channels)
        if npc != hidden:
            raise ValueError(
                f"num_per_channels: E5M6 has one scale per token, so it must be hidden ({hidden}) or None, got {npc}"
            )
    layout = scale_layout(bool(use_tma_aligned_col_major_sf), bool(round_sf), bool(use_packed_ue8m0))
    if hidden % 8 != 0:
        raise ValueError(f"x: hidden ({hidden}) must be a multiple of 8 (eight codes per three words)")
    sf_layout = "ue8m0" if layout == "ue8m0" else "float"
    if out is not None:
        _check_out(out, x.shape[0], torch.int32 if sf_layout == "ue8m0" else torch.float32)
    # Grid order: in_dtype, hidden, round_sf, sf_layout.
    launcher = _cast_kernel.variant(dtype_name(x.dtype), hidden, bool(round_sf), sf_layout)
    outputs = _column_major_words if layout == "ue8m0" else _column_major if layout == "col_major" else \
        (empty(torch.uint8, size(x, 0), hidden // 8 * _GROUP_BYTES), empty(torch.float32, size(x, 0), 1))
    return launch(launcher, x, output(0, view=_words), output(1, view=_tokens), outputs=outputs)


@op(outputs=("q", "sf"))
def per_token_cast_e5m6(
    x: torch.Tensor,
    num_per_channels: int | None = None,
    *,
    round_sf: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    use_packed_ue8m0: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Plan:
    """Cast x (num_tokens, hidden) to packed E5M6 with one scale per token.

    Args:
        x: bf16 or fp32 CUDA tensor of shape (num_tokens, hidden), contiguous.
        num_per_channels: channels per scale; must be hidden (None means hidden).
        round_sf: round each scale up to a power of two.
        use_tma_aligned_col_major_sf: return sf column-major with the token dimension padded to
            a multiple of 4, strides (1, align(num_tokens, 4)) (same values).
        use_packed_ue8m0: sf as int32 UE8M0 words (num_tokens, 1), column-major as above: byte 0 of
            a token's word is its power-of-two scale's biased exponent, the rest 0 (needs
            use_tma_aligned_col_major_sf and round_sf).
        out: ``(q, sf)`` to write into instead of allocating, as this call would return them
            (e.g. the pair of an earlier call): q uint8 (num_tokens, hidden * 3 / 2), contiguous;
            sf float32 (num_tokens, 1) with token stride 1, row- or column-major (token t is
            element t in both); not overlapping x. Every code and scale is written (not the
            padding of a column-major sf). Returned as given.

    Returns:
        ``(q, sf)``: q uint8 (num_tokens, hidden * 3 / 2), per 8 channels three little-endian
        uint32 words w0 = h0 << 20 | h1 << 8 | h2 >> 4, w1 = h2 << 28 | h3 << 16 | h4 << 4 |
        h5 >> 8, w2 = h5 << 24 | h6 << 12 | h7 of the 12-bit codes h (the top 12 bits of the fp16
        of x * 65024 / amax, rounded to nearest even); sf float32 (num_tokens, 1) =
        max(amax, 1e-4) / 65024, so that decode(q) * sf approximates x. NaN inputs give NaN codes.
    """
    return _cast(x, num_per_channels, round_sf, use_tma_aligned_col_major_sf, use_packed_ue8m0, out)


@op(outputs=("q", "sf"))
def per_token_cast_to_e5m6(
    x: torch.Tensor,
    num_per_channels: int | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Plan:
    """``per_token_cast_e5m6`` under TileKernels' name, with its positional order of the flags."""
    return _cast(x, num_per_channels, round_sf, use_tma_aligned_col_major_sf, use_packed_ue8m0, out)


def _launch_back(launcher: Callable[..., None], q: torch.Tensor, sf: torch.Tensor, out: torch.Tensor) -> None:
    """launcher on q's int32 words and sf's (T,) view, on real tensors (torch.compile reads no offsets)."""
    if q.storage_offset() % 4 != 0:
        raise KernelArgumentError(f"x[0] (q): expected to start on a 4-byte word, got storage offset "
                                  f"{q.storage_offset()}")
    sf = _tokens(sf)  # one scale per token: element t of sf (strides (1, any)) is token t's in either layout
    if sf.data_ptr() % 32 != 0:  # a token slice of a pair: copy the scales to an aligned start
        sf = sf.clone()
    launcher(q.view(torch.int32), sf, out)


def _pair(x: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The (codes, scales) pair, checked where the kernel's view of it needs more than the launcher checks."""
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise TypeError(f"x: expected a (q, sf) pair of tensors, got {type(x).__name__}")
    q = matrix("x[0] (q)", x[0], "(num_tokens, hidden * 3 / 2)")
    sf = matrix("x[1] (sf)", x[1], "(num_tokens, 1)")
    if q.dtype != torch.uint8:
        raise KernelArgumentError(f"x[0] (q): expected uint8 packed E5M6 codes, got {q.dtype}")
    width = int(q.shape[1])
    if width % _GROUP_BYTES != 0:
        raise KernelArgumentError(
            f"x[0] (q): expected a width of hidden * 3 / 2 bytes, a multiple of 12 (8 codes per 3 words), got {width}"
        )
    # The kernel reads q as int32 words: contiguous rows (the launcher checks the alignment).
    if not q.is_contiguous():
        raise KernelArgumentError(f"x[0] (q): expected a contiguous tensor, got strides {tuple(q.stride())}")
    if tuple(sf.shape) != (q.shape[0], 1):
        raise KernelArgumentError(
            f"x[1] (sf): expected shape ({q.shape[0]}, 1), one scale per token of q {tuple(q.shape)}, "
            f"got {tuple(sf.shape)}"
        )
    if sf.shape[0] > 1 and sf.stride(0) != 1:
        sf = sf.contiguous()  # tokens apart in memory (a strided slice): gather them once
    return q, sf


@op(outputs=("out",))
def cast_back_e5m6(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str | torch.dtype,
    x_block_size: tuple[int, int] | None = None,
) -> Plan:
    """Dequantize packed E5M6 codes with one scale per token: out = decode(q) * sf.

    Args:
        x: ``(q, sf)`` as ``per_token_cast_e5m6`` returns it: q uint8 (num_tokens, hidden * 3 / 2),
            contiguous; sf float32 (num_tokens, 1), row-major or column-major, or int32 UE8M0 words
            (num_tokens, 1) (the exponent in byte 0 of each).
        fmt: output format, ``'bf16'`` or ``'fp32'`` (or the torch dtype).
        x_block_size: TileKernels' (num_per_tokens, num_per_channels); only (1, hidden), one
            scale per token, is built (None means that).
        out: a contiguous (num_tokens, hidden) tensor of the output dtype to write into instead
            of allocating (not overlapping q or sf), returned as given.

    Returns:
        out (num_tokens, hidden) in bf16 or fp32: the fp32 product of the code's fp16 value and
        sf, rounded to nearest even when the output is bf16.
    """
    out_dtype = output_dtype(fmt)
    q, sf = _pair(x)
    hidden = int(q.shape[1]) // _GROUP_BYTES * 8
    if x_block_size is not None:
        try:
            block = (operator.index(x_block_size[0]), operator.index(x_block_size[1]))
        except (TypeError, IndexError):
            raise TypeError(f"x_block_size: expected a (num_per_tokens, num_per_channels) pair, "
                            f"got {x_block_size!r}") from None
        if len(x_block_size) != 2 or block != (1, hidden):
            raise not_built("x_block_size", f"the block size {x_block_size!r} (only (1, {hidden}): one scale per "
                            "token)", "cast_back_e5m6")
    # The variant of fmt, whatever out's dtype: the launcher then refuses an out of another.
    if sf.dtype not in (torch.float32, torch.int32):
        raise KernelArgumentError(f"x[1] (sf): expected float32 scales or int32 UE8M0 words, got {sf.dtype}")
    # Grid order: out_dtype, hidden, sf_layout.
    launcher = _cast_back_kernel.variant(dtype_name(out_dtype), hidden, "ue8m0" if sf.dtype == torch.int32 else "float")
    return launch(_launch_back, launcher, q, sf, output(0), outputs=(empty(out_dtype, size(q, 0), hidden),))
