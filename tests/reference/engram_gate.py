"""Plain-torch reference of the Engram gate (KERNELS.md, "Engram"): forward, and its gradients by autograd.

Written from the formula, in fp32: rstd = rsqrt(mean(x^2) + eps) for x and k, the raw dot
sum(x * wh * k * we), d = dot * rstd_x * rstd_k / sqrt(H), gate = sigmoid(sign(d) * sqrt(max(|d|,
clamp))), out = bf16(x + gate * v). Differentiable in every tensor argument.
"""

from __future__ import annotations

import torch

from tests.reference.engram import calc_diff

__all__ = ["calc_diff", "engram_gate_ref"]


def engram_gate_ref(hidden_states: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight_hidden: torch.Tensor,
                    weight_embed: torch.Tensor, clamp_value: float, eps: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output bf16, raw dot, gate, rstd_x, rstd_k) for x, k (T, hc, H), v (T, H), weights (hc, H)."""
    hidden = hidden_states.shape[-1]
    x, kf = hidden_states.float(), k.float()
    wh, we = weight_hidden.float(), weight_embed.float()
    rstd_x = torch.rsqrt(x.square().mean(-1) + eps)
    rstd_k = torch.rsqrt(kf.square().mean(-1) + eps)
    dot = ((x * wh) * (kf * we)).sum(-1)
    d = dot * rstd_x * rstd_k * hidden**-0.5
    gate = torch.sigmoid(d.abs().clamp_min(clamp_value).sqrt() * d.sign())
    out = (x + gate.unsqueeze(-1) * v.float().unsqueeze(-2)).bfloat16()
    return out, dot, gate, rstd_x, rstd_k
