"""SwiGLU forward fused with a per-channel FP8 cast and a transpose
(TileKernels' ``swiglu_forward_and_per_channel_cast_and_transpose``).

act = bf16(min(xl, c) * sigmoid(min(xl, c)) * clamp(xr, -c, c)), then one e4m3 scale per
channel and group of num_per_tokens tokens; q is stored (hidden, num_tokens), or
(num_tokens, hidden) with without_transpose. The launcher validates every tensor and names it
in its errors; this module checks the other arguments.
"""

from __future__ import annotations

import math

import torch

from .._args import copied_into, matrix, one_of, out_tensors, positive_int
from .._runtime import custom_op, get_kernel

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
         out: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the variant and launch it into fresh (q, sf), or into out's; the launcher checks every
    tensor (out's too, overlaps included) and names it in errors."""
    launch = _kernel.select(hidden=int(x.shape[1]) // 2, npt=npt, without_transpose=without_transpose)
    if out is None:
        q, sf = _outputs(x, npt, round_sf, without_transpose, clamp)
    else:
        q, sf = out_tensors(out, ("q", "sf"))
    # With no token there is nothing to write, and torch gives the empty (hidden, 0) q the
    # strides (1, 1) rather than the (0, 1) the launcher checks.
    if x.shape[0] > 0:
        launch(x, q, sf, clamp, int(round_sf))
    return q, sf


# What torch.compile sees: one opaque op with a fixed schema.
_swiglu_per_channel_op = custom_op("swiglu_forward_and_per_channel_cast_and_transpose", fake=_outputs)(_launch)


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
            with without_transpose), not overlapping x. Every element is written. Returned as
            given (not checked when num_tokens is 0: nothing is launched).

    Returns:
        ``(q, sf)``: q float8_e4m3fn (hidden, num_tokens) (or (num_tokens, hidden)), and sf
        float32 (num_tokens / num_per_tokens, hidden), with q * sf ~ act per group.
    """
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
    return _run(*args, out)
