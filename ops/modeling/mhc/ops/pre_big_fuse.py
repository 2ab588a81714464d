"""modeling.mhc.ops.pre_big_fuse: TileKernels' ``mhc_pre_big_fuse``, the inference-only fused pre step.

TileKernels' function has no autograd (``mhc_pre`` calls it with gradients disabled); it is ``mhc.mhc_pre_big_fuse``
with TileKernels' keyword spelling, its outputs equal to mhc_pre_norm_fn (no RMSNorm weight), mhc_pre_split_mixes,
sinkhorn_normalize and mhc_pre_apply_mix run one after the other, bit for bit.
"""

from __future__ import annotations

import torch

from ....mhc import mhc_pre_big_fuse as _mhc_pre_big_fuse

__all__ = ["mhc_pre_big_fuse"]


def mhc_pre_big_fuse(residual: torch.Tensor, fn: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                     rms_eps: float, mhc_pre_eps: float, mhc_sinkhorn_eps: float, mhc_post_mult_value: float,
                     sinkhorn_repeat: int, n_splits: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(post_mix (..., m, 1), comb_mix (..., m, m), layer_input (..., hidden))`` of one mHC layer (TileKernels'
    ``mhc_pre_big_fuse``; see ``mhc.mhc_pre_big_fuse``)."""
    return _mhc_pre_big_fuse(residual, fn, mhc_scale, mhc_base,  # type: ignore[no-any-return]
                             rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat, n_splits)
