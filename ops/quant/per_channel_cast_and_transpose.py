"""Per-channel FP8 e4m3 cast of x (num_tokens, hidden) written transposed, q (hidden, num_tokens).

The public API follows TileKernels' ``tile_kernels.quant.per_channel_cast_and_transpose``: one
fp32 scale per channel and group of 32 or 128 tokens, sf (num_tokens / npt, hidden) row-major.
The launcher validates the tensors (dtype, device, shape, strides, alignment) and names the
argument in its errors; this module checks the non-tensor arguments and the sizes TileKernels
requires. That num_tokens is a multiple of the kernel's tile, which the launcher's contract only
reads (sf's rows are num_tokens // npt there), is a rule of the launch: dispatch() checks it on
every call it replays.
"""

from __future__ import annotations

import torch

from .._args import matrix, one_of, positive_int
from .._op import Plan, empty, launch, multiple, op, out, size
from .._runtime import get_kernel

__all__ = ["per_channel_cast_and_transpose"]

_kernel = get_kernel("per_channel_cast_and_transpose")

TOKEN_TILE = 128  # num_tokens must be a multiple of the kernel's tile height
_NUM_PER_TOKENS = (32, 128)


@op(outputs=("q", "sf"), inputs={"x": (1,)})
def per_channel_cast_and_transpose(x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False) -> Plan:
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
    # The variants take any hidden (grid value 0: the tiles do not depend on it).
    launcher = _kernel.variant(0, npt, bool(round_sf))
    return launch(launcher, x, out(0), out(1),
                  outputs=(empty(torch.float8_e4m3fn, hidden, size(x, 0)),
                           empty(torch.float32, size(x, 0, per=npt), hidden)),
                  rules=(multiple("x", x, 0, TOKEN_TILE),))
