"""Per-channel FP8 e4m3 cast of x (num_tokens, hidden) written transposed, q (hidden, num_tokens).

The public API follows TileKernels' ``tile_kernels.quant.per_channel_cast_and_transpose``: one
fp32 scale per channel and group of 32 or 128 tokens, sf (num_tokens / npt, hidden) row-major.
The launcher validates the tensors (dtype, device, shape, strides, alignment) and names the
argument in its errors; this module checks the non-tensor arguments and the sizes TileKernels
requires.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._args import copied_into, matrix, one_of, out_tensors, positive_int
from .._runtime import (
    custom_op,
    dispatch,
    fast_path,
    from_input,
    from_out,
    get_kernel,
    output,
    remember,
    size_multiple,
    size_of,
)
from ..errors import KernelArgumentError

__all__ = ["per_channel_cast_and_transpose"]

_kernel = get_kernel("per_channel_cast_and_transpose")

TOKEN_TILE = 128  # num_tokens must be a multiple of the kernel's tile height
_NUM_PER_TOKENS = (32, 128)


def _outputs(x: torch.Tensor, npt: int, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf); also the fake (meta) kernel that torch.compile traces with."""
    num_tokens, hidden = x.shape
    q = x.new_empty((hidden, num_tokens), dtype=torch.float8_e4m3fn)
    sf = x.new_empty((num_tokens // npt, hidden), dtype=torch.float32)
    return q, sf


def _cast(x: torch.Tensor, npt: int, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The custom op's body: a launch into fresh outputs."""
    return _launch(x, npt, round_sf, None)


def _launch(x: torch.Tensor, npt: int, round_sf: bool, out: object, key: tuple[object, ...] | None = None,
            options: tuple[object, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the variant and launch it into fresh (q, sf), or into out's; the launcher checks every
    tensor (out's too, overlaps included) and names it in errors. The launcher is then stored
    under key (None: a call not cached) and remembered for dispatch() under the call's options as
    given (None: not remembered)."""
    launch = _kernel.select(hidden=int(x.shape[1]), npt=npt, round_sf=round_sf)
    q, sf = _outputs(x, npt, round_sf) if out is None else out_tensors(out, ("q", "sf"))
    launch(x, q, sf)
    if key is not None:  # the launcher accepted the call: later ones of its signature may skip the checks
        _LAUNCHERS[key] = (launch, npt)
    if options is not None:
        _remember_fast(launch, (q, sf), npt, x, out, *options)
    return q, sf


def _remember_fast(launch: Callable[..., None], result: tuple[torch.Tensor, torch.Tensor], npt: int,
                   *call: object) -> None:
    """Let dispatch() take later calls like ``call`` (x, out, options; see _FAST), which returned ``result``;
    an allocating call (out None) allocates (q, sf) as it did: q (hidden, T), sf (T // npt, hidden), hidden keyed."""
    q, sf = result
    remember(_FAST, launch, (from_input(0), from_out(0), from_out(1)), (size_multiple(0, 0, TOKEN_TILE),), *call,
             outputs=(output(q.dtype, q.shape[0], size_of(0, 0)),
                      output(sf.dtype, size_of(0, 0, per=npt), sf.shape[1])))


# What torch.compile sees: one opaque op, torch.ops.<package>.per_channel_cast_and_transpose.
_transpose_op = custom_op("per_channel_cast_and_transpose", fake=_outputs)(_cast)


# Eager calls on a 2-D x, keyed by what the checks and select read: (x.dtype, hidden, fmt,
# num_per_tokens, round_sf) -> (the launcher, npt). A key is stored only after the checks passed
# and the launcher accepted the call, so a hit skips both; the launcher checks every tensor on
# every call (sf's rows are num_tokens // npt in the contract), and where it refuses one the
# checks run, to name it. That num_tokens is a multiple of the tile, which the launcher cannot
# see, is checked on every hit. Only options of exactly the types str, int and bool are keyed:
# 128.0 == 128 and True == 1 hash alike, but positive_int refuses the float and the bool.
_LAUNCHERS: dict[tuple[object, ...], tuple[Callable[..., None], int]] = {}
# per_channel_cast_and_transpose(x, ..., out=(q, sf)) in one C call (_runtime.dispatch): keyed by
# x's dtype and width and the options as given, checked by the launcher's contract and
# num_tokens % TOKEN_TILE (which the contract only reads; sf's rows are num_tokens // npt there).
# An allocating call (out None) has dispatch() allocate (q, sf) as _outputs does.
_FAST = fast_path(inputs=((1,),), outputs=2)


def per_channel_cast_and_transpose(
    x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False, *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast x to FP8 with one scale per channel and ``num_per_tokens`` tokens, transposing the codes.

    Args:
        x: bf16 CUDA tensor (num_tokens, hidden), contiguous; num_tokens % 128 == 0,
            hidden % 64 == 0.
        fmt: ``'e4m3'``.
        num_per_tokens: tokens sharing one scale: 32 or 128.
        round_sf: round each scale up to a power of two.
        out: ``(q, sf)`` to write into instead of allocating, each exactly as this call would
            return it (dtype, shape, contiguous: q (hidden, num_tokens)), not overlapping x.
            Every element is written. Returned as given.

    Returns:
        ``(q, sf)``: q float8_e4m3fn (hidden, num_tokens), contiguous; sf float32
        (num_tokens / num_per_tokens, hidden), so that ``q[h, t] * sf[t // npt, h]``
        approximates x[t, h]. NaN inputs are left out of the scales and give NaN codes.
    """
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        done = dispatch(_FAST, x, out, fmt, num_per_tokens, round_sf)
        if done is not None:
            return done  # type: ignore[no-any-return]
    key = None
    if not torch.compiler.is_compiling() and isinstance(x, torch.Tensor) and x.dim() == 2 and type(fmt) is str \
            and type(num_per_tokens) is int and type(round_sf) is bool:
        key = (x.dtype, x.shape[1], fmt, num_per_tokens, round_sf)
        hit = _LAUNCHERS.get(key)
        if hit is not None and x.shape[0] % TOKEN_TILE == 0:
            launch, npt = hit
            q, sf = _outputs(x, npt, round_sf) if out is None else out_tensors(out, ("q", "sf"))
            try:
                launch(x, q, sf)
            except KernelArgumentError:
                pass  # the checks below name what is wrong
            else:  # dispatch() had not seen it, or declined
                _remember_fast(launch, (q, sf), npt, x, out, fmt, num_per_tokens, round_sf)
                return q, sf
    x = matrix("x", x)
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x: expected bfloat16, got {x.dtype}")
    one_of("fmt", fmt, ("e4m3",))
    npt = positive_int("num_per_tokens", num_per_tokens)
    if npt not in _NUM_PER_TOKENS:
        raise ValueError(f"num_per_tokens: expected 32 or 128, got {npt}")
    num_tokens, hidden = int(x.shape[0]), int(x.shape[1])
    if num_tokens % TOKEN_TILE != 0:
        raise ValueError(f"x: num_tokens ({num_tokens}) must be a multiple of {TOKEN_TILE}")
    if hidden % 64 != 0:
        raise ValueError(f"x: hidden ({hidden}) must be a multiple of 64")
    if torch.compiler.is_compiling():
        result = _transpose_op(x, npt, bool(round_sf))
        return result if out is None else copied_into(out, ("q", "sf"), result)
    return _launch(x, npt, bool(round_sf), out, key, (fmt, num_per_tokens, round_sf))
