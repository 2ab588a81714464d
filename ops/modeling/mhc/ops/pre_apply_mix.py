"""modeling.mhc.ops.pre_apply_mix: TileKernels' ``mhc_pre_apply_mix`` with autograd.

Where TileKernels accumulates the gradient of x into the tensor ``mhc_post`` left on x's storage
(``grad_from_mhc_post``), the sum is written back into that tensor and None returned for x, as there.
"""

from __future__ import annotations

from typing import Any

import torch

from ...._args import storage_gradients
from ....mhc import mhc_pre_apply_mix as _mhc_pre_apply_mix
from ....mhc import mhc_pre_apply_mix_bwd

__all__ = ["MHCPreApplyMix", "mhc_pre_apply_mix"]


class MHCPreApplyMix(torch.autograd.Function):
    """(x * mix).sum(-2) in bf16: see ``mhc.mhc_pre_apply_mix``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, mix)
        return _mhc_pre_apply_mix(x, mix) if out is None else _mhc_pre_apply_mix(x, mix, out=out)

    @staticmethod
    def backward(ctx: Any, o_grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor, None]:
        x, mix = ctx.saved_tensors
        accumulated = getattr(x.untyped_storage(), "grad_from_mhc_post", None) if storage_gradients(True) else None
        x_grad, mix_grad = mhc_pre_apply_mix_bwd(o_grad.contiguous(), x, mix, accumulated)
        if accumulated is not None:
            accumulated.copy_(x_grad)  # TileKernels adds into it in place and returns no gradient for x
            return None, mix_grad, None
        return x_grad, mix_grad, None


def mhc_pre_apply_mix(x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The layer input from the streams, with autograd (TileKernels' ``mhc_pre_apply_mix``)."""
    return MHCPreApplyMix.apply(x, mix, out)  # type: ignore[no-any-return]
