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

import torch

from .._args import matrix, one_of, out_tensors, positive_int
from .._op import Plan, Result, empty, launch, multiple, op, out, result, same_size, size
from .._runtime import get_kernel
from ..errors import KernelArgumentError

__all__ = ["swiglu_forward_and_per_channel_cast_and_transpose"]

_kernel = get_kernel("swiglu_forward_and_per_channel_cast_and_transpose")

_Q, _SF = out(0), out(1)  # (the plan's out parameter hides the function)


def _out_pair(out: object, x: torch.Tensor, npt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """out's (q, sf), or an error naming out or sf.

    The kernel's grid has one row of blocks per row of sf (num_token_groups, a size of its own in
    the contract), each reading npt rows of x and writing them to q: sf must have exactly
    num_tokens / npt rows, which the launcher cannot see (the plan's rule re-checks it on replay).
    """
    q, sf = out_tensors(out, ("q", "sf"))
    groups = x.shape[0] // npt
    if sf.dim() != 2 or sf.shape[0] != groups:
        raise KernelArgumentError(f"sf: expected {groups} rows (num_tokens / num_per_tokens), got shape "
                                  f"{tuple(sf.shape)}")
    return q, sf


@op(outputs=("q", "sf"), inputs={"x": (1,)})
def swiglu_forward_and_per_channel_cast_and_transpose(
    x: torch.Tensor,
    fmt: str,
    num_per_tokens: int,
    round_sf: bool = False,
    without_transpose: bool = False,
    swiglu_clamp_value: float | None = None,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Plan | Result:
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

    hidden = width // 2
    given = None if out is None else _out_pair(out, x, npt)
    if num_tokens == 0:
        # Nothing to write, and torch gives the empty (hidden, 0) q the strides (1, 1) rather
        # than the (0, 1) the launcher checks: nothing is launched.
        if given is not None:
            return result(given)
        q = x.new_empty((0, hidden) if without_transpose else (hidden, 0), dtype=torch.float8_e4m3fn)
        return result((q, x.new_empty((0, hidden), dtype=torch.float32)))
    q_dims = (size(x, 0), hidden) if without_transpose else (hidden, size(x, 0))
    # The variants take any hidden (grid value 0: the tiles do not depend on it).
    launcher = _kernel.variant(0, npt, bool(without_transpose))
    return launch(launcher, x, _Q, _SF, clamp, int(bool(round_sf)),
                  outputs=(empty(torch.float8_e4m3fn, *q_dims), empty(torch.float32, size(x, 0, per=npt), hidden)),
                  rules=(multiple("x", x, 0, 128), same_size("sf", _SF, 0, x, 0, times=npt)))
