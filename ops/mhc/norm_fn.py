"""mhc.mhc_pre_norm_fn / mhc_pre_norm_fn_fwd / mhc_pre_norm_fn_bwd: the raw mixes of an mHC layer (an
RMS-normalized GEMM of the flattened residual streams with the layer's mix weights), and its gradients.

TileKernels' ``mhc_pre_norm_fn`` (KERNELS.md, "mHC"), whose autograd op is in ``modeling.mhc.ops``; its
kernels module (``tile_kernels.mhc.norm_fn_kernel``) exports no public names, so the ops here are this
package's own stages: ``mhc_pre_norm_fn`` with TileKernels' signature (the forward alone),
``mhc_pre_norm_fn_fwd`` with what the backward needs, and ``mhc_pre_norm_fn_bwd``. Kernels in
kernels/mhc/norm_fn_fwd.py.j2 and norm_fn_bwd.py.j2 (kernel_specs/mhc_norm.yaml): the token count and
K = mhc_mult * hidden are runtime sizes, the GEMMs split over K (forward) or tokens (backward) by counts
sized from the SM count. The forward's GEMM runs on TF32 tensor cores as TileKernels' does (its products
and its order of the sums: with one split, which a token count that fills the GPU gets, its bits), on CUDA
cores for a K its 64-wide steps do not divide. The backward keeps TileKernels' TF32 rounding of the dots'
gradient on CUDA cores; its products are exact in fp32 and only the fp32 order of the sums differs.
"""

from __future__ import annotations

import torch

from .._args import positive_int, real
from .._op import Plan, Result, empty, launch, op, out, result, size
from .._runtime import get_kernel, sm_count
from ._norm import gemm_outputs, gemm_plans, rows, streams

__all__ = ["mhc_pre_norm_fn", "mhc_pre_norm_fn_bwd", "mhc_pre_norm_fn_fwd"]

_norm = get_kernel("mhc_norm_fn_norm")
_bwd_norm = get_kernel("mhc_norm_fn_bwd_norm")
_bwd_x = get_kernel("mhc_norm_fn_bwd_x")
_bwd_fn = get_kernel("mhc_norm_fn_bwd_fn")

_BWD_COLUMNS_PER_BLOCK = 128 * 4  # the backward's fn stage: Config.threads x 4 columns
_BWD_BLOCKS_PER_SM = 2  # a block of the fn stage holds 96 sums a thread


def _weight(norm_weight: object, mhc_hidden: int) -> torch.Tensor | None:
    if norm_weight is None:
        return None
    if not isinstance(norm_weight, torch.Tensor):
        raise TypeError(f"mhc_norm_weight: expected None or a torch.Tensor, got {type(norm_weight).__name__}")
    if tuple(norm_weight.shape) != (mhc_hidden,) or norm_weight.dtype != torch.float32:
        raise ValueError(f"mhc_norm_weight: expected a float32 tensor of shape ({mhc_hidden},) (mhc_mult * hidden), "
                         f"got {norm_weight.dtype} {tuple(norm_weight.shape)}")
    return norm_weight


def _saved(mixes: torch.Tensor, fn_eff: torch.Tensor, dots_sum: torch.Tensor, sqrsum: torch.Tensor,
           dots: torch.Tensor, sqrsum_parts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The forward's result: the partial sums are the GEMM's workspace, not returned."""
    return mixes, fn_eff, dots_sum, sqrsum


@op(outputs=("mixes", "fn_eff", "dots_sum", "sqrsum", "dots", "sqrsum_parts"), out=False)
def mhc_pre_norm_fn_fwd(residual: torch.Tensor, mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None,
                        mhc_norm_eps: float) -> list[Plan]:
    """The raw mixes, with what ``mhc_pre_norm_fn_bwd`` needs.

    ``mixes[t, j] = dot(x[t], f[j]) * rsqrt(sum(x[t]^2) / K + eps)`` with x the token's m streams flattened
    (K = m * hidden values) and f = round_to_tf32(mhc_fn * mhc_norm_weight) (TileKernels' weights merge
    and rounding; without a weight, round_to_tf32(mhc_fn)).

    Args:
        residual: bfloat16 CUDA tensor (..., mhc_mult, hidden), contiguous; mhc_mult 4 is built.
        mhc_fn: float32 (mhc_mult * (mhc_mult + 2), mhc_mult * hidden), contiguous.
        mhc_norm_weight: None or float32 (mhc_mult * hidden,): the RMSNorm weight, merged into mhc_fn.
        mhc_norm_eps: the RMSNorm epsilon.

    Returns:
        ``(mixes, fn_eff, dots_sum, sqrsum)``: float32 (num_tokens, m3) mixes (num_tokens: residual's
        leading dimensions flattened), the TF32 weights f like mhc_fn, the un-normalized dots (num_tokens,
        m3) and the sums of squares (num_tokens,).
    """
    residual, fn = streams(residual, mhc_fn)
    x = rows(residual)
    weight = _weight(mhc_norm_weight, int(x.shape[1]))
    eps = real("mhc_norm_eps", mhc_norm_eps)
    m, m3 = int(residual.shape[-2]), int(fn.shape[0])
    fn_eff, dots, parts = gemm_outputs(x, fn)
    outputs = (empty(torch.float32, size(x, 0), m3), fn_eff, empty(torch.float32, size(x, 0), m3),
               empty(torch.float32, size(x, 0)), dots, parts)
    plans = gemm_plans(x, m, fn, weight, fn_eff=1, dots=4, sqrsum=5, outputs=outputs)
    plans.append(launch(_norm.variant("norm", m), out(4), out(5), out(0), out(2), out(3), int(x.shape[1]), eps,
                        then=_saved))
    return plans


@op(outputs=("mixes",), out=False)
def mhc_pre_norm_fn(residual: torch.Tensor, mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None,
                    mhc_norm_eps: float, fuse_grad_acc: bool = True, n_splits: int = 16) -> Result:
    """The raw mixes of an mHC layer, without autograd (TileKernels' ``mhc_pre_norm_fn`` forward; the
    autograd op is ``modeling.mhc.ops.mhc_pre_norm_fn``).

    ``mixes = (x . f^T) * rsqrt(mean(x^2) + eps)`` per token, x the token's streams flattened, f =
    round_to_tf32(mhc_fn * mhc_norm_weight); see ``mhc_pre_norm_fn_fwd``.

    Args:
        residual, mhc_fn, mhc_norm_weight, mhc_norm_eps: as ``mhc_pre_norm_fn_fwd``.
        fuse_grad_acc: TileKernels' backward option; a forward without autograd has no backward.
        n_splits: TileKernels' split-K count, which its kernels set to 1 whatever the caller passes; here
            the split count is chosen from the token count and the SM count (a positive int is checked).

    Returns:
        float32 (..., mhc_mult * (mhc_mult + 2)): residual's leading dimensions.
    """
    positive_int("n_splits", n_splits)
    mixes = mhc_pre_norm_fn_fwd(residual, mhc_fn, mhc_norm_weight, mhc_norm_eps)[0]
    return result(mixes.view(*residual.shape[:-2], mixes.shape[-1]))


def _grads(x_grad: torch.Tensor, fn_grad_parts: torch.Tensor, dots_grad: torch.Tensor,
           sqrsum_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward's result: x's gradient and the weights' partial sums summed (in split order)."""
    return x_grad, fn_grad_parts.sum(0)


def _fn_splits(num_tokens: int, mhc_hidden: int, device: int) -> int:
    """Token ranges of the backward's weight gradient: enough blocks to fill the GPU, at most one a token."""
    if device < 0:
        return 1  # a tensor elsewhere: the launcher refuses it by name
    tiles = -(-mhc_hidden // _BWD_COLUMNS_PER_BLOCK)
    return max(1, min(num_tokens, -(-sm_count(device) * _BWD_BLOCKS_PER_SM // max(tiles, 1))))


@op(outputs=("x_grad", "fn_grad", "dots_grad", "sqrsum_grad"), out=False)
def mhc_pre_norm_fn_bwd(mixes_grad: torch.Tensor, residual: torch.Tensor, fn_eff: torch.Tensor,
                        dots_sum: torch.Tensor, sqrsum: torch.Tensor, mhc_norm_eps: float,
                        x_grad: torch.Tensor | None = None) -> list[Plan]:
    """The gradients of ``mhc_pre_norm_fn_fwd``'s mixes by residual and by the TF32 weights.

    With rms = rsqrt(sqrsum / K + eps) and og = round_to_tf32(mixes_grad * rms) (TileKernels rounds the
    dots' gradient for its TF32 GEMMs): ``fn_grad = og^T . x`` and
    ``x_grad = bf16(x_grad_in + og . f + 2 * x * qg)``, qg = ``(mixes_grad . dots_sum) * rms / (sqrsum + eps *
    K) / -2`` (the gradient through the sum of squares), all in fp32 with exact products.

    Args:
        mixes_grad: float32 (num_tokens, m3) (or (..., m3), residual's leading dimensions), contiguous.
        residual: the forward's residual (..., mhc_mult, hidden).
        fn_eff, dots_sum, sqrsum: ``mhc_pre_norm_fn_fwd``'s saved outputs.
        mhc_norm_eps: the forward's epsilon.
        x_grad: None, or a bfloat16 tensor like residual holding the gradient accumulated so far
            (TileKernels' ``grad_from_mhc_post``), which the result adds to (it is only read).

    Returns:
        ``(x_grad, fn_grad)``: bfloat16 (num_tokens, mhc_mult * hidden) (``view_as(residual)``) and float32
        like fn_eff: the gradient by the merged, rounded weights (the weight merge's own backward is the
        modeling layer's).
    """
    residual, fn_eff = streams(residual, fn_eff, "fn_eff")
    x = rows(residual)
    num_tokens, mhc_hidden = int(x.shape[0]), int(x.shape[1])
    m, m3 = int(residual.shape[-2]), int(fn_eff.shape[0])
    eps = real("mhc_norm_eps", mhc_norm_eps)
    for name, t, width in (("mixes_grad", mixes_grad, m3), ("dots_sum", dots_sum, m3), ("sqrsum", sqrsum, 1)):
        # (num_tokens, width) or residual's leading dimensions then width (sqrsum: without its width).
        if not isinstance(t, torch.Tensor) or t.numel() != num_tokens * width or (width > 1 and t.shape[-1] != width):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: expected {num_tokens} rows of {width} for residual of shape "
                             f"{tuple(residual.shape)}, got {got}")
    g, d, q = mixes_grad.reshape(num_tokens, m3), dots_sum.reshape(num_tokens, m3), sqrsum.reshape(num_tokens)
    if x_grad is not None and (not isinstance(x_grad, torch.Tensor) or x_grad.shape != residual.shape):
        got = tuple(x_grad.shape) if isinstance(x_grad, torch.Tensor) else type(x_grad).__name__
        raise ValueError(f"x_grad: expected None or the shape of residual {tuple(residual.shape)}, got {got}")
    acc = x if x_grad is None else rows(x_grad)  # not read without accumulate: any tensor of x's layout
    splits = _fn_splits(num_tokens, mhc_hidden, x.get_device())
    outputs = (empty(torch.bfloat16, size(x, 0), size(x, 1)), empty(torch.float32, splits, m3, size(x, 1)),
               empty(torch.float32, size(x, 0), m3), empty(torch.float32, size(x, 0)))
    return [launch(_bwd_norm.variant("norm", m), g, d, q, out(2), out(3), mhc_hidden, eps, outputs=outputs),
            launch(_bwd_x.variant("x", m), out(2), out(3), x, fn_eff, acc, out(0), int(x_grad is not None)),
            launch(_bwd_fn.variant("fn", m), out(2), x, out(1), then=_grads)]
