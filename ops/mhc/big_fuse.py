"""mhc.mhc_pre_big_fuse: the pre step of an mHC layer for inference, fused.

TileKernels' ``mhc_pre_big_fuse`` (KERNELS.md, "mHC"; its modeling layer's function, which
``modeling.mhc.ops.mhc_pre_big_fuse`` re-exports): mhc_pre_norm_fn (without an RMSNorm weight, as there),
mhc_pre_split_mixes, sinkhorn_normalize on comb and mhc_pre_apply_mix, with outputs equal to those ops' bit
for bit. Four launches: the norm's GEMM stages (kernels/mhc/norm_fn_fwd.py.j2's ``weights``, then ``mma`` or ``dots``,
kernel_specs/mhc_norm.yaml, the split count chosen as mhc_pre_norm_fn chooses it) and the fused rest in two kernels
(kernels/mhc/big_fuse.py.j2, kernel_specs/mhc_big_fuse.yaml: the stream mix per column tile, the post and comb
mixes per token). The token count and hidden are runtime sizes;
leading dimensions are flattened into tokens through the op itself.
"""

from __future__ import annotations

import torch

from .._args import positive_int, real
from .._op import Plan, Result, empty, launch, op, out, result, size
from .._runtime import get_kernel
from ._norm import gemm_outputs, gemm_plans, rows, streams

__all__ = ["mhc_pre_big_fuse"]

_fuse = get_kernel("mhc_pre_big_fuse")
_mixes = get_kernel("mhc_pre_big_fuse_mixes")


def _mix_vector(name: str, t: object, length: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != (length,) or t.dtype != torch.float32:
        raise ValueError(f"{name}: expected a float32 tensor of shape ({length},), got {t.dtype} {tuple(t.shape)}")
    return t


def _results(post_mix: torch.Tensor, comb_mix: torch.Tensor, layer_input: torch.Tensor, *workspace: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the op returns: the GEMM's weights and partial sums are its workspace."""
    return post_mix, comb_mix, layer_input


@op(outputs=("post_mix", "comb_mix", "layer_input", "fn_eff", "dots", "sqrsum"), out=False)
def mhc_pre_big_fuse(residual: torch.Tensor, fn: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                     rms_eps: float, mhc_pre_eps: float, mhc_sinkhorn_eps: float, mhc_post_mult_value: float,
                     sinkhorn_repeat: int, n_splits: int = 16) -> list[Plan] | Result:
    """The layer input and the post / comb mixes of one mHC layer, without autograd.

    mixes = mhc_pre_norm_fn(residual, fn, None, rms_eps); pre, post, comb = mhc_pre_split_mixes(mixes, mhc_scale,
    mhc_base, m, mhc_post_mult_value, mhc_pre_eps); comb = sinkhorn_normalize(comb, sinkhorn_repeat,
    mhc_sinkhorn_eps); layer_input = mhc_pre_apply_mix(residual, pre): the same values, bit for bit.

    Args:
        residual: bfloat16 CUDA tensor (..., mhc_mult, hidden), contiguous; mhc_mult 4 is built.
        fn: float32 (mhc_mult * (mhc_mult + 2), mhc_mult * hidden), contiguous.
        mhc_scale: float32 (3,); mhc_base: float32 (mhc_mult * (mhc_mult + 2),).
        rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value: floats; sinkhorn_repeat: a positive int.
        n_splits: TileKernels' split-K count, which its kernels set to 1; here the split count is chosen from
            the token count and the SM count, as mhc_pre_norm_fn chooses it (a positive int is checked).

    Returns:
        ``(post_mix, comb_mix, layer_input)``: float32 (..., mhc_mult, 1), float32 (..., mhc_mult, mhc_mult)
        and bfloat16 (..., hidden).
    """
    residual, fn = streams(residual, fn, "fn")
    m, hidden = int(residual.shape[-2]), int(residual.shape[-1])
    scale, base = _mix_vector("mhc_scale", mhc_scale, 3), _mix_vector("mhc_base", mhc_base, m * (m + 2))
    eps = [real(name, v) for name, v in (("rms_eps", rms_eps), ("mhc_pre_eps", mhc_pre_eps),
                                          ("mhc_sinkhorn_eps", mhc_sinkhorn_eps),
                                          ("mhc_post_mult_value", mhc_post_mult_value))]
    repeat = positive_int("sinkhorn_repeat", sinkhorn_repeat)
    positive_int("n_splits", n_splits)
    if residual.dim() != 3:  # other leading dimensions: the same op over the flattened tokens, viewed back
        post, comb, layer_input = mhc_pre_big_fuse(residual.reshape(-1, m, hidden), fn, scale, base, *eps, repeat,
                                                   n_splits)
        lead = residual.shape[:-2]
        return result((post.view(*lead, m, 1), comb.view(*lead, m, m), layer_input.view(*lead, hidden)))
    x = rows(residual)
    fn_eff, dots, sqrsum = gemm_outputs(x, fn)
    outputs = (empty(torch.float32, size(residual, 0), m, 1), empty(torch.float32, size(residual, 0), m, m),
               empty(torch.bfloat16, size(residual, 0), size(residual, 2)), fn_eff, dots, sqrsum)
    plans = gemm_plans(x, m, fn, None, fn_eff=3, dots=4, sqrsum=5, outputs=outputs)
    rms_eps, pre_eps, sinkhorn_eps, post_mult = eps
    plans.append(launch(_fuse.variant("stream", m, 8 if hidden % 8 == 0 else 1), out(4), out(5), scale, base,
                        residual, out(2), rms_eps, pre_eps))
    plans.append(launch(_mixes.variant("mixes", m), out(4), out(5), scale, base, out(0), out(1), m * hidden, rms_eps,
                        sinkhorn_eps, post_mult, repeat, then=_results))
    return plans
