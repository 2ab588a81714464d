"""modeling.mhc.ops.post: TileKernels' ``mhc_post`` with autograd, and its ``mhc_post_fwd`` / ``mhc_post_bwd``.

TileKernels' modeling module re-exports its kernels' ``mhc_post_fwd`` and ``mhc_post_bwd``; here they are
``mhc.mhc_post_fwd`` (``out`` positional, as there) and ``mhc.mhc_post_bwd`` plus ``fuse_grad_acc``: the
residual's gradient is left on residual's storage (``grad_from_mhc_post``), where the backward of
``mhc_pre_apply_mix`` over the same streams adds its own gradient to it.
"""

from __future__ import annotations

from typing import Any

import torch

from ...._args import storage_gradients
from ....mhc import mhc_post_bwd as _mhc_post_bwd
from ....mhc import mhc_post_fwd as _mhc_post_fwd

__all__ = ["MHCPost", "mhc_post", "mhc_post_bwd", "mhc_post_fwd"]


def mhc_post_fwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """The streams after the layer, in bf16 (TileKernels' ``mhc_post_fwd``; see ``mhc.mhc_post_fwd``)."""
    if out is None:
        return _mhc_post_fwd(x, residual.contiguous(), post_layer_mix, comb_res_mix)  # type: ignore[no-any-return]
    return _mhc_post_fwd(x, residual.contiguous(), post_layer_mix, comb_res_mix,  # type: ignore[no-any-return]
                         out=out)


def mhc_post_bwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                 d_o: torch.Tensor, fuse_grad_acc: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of ``mhc_post_fwd`` by x, residual, post_layer_mix and comb_res_mix (TileKernels'
    ``mhc_post_bwd``); with ``fuse_grad_acc`` the residual's gradient is also left on residual's storage."""
    grads = _mhc_post_bwd(x, residual, post_layer_mix, comb_res_mix, d_o.contiguous())
    if storage_gradients(fuse_grad_acc):
        residual.untyped_storage().grad_from_mhc_post = grads[1]  # type: ignore[attr-defined]
    return grads  # type: ignore[no-any-return]


class MHCPost(torch.autograd.Function):
    """post * x + comb^T residual per token, in bf16: see ``mhc.mhc_post_fwd``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
                comb_res_mix: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        result = mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix, out)
        ctx.save_for_backward(x, residual, post_layer_mix, comb_res_mix)
        return result

    @staticmethod
    def backward(ctx: Any, d_o: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, None]:
        x, residual, post_layer_mix, comb_res_mix = ctx.saved_tensors
        return (*mhc_post_bwd(x, residual, post_layer_mix, comb_res_mix, d_o), None)


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """The streams after the layer, with autograd (TileKernels' ``mhc_post``)."""
    return MHCPost.apply(x, residual, post_layer_mix, comb_res_mix, out)  # type: ignore[no-any-return]
