"""Plain-torch references for mHC's post op (KERNELS.md, "mHC"): TileKernels 1.0.0's ``mhc_post_ref``
(tile_kernels/torch/mhc.py), and the kernels' forward and backward arithmetic written out in torch
(kernels/mhc/post_fwd.py.j2 and post_bwd.py.j2: each product and sum rounded to fp32 as the kernels round
them, the sums over the m streams in stream order). Gradients by autograd: ``mhc_mix.autograd``."""

from __future__ import annotations

import torch


def post_ref(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
             comb_res_mix: torch.Tensor) -> torch.Tensor:
    """TileKernels' mhc_post_ref: bf16(x * post + einsum(comb, residual)), (..., m, hidden)."""
    term2 = torch.einsum("abmn,abmc->abnc", comb_res_mix, residual.float())
    return (x.float().unsqueeze(-2) * post_layer_mix + term2).bfloat16()


def post_fwd_formula(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
                     comb_res_mix: torch.Tensor) -> torch.Tensor:
    """post_fwd.py.j2's arithmetic: bf16(x * post[n] + (((comb[0, n] * r0 + comb[1, n] * r1) + ...)))."""
    r = residual.float()
    m = r.shape[-2]
    acc = comb_res_mix[..., 0, :].unsqueeze(-1) * r[..., 0:1, :]
    for k in range(1, m):
        acc = acc + comb_res_mix[..., k, :].unsqueeze(-1) * r[..., k:k + 1, :]
    return (x.float().unsqueeze(-2) * post_layer_mix + acc).bfloat16()


def post_bwd_formula(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
                     comb_res_mix: torch.Tensor, d_o: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """post_bwd.py.j2's arithmetic: (x_grad, residual_grad, post_layer_mix_grad, comb_res_mix_grad)."""
    g = d_o.float()
    m = g.shape[-2]
    post = post_layer_mix[..., 0]
    x_grad = g[..., 0, :] * post[..., 0:1]
    for n in range(1, m):
        x_grad = x_grad + g[..., n, :] * post[..., n:n + 1]
    res_grad = comb_res_mix[..., :, 0:1] * g[..., 0:1, :]
    for n in range(1, m):
        res_grad = res_grad + comb_res_mix[..., :, n:n + 1] * g[..., n:n + 1, :]
    post_grad = (g * x.float().unsqueeze(-2)).sum(-1, keepdim=True)
    comb_grad = torch.einsum("...kh,...nh->...kn", residual.float(), g)
    return x_grad.bfloat16(), res_grad.bfloat16(), post_grad, comb_grad
