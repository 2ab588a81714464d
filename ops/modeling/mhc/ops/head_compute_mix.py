"""modeling.mhc.ops.head_compute_mix: TileKernels' ``mhc_head_compute_mix`` with autograd."""

from __future__ import annotations

from typing import Any

import torch

from ....mhc import mhc_head_compute_mix as _mhc_head_compute_mix
from ....mhc import mhc_head_compute_mix_bwd

__all__ = ["MHCHeadComputeMix", "mhc_head_compute_mix"]


class MHCHeadComputeMix(torch.autograd.Function):
    """sigmoid(mix * scale + base) + pre_eps: see ``mhc.mhc_head_compute_mix``."""

    @staticmethod
    def forward(ctx: Any, input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                mhc_pre_eps: float) -> torch.Tensor:
        ctx.save_for_backward(input_mix, mhc_scale, mhc_base)
        return _mhc_head_compute_mix(input_mix, mhc_scale, mhc_base, mhc_pre_eps)  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, output_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        input_mix, mhc_scale, mhc_base = ctx.saved_tensors
        grads = mhc_head_compute_mix_bwd(output_grad.contiguous(), input_mix, mhc_scale, mhc_base)
        return (*grads, None)


def mhc_head_compute_mix(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                         mhc_pre_eps: float) -> torch.Tensor:
    """The head's mix, with autograd (TileKernels' ``mhc_head_compute_mix``)."""
    return MHCHeadComputeMix.apply(input_mix, mhc_scale, mhc_base, mhc_pre_eps)  # type: ignore[no-any-return]
