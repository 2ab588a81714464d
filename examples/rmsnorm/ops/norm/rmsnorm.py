"""norm.rmsnorm: y = x * rsqrt(mean(x^2) + eps) * weight over the last dimension of bf16 rows."""

from __future__ import annotations

import torch

from .._args import matrix
from .._op import Plan, empty, launch, op, out, size
from .._runtime import get_kernel

__all__ = ["rmsnorm"]

_kernel = get_kernel("rmsnorm")


@op(outputs=("y",), inputs={"x": (1,), "weight": (0,)})
def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> Plan:
    """RMSNorm of each row of x (num_tokens, hidden), bf16, with a bf16 weight (hidden,)."""
    x = matrix("x", x, "(num_tokens, hidden)")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"eps: expected a non-negative float, got {eps!r}")
    return launch(_kernel.variant(int(x.shape[1])), x, weight, out(0), float(eps),
                  outputs=(empty(torch.bfloat16, size(x, 0), x.shape[1]),))
