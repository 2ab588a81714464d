"""modeling.mhc.functional: TileKernels' mHC pipeline over the autograd ops of ``modeling.mhc.ops``.

A model keeps m = mhc_mult residual streams (..., m, hidden): ``expand_from_embedding`` makes them from the
embedding, ``mhc_pre`` turns them into one sublayer's input (plus the mixes ``mhc_post`` needs),
``mhc_post`` merges the sublayer's output back into the streams, and ``mhc_head`` mixes them into the input
of the language-model head. Names, arguments and defaults are TileKernels' (``tile_kernels.modeling.mhc``,
whose package exports expand_from_embedding, mhc_pre and mhc_head; ``mhc_post`` is its functional module's
import of ``ops.mhc_post``, exported here too).

One intended difference: with gradients disabled, TileKernels' ``mhc_pre`` calls the fused inference kernel
without ``norm_weight`` (the fused kernel takes none), so an RMSNorm weight changes the training result but
not the inference one. Here the weight is merged into ``fn`` first (``fn * norm_weight``, what
``mhc_pre_norm_fn`` does before its GEMM), so that both paths compute the same mixes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ops.expand import expand_to_mhc
from .ops.head_compute_mix import mhc_head_compute_mix
from .ops.norm_fn import mhc_pre_norm_fn
from .ops.post import mhc_post
from .ops.pre_apply_mix import mhc_pre_apply_mix
from .ops.pre_big_fuse import mhc_pre_big_fuse
from .ops.pre_split_mixes import mhc_pre_split_mixes
from .ops.sinkhorn import sinkhorn_normalize

__all__ = ["expand_from_embedding", "mhc_head", "mhc_post", "mhc_pre"]


def expand_from_embedding(x: torch.Tensor, mhc_mult: int = 4) -> torch.Tensor:
    """The m residual streams of an embedding: (..., hidden) -> (..., mhc_mult, hidden) copies, with autograd."""
    return expand_to_mhc(x, mhc_mult)


def mhc_pre(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
            norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, mhc_mult: int = 4,
            post_mult_value: float = 1.0, pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6, sinkhorn_repeat: int = 10,
            n_splits: int = 16) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One sublayer's input from the streams: mhc_pre_norm_fn, mhc_pre_split_mixes, sinkhorn_normalize and
    mhc_pre_apply_mix, or with gradients disabled the fused ``mhc_pre_big_fuse`` (the same results).

    Args:
        residual: bfloat16 (..., mhc_mult, hidden): the streams.
        fn: float32 (mhc_mult * (mhc_mult + 2), mhc_mult * hidden): the mix weights.
        scale: float32 (3,): the scales of the pre, post and comb mixes. base: float32 (mhc_mult * (mhc_mult + 2),).
        norm_weight: optional float32 (mhc_mult * hidden,) RMSNorm weight, merged into fn.
        norm_eps, post_mult_value, pre_eps, sinkhorn_eps, sinkhorn_repeat, n_splits: as TileKernels'.

    Returns:
        ``(layer_input (..., hidden) bfloat16, (post_mix (..., mhc_mult, 1), comb_mix (..., mhc_mult, mhc_mult)))``:
        the sublayer's input and the context to pass to ``mhc_post``.
    """
    if not torch.is_grad_enabled():
        merged = fn if norm_weight is None else fn * norm_weight
        post_mix, comb_mix, layer_input = mhc_pre_big_fuse(
            residual, merged, scale, base, rms_eps=norm_eps, mhc_pre_eps=pre_eps, mhc_sinkhorn_eps=sinkhorn_eps,
            mhc_post_mult_value=post_mult_value, sinkhorn_repeat=sinkhorn_repeat, n_splits=n_splits)
        return layer_input, (post_mix, comb_mix)
    mixes = mhc_pre_norm_fn(residual, fn, norm_weight, norm_eps, n_splits=n_splits)
    pre_mix, post_mix, comb_mix = mhc_pre_split_mixes(mixes, scale, base, mhc_mult, post_mult_value, pre_eps)
    comb_mix = sinkhorn_normalize(comb_mix, repeat=sinkhorn_repeat, eps=sinkhorn_eps)
    layer_input = mhc_pre_apply_mix(residual, pre_mix)
    return layer_input, (post_mix, comb_mix)


def mhc_head(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
             norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, mhc_mult: int = 4, pre_eps: float = 1e-6,
             n_splits: int = 16) -> torch.Tensor:
    """The language-model head's input from the streams: mhc_pre_norm_fn, mhc_head_compute_mix, mhc_pre_apply_mix.

    Args:
        residual: bfloat16 (..., mhc_mult, hidden).
        fn: float32 (mhc_mult, mhc_mult * hidden), zero-padded to the block's mhc_mult * (mhc_mult + 2) rows so
            that the block's norm_fn kernels serve the head (the extra mixes are dropped).
        scale: float32 (1,) or a scalar tensor. base: float32 (mhc_mult,).
        norm_weight, norm_eps, pre_eps, n_splits: as in ``mhc_pre``.

    Returns:
        bfloat16 (..., hidden).
    """
    rows = mhc_mult * (2 + mhc_mult)
    if fn.shape[0] < rows:
        fn = F.pad(fn, (0, 0, 0, rows - fn.shape[0]))
    mixes = mhc_pre_norm_fn(residual, fn, norm_weight, norm_eps, n_splits=n_splits)
    # The first mhc_mult mixes, made contiguous: the head's mix kernel reads dense (..., mhc_mult) rows.
    mixes = mixes[..., :mhc_mult].contiguous()
    if scale.numel() == 1:
        scale = scale.reshape(1)
    mix = mhc_head_compute_mix(mixes, scale, base, pre_eps)
    return mhc_pre_apply_mix(residual, mix.unsqueeze(-1))
