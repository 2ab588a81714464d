"""SwiGLU forward fused with a per-channel FP8 cast and a transpose
(TileKernels' ``swiglu_forward_and_per_channel_cast_and_transpose``).

act = bf16(min(xl, c) * sigmoid(min(xl, c)) * clamp(xr, -c, c)), then one e4m3 scale per
channel and group of num_per_tokens tokens; q is stored (hidden, num_tokens), or
(num_tokens, hidden) with without_transpose. A NaN in x stays NaN through the clamps (as
torch.clamp) and gets the e4m3 NaN code; a group's scale skips it (as TileKernels' kernels).
The launcher validates every tensor and names it
in its errors; this module checks the other arguments.
"""

from __future__ import annotations

import math
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
    same_size,
    size_multiple,
    size_of,
)
from ..errors import KernelArgumentError

__all__ = ["swiglu_forward_and_per_channel_cast_and_transpose"]

_kernel = get_kernel("swiglu_forward_and_per_channel_cast_and_transpose")


def _outputs(x: torch.Tensor, npt: int, round_sf: bool, without_transpose: bool,
             clamp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf); also the fake (meta) kernel that torch.compile traces with."""
    num_tokens, hidden = int(x.shape[0]), int(x.shape[1]) // 2
    shape = (num_tokens, hidden) if without_transpose else (hidden, num_tokens)
    q = x.new_empty(shape, dtype=torch.float8_e4m3fn)
    sf = x.new_empty((num_tokens // npt, hidden), dtype=torch.float32)
    return q, sf


def _launch(x: torch.Tensor, npt: int, round_sf: bool, without_transpose: bool,
            clamp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The custom op's body: a launch into fresh outputs."""
    return _run(x, npt, round_sf, without_transpose, clamp, None)


def _run(x: torch.Tensor, npt: int, round_sf: bool, without_transpose: bool, clamp: float,
         out: object, key: tuple[object, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the variant and launch it into fresh (q, sf), or into out's; the launcher checks every
    tensor (out's too, overlaps included) and names it in errors. The launcher is then stored
    under key (None: a call not cached)."""
    launch = _kernel.select(hidden=int(x.shape[1]) // 2, npt=npt, without_transpose=without_transpose)
    q, sf = _outputs(x, npt, round_sf, without_transpose, clamp) if out is None else _out_pair(out, x, npt)
    # With no token there is nothing to write, and torch gives the empty (hidden, 0) q the
    # strides (1, 1) rather than the (0, 1) the launcher checks.
    if x.shape[0] > 0:
        round_flag = int(round_sf)
        launch(x, q, sf, clamp, round_flag)
        if key is not None:  # the launcher accepted the call: later ones of its signature may skip the checks
            _CALLS[key] = (launch, npt, without_transpose, clamp, round_flag)
    return q, sf


def _out_pair(out: object, x: torch.Tensor, npt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """out's (q, sf), or an error naming out or sf.

    The kernel's grid has one row of blocks per row of sf (num_token_groups, a size of its own in
    the contract), each reading npt rows of x and writing them to q: sf must have exactly
    num_tokens / npt rows, which the launcher cannot see.
    """
    q, sf = out_tensors(out, ("q", "sf"))
    groups = x.shape[0] // npt
    if sf.dim() != 2 or sf.shape[0] != groups:
        raise KernelArgumentError(f"sf: expected {groups} rows (num_tokens / num_per_tokens), got shape "
                                  f"{tuple(sf.shape)}")
    return q, sf


# What torch.compile sees: one opaque op with a fixed schema.
_swiglu_per_channel_op = custom_op("swiglu_forward_and_per_channel_cast_and_transpose", fake=_outputs)(_launch)


# Eager calls, keyed by what the checks and select read: (x.dtype, x's width, fmt,
# num_per_tokens, round_sf, without_transpose, swiglu_clamp_value) -> (the launcher, npt,
# without_transpose, its clamp, its round_sf flag). A key is stored only after the checks passed
# and the launcher accepted the call, so a hit skips both; the launcher checks every tensor on
# every call, and where it refuses one the checks run, to name it. What the launcher cannot see
# is checked on every hit: that num_tokens is a multiple of 128 (and not 0: nothing is launched
# then), and out's sf rows (_out_pair). Only options of exactly the types str, int, bool and (the
# clamp) None or float are keyed: 128.0 == 128 and True == 1 hash alike, but positive_int refuses
# the float and the bool.
_CALLS: dict[tuple[object, ...], tuple[Callable[..., None], int, bool, float, int]] = {}
# The same calls in one C call (_runtime.dispatch): keyed by x's dtype and width and the options as
# passed; the launcher's contract checks every tensor, and the rules are what _run_cached checks on
# a hit: num_tokens a multiple of 128 and sf's rows num_tokens / npt. (With no token the contract
# still checks q, where the Python path launches nothing and checks nothing: a refused empty q only
# sends the call down that path.) An allocating call (out None) has dispatch() allocate (q, sf) as
# _outputs does.
_FAST = fast_path(inputs=((1,),), outputs=2)


def _remember_fast(hit: tuple[Callable[..., None], int, bool, float, int], result: tuple[torch.Tensor, torch.Tensor],
                   x: torch.Tensor, out: object, *options: object) -> None:
    """Let dispatch() take later calls like this one (options: those after out in its dispatch call), which
    returned ``result``; an allocating call (out None) allocates (q, sf) as it did: q (hidden, T) or, without
    the transpose, (T, hidden), and sf (T // npt, hidden), hidden keyed."""
    launch, npt, without_transpose, clamp, round_flag = hit
    q, sf = result
    q_dims = (size_of(0, 0), q.shape[1]) if without_transpose else (q.shape[0], size_of(0, 0))
    remember(_FAST, launch, (from_input(0), from_out(0), from_out(1), clamp, round_flag),
             (size_multiple(0, 0, 128), same_size(2, 0, 0, 0, times=npt)), x, out, *options,
             outputs=(output(q.dtype, *q_dims), output(sf.dtype, size_of(0, 0, per=npt), sf.shape[1])))


def _key(x: object, fmt: object, num_per_tokens: object, round_sf: object, without_transpose: object,
         swiglu_clamp_value: object) -> tuple[object, ...] | None:
    """The cache key of an eager call on a 2-D tensor x with plainly typed options; None for anything else
    (a call while compiling included). A None key is never stored: its lookup misses."""
    if torch.compiler.is_compiling() or not (
            isinstance(x, torch.Tensor) and x.dim() == 2 and type(fmt) is str and type(num_per_tokens) is int
            and type(round_sf) is bool and type(without_transpose) is bool
            and (swiglu_clamp_value is None or type(swiglu_clamp_value) is float)):
        return None
    return (x.dtype, x.shape[1], fmt, num_per_tokens, round_sf, without_transpose, swiglu_clamp_value)


def _run_cached(hit: tuple[Callable[..., None], int, bool, float, int], x: torch.Tensor,
                out: object) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The call through a cached launcher, or None where the checks must run (a number of tokens
    they refuse or that launches nothing, or tensors the launcher refused)."""
    num_tokens = x.shape[0]
    if num_tokens % 128 != 0 or num_tokens == 0:
        return None
    launch, npt, without_transpose, clamp, round_flag = hit
    q, sf = _outputs(x, npt, False, without_transpose, clamp) if out is None else _out_pair(out, x, npt)
    try:
        launch(x, q, sf, clamp, round_flag)
    except KernelArgumentError:
        return None
    return q, sf


def swiglu_forward_and_per_channel_cast_and_transpose(
    x: torch.Tensor,
    fmt: str,
    num_per_tokens: int,
    round_sf: bool = False,
    without_transpose: bool = False,
    swiglu_clamp_value: float | None = None,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SwiGLU of x's two halves, cast per channel (groups of tokens) to FP8 e4m3, transposed.

    Args:
        x: bf16 CUDA tensor (num_tokens, 2 * hidden), contiguous; num_tokens % 128 == 0,
            hidden % 64 == 0.
        fmt: ``'e4m3'``.
        num_per_tokens: tokens per scale: 32 or 128.
        round_sf: round each scale up to a power of two.
        without_transpose: return q as (num_tokens, hidden) instead of (hidden, num_tokens).
        swiglu_clamp_value: c > 0 or None: xl = min(xl, c), xr = clamp(xr, -c, c).
        out: ``(q, sf)`` to write into instead of allocating, each exactly as this call would
            return it (dtype, shape, contiguous: q (hidden, num_tokens), or (num_tokens, hidden)
            with without_transpose; sf with num_tokens / num_per_tokens rows), not overlapping x.
            Every element is written. Returned as given (q is not checked when num_tokens is 0:
            nothing is launched).

    Returns:
        ``(q, sf)``: q float8_e4m3fn (hidden, num_tokens) (or (num_tokens, hidden)), and sf
        float32 (num_tokens / num_per_tokens, hidden), with q * sf ~ act per group.
    """
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        done = dispatch(_FAST, x, out, fmt, num_per_tokens, round_sf, without_transpose, swiglu_clamp_value)
        if done is not None:
            return done  # type: ignore[no-any-return]
    options = (fmt, num_per_tokens, round_sf, without_transpose, swiglu_clamp_value)  # as dispatch() took them
    key = _key(x, fmt, num_per_tokens, round_sf, without_transpose, swiglu_clamp_value)
    hit = _CALLS.get(key)
    if hit is not None:
        result = _run_cached(hit, x, out)  # type: ignore[arg-type]
        if result is not None:  # dispatch() had not seen it, or declined
            _remember_fast(hit, result, x, out, *options)  # type: ignore[arg-type]
            return result
    x = matrix("x", x, "(num_tokens, 2 * hidden)")
    one_of("fmt", fmt, ("e4m3",))
    npt = positive_int("num_per_tokens", num_per_tokens)
    if npt not in (32, 128):
        raise ValueError(f"num_per_tokens: expected 32 or 128, got {npt}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x: expected dtype torch.bfloat16, got {x.dtype}")
    num_tokens, width = int(x.shape[0]), int(x.shape[1])
    if num_tokens % 128 != 0:
        raise ValueError(f"x: num_tokens ({num_tokens}) must be a multiple of 128")
    if width % 128 != 0:
        raise ValueError(f"x: the width 2 * hidden ({width}) must be a multiple of 128 (hidden % 64 == 0)")
    clamp = math.inf
    if swiglu_clamp_value is not None:
        clamp = float(swiglu_clamp_value)
        if not clamp > 0:  # also refuses NaN
            raise ValueError(f"swiglu_clamp_value: expected a positive float or None, got {swiglu_clamp_value!r}")

    args = (x, npt, bool(round_sf), bool(without_transpose), clamp)
    if torch.compiler.is_compiling():
        result = _swiglu_per_channel_op(*args)
        return result if out is None else copied_into(out, ("q", "sf"), result)
    result = _run(*args, out, key)
    if key in _CALLS:  # launched (with tokens) and stored under key
        _remember_fast(_CALLS[key], result, x, out, *options)  # type: ignore[index]
    return result
