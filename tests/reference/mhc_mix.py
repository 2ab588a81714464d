"""Plain-torch references for mHC's mix ops (KERNELS.md, "mHC"): TileKernels 1.0.0's torch forms
(tile_kernels/torch/mhc.py), their gradients by torch autograd, and the kernels' backward formulas
written out in torch (what the kernels compute per token, before their sums over tokens)."""

from __future__ import annotations

import torch


def pre_split_mixes_ref(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int,
                        mhc_post_mult_value: float, mhc_pre_eps: float) -> tuple[torch.Tensor, ...]:
    """TileKernels' mhc_pre_split_mixes_ref: (pre (n0, n1, m, 1), post (n0, n1, m, 1), comb (n0, n1, m, m))."""
    m = mhc_mult
    a, b = input_mixes.shape[:2]
    scale = torch.cat([mhc_scale[0].expand(m), mhc_scale[1].expand(m), mhc_scale[2].expand(m * m)])
    lin = input_mixes * scale + mhc_base
    pre = lin[:, :, :m].sigmoid().unsqueeze(-1) + mhc_pre_eps
    post = (lin[:, :, m:2 * m].sigmoid() * mhc_post_mult_value).unsqueeze(-1)
    return pre, post, lin[:, :, 2 * m:].view(a, b, m, m)


def head_compute_mix_ref(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                         mhc_pre_eps: float) -> torch.Tensor:
    """TileKernels' mhc_head_compute_mix_ref."""
    return torch.sigmoid(input_mix * mhc_scale + mhc_base) + mhc_pre_eps


def pre_apply_mix_ref(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """TileKernels' mhc_pre_apply_mix_ref: (x * mix).sum(-2) in bf16."""
    return (x * mix).sum(-2).bfloat16()


def autograd(fn, inputs: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor, ...], *args: object
             ) -> tuple[torch.Tensor, ...]:
    """The gradients of fn(*inputs, *args) by inputs for the output gradients grads (torch autograd)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    outputs = fn(*leaves, *args)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    torch.autograd.backward(list(outputs), list(grads))
    return tuple(t.grad for t in leaves)


def pre_split_mixes_bwd_formula(pre_grad: torch.Tensor, post_grad: torch.Tensor, comb_grad: torch.Tensor,
                                input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                                mhc_mult: int, mhc_post_mult_value: float) -> tuple[torch.Tensor, ...]:
    """kernels/mhc/mix_split_bwd.py.j2's arithmetic per token, then torch's sums over tokens."""
    m = mhc_mult
    scale = torch.cat([mhc_scale[0].expand(m), mhc_scale[1].expand(m), mhc_scale[2].expand(m * m)])
    lin = input_mixes * scale + mhc_base
    sig = lin[..., :2 * m].sigmoid()
    up = torch.cat([pre_grad.flatten(-2), post_grad.flatten(-2) * mhc_post_mult_value], -1)
    g = torch.cat([up * (1 - sig) * sig, comb_grad.flatten(-2)], -1)
    gx = (g * input_mixes).flatten(0, 1).sum(0)
    scale_grad = torch.stack([gx[:m].sum(), gx[m:2 * m].sum(), gx[2 * m:].sum()])
    return g * scale, scale_grad, g.flatten(0, 1).sum(0)


def head_compute_mix_bwd_formula(grad: torch.Tensor, input_mix: torch.Tensor, mhc_scale: torch.Tensor,
                                 mhc_base: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """kernels/mhc/mix_head_bwd.py.j2's arithmetic per token, then torch's sums over tokens."""
    sig = torch.sigmoid(input_mix * mhc_scale + mhc_base)
    g = grad * (1 - sig) * sig
    return g * mhc_scale, (g * input_mix).sum().reshape(1), g.flatten(0, 1).sum(0)


def pre_apply_mix_bwd_formula(o_grad: torch.Tensor, x: torch.Tensor, mix: torch.Tensor,
                              x_grad: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """kernels/mhc/mix_apply_bwd.py.j2's result: bf16(x_grad + o_grad * mix), sum_h o_grad * x (fp32)."""
    g = o_grad.float().unsqueeze(-2)
    acc = x_grad.float() if x_grad is not None else torch.zeros_like(x, dtype=torch.float32)
    return (acc + g * mix).bfloat16(), (g * x.float()).sum(-1, keepdim=True)
