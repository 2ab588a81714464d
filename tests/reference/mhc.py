"""Plain-torch references for the mHC expand and Sinkhorn kernels (KERNELS.md, "mHC").

They run on CPU or GPU tensors. expand_to_mhc is a copy (bit-exact); its backward sums the mhc_mult
streams in fp32 in index order from +0.0 and rounds once to bf16, as the kernel does (bit-exact too).
sinkhorn_normalize_ref is TileKernels' torch reference; sinkhorn_normalize_bwd_ref is the same
chain's vector-Jacobian product written step by step in the kernel's order (the kernel's sums may
still round differently from torch's, so the GPU tests compare with TileKernels' fp32 tolerances),
and sinkhorn_normalize_bwd_autograd is torch autograd through the forward reference.
"""

from __future__ import annotations

import torch


def expand_to_mhc_ref(hidden: torch.Tensor, mhc_mult: int) -> torch.Tensor:
    """(..., H) -> (..., mhc_mult, H) copies (TileKernels' expand_to_mhc_ref)."""
    return hidden.unsqueeze(-2).expand(*hidden.shape[:-1], mhc_mult, hidden.shape[-1]).contiguous()


def expand_to_mhc_bwd_ref(out_grad: torch.Tensor) -> torch.Tensor:
    """(..., m, H) -> (..., H): the fp32 sum over m in index order from +0.0, rounded to bf16 once."""
    acc = torch.zeros(*out_grad.shape[:-2], out_grad.shape[-1], dtype=torch.float32, device=out_grad.device)
    for j in range(out_grad.shape[-2]):
        acc = acc + out_grad[..., j, :].float()
    return acc.to(torch.bfloat16)


def sinkhorn_normalize_ref(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """TileKernels' sinkhorn_normalize_ref."""
    x = x.softmax(-1) + eps
    x = x / (x.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        x = x / (x.sum(-1, keepdim=True) + eps)
        x = x / (x.sum(-2, keepdim=True) + eps)
    return x


def sinkhorn_normalize_bwd_ref(grad_output: torch.Tensor, x: torch.Tensor, repeat: int = 10,
                               eps: float = 1e-6) -> torch.Tensor:
    """The gradient of sinkhorn_normalize_ref at x, step by step in reverse (the kernel's formulas).

    Step s = 1 .. 2 repeat - 1 divides z by (its column sums + eps) for odd s, by (its row sums + eps)
    for even s; its backward is dz = (dy - sum(dy * z) / (sum(z) + eps)) / (sum(z) + eps) along the
    same dimension. Through the softmax p: dx = (dp - sum(dp * p, -1)) * p.
    """
    p = x.softmax(-1)
    inputs = [p + eps]  # inputs[s - 1]: the input of step s
    for s in range(1, 2 * repeat - 1):
        z = inputs[-1]
        dim = -2 if s % 2 == 1 else -1
        inputs.append(z / (z.sum(dim, keepdim=True) + eps))
    g = grad_output
    for s in range(2 * repeat - 1, 0, -1):
        z = inputs[s - 1]
        dim = -2 if s % 2 == 1 else -1
        denom = z.sum(dim, keepdim=True) + eps
        g = (g - (g * z).sum(dim, keepdim=True) / denom) / denom
    return (g - (g * p).sum(-1, keepdim=True)) * p


def sinkhorn_normalize_bwd_autograd(grad_output: torch.Tensor, x: torch.Tensor, repeat: int = 10,
                                    eps: float = 1e-6) -> torch.Tensor:
    """torch autograd's gradient through sinkhorn_normalize_ref (TileKernels' test compares against it)."""
    leaf = x.detach().clone().requires_grad_()
    with torch.enable_grad():
        sinkhorn_normalize_ref(leaf, repeat, eps).backward(grad_output)
    assert leaf.grad is not None
    return leaf.grad
