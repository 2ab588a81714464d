"""modeling.mhc.ops.norm_fn: TileKernels' ``mhc_pre_norm_fn`` with autograd (``MHCPreNormFn``).

As in TileKernels, an RMSNorm weight is merged into the mix weights first (``fn * norm_weight``, an autograd
function of its own whose backward accumulates into ``main_grad`` where a parameter has one), and with
``fuse_grad_acc`` the residual's gradient is added to the tensor ``mhc_post`` left on residual's storage
(``grad_from_mhc_post``): the sum is written back into it, the attribute removed and None returned for the
residual, as there. Without that tensor the gradient is returned (TileKernels would raise).
"""

from __future__ import annotations

from typing import Any

import torch

from ...._args import storage_gradients
from ....mhc import mhc_pre_norm_fn_bwd, mhc_pre_norm_fn_fwd

__all__ = ["MHCPreNormFn", "mhc_pre_norm_fn"]


class _MHCFnNormwMerge(torch.autograd.Function):
    """fn * normw (fp32), TileKernels' merge of the RMSNorm weight into the mix weights."""

    @staticmethod
    def forward(ctx: Any, fn: torch.Tensor, normw: torch.Tensor) -> torch.Tensor:
        ctx.fn_main_grad = getattr(fn, "main_grad", None)
        ctx.normw_main_grad = getattr(normw, "main_grad", None)
        ctx.save_for_backward(fn, normw)
        return fn * normw

    @staticmethod
    def backward(ctx: Any, out_fn_grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        fn, normw = ctx.saved_tensors
        fn_grad: torch.Tensor | None = out_fn_grad * normw
        normw_grad: torch.Tensor | None = (out_fn_grad * fn).sum(0)
        if ctx.fn_main_grad is not None:
            ctx.fn_main_grad.add_(fn_grad)
            fn_grad = None
        if ctx.normw_main_grad is not None:
            ctx.normw_main_grad.add_(normw_grad)
            normw_grad = None
        return fn_grad, normw_grad


class MHCPreNormFn(torch.autograd.Function):
    """The raw mixes (x . round_to_tf32(fn)^T) * rsqrt(mean(x^2) + eps): see ``mhc.mhc_pre_norm_fn_fwd``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fn: torch.Tensor, norm_eps: float, fuse_grad_acc: bool,
                n_splits: int) -> torch.Tensor:
        mixes, fn_eff, dots_sum, sqrsum = mhc_pre_norm_fn_fwd(x, fn, None, norm_eps)
        ctx.save_for_backward(x, fn_eff, dots_sum, sqrsum)
        ctx.norm_eps = norm_eps
        ctx.fuse_grad_acc = fuse_grad_acc
        return mixes.view(*x.shape[:-2], mixes.shape[-1])  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, out_grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor, None, None, None]:
        x, fn_eff, dots_sum, sqrsum = ctx.saved_tensors
        storage = x.untyped_storage() if storage_gradients(ctx.fuse_grad_acc) else None
        accumulated = None if storage is None else getattr(storage, "grad_from_mhc_post", None)
        x_grad, fn_grad = mhc_pre_norm_fn_bwd(out_grad.contiguous(), x, fn_eff, dots_sum, sqrsum, ctx.norm_eps,
                                              None if accumulated is None else accumulated.view_as(x))
        if storage is not None and accumulated is not None:
            accumulated.view_as(x).copy_(x_grad.view_as(x))  # TileKernels adds into it in place
            del storage.grad_from_mhc_post
            return None, fn_grad, None, None, None
        return x_grad.view_as(x), fn_grad, None, None, None


def mhc_pre_norm_fn(residual: torch.Tensor, mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None,
                    mhc_norm_eps: float, fuse_grad_acc: bool = True, n_splits: int = 16) -> torch.Tensor:
    """The raw mixes of an mHC layer, with autograd (TileKernels' ``mhc_pre_norm_fn``). n_splits is
    accepted and, as in TileKernels, sets nothing: the split count is chosen per call."""
    if mhc_norm_weight is not None:
        mhc_fn = _MHCFnNormwMerge.apply(mhc_fn, mhc_norm_weight)
    return MHCPreNormFn.apply(residual, mhc_fn, mhc_norm_eps, fuse_grad_acc, n_splits)  # type: ignore[no-any-return]
