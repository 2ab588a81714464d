"""Per-block casts to FP8 e4m3 or packed FP4 e2m1 with one fp32 scale per (bm x bk) block.

The public API follows TileKernels' ``tile_kernels.quant.per_block_cast`` (and its
``_with_sf_only`` and ``_with_precomputed_sf`` forms); this build covers plain-tensor inputs
and the row-major fp32 scale layout. The launcher validates the tensors (dtype, device, shape,
strides, alignment) and names the argument in its errors; this module checks the non-tensor
arguments and the options the build does not cover.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch

from .._args import copied_into, matrix, not_built, one_of, out_tensors
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

__all__ = ["per_block_cast", "per_block_cast_with_precomputed_sf", "per_block_cast_with_sf_only"]

_kernel = get_kernel("per_block_cast")

_FORMATS = ("e4m3", "e2m1")


def _not_built(argument: str, what: str) -> NotImplementedError:
    return not_built(argument, what, "per_block_cast")


def _outputs(
    x: torch.Tensor, fmt: str, block_m: int, block_k: int, round_sf: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf) for x; also the fake (meta) kernel that torch.compile traces with."""
    num_tokens, hidden = x.shape
    sf = x.new_empty(((num_tokens + block_m - 1) // block_m, hidden // block_k), dtype=torch.float32)
    return _codes(x, fmt), sf


def _codes(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Uninitialised q for x: e4m3 codes, or e2m1 ones two to an int8."""
    num_tokens, hidden = x.shape
    if fmt == "e4m3":
        return x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    return x.new_empty((num_tokens, hidden // 2), dtype=torch.int8)


def _select(x: torch.Tensor, fmt: str, block_m: int, block_k: int, *, round_sf: bool,
            precomputed_sf: bool) -> Callable[..., None]:
    return _kernel.select(in_dtype=dtype_name(x.dtype), hidden=int(x.shape[1]), fmt=fmt, block_m=block_m,
                          block_k=block_k, round_sf=round_sf, precomputed_sf=precomputed_sf)


def _cast(x: torch.Tensor, fmt: str, block_m: int, block_k: int, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The custom op's body: a launch into fresh outputs."""
    q, sf = _outputs(x, fmt, block_m, block_k)
    _select(x, fmt, block_m, block_k, round_sf=round_sf, precomputed_sf=False)(x, q, sf)
    return q, sf


def _q_output(x: torch.Tensor, sf: torch.Tensor, fmt: str, block_m: int, block_k: int) -> torch.Tensor:
    """Uninitialised q for x; also the fake kernel of the precomputed-sf op."""
    return _codes(x, fmt)


def _cast_with_sf(x: torch.Tensor, sf: torch.Tensor, fmt: str, block_m: int, block_k: int) -> torch.Tensor:
    """The custom op's body: q = x * (1 / sf) per block into a fresh q (the launcher checks sf, an input here)."""
    q = _q_output(x, sf, fmt, block_m, block_k)
    _select(x, fmt, block_m, block_k, round_sf=False, precomputed_sf=True)(x, q, sf)
    return q


# What torch.compile sees: one opaque op, torch.ops.<package>.per_block_cast, with a fixed schema.
_per_block_cast_op = custom_op("per_block_cast", fake=_outputs)(_cast)
_per_block_cast_with_sf_op = custom_op("per_block_cast_with_precomputed_sf", fake=_q_output)(_cast_with_sf)


# Eager calls on a 2-D x, keyed by what the checks and select read: (x.dtype, hidden, fmt,
# block_size, the three flags) -> the launcher. A key is stored only after the checks passed and
# the launcher accepted the call, so a hit skips both; the launcher checks every tensor on every
# call (the contract ties all their sizes to x's tokens and the variant's hidden), and where it
# refuses one the checks run, to name it. Only options of exactly the types str, bool and (for
# block_size) a tuple of two ints are keyed: (128.0, 128) == (128, 128) hashes alike, but
# _block_size refuses the float (and True for 1). Bounded by the signatures a program uses.
_CASTS: dict[tuple[object, ...], Callable[..., None]] = {}
# The same for per_block_cast_with_precomputed_sf, whose variants are others (precomputed_sf).
_GIVEN: dict[tuple[object, ...], Callable[..., None]] = {}
# per_block_cast(x, ..., out=(q, sf)) in one C call (_runtime.dispatch): keyed by x's dtype and width
# and the options as given, which is all the checks read; the launcher's contract ties every size to
# x's tokens and the variant's hidden, so no rule is left to restate. An allocating call (out None)
# has dispatch() allocate (q, sf) as _outputs does: q T rows, sf ceil(T / block_m) rows.
_FAST = fast_path(inputs=((1,),), outputs=2)
# per_block_cast_with_precomputed_sf(x, ..., sf, out=q) likewise: keyed by x's dtype and width, sf's
# dtype and rank and the options; the contract checks sf (an input here) as it checks q. Allocating:
# q of T rows, as _codes allocates it.
_FAST_GIVEN = fast_path(inputs=((1,), ()), outputs=1)


def _key(x: object, fmt: object, block_size: object, use_tma_aligned_col_major_sf: object, round_sf: object,
         use_packed_ue8m0: object) -> tuple[object, ...] | None:
    """The cache key of an eager call on a 2-D tensor x with plainly typed options; None for anything else
    (a call while compiling included). A None key is never stored: its lookup misses."""
    if torch.compiler.is_compiling() or not (
            isinstance(x, torch.Tensor) and x.dim() == 2 and type(fmt) is str and type(block_size) is tuple
            and len(block_size) == 2 and type(block_size[0]) is int and type(block_size[1]) is int
            and type(use_tma_aligned_col_major_sf) is bool and type(round_sf) is bool
            and type(use_packed_ue8m0) is bool):
        return None
    return (x.dtype, x.shape[1], fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


def _launched(launch: Callable[..., None], x: torch.Tensor, q: torch.Tensor, sf: torch.Tensor,
              key: tuple[object, ...] | None, cache: dict[tuple[object, ...], Callable[..., None]]) -> None:
    """launch(x, q, sf), then launch stored under key (None: a call not cached): it accepted the call."""
    launch(x, q, sf)
    if key is not None:
        cache[key] = launch


def _remember_fast(launch: Callable[..., None], result: tuple[torch.Tensor, torch.Tensor], block_m: int,
                   *call: object) -> None:
    """Let dispatch() take later per_block_cast calls like ``call`` (x, out, options), which returned ``result``;
    an allocating call (out None) allocates (q, sf) as it did: T and ceil(T / block_m) rows (widths keyed)."""
    q, sf = result
    remember(_FAST, launch, (from_input(0), from_out(0), from_out(1)), (), *call,
             outputs=(output(q.dtype, size_of(0, 0), q.shape[1]),
                      output(sf.dtype, size_of(0, 0, plus=block_m - 1, per=block_m), sf.shape[1])))


def _remember_given(launch: Callable[..., None], q: torch.Tensor, *call: object) -> None:
    """Let dispatch() take later per_block_cast_with_precomputed_sf calls like ``call`` (x, sf, out, options),
    which returned ``q``; an allocating call (out None) allocates q as it did: T rows (width keyed)."""
    remember(_FAST_GIVEN, launch, (from_input(0), from_out(0), from_input(1)), (), *call,
             outputs=(output(q.dtype, size_of(0, 0), q.shape[1]),))


def _block_size(block_size: object) -> tuple[int, int]:
    try:
        block_m, block_k = block_size  # type: ignore[misc]
        if isinstance(block_m, bool) or isinstance(block_k, bool):
            raise TypeError
        block_m, block_k = operator.index(block_m), operator.index(block_k)
    except (TypeError, ValueError):
        raise TypeError(f"block_size: expected a pair of ints (block_m, block_k), got {block_size!r}") from None
    if block_m <= 0 or block_k <= 0:
        raise ValueError(f"block_size: expected positive sizes, got {block_size!r}")
    return block_m, block_k


def _checked(
    x: object, fmt: str, block_size: object, use_tma_aligned_col_major_sf: bool, use_packed_ue8m0: bool
) -> tuple[int, int]:
    """Check the arguments every form shares; returns (block_m, block_k)."""
    if isinstance(x, tuple):
        raise _not_built("x", "re-quantization of a (data, sf) pair")
    x = matrix("x", x)
    one_of("fmt", fmt, _FORMATS)
    block_m, block_k = _block_size(block_size)
    if use_tma_aligned_col_major_sf:
        raise _not_built("use_tma_aligned_col_major_sf", "the column-major TMA-aligned scale layout")
    if use_packed_ue8m0:
        raise _not_built("use_packed_ue8m0", "the packed UE8M0 scale layout")
    hidden = int(x.shape[1])
    if hidden % 64 != 0:
        raise ValueError(f"x: hidden ({hidden}) must be a multiple of 64")
    if hidden % block_k != 0:
        raise ValueError(f"block_size: hidden ({hidden}) must be a multiple of block_k ({block_k})")
    return block_m, block_k


def per_block_cast(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast x (num_tokens, hidden) to FP8/FP4 with one scale per (block_m, block_k) block.

    Args:
        x: bf16 CUDA tensor of shape (num_tokens, hidden), contiguous; hidden % 64 == 0;
            num_tokens at most 65535 * block_m (the row tiles are the grid's y dimension;
            beyond, the launcher raises naming the grid).
        fmt: ``'e4m3'`` (FP8) or ``'e2m1'`` (FP4, two codes per int8).
        block_size: ``(block_m, block_k)``: tokens and channels sharing one scale factor,
            each 32 or 128.
        use_tma_aligned_col_major_sf: column-major, TMA-aligned scales; not built (must be False).
        round_sf: round each scale up to a power of two.
        use_packed_ue8m0: UE8M0 exponents packed into int32; not built (must be False).
        out: ``(q, sf)`` to write into instead of allocating, each exactly as this call would
            return it (dtype, shape, contiguous; e.g. the pair of an earlier call), not
            overlapping x. Every element is written. Returned as given.

    Returns:
        ``(q, sf)``: q is float8_e4m3fn (num_tokens, hidden) for e4m3, or int8
        (num_tokens, hidden / 2) for e2m1 (element 2i in the low nibble, 2i + 1 in the high
        one); sf is float32 (ceil(num_tokens / block_m), hidden / block_k), row-major, so that
        ``decode(q) * sf`` (per block) approximates x.
    """
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        done = dispatch(_FAST, x, out, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
        if done is not None:
            return done  # type: ignore[no-any-return]
    key = _key(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    launch = _CASTS.get(key)
    if launch is not None:
        q, sf = _outputs(x, fmt, *block_size) if out is None else out_tensors(out, ("q", "sf"))  # type: ignore[arg-type]
        try:
            launch(x, q, sf)
        except KernelArgumentError:
            pass  # the checks below name what is wrong
        else:  # dispatch() had not seen it, or declined; block_size is a pair of ints here (keyed)
            _remember_fast(launch, (q, sf), block_size[0], x, out, fmt, block_size, use_tma_aligned_col_major_sf,
                           round_sf, use_packed_ue8m0)
            return q, sf
    block_m, block_k = _checked(x, fmt, block_size, use_tma_aligned_col_major_sf, use_packed_ue8m0)
    if torch.compiler.is_compiling():  # torch.compile sees a pure op, its result copied into out
        result = _per_block_cast_op(x, fmt, block_m, block_k, bool(round_sf))
        return result if out is None else copied_into(out, ("q", "sf"), result)
    q, sf = _outputs(x, fmt, block_m, block_k) if out is None else out_tensors(out, ("q", "sf"))
    launch = _select(x, fmt, block_m, block_k, round_sf=bool(round_sf), precomputed_sf=False)
    _launched(launch, x, q, sf, key, _CASTS)
    _remember_fast(launch, (q, sf), block_m, x, out, fmt, block_size, use_tma_aligned_col_major_sf, round_sf,
                   use_packed_ue8m0)
    return q, sf


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
    return per_block_cast(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)[1]


def per_block_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    sf: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cast x with given per-block scales: q = x_f32 * (1 / sf) per block (1 / sf an IEEE division).

    Args:
        x: bf16 CUDA tensor of shape (num_tokens, hidden), contiguous; hidden % 64 == 0;
            num_tokens at most 65535 * block_m, as for ``per_block_cast``.
        fmt: ``'e4m3'`` (FP8) or ``'e2m1'`` (FP4, two codes per int8).
        block_size: ``(block_m, block_k)``, each 32 or 128.
        sf: float32 (ceil(num_tokens / block_m), hidden / block_k), contiguous, e.g. from
            ``per_block_cast_with_sf_only``; used as given.
        use_tma_aligned_col_major_sf: not built (must be False).
        round_sf: has no effect: sf is used as given (as in TileKernels).
        use_packed_ue8m0: not built (must be False).
        out: a contiguous q of this call's dtype and shape to write into instead of allocating
            (not overlapping x or sf), returned as given.

    Returns:
        q: float8_e4m3fn (num_tokens, hidden) or packed FP4 int8 (num_tokens, hidden / 2).
    """
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        done = dispatch(_FAST_GIVEN, x, sf, out, fmt, block_size, use_tma_aligned_col_major_sf, round_sf,
                        use_packed_ue8m0)
        if done is not None:
            return done  # type: ignore[no-any-return]
    key = _key(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    launch = _GIVEN.get(key)
    if launch is not None:
        q = _codes(x, fmt) if out is None else out_tensors(out, ("q",))[0]
        try:
            launch(x, q, sf)
        except KernelArgumentError:
            pass  # the checks below name what is wrong
        else:  # dispatch() had not seen it, or declined
            _remember_given(launch, q, x, sf, out, fmt, block_size, use_tma_aligned_col_major_sf, round_sf,
                            use_packed_ue8m0)
            return q
    block_m, block_k = _checked(x, fmt, block_size, use_tma_aligned_col_major_sf, use_packed_ue8m0)
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"sf: expected a float32 torch.Tensor of per-block scales, got {type(sf).__name__}")
    if torch.compiler.is_compiling():
        q = _per_block_cast_with_sf_op(x, sf, fmt, block_m, block_k)
        return q if out is None else out_tensors(out, ("q",))[0].copy_(q)
    q = _q_output(x, sf, fmt, block_m, block_k) if out is None else out_tensors(out, ("q",))[0]
    # The launcher checks sf's dtype, shape and layout (an input here) and out's as q's.
    launch = _select(x, fmt, block_m, block_k, round_sf=False, precomputed_sf=True)
    _launched(launch, x, q, sf, key, _GIVEN)
    _remember_given(launch, q, x, sf, out, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    return q
