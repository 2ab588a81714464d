"""Plain-torch references for mHC's pre-norm mixes (KERNELS.md, "mHC"): TileKernels 1.0.0's
``mhc_pre_norm_fn_ref`` (tile_kernels/torch/mhc.py), and the kernels' arithmetic (kernels/mhc/norm_fn_fwd.py.j2
and norm_fn_bwd.py.j2) written out in float64: the TF32 weights and dots' gradient rounded as the kernels
(and TileKernels' tensor cores) round them, every product of those with bf16 values exact, and the sums
exact enough in float64 that a kernel's fp32 sums may be held to them within a few fp32 ulps of the terms."""

from __future__ import annotations

import torch


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """The TF32 value of each fp32 element that TileKernels' GEMMs multiply: its ``round_to_tf32`` (bits +
    0x1000) with the 13 low bits the tensor core ignores cleared."""
    bits = (x.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF
    return bits.view(torch.float32)


def norm_fn_ref(residual: torch.Tensor, mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None,
                mhc_norm_eps: float) -> torch.Tensor:
    """TileKernels' mhc_pre_norm_fn_ref: (..., m, hidden) bf16 streams -> (..., m * (m + 2)) fp32 mixes."""
    if mhc_norm_weight is not None:
        mhc_fn = mhc_fn * mhc_norm_weight
    x = residual.flatten(-2, -1).float()
    k = mhc_fn.shape[-1]
    mixes = torch.einsum("...k,nk->...n", x, mhc_fn)
    sqrsum = x.square().sum(-1, keepdim=True)
    return mixes * (sqrsum / k + mhc_norm_eps).rsqrt()


def fn_eff(mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None) -> torch.Tensor:
    """The kernels' weights: round_to_tf32(fn * weight) (the product rounded to fp32 first)."""
    return round_to_tf32(mhc_fn if mhc_norm_weight is None else mhc_fn * mhc_norm_weight)


def norm_fn_formula(residual: torch.Tensor, mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None,
                    mhc_norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward's (mixes, dots, sqrsum) in float64 over the TF32 weights; (num_tokens, m3), (num_tokens,
    m3), (num_tokens,)."""
    x = residual.flatten(-2, -1).reshape(-1, mhc_fn.shape[-1]).double()
    f = fn_eff(mhc_fn, mhc_norm_weight).double()
    dots = x @ f.T
    sqrsum = x.square().sum(-1)
    rms = (sqrsum / x.shape[-1] + mhc_norm_eps).rsqrt()
    return dots * rms[:, None], dots, sqrsum


def norm_fn_bwd_formula(mixes_grad: torch.Tensor, residual: torch.Tensor, mhc_fn: torch.Tensor,
                        mhc_norm_weight: torch.Tensor | None, mhc_norm_eps: float,
                        x_grad: torch.Tensor | None = None,
                        sqrsum: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward's (x_grad before its bf16 rounding, fn_grad by the TF32 weights), float64:
    og = tf32(fp32(g * rms)) with an fp32 rms from ``sqrsum`` (the forward's fp32 sums of squares; by default
    the float64 ones rounded to fp32). The TF32 rounding of og is a step function: an rms one ulp off moves
    some og by a TF32 ulp (2^-10 relative), so pass the kernels' own sums to follow them closely."""
    k = mhc_fn.shape[-1]
    x = residual.flatten(-2, -1).reshape(-1, k).double()
    f = fn_eff(mhc_fn, mhc_norm_weight).double()
    _, dots, sums = norm_fn_formula(residual, mhc_fn, mhc_norm_weight, mhc_norm_eps)
    g = mixes_grad.reshape(-1, f.shape[0]).double()
    q = sums.float() if sqrsum is None else sqrsum.reshape(-1).float()
    rms = (q / k + mhc_norm_eps).rsqrt()
    og = round_to_tf32(g.float() * rms[:, None]).double()
    qg = (g * dots).sum(-1) * rms.double() / (q.double() + mhc_norm_eps * k) / -2
    acc = torch.zeros_like(x) if x_grad is None else x_grad.reshape(-1, k).double()
    return acc + og @ f + 2 * x * qg[:, None], og.T @ x


def autograd_norm_fn(residual: torch.Tensor, mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None,
                     mhc_norm_eps: float, mixes_grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """(residual.grad, fn.grad, weight.grad) of norm_fn_ref by torch autograd, as TileKernels' test takes them."""
    leaves = [residual.clone().requires_grad_(), mhc_fn.clone().requires_grad_()]
    weight = None if mhc_norm_weight is None else mhc_norm_weight.clone().requires_grad_()
    out = norm_fn_ref(leaves[0], leaves[1], weight, mhc_norm_eps)
    torch.autograd.backward([out], [mixes_grad])
    return leaves[0].grad, leaves[1].grad, None if weight is None else weight.grad
