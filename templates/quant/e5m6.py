"""E5M6 per-token cast and cast back: 12-bit codes (the top 12 bits of an fp16), one scale per token.

The public API follows TileKernels' ``per_token_cast_to_e5m6`` and ``cast_back_e5m6``; the
generic ``per_token_cast(x, 'e5m6', ...)`` and ``cast_back(..., x_special_fmt='e5m6')`` forward
here. Codes are uint8 (num_tokens, 1.5 hidden): eight 12-bit codes per three little-endian
uint32 words (KERNELS.md, "Quantization": E5M6). Scales are float32 (num_tokens, 1), row-major or,
with ``use_tma_aligned_col_major_sf``, column-major with the token dimension padded to a multiple
of 4; with one scale per token both put token t at element t, so one kernel serves both and
reads or writes the (num_tokens,) view. The packed UE8M0 scale layout is not built. The
launchers validate the tensors (dtype, device, shape, strides, alignment) and name the
argument in their errors; this module checks the rest.
"""

from __future__ import annotations

import operator

import torch

from .._args import OUT_DTYPES, copied_into, matrix, not_built, out_tensors, output_dtype, positive_int
from .._runtime import custom_op, dtype_name, get_kernel
from ..errors import KernelArgumentError

__all__ = ["cast_back_e5m6", "per_token_cast_e5m6"]

_cast_kernel = get_kernel("per_token_cast_e5m6")
_cast_back_kernel = get_kernel("cast_back_e5m6")

_GROUP_BYTES = 12  # eight 12-bit codes in three 4-byte words


def _align4(n: int) -> int:
    return (n + 3) // 4 * 4


def _allocate(x: torch.Tensor, col_major: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf, sf_arg): sf is what the op returns, sf_arg the (T,) view the kernel writes.

    col_major: storage float32 (1, align(T, 4)); sf = storage.T[:T], strides (1, align(T, 4)),
    as TileKernels allocates it. The padding tokens T .. align(T, 4) - 1 are never written.
    """
    num_tokens, hidden = x.shape
    q = x.new_empty((num_tokens, hidden // 8 * _GROUP_BYTES), dtype=torch.uint8)
    if not col_major:
        sf = x.new_empty((num_tokens, 1), dtype=torch.float32)
        return q, sf, sf.as_strided((num_tokens,), (1,))
    padded = _align4(num_tokens)
    storage = x.new_empty((1, padded), dtype=torch.float32)
    # as_strided spells out the strides; torch reports other ones for size-1 and empty dims.
    return q, storage.as_strided((num_tokens, 1), (1, padded)), storage.as_strided((num_tokens,), (1,))


def _cast_outputs(x: torch.Tensor, round_sf: bool, col_major: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf) for x; also the fake (meta) kernel that torch.compile traces with."""
    q, sf, _ = _allocate(x, col_major)
    return q, sf


def _cast(x: torch.Tensor, round_sf: bool, col_major: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the variant and launch it; the launcher checks every tensor and names it in errors."""
    launch = _cast_kernel.select(in_dtype=dtype_name(x.dtype), hidden=int(x.shape[1]), round_sf=round_sf)
    q, sf, sf_arg = _allocate(x, col_major)
    launch(x, q.view(torch.int32), sf_arg)  # the kernel stores whole words
    return q, sf


def _cast_into(x: torch.Tensor, round_sf: bool, out: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch into the caller's (q, sf) through the views the kernel writes; returns them as given.

    The launcher sees q's int32 words and sf's (T,) view: what those views hide (q's dtype and
    rows of whole words, sf's (T, 1) shape and unit token stride) is checked here, by name.
    """
    q, sf = out_tensors(out, ("q", "sf"))
    if q.dtype != torch.uint8:
        raise KernelArgumentError(f"q: expected uint8 packed E5M6 codes, got {q.dtype}")
    try:
        words = q.view(torch.int32)
    except RuntimeError:
        raise KernelArgumentError(f"q: expected rows of whole 4-byte words (unit column stride, a width that is a "
                                  f"multiple of 4), got shape {tuple(q.shape)} and strides {tuple(q.stride())}; "
                                  "pass the q of an earlier call") from None
    num_tokens = int(x.shape[0])
    if tuple(sf.shape) != (num_tokens, 1) or (num_tokens > 1 and sf.stride(0) != 1):
        raise KernelArgumentError(f"sf: expected shape ({num_tokens}, 1) with token stride 1 (row- or column-major), "
                                  f"got shape {tuple(sf.shape)} and strides {tuple(sf.stride())}")
    launch = _cast_kernel.select(in_dtype=dtype_name(x.dtype), hidden=int(x.shape[1]), round_sf=round_sf)
    launch(x, words, sf.as_strided((num_tokens,), (1,)))
    return q, sf


# What torch.compile sees: one opaque op, torch.ops.<package>.per_token_cast_e5m6, with a fixed schema.
_cast_op = custom_op("per_token_cast_e5m6", fake=_cast_outputs)(_cast)


def per_token_cast_e5m6(
    x: torch.Tensor,
    num_per_channels: int | None = None,
    *,
    round_sf: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    use_packed_ue8m0: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast x (num_tokens, hidden) to packed E5M6 with one scale per token.

    Args:
        x: bf16 or fp32 CUDA tensor of shape (num_tokens, hidden), contiguous.
        num_per_channels: channels per scale; must be hidden (None means hidden).
        round_sf: round each scale up to a power of two.
        use_tma_aligned_col_major_sf: return sf column-major with the token dimension padded to
            a multiple of 4, strides (1, align(num_tokens, 4)) (same values).
        use_packed_ue8m0: packed UE8M0 scales; not built (must be False).
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
    x = matrix("x", x)
    hidden = int(x.shape[1])
    if num_per_channels is not None:
        npc = positive_int("num_per_channels", num_per_channels)
        if npc != hidden:
            raise ValueError(
                f"num_per_channels: E5M6 has one scale per token, so it must be hidden ({hidden}) or None, got {npc}"
            )
    if use_packed_ue8m0:
        raise not_built("use_packed_ue8m0", "the packed UE8M0 scale layout for E5M6", "per_token_cast_e5m6")
    if hidden % 8 != 0:
        raise ValueError(f"x: hidden ({hidden}) must be a multiple of 8 (eight codes per three words)")

    if torch.compiler.is_compiling():
        result = _cast_op(x, bool(round_sf), bool(use_tma_aligned_col_major_sf))
        return result if out is None else copied_into(out, ("q", "sf"), result)
    if out is not None:
        return _cast_into(x, bool(round_sf), out)
    return _cast(x, bool(round_sf), bool(use_tma_aligned_col_major_sf))


def _back_outputs(q: torch.Tensor, sf: torch.Tensor, out_fmt: str) -> torch.Tensor:
    """Uninitialised out for (q, sf); also the fake (meta) kernel that torch.compile traces with."""
    num_tokens, width = q.shape
    return q.new_empty((num_tokens, width // _GROUP_BYTES * 8), dtype=OUT_DTYPES[out_fmt])


def _cast_back(q: torch.Tensor, sf: torch.Tensor, out_fmt: str) -> torch.Tensor:
    """The custom op's body: a launch into a fresh tensor."""
    return _run_back(q, sf, out_fmt, None)


def _run_back(q: torch.Tensor, sf: torch.Tensor, out_fmt: str, out: torch.Tensor | None) -> torch.Tensor:
    """Pick the variant and launch it into a fresh tensor or out; the launcher checks every tensor
    (out's too, overlaps included) and names it in errors."""
    if q.storage_offset() % 4 != 0:  # checked here, on real tensors: torch.compile traces _pair
        raise KernelArgumentError(f"x[0] (q): expected to start on a 4-byte word, got storage offset "
                                  f"{q.storage_offset()}")
    if out is None:
        out = _back_outputs(q, sf, out_fmt)
    # The variant of out_fmt, whatever out's dtype: the launcher then refuses an out of another.
    launch = _cast_back_kernel.select(out_dtype=dtype_name(OUT_DTYPES[out_fmt]),
                                      hidden=int(q.shape[1]) // _GROUP_BYTES * 8)
    # One scale per token: element t of sf (strides (1, any)) is token t's in either layout.
    sf_arg = sf.as_strided((sf.shape[0],), (1,))
    if sf_arg.data_ptr() % 32 != 0:  # a token slice of a pair: copy the scales to an aligned start
        sf_arg = sf_arg.clone()
    launch(q.view(torch.int32), sf_arg, out)
    return out


# What torch.compile sees: one opaque op, torch.ops.<package>.cast_back_e5m6, with a fixed schema.
_cast_back_op = custom_op("cast_back_e5m6", fake=_back_outputs)(_cast_back)


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
    if sf.dtype == torch.int32:
        raise not_built("x[1] (sf)", "packed UE8M0 scales for E5M6", "cast_back_e5m6")
    if tuple(sf.shape) != (q.shape[0], 1):
        raise KernelArgumentError(
            f"x[1] (sf): expected shape ({q.shape[0]}, 1), one scale per token of q {tuple(q.shape)}, "
            f"got {tuple(sf.shape)}"
        )
    if sf.shape[0] > 1 and sf.stride(0) != 1:
        sf = sf.contiguous()  # tokens apart in memory (a strided slice): gather them once
    return q, sf


def cast_back_e5m6(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str | torch.dtype,
    x_block_size: tuple[int, int] | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dequantize packed E5M6 codes with one scale per token: out = decode(q) * sf.

    Args:
        x: ``(q, sf)`` as ``per_token_cast_e5m6`` returns it: q uint8 (num_tokens, hidden * 3 / 2),
            contiguous; sf float32 (num_tokens, 1), row-major or column-major.
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
    out_fmt = "bf16" if out_dtype == torch.bfloat16 else "fp32"
    q, sf = _pair(x)
    if x_block_size is not None:
        hidden = int(q.shape[1]) // _GROUP_BYTES * 8
        try:
            block = (operator.index(x_block_size[0]), operator.index(x_block_size[1]))
        except (TypeError, IndexError):
            raise TypeError(f"x_block_size: expected a (num_per_tokens, num_per_channels) pair, "
                            f"got {x_block_size!r}") from None
        if len(x_block_size) != 2 or block != (1, hidden):
            raise not_built("x_block_size", f"the block size {x_block_size!r} (only (1, {hidden}): one scale per "
                            "token)", "cast_back_e5m6")
    if out is not None:
        (out,) = out_tensors(out, ("out",))
    if torch.compiler.is_compiling():
        result = _cast_back_op(q, sf, out_fmt)
        return result if out is None else out.copy_(result)
    return _run_back(q, sf, out_fmt, out)
