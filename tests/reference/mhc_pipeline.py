"""Plain-torch references for mHC's functional pipeline (``modeling.mhc``: expand_from_embedding, mhc_pre,
mhc_post, mhc_head), TileKernels 1.0.0's functional.py written over its torch references
(tile_kernels/torch/mhc.py): differentiable end to end by torch autograd. ``Ops`` names the per-op functions
a pipeline is made of, so that the same composition runs over the references or over other implementations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tests.reference.mhc import expand_to_mhc_ref, sinkhorn_normalize_ref
from tests.reference.mhc_mix import head_compute_mix_ref, pre_apply_mix_ref, pre_split_mixes_ref
from tests.reference.mhc_post import post_ref


def norm_fn_ref(residual: torch.Tensor, mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None,
                mhc_norm_eps: float) -> torch.Tensor:
    """TileKernels' mhc_pre_norm_fn_ref: (..., m, hidden) bf16 streams -> (..., m * (m + 2)) fp32 mixes, the
    streams flattened, dotted with each row of fn (times the RMSNorm weight) and scaled by their rsqrt(mean^2 + eps)."""
    if mhc_norm_weight is not None:
        mhc_fn = mhc_fn * mhc_norm_weight
    x = residual.flatten(-2, -1).float()
    mixes = torch.einsum("...k,nk->...n", x, mhc_fn)
    return mixes * (x.square().sum(-1, keepdim=True) / x.shape[-1] + mhc_norm_eps).rsqrt()


def sinkhorn_ref(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    return sinkhorn_normalize_ref(x, repeat, eps)


@dataclass(frozen=True)
class Ops:
    """The per-op functions of the pipeline, with TileKernels' modeling.mhc.ops signatures."""

    expand_to_mhc: Any = expand_to_mhc_ref
    mhc_pre_norm_fn: Any = norm_fn_ref
    mhc_pre_split_mixes: Any = pre_split_mixes_ref
    sinkhorn_normalize: Any = sinkhorn_ref
    mhc_pre_apply_mix: Any = pre_apply_mix_ref
    mhc_post: Any = post_ref
    mhc_head_compute_mix: Any = head_compute_mix_ref


REFERENCE = Ops()


def expand_from_embedding_ref(x: torch.Tensor, mhc_mult: int = 4, ops: Ops = REFERENCE) -> torch.Tensor:
    return ops.expand_to_mhc(x, mhc_mult)  # type: ignore[no-any-return]


def mhc_pre_ref(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
                norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, mhc_mult: int = 4,
                post_mult_value: float = 1.0, pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6,
                sinkhorn_repeat: int = 10, ops: Ops = REFERENCE
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """TileKernels' mhc_pre with gradients enabled: norm_fn, split, sinkhorn, apply."""
    mixes = ops.mhc_pre_norm_fn(residual, fn, norm_weight, norm_eps)
    pre_mix, post_mix, comb_mix = ops.mhc_pre_split_mixes(mixes, scale, base, mhc_mult, post_mult_value, pre_eps)
    comb_mix = ops.sinkhorn_normalize(comb_mix, sinkhorn_repeat, sinkhorn_eps)
    return ops.mhc_pre_apply_mix(residual, pre_mix), (post_mix, comb_mix)


def mhc_post_ref(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, comb_mix: torch.Tensor,
                 ops: Ops = REFERENCE) -> torch.Tensor:
    return ops.mhc_post(x, residual, post_mix, comb_mix)  # type: ignore[no-any-return]


def mhc_head_ref(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
                 norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, mhc_mult: int = 4,
                 pre_eps: float = 1e-6, ops: Ops = REFERENCE) -> torch.Tensor:
    """TileKernels' mhc_head: fn zero-padded to m * (m + 2) rows, the first m mixes, sigmoid mix, apply."""
    rows = mhc_mult * (2 + mhc_mult)
    if fn.shape[0] < rows:
        fn = F.pad(fn, (0, 0, 0, rows - fn.shape[0]))
    mixes = ops.mhc_pre_norm_fn(residual, fn, norm_weight, norm_eps)[..., :mhc_mult]
    mix = ops.mhc_head_compute_mix(mixes, scale.reshape(1) if scale.numel() == 1 else scale, base, pre_eps)
    return ops.mhc_pre_apply_mix(residual, mix.unsqueeze(-1))  # type: ignore[no-any-return]
