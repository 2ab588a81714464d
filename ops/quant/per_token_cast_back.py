"""Cast back: FP8 e4m3 / packed FP4 e2m1 codes with per-token scale factors -> bf16 or fp32.

The public API follows TileKernels' ``tile_kernels.quant.per_token_cast_back`` and
``cast_back``; this build covers per-token scales (one per token and ``num_per_channels``
channels) in the three layouts ``per_token_cast`` produces, told apart by sf's dtype and
strides: fp32 row-major, fp32 column-major with the token dimension padded
(``use_tma_aligned_col_major_sf``) and int32 words of packed UE8M0 exponents
(``use_packed_ue8m0``), with num_per_channels up to hidden (one scale per row, grid npc 0), for any
hidden that is a multiple of 64 (the variants built per hidden preferred; G = ceil(hidden / npc));
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

from .._args import column_storage, matrix, not_built, output_dtype, positive_int
from .._op import Plan, Result, empty, launch, op, pair, result, size
from .._op import out as output
from .._runtime import dtype_name, get_kernel
from ..errors import KernelArgumentError
from ._scales import stored_codes, ue8m0_values

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
    q = matrix("x[0] (q)", x[0], "(num_tokens, ...)")
    sf = matrix("x[1] (sf)", x[1], "(num_tokens, ...)")
    q = stored_codes(q)
    if q.dtype not in _IN_FORMATS:
        raise KernelArgumentError(f"x[0] (q): expected float8_e4m3fn (e4m3) or int8 (packed e2m1) codes, got {q.dtype}")
    return q, sf


def _sf_layout(sf: torch.Tensor) -> str:
    """The layout of the logical (T, G) or UE8M0 (T, G / 4) scales, from their dtype and strides."""
    if sf.dtype == torch.int32:
        return "ue8m0"
    num_tokens, groups = sf.shape
    # Column-major: tokens adjacent (strides (1, P)); with one token, any column stride but 1.
    if groups > 1 and (sf.stride(0) == 1 if num_tokens > 1 else sf.stride(1) != 1):
        return "col_major"
    return "row_major"  # the launcher refuses other strides, naming sf


def _from_storage(launcher: Callable[..., None], q: torch.Tensor, sf: torch.Tensor, out: torch.Tensor) -> None:
    """launcher(q, the kernel's view of column-major or UE8M0 sf, out): the (columns, padded_tokens) storage
    where it is what per_token_cast allocates (``column_storage``), else a (columns, T) copy; UE8M0 as the
    bytes of its words. Made here, at the launch, on real tensors: torch.compile traces the op but not its
    launch (the storage test would break its graph). The C dispatch takes no views: such a call keeps the
    Python path (this function is no launcher dispatch could replay)."""
    storage = column_storage(sf)
    if storage is None:
        storage = sf.new_empty((sf.shape[1], sf.shape[0])).copy_(sf.t())  # fresh: standard strides even when empty
    if sf.dtype == torch.int32:  # packed UE8M0: the kernel reads the bytes of the column storage
        storage = storage.view(torch.uint8).view(storage.shape[0], storage.shape[1], 4)
    launcher(q, storage, out)


# dispatch() keys the call by the pair's halves: q's dtype and width, sf's dtype and rank, and the
# options as given; the launcher's contract ties sf's shape to q's rows and the variant's groups, and
# its row-major strides refuse every sf that _sf_layout calls column-major.
@op(outputs=("out",), inputs={"x": pair((1,), ())})
def per_token_cast_back(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str | torch.dtype,
    num_per_channels: int,
    x_special_fmt: str | None = None,
    *,
    out: torch.Tensor | None = None,
) -> Plan | Result:
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
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise TypeError(f"x: expected a (q, sf) pair of tensors, got {type(x).__name__}")
    out_dtype = output_dtype(fmt)
    out_fmt = "bf16" if out_dtype == torch.bfloat16 else "fp32"
    if x_special_fmt == "e5m6":
        return result(_e5m6((x[0], x[1]), out_fmt, (1, num_per_channels), out))
    if x_special_fmt is not None:
        raise ValueError(f"x_special_fmt: expected None or 'e5m6', got {x_special_fmt!r}")
    npc = positive_int("num_per_channels", num_per_channels)
    q, sf = _pair(x)
    hidden = int(q.shape[1]) * (2 if q.dtype == torch.int8 else 1)
    groups = -(-hidden // npc)  # the last group partial where npc does not divide hidden, as per_token_cast
    if sf.dtype == torch.int32:
        expected = (q.shape[0], (groups + 3) // 4)
        what = "(num_tokens, ceil(hidden / num_per_channels / 4)) UE8M0 words"
    else:
        expected, what = (q.shape[0], groups), "(num_tokens, ceil(hidden / num_per_channels))"
    if tuple(sf.shape) != expected:
        raise KernelArgumentError(
            f"x[1] (sf): expected shape {expected} {what} for codes of shape {tuple(q.shape)}, got {tuple(sf.shape)}"
        )
    sf_layout = _sf_layout(sf)
    # Grid order: fmt, npc (one scale per row is npc 0), out_dtype, hidden, sf_layout. The variant built for this
    # hidden where there is one, else the one for any hidden (grid value 0; the launcher requires a multiple of 64).
    key = (_IN_FORMATS[q.dtype], 0 if npc == hidden else npc, dtype_name(out_dtype))
    launcher = _kernel.find(*key, hidden, sf_layout, 1) or _kernel.variant(*key, 0, sf_layout, 1)
    outputs = (empty(out_dtype, size(q, 0), hidden),)
    if sf_layout == "row_major":
        return launch(launcher, q, sf, output(0), outputs=outputs)
    return launch(_from_storage, launcher, q, sf, output(0), outputs=outputs)



_BLOCK_SIDES = (32, 128)  # per-block scales: (32 | 128) x (32 | 128) blocks, as per_block_cast makes them


def _block_scales(x: object, num_per_tokens: int, num_per_channels: int
                  ) -> tuple[torch.Tensor, torch.Tensor, int, tuple[int, int], tuple[int, int]]:
    """(q, sf, hidden, the fp32 scales' shape, the UE8M0 words' shape) of per-block or per-channel scales, or an error
    naming what is wrong: blocks (32 | 128) x (32 | 128 | 1); sf (ceil(T / bm), ceil(H / bk)) fp32 or, for
    blocks, packed UE8M0 int32 words (ceil(T / bm), ceil(H / bk / 4))."""
    if num_per_tokens not in _BLOCK_SIDES or num_per_channels not in (*_BLOCK_SIDES, 1):
        raise _not_built("x_block_size", f"the block size {(num_per_tokens, num_per_channels)!r} (per-token (1, npc) "
                         "blocks, (32 | 128) x (32 | 128) blocks and (32 | 128, 1) per-channel blocks are)")
    q, sf = _pair(x)
    num_tokens, width = q.shape
    hidden = width * 2 if q.dtype == torch.int8 else width
    if hidden % 64 != 0:
        raise ValueError(f"x[0] (q): hidden ({hidden}) must be a multiple of 64")
    expected = (-(-num_tokens // num_per_tokens), -(-hidden // num_per_channels))
    words = (expected[0], (expected[1] + 3) // 4)
    return q, sf, hidden, expected, words


def _per_token_scales(
    x: object, num_per_tokens: int, num_per_channels: int
) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
    """Per-block scales in a layout the kernel does not read in place (column-major fp32, packed UE8M0 int32 words)
    spread to per-token fp32 ones: ((q, sf (T, G)), npc).

    Each block scale is repeated over its bm tokens (and, for FP4 with bk = 128, over four
    32-channel groups), so per_token_cast_back computes the same fp32 product decode(q) * sf per
    element, bit for bit.
    """
    q, sf, _, expected, words = _block_scales(x, num_per_tokens, num_per_channels)
    if sf.dtype == torch.int32 and tuple(sf.shape) == words and num_per_channels != 1:  # UE8M0, four to a word
        sf = ue8m0_values(sf, expected[1])
    if sf.dtype != torch.float32 or tuple(sf.shape) != expected:
        raise KernelArgumentError(f"x[1] (sf): expected float32 per-block scales of shape {expected} (or int32 "
                                  f"UE8M0 words {words}) for codes of shape {tuple(q.shape)}, got {sf.dtype} "
                                  f"{tuple(sf.shape)}")
    sf = sf.repeat_interleave(num_per_tokens, dim=0)[:q.shape[0]]
    npc = num_per_channels
    if q.dtype == torch.int8 and npc == 128:
        groups = -(-2 * int(q.shape[1]) // 32)  # ceil(hidden / 32): the last 128-block may be partial
        sf, npc = sf.repeat_interleave(4, dim=1)[:, :groups], 32
    return (q, sf.contiguous()), npc


@op(outputs=("out",), inputs={"x": pair((1,), ())}, name="cast_back_blocks")
def _cast_back_blocks(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str | torch.dtype,
    x_block_size: tuple[int, int],
    *,
    out: torch.Tensor | None = None,
) -> Plan:
    """cast_back of row-major fp32 per-block (bm, bk) or per-channel (bm, 1) scales, read in place by the variant of
    that block_m: out = decode(q) * sf[t / bm, c / bk] per element (one fp32 multiply, as the per-token path)."""
    num_per_tokens, num_per_channels = x_block_size
    q, sf, hidden, expected, _ = _block_scales(x, num_per_tokens, num_per_channels)
    if tuple(sf.shape) != expected:
        raise KernelArgumentError(f"x[1] (sf): expected float32 scales of shape {expected} for codes of shape "
                                  f"{tuple(q.shape)} and blocks {tuple(x_block_size)}, got {tuple(sf.shape)}")
    out_dtype = output_dtype(fmt)
    # Grid order: fmt, npc, out_dtype, hidden, sf_layout, block_m; the launcher checks sf's dtype and strides.
    launcher = _kernel.variant(_IN_FORMATS[q.dtype], num_per_channels, dtype_name(out_dtype), 0, "row_major",
                               num_per_tokens)
    return launch(launcher, q, sf, output(0), outputs=(empty(out_dtype, size(q, 0), hidden),))


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
    (ceil(T / bm), H / bk), row- or column-major, or their packed UE8M0 exponents, int32 words
    (ceil(T / bm), ceil(H / bk / 4)) in any layout (scale = float with bits byte << 23); they are
    spread to per-token scales (a T x H / bk fp32 tensor) and decoded by the same kernel, so
    out = decode(q) * sf exactly.
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
        if x_special_fmt is not None:
            raise ValueError(f"x_special_fmt: expected None or 'e5m6', got {x_special_fmt!r}")
        q, sf = _pair(x)
        if sf.dtype == torch.float32 and _sf_layout(sf) == "row_major":
            return _cast_back_blocks((q, sf), fmt, (num_per_tokens, num_per_channels), out=out)  # type: ignore[no-any-return]
        x, num_per_channels = _per_token_scales(x, num_per_tokens, num_per_channels)
    return per_token_cast_back(x, fmt, num_per_channels, x_special_fmt=x_special_fmt, out=out)
