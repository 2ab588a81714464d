"""modeling.mhc.ops.sinkhorn: TileKernels' ``sinkhorn_normalize`` with autograd, over ``mhc.sinkhorn_normalize``."""

from __future__ import annotations

from typing import Any

import torch

from ....mhc import sinkhorn_normalize as _sinkhorn_normalize
from ....mhc import sinkhorn_normalize_bwd

__all__ = ["sinkhorn_normalize"]


class _SinkhornNormalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.repeat, ctx.eps = repeat, eps
        return _sinkhorn_normalize(x, repeat, eps)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (x,) = ctx.saved_tensors
        return sinkhorn_normalize_bwd(grad_output.contiguous(), x, ctx.repeat, ctx.eps), None, None


def sinkhorn_normalize(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """Sinkhorn normalization of (..., m, m) fp32 matrices, with autograd (TileKernels' ``sinkhorn_normalize``)."""
    return _SinkhornNormalize.apply(x.contiguous(), repeat, eps)  # type: ignore[no-any-return]
