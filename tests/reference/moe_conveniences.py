"""Plain-torch references of the MoE conveniences (ops/moe/gating.py, ops/moe/routing.py):
topk_gating and moe_routing. CPU or GPU; differentiable through torch's own autograd.

topk_gating_ref uses the gating references (stable descending top-k, the kernels' summation
order for the normalization), so on the same softmax scores its ids and weights are the ops'
bit for bit. moe_routing_ref calls each expert on the rows of its tokens in ascending
(token, k) order, the rows the op's segment holds with alignment 1, and sums each token's
results in fp32 in k order as reduce_fused does; it never builds the fused layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tests.reference.moe_gate import sequential_sum, stable_topk_idx
from tests.reference.numeric import fma_f32

Experts = Callable[[int, torch.Tensor], torch.Tensor] | Sequence[Callable[[torch.Tensor], torch.Tensor]]


def topk_gating_ref(gate_logits: torch.Tensor, k: int, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(int64 ids, float32 weights) of shape gate_logits.shape[:-1] + (k,): softmax in fp32 over the
    experts, the k largest (ties to the lower id), renormalized by 1e-20 + their sum when normalize."""
    lead, num_experts = gate_logits.shape[:-1], gate_logits.shape[-1]
    scores = torch.softmax(gate_logits.reshape(-1, num_experts).float(), dim=-1)
    idx = stable_topk_idx(scores, k)
    weights = scores.gather(1, idx)
    if normalize:
        weights = weights / sequential_sum(weights)[:, None]
    return idx.reshape(*lead, k), weights.reshape(*lead, k)


def _call(experts: Experts, expert: int, rows: torch.Tensor) -> torch.Tensor:
    if isinstance(experts, (list, tuple, torch.nn.ModuleList)):
        return experts[expert](rows)  # type: ignore[no-any-return]
    return experts(expert, rows)  # type: ignore[operator]


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 a * b + c rounded once (fma_f32's bits), differentiable as a * b + c: where that is finite the two differ
    by at most an ulp, so their difference is exact and adding it back gives the fused value itself."""
    plain = a * b + c
    fused = fma_f32(a.detach(), b.detach(), c.detach())
    return torch.where(plain.isfinite(), plain + (fused - plain).detach(), fused)


def moe_routing_ref(hidden_states: torch.Tensor, expert_idx: torch.Tensor, expert_weights: torch.Tensor,
                    experts: Experts | None = None, num_experts: int | None = None) -> torch.Tensor:
    """out[t] = sum_k w[t, k] * expert_{idx[t, k]}(x[t]) in fp32 from +0.0 in k order, each step one fused
    multiply-add (acc = fma(row, w, acc), reduce_fused's rounding), slots with an id outside [0, num_experts)
    skipped; result in hidden_states' dtype and shape.

    num_experts defaults to len(experts) for a sequence, else the largest id + 1 (at least 1).
    Each expert runs once, on the rows of its (token, k) slots in ascending flat order.
    """
    shape, hidden = hidden_states.shape, hidden_states.shape[-1]
    x = hidden_states.reshape(-1, hidden)
    idx = expert_idx.reshape(x.shape[0], -1)
    w = expert_weights.reshape(idx.shape)
    if num_experts is None:
        if isinstance(experts, (list, tuple, torch.nn.ModuleList)):
            num_experts = len(experts)
        else:
            num_experts = max(int(idx.max()) + 1, 1) if idx.numel() else 1
    num_tokens, num_topk = idx.shape
    # rows[t, k]: what slot (t, k)'s expert returns for token t (zero for a dropped slot).
    rows = x.new_zeros((num_tokens * num_topk, hidden))
    if experts is None:
        rows = x[:, None, :].expand(num_tokens, num_topk, hidden).reshape(-1, hidden)
    else:
        flat = idx.reshape(-1)
        for expert in range(num_experts):
            slots = torch.nonzero(flat == expert).reshape(-1)  # ascending (token, k)
            if slots.numel():
                out = _call(experts, expert, x[slots // num_topk]).to(x.dtype)
                rows = rows.index_put((slots,), out)
    rows = rows.reshape(num_tokens, num_topk, hidden)
    routed = (idx >= 0) & (idx < num_experts)
    acc = torch.zeros((num_tokens, hidden), dtype=torch.float32, device=x.device)
    for k in range(num_topk):
        acc = torch.where(routed[:, k, None], _fma(rows[:, k].float(), w[:, k, None].float(), acc), acc)
    return acc.to(hidden_states.dtype).reshape(shape)
