"""Cast back: FP8 e4m3 / packed FP4 e2m1 codes with per-token scale factors -> bf16 or fp32.

The public API follows TileKernels' ``tile_kernels.quant.per_token_cast_back`` and
``cast_back``; this build covers per-token scales (one per token and ``num_per_channels``
channels) in the three layouts ``per_token_cast`` produces, told apart by sf's dtype and
strides: fp32 row-major, fp32 column-major with the token dimension padded
(``use_tma_aligned_col_major_sf``) and int32 words of packed UE8M0 exponents
(``use_packed_ue8m0``), with num_per_channels up to hidden (one scale per row, grid npc 0);
``cast_back`` also takes per-block fp32 scales, blocks (32 | 128) x (32 | 128), spread to
per-token scales for the same kernel; ``x_special_fmt='e5m6'`` goes to the E5M6 op module.
The input format comes from the codes' dtype: float8_e4m3fn is e4m3,
int8 is packed e2m1 (element 2i in the low nibble). The launcher validates the tensors (dtype,
device, shape, strides, alignment) and names the argument (``q`` the codes, ``sf`` the scales)
in its errors; this module checks the rest.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._args import OUT_DTYPES, column_storage, matrix, not_built, out_tensors, output_dtype, positive_int
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
)
from ..errors import KernelArgumentError

__all__ = ["cast_back", "per_token_cast_back"]

_kernel = get_kernel("per_token_cast_back")

# dtype of the codes -> input format
_IN_FORMATS = {torch.float8_e4m3fn: "e4m3", torch.int8: "e2m1"}


def _not_built(argument: str, what: str) -> NotImplementedError:
    return not_built(argument, what, "per_token_cast_back")


def _e5m6(x: tuple[torch.Tensor, torch.Tensor], fmt: str | torch.dtype, x_block_size: tuple[int, int],
          out: torch.Tensor | None) -> torch.Tensor:
    """Route E5M6 codes to the E5M6 op module (which checks the block), when the package has it."""
    try:
        from ._e5m6 import cast_back_e5m6  # type: ignore[import-not-found]
    except ImportError:
        raise _not_built("x_special_fmt", "the E5M6 format ('e5m6')") from None
    return cast_back_e5m6(x, fmt, x_block_size, out=out)  # type: ignore[no-any-return]


def _pair(x: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The (codes, scales) pair, with the codes viewed as the dtype the kernel reads."""
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise TypeError(f"x: expected a (q, sf) pair of tensors, got {type(x).__name__}")
    q, sf = x
    q = matrix("x[0] (q)", q, "(num_tokens, ...)")
    sf = matrix("x[1] (sf)", sf, "(num_tokens, ...)")
    fp4x2 = getattr(torch, "float4_e2m1fn_x2", None)
    if fp4x2 is not None and q.dtype == fp4x2:
        q = q.view(torch.int8)  # same bytes, same nibble order
    if q.dtype not in _IN_FORMATS:
        raise KernelArgumentError(f"x[0] (q): expected float8_e4m3fn (e4m3) or int8 (packed e2m1) codes, got {q.dtype}")
    return q, sf


def _outputs(q: torch.Tensor, sf: torch.Tensor, out_fmt: str, npc: int) -> torch.Tensor:
    """Uninitialised out for (q, sf); also the fake (meta) kernel that torch.compile traces with."""
    num_tokens, width = q.shape
    hidden = width * 2 if q.dtype == torch.int8 else width
    return q.new_empty((num_tokens, hidden), dtype=OUT_DTYPES[out_fmt])


def _column_storage(sf: torch.Tensor) -> torch.Tensor:
    """The (columns, padded_tokens) storage behind a column-major (T, columns) view: read in place
    where it is what per_token_cast allocates (``column_storage``), else copied to (columns, T)."""
    storage = column_storage(sf)
    if storage is None:
        storage = sf.new_empty((sf.shape[1], sf.shape[0])).copy_(sf.t())  # fresh: standard strides even when empty
    return storage

def _scale_argument(sf: torch.Tensor) -> tuple[str, torch.Tensor]:
    """(sf_layout, the tensor the kernel reads) for the logical (T, G) or UE8M0 (T, G / 4) scales."""
    if sf.dtype == torch.int32:  # packed UE8M0: the kernel reads the bytes of the column storage
        words = _column_storage(sf)
        return "ue8m0", words.view(torch.uint8).view(words.shape[0], words.shape[1], 4)
    num_tokens, groups = sf.shape
    # Column-major: tokens adjacent (strides (1, P)); with one token, any column stride but 1.
    if groups > 1 and (sf.stride(0) == 1 if num_tokens > 1 else sf.stride(1) != 1):
        return "col_major", _column_storage(sf)
    return "row_major", sf  # the launcher refuses other strides, naming sf


def _cast_back(q: torch.Tensor, sf: torch.Tensor, out_fmt: str, npc: int) -> torch.Tensor:
    return _run(q, sf, out_fmt, npc, None)


# Eager calls, keyed by what the checks and the variant choice read besides the number of tokens:
# (q.dtype, q's width, sf_layout, fmt, num_per_channels) -> (launcher, output dtype). A key is
# stored only after the full checks passed for it, so a hit skips them; what depends on the
# tokens (sf's rows, for the column-major layouts whose storage the launcher sees padded) is
# checked on every call. num_per_channels is keyed only as an exact int: 128.0 == 128 hashes
# alike, but positive_int refuses the float.
_VARIANTS: dict[tuple[object, ...], tuple[Callable[..., None], torch.dtype]] = {}
# per_token_cast_back((q, sf), ..., out=out) with row-major scales, in one C call (_runtime.dispatch),
# called as dispatch(_FAST, q, sf, out, fmt, num_per_channels, x_special_fmt) with the pair unpacked
# (out None: an allocating call, whose out dispatch() allocates as _outputs does: T rows of hidden):
# keyed by q's dtype and width, sf's dtype and rank and the options as given; checked by the
# launcher's contract, which ties sf's shape to q's rows and the variant's groups. The contract's
# row-major strides refuse every sf that _scale_argument would call column-major (G > 1: a unit
# token stride, or with one token a column stride other than 1). The column-major layouts, whose
# launcher reads a storage view of sf, and FP4 codes given as float4_e2m1fn_x2 (viewed as int8)
# are not remembered: dispatch() cannot build views.
_FAST = fast_path(inputs=((1,), ()), outputs=1)


def _remember_fast(launch: Callable[..., None], result: torch.Tensor, *call: object) -> None:
    """Let dispatch() take later calls like ``call`` (q, sf, out, options; row-major sf, q as the launcher reads it),
    which returned ``result``; an allocating call (out None) allocates it as it did: T rows, hidden (keyed) wide."""
    remember(_FAST, launch, (from_input(0), from_input(1), from_out(0)), (), *call,
             outputs=(output(result.dtype, size_of(0, 0), result.shape[1]),))


def _run(q: torch.Tensor, sf: torch.Tensor, out_fmt: str, npc: int, out: torch.Tensor | None,
         call: tuple[object, ...] | None = None) -> torch.Tensor:
    """Pick the variant and launch it into out or a fresh tensor; the launcher checks every tensor and names it.

    call: the call as dispatch() keys it (out None: allocating), remembered for it when the launcher reads sf as
    given.
    """
    sf_layout, sf_arg = _scale_argument(sf)
    if out is None:  # else the launcher checks the caller's out like any tensor, overlaps included
        out = _outputs(q, sf, out_fmt, npc)
    hidden = int(q.shape[1]) * (2 if q.dtype == torch.int8 else 1)  # q's, not out's: the launcher checks out
    grid_npc = 0 if npc == hidden else npc  # the grid spells one scale per row npc = 0
    # Grid order: fmt, npc, out_dtype, hidden, sf_layout.
    out_dtype = OUT_DTYPES[out_fmt]
    launch = _kernel.variant(_IN_FORMATS[q.dtype], grid_npc, dtype_name(out_dtype), hidden, sf_layout)
    launch(q, sf_arg, out)
    if type(npc) is int and not torch.compiler.is_compiling():  # remembered once the launcher accepted the call
        _VARIANTS[(q.dtype, q.shape[1], sf_layout, out_fmt, npc)] = (launch, out_dtype)
    if call is not None and sf_layout == "row_major":
        _remember_fast(launch, out, *call)
    return out


def _run_cached(x: object, fmt: object, npc: object, out: object) -> torch.Tensor | None:
    """The call through a cached variant, or None where the full path must decide (first call of a
    signature, anything unusual, compiling). fmt is keyed as given ('bf16' or the dtype)."""
    # Compiling first: dynamo must not trace _scale_argument's storage test (a graph break).
    if type(x) is not tuple or len(x) != 2 or type(npc) is not int or torch.compiler.is_compiling():
        return None
    q, sf = x
    if not (isinstance(q, torch.Tensor) and isinstance(sf, torch.Tensor)) or q.dim() != 2 or sf.dim() != 2:
        return None
    sf_layout, sf_arg = _scale_argument(sf)
    hit = _VARIANTS.get((q.dtype, q.shape[1], sf_layout, _FMT_NAMES.get(fmt), npc))  # type: ignore[call-overload]
    if hit is None or (sf_layout != "row_major" and sf.shape[0] != q.shape[0]):
        return None
    launch, out_dtype = hit
    if out is not None:
        if type(out) is not torch.Tensor:
            return None
        launch(q, sf_arg, out)
        if sf_layout == "row_major":  # dispatch() had not seen it, or declined (x_special_fmt is None here)
            _remember_fast(launch, out, q, sf, out, fmt, npc, None)
        return out
    result = q.new_empty((q.shape[0], q.shape[1] * 2 if q.dtype == torch.int8 else q.shape[1]), dtype=out_dtype)
    launch(q, sf_arg, result)
    if sf_layout == "row_major":  # as for out=: dispatch() had not seen it
        _remember_fast(launch, result, q, sf, None, fmt, npc, None)
    return result


# fmt as the cache keys it: what output_dtype accepts, spelled as the custom op's out_fmt.
_FMT_NAMES: dict[object, str] = {**{name: name for name in OUT_DTYPES}, **{d: name for name, d in OUT_DTYPES.items()}}


# What torch.compile sees: one opaque op, torch.ops.<package>.per_token_cast_back, with a fixed schema.
_per_token_cast_back_op = custom_op("per_token_cast_back", fake=_outputs)(_cast_back)


def per_token_cast_back(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str | torch.dtype,
    num_per_channels: int,
    x_special_fmt: str | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dequantize (q, sf) with one scale per token and npc channels: out = decode(q) * sf.

    Args:
        x: ``(q, sf)``: q float8_e4m3fn (num_tokens, hidden) or int8 (num_tokens, hidden / 2)
            packed FP4 e2m1 (element 2i in the low nibble); sf as ``per_token_cast`` returns
            it: float32 (num_tokens, G), G = hidden / num_per_channels, row-major or
            column-major (strides (1, P), P >= num_tokens), or int32 (num_tokens, ceil(G / 4))
            packed UE8M0 exponents (byte g % 4 of word g / 4 is group g's biased exponent).
        fmt: output format, ``'bf16'`` or ``'fp32'`` (or the torch dtype).
        num_per_channels: channels sharing one scale factor (npc).
        x_special_fmt: None, or ``'e5m6'`` for E5M6 codes (routed to ``cast_back_e5m6``, which
            needs a package built with the E5M6 kernels: NotImplementedError naming it otherwise).
        out: a contiguous (num_tokens, hidden) tensor of the output dtype to write into instead
            of allocating (not overlapping q or sf), returned as given (for E5M6 codes too).

    Returns:
        out (num_tokens, hidden) in bf16 or fp32: the fp32 product decode(q) * sf, rounded to
        nearest even when the output is bf16.
    """
    if type(x) is tuple and len(x) == 2 and not torch.compiler.is_compiling():
        done = dispatch(_FAST, x[0], x[1], out, fmt, num_per_channels, x_special_fmt)  # seen before: one C call
        if done is not None:
            return done  # type: ignore[no-any-return]
    if x_special_fmt is None:
        result = _run_cached(x, fmt, num_per_channels, out)
        if result is not None:
            return result
    out_dtype = output_dtype(fmt)
    out_fmt = "bf16" if out_dtype == torch.bfloat16 else "fp32"
    if x_special_fmt == "e5m6":
        return _e5m6(x, out_fmt, (1, num_per_channels), out)
    if x_special_fmt is not None:
        raise ValueError(f"x_special_fmt: expected None or 'e5m6', got {x_special_fmt!r}")
    if out is not None:
        (out,) = out_tensors(out, ("out",))
    npc = positive_int("num_per_channels", num_per_channels)
    q, sf = _pair(x)
    hidden = int(q.shape[1]) * (2 if q.dtype == torch.int8 else 1)
    if hidden % npc != 0:
        raise ValueError(f"num_per_channels: hidden ({hidden}) must be a multiple of num_per_channels ({npc})")
    groups = hidden // npc
    if sf.dtype == torch.int32:
        expected = (q.shape[0], (groups + 3) // 4)
        what = "(num_tokens, ceil(hidden / num_per_channels / 4)) UE8M0 words"
    else:
        expected, what = (q.shape[0], groups), "(num_tokens, hidden / num_per_channels)"
    if tuple(sf.shape) != expected:
        raise KernelArgumentError(
            f"x[1] (sf): expected shape {expected} {what} for codes of shape {tuple(q.shape)}, got {tuple(sf.shape)}"
        )

    if torch.compiler.is_compiling():
        result = _per_token_cast_back_op(q, sf, out_fmt, npc)
        return result if out is None else out.copy_(result)
    # The call as dispatch() keys it (x unpacked), unless the launcher reads a view of the codes (_pair).
    call = None if q is not x[0] else (q, sf, out, fmt, num_per_channels, x_special_fmt)
    return _run(q, sf, out_fmt, npc, out, call)


_BLOCK_SIDES = (32, 128)  # per-block scales: (32 | 128) x (32 | 128) blocks, as per_block_cast makes them


def _per_token_scales(
    x: object, num_per_tokens: int, num_per_channels: int
) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
    """Per-block fp32 scales (ceil(T / bm), H / bk) spread to per-token ones: ((q, sf (T, H / npc)), npc).

    Each block scale is repeated over its bm tokens (and, for FP4 with bk = 128, over four
    32-channel groups: e2m1 is built for npc 16 and 32), so per_token_cast_back computes the
    same fp32 product decode(q) * sf per element, bit for bit.
    """
    if num_per_tokens not in _BLOCK_SIDES or num_per_channels not in _BLOCK_SIDES:
        raise _not_built("x_block_size", f"the block size {(num_per_tokens, num_per_channels)!r} (per-token (1, npc) "
                         "blocks and (32 | 128) x (32 | 128) blocks are)")
    q, sf = _pair(x)
    num_tokens, width = q.shape
    hidden = width * 2 if q.dtype == torch.int8 else width
    if hidden % num_per_channels != 0:
        raise ValueError(f"x_block_size: hidden ({hidden}) must be a multiple of num_per_channels ({num_per_channels})")
    expected = ((num_tokens + num_per_tokens - 1) // num_per_tokens, hidden // num_per_channels)
    if sf.dtype != torch.float32 or tuple(sf.shape) != expected:
        raise KernelArgumentError(f"x[1] (sf): expected float32 per-block scales of shape {expected} for codes of "
                                  f"shape {tuple(q.shape)}, got {sf.dtype} {tuple(sf.shape)}")
    sf = sf.repeat_interleave(num_per_tokens, dim=0)[:num_tokens]
    npc = num_per_channels
    if q.dtype == torch.int8 and npc == 128:
        sf, npc = sf.repeat_interleave(4, dim=1), 32
    return (q, sf.contiguous()), npc


def cast_back(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str | torch.dtype,
    x_block_size: tuple[int, int],
    x_special_fmt: str | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dequantize (q, sf) scaled per ``x_block_size`` = (num_per_tokens, num_per_channels) blocks.

    Per-token blocks (1, npc) go to ``per_token_cast_back`` (every scale layout it reads).
    Per-block scales, blocks (32 | 128) x (32 | 128) as ``per_block_cast`` makes them, are fp32
    (ceil(T / bm), H / bk), row- or column-major; they are spread to per-token scales (a
    T x H / bk fp32 tensor) and decoded by the same kernel, so out = decode(q) * sf exactly.
    out: as for ``per_token_cast_back``.
    """
    try:
        num_per_tokens, num_per_channels = x_block_size
    except (TypeError, ValueError):
        raise TypeError(
            f"x_block_size: expected a (num_per_tokens, num_per_channels) pair, got {x_block_size!r}"
        ) from None
    if x_special_fmt == "e5m6":
        return _e5m6(x, output_dtype(fmt), (num_per_tokens, num_per_channels), out)
    if num_per_tokens != 1:
        x, num_per_channels = _per_token_scales(x, num_per_tokens, num_per_channels)
    return per_token_cast_back(x, fmt, num_per_channels, x_special_fmt=x_special_fmt, out=out)
