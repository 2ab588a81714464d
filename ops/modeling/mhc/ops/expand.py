"""modeling.mhc.ops.expand: TileKernels' ``expand_to_mhc`` with autograd, over ``mhc.expand_to_mhc``."""

from __future__ import annotations

from typing import Any

import torch

from ....mhc import expand_to_mhc as _expand_to_mhc
from ....mhc import expand_to_mhc_bwd

__all__ = ["ExpandToMHCFn", "expand_to_mhc"]


class ExpandToMHCFn(torch.autograd.Function):
    """hidden (..., H) -> (..., mhc_mult, H) copies; the backward sums the streams."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None) -> torch.Tensor:
        return _expand_to_mhc(hidden, mhc_mult) if out is None else _expand_to_mhc(hidden, mhc_mult, out=out)

    @staticmethod
    def backward(ctx: Any, out_grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return expand_to_mhc_bwd(out_grad.contiguous()), None, None


def expand_to_mhc(hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``hidden`` copied into ``mhc_mult`` streams, with autograd (TileKernels' ``expand_to_mhc``)."""
    return ExpandToMHCFn.apply(hidden, mhc_mult, out)  # type: ignore[no-any-return]
