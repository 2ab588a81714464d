"""Plain-torch references for the MoE gating kernels (KERNELS.md, "MoE gating and routing").

They run on CPU or GPU tensors. Ids are defined exactly: a stable descending sort (equal keys
keep the lower id first), NaN keys rank as -inf. Sums whose order the kernels fix are written
out in that order (1e-20 first, then k = 0, 1, ...), so normalize_weight is bit-exact and the
top-2 group sums are bit-exact; the scoring functions (sigmoid, softplus, exp) may differ from
the kernels' in the last bits, which the GPU tests allow for in the weights only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SCORING: tuple[str, ...] = ("sigmoid", "sqrtsoftplus", "softmax")
EPS = 1e-20  # added to every weight denominator, first
HASH_PRIME = 23333  # token hash spreading one rank's tokens over an expert's duplicates


def _no_nan(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(x), torch.full_like(x, float("-inf")), x)


def stable_topk_idx(keys: torch.Tensor, k: int) -> torch.Tensor:
    """int64 ids of the k largest keys of each row: descending, ties to the lower id, NaN = -inf."""
    return torch.sort(_no_nan(keys), dim=-1, descending=True, stable=True).indices[..., :k]


def topk_gate_ref(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    return stable_topk_idx(scores.float(), num_topk)


def group_scores(scores: torch.Tensor, num_topk_sum: int) -> torch.Tensor:
    """(T, G) sum of each group's num_topk_sum largest scores (largest + second, in that order)."""
    top = torch.topk(_no_nan(scores), num_topk_sum, dim=-1).values
    return top[..., 0] if num_topk_sum == 1 else top[..., 0] + top[..., 1]


def topk_sum_and_topk_group_idx_ref(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    """scores (T, G, E/G) -> int64 (T, num_topk_groups) group ids, best group first."""
    return stable_topk_idx(group_scores(scores, num_topk_sum), num_topk_groups)


def sequential_sum(w: torch.Tensor) -> torch.Tensor:
    """(T,) fp32 ((EPS + w[:, 0]) + w[:, 1]) + ..., the kernels' summation order."""
    total = torch.full((w.shape[0],), EPS, dtype=torch.float32, device=w.device)
    for k in range(w.shape[1]):
        total = total + w[:, k]
    return total


def normalize_weight_ref(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    denominator = sequential_sum(topk_weights)
    return denominator, topk_weights / denominator[:, None]


def scores_of(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    """Unbiased scores. Elementwise scores are computed once per distinct logit: torch's CPU
    kernels round a vectorized body and its scalar tail differently, which would make equal
    logits score differently and break the lower-id rule for ties."""
    if scoring == "softmax":
        return torch.softmax(logits, dim=-1)
    values, inverse = torch.unique(logits, return_inverse=True)
    if scoring == "sigmoid":
        return torch.sigmoid(values)[inverse]
    if scoring == "sqrtsoftplus":
        return torch.sqrt(F.softplus(values))[inverse]  # softplus(x) = x above 20 (torch's threshold)
    raise ValueError(f"scoring must be one of {SCORING}, got {scoring!r}")


def mask_by_tp(ids: torch.Tensor, experts_per_rank: int, tp_rank: int, num_tp_ranks: int) -> torch.Tensor:
    """top2_sum_gate's EP/TP masking (floor division, as the kernel's integer arithmetic)."""
    per_dp = experts_per_rank * num_tp_ranks
    keep = (ids // experts_per_rank) % num_tp_ranks == tp_rank
    local = ids - tp_rank * experts_per_rank
    local = local - (local // per_dp) * (per_dp - experts_per_rank)
    local = torch.where(local < 0, torch.full_like(local, -1), local)
    return torch.where(keep, local, torch.full_like(ids, -1))


def top2_sum_gate_ref(
    logits: torch.Tensor,
    bias: torch.Tensor,
    num_topk: int,
    num_topk_groups: int,
    num_groups: int,
    num_shared_experts: int,
    routed_scaling_factor: float,
    ep_rank: int,
    num_ep_ranks: int,
    tp_rank: int,
    num_tp_ranks: int,
    scoring: str,
    to_physical_map: torch.Tensor | None = None,
    logical_count: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    fix_routing_mask: torch.Tensor | None = None,
    unmapped_topk_idx: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_idx int64, topk_weights fp32), both (T, num_topk + num_shared_experts).

    TileKernels' optional tensors: ``mask`` False leaves a token unrouted (ids -1, weights 0);
    ``fix_routing_mask`` True takes the token's ids from ``unmapped_topk_idx`` (weights from their scores,
    read at the id clamped into 0 .. E - 1); ``unmapped_topk_idx`` is written in place with each token's
    logical ids (-1 for an unrouted token)."""
    num_tokens, num_experts = logits.shape
    scores = scores_of(logits, scoring)
    keys = _no_nan((logits if scoring == "softmax" else scores) + bias)
    order = torch.sort(keys, dim=-1, descending=True, stable=True).indices
    if num_groups and num_groups != num_topk_groups:
        per_group = num_experts // num_groups
        best_groups = stable_topk_idx(group_scores(keys.view(num_tokens, num_groups, per_group), 2), num_topk_groups)
        chosen = torch.zeros(num_tokens, num_groups, dtype=torch.bool, device=logits.device)
        chosen.scatter_(1, best_groups, True)
        in_chosen = chosen.gather(1, order // per_group)
        # Candidates first (a stable sort keeps the key order inside each part).
        order = order.gather(1, torch.sort(in_chosen.to(torch.int8), dim=-1, descending=True, stable=True).indices)
    ids = order[:, :num_topk]
    if fix_routing_mask is not None:
        assert unmapped_topk_idx is not None
        ids = torch.where(fix_routing_mask[:, None], unmapped_topk_idx, ids)
    picked = scores.gather(1, ids.clamp(0, num_experts - 1))
    weights = picked / sequential_sum(picked)[:, None] * routed_scaling_factor
    routed = torch.ones(num_tokens, dtype=torch.bool, device=logits.device) if mask is None else mask
    if unmapped_topk_idx is not None:
        unmapped_topk_idx.copy_(torch.where(routed[:, None], ids, torch.full_like(ids, -1)))
    shared = torch.arange(num_experts, num_experts + num_shared_experts, device=logits.device)
    ids = torch.cat([ids, shared.expand(num_tokens, -1)], dim=1)
    weights = torch.cat([weights, torch.ones(num_tokens, num_shared_experts, device=logits.device)], dim=1)
    num_extra = 0
    valid = (ids >= 0) & (ids < num_experts + num_shared_experts)
    if to_physical_map is not None:
        assert logical_count is not None
        num_extra = to_physical_map.shape[1] - 1
        at = torch.where(valid, ids, torch.zeros_like(ids))
        count = logical_count.long().clamp(1, to_physical_map.shape[1])[at]
        token = torch.arange(num_tokens, device=logits.device)[:, None]
        ids = torch.where(valid, to_physical_map.long()[at, (ep_rank + token * HASH_PRIME) % count], ids)
    experts_per_rank = (num_experts + num_extra) // num_ep_ranks
    ids = mask_by_tp(ids, experts_per_rank, tp_rank, num_tp_ranks)
    ids = torch.where(routed[:, None], ids, torch.full_like(ids, -1))
    return ids, torch.where(routed[:, None], weights, torch.zeros_like(weights))


def mask_indices_by_tp_ref(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int,
                           num_tp_ranks: int) -> torch.Tensor:
    per_gpu = n // num_ep_ranks
    v = indices.long()
    masked = mask_by_tp(v, per_gpu, tp_rank, num_tp_ranks)
    return torch.where(v < 0, torch.full_like(v, -1), masked).to(indices.dtype)


def unique_group_indices_ref(group_indices: torch.Tensor) -> torch.Tensor:
    """A copy of group_indices with every repeat of an earlier non-negative id in its row set to -1."""
    out = group_indices.clone()
    for k in range(1, group_indices.shape[1]):
        repeat = (group_indices[:, :k] == group_indices[:, k:k + 1]).any(dim=1) & (group_indices[:, k] >= 0)
        out[:, k] = torch.where(repeat, torch.full_like(out[:, k], -1), out[:, k])
    return out


# Inputs with deliberate ties for the GPU tests. Equal (logit, bias) pairs give equal keys in
# any implementation; distinct pairs must give keys (and top-2 group sums) far enough apart that
# last-bit differences between the kernel's and torch's sigmoid / softplus cannot reorder them.
# Logits are non-negative: sigmoid(x) + sigmoid(-x) = 1 would make distinct pairs' sums equal
# in exact arithmetic but not in fp32. Biases are 0 or 4 (above twice the largest score, 1.75),
# so the bias decides first; with groups the bias is the same for all experts of a group, since
# (s1 + 0) + (s2 + 4) and (s2 + 0) + (s1 + 4) are equal in exact arithmetic only. Softmax keys
# (logit + bias) and their sums are exact in fp32.
TIE_LOGITS: tuple[float, ...] = (0.0, 0.25, 0.75, 1.5, 2.5, 3.0)
TIE_BIAS: tuple[float, ...] = (0.0, 4.0)
MIN_KEY_GAP = 1e-3  # pinned by tests/test_reference_moe_gate.py


def tie_gaps(scoring: str) -> tuple[float, float]:
    """(smallest gap between distinct keys, between top-2 sums of distinct pairs of one bias), float64."""
    logits = torch.tensor(TIE_LOGITS, dtype=torch.float64)
    base = logits if scoring == "softmax" else scores_of(logits, scoring)
    biases = torch.tensor(TIE_BIAS, dtype=torch.float64)
    keys = (base[:, None] + biases[None, :]).flatten()
    pairs = torch.combinations(torch.arange(base.numel()), r=2, with_replacement=True)
    sums = torch.cat([(base[pairs[:, 0]] + b) + (base[pairs[:, 1]] + b) for b in biases.tolist()])

    def smallest_gap(values: torch.Tensor) -> float:
        diff = (values[:, None] - values[None, :]).abs()
        return float(diff[~torch.eye(values.numel(), dtype=torch.bool)].min())

    return smallest_gap(keys), smallest_gap(sums)


def tie_inputs(num_tokens: int, num_experts: int, group_size: int, device: str = "cuda",
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (T, E), bias (E,)) drawn from TIE_LOGITS / TIE_BIAS; bias constant per group_size experts."""
    values = torch.tensor(TIE_LOGITS, device=device)
    choice = torch.randint(0, len(TIE_LOGITS), (num_tokens, num_experts), device=device, generator=generator)
    groups = torch.randint(0, len(TIE_BIAS), (num_experts // group_size,), device=device, generator=generator)
    bias = torch.tensor(TIE_BIAS, device=device)[groups].repeat_interleave(group_size)
    return values[choice], bias
