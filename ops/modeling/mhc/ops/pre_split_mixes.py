"""modeling.mhc.ops.pre_split_mixes: TileKernels' ``mhc_pre_split_mixes`` with autograd."""

from __future__ import annotations

from typing import Any

import torch

from ....mhc import mhc_pre_split_mixes as _mhc_pre_split_mixes
from ....mhc import mhc_pre_split_mixes_bwd

__all__ = ["MHCPreSplitMixes", "mhc_pre_split_mixes"]


class MHCPreSplitMixes(torch.autograd.Function):
    """The layer's mixes split into (pre, post, comb): see ``mhc.mhc_pre_split_mixes``."""

    @staticmethod
    def forward(ctx: Any, input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int,
                mhc_post_mult_value: float, mhc_pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(input_mixes, mhc_scale, mhc_base)
        ctx.mhc_mult, ctx.mhc_post_mult_value = mhc_mult, mhc_post_mult_value
        return _mhc_pre_split_mixes(  # type: ignore[no-any-return]
            input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)

    @staticmethod
    def backward(ctx: Any, pre_grad: torch.Tensor, post_grad: torch.Tensor,
                 comb_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:
        input_mixes, mhc_scale, mhc_base = ctx.saved_tensors
        grads = mhc_pre_split_mixes_bwd(pre_grad.contiguous(), post_grad.contiguous(), comb_grad.contiguous(),
                                        input_mixes, mhc_scale, mhc_base, ctx.mhc_mult, ctx.mhc_post_mult_value)
        return (*grads, None, None, None)


def mhc_pre_split_mixes(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int,
                        mhc_post_mult_value: float, mhc_pre_eps: float
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre, post, comb) from the layer's mixes, with autograd (TileKernels' ``mhc_pre_split_mixes``)."""
    return MHCPreSplitMixes.apply(  # type: ignore[no-any-return]
        input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)
