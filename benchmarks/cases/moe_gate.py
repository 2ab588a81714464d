"""MoE gating at the production shape (T = 16384 tokens, E = 256 experts, K = 8): µs per call.

Eager baselines are the plain torch formulations (torch.topk, a DeepSeek-V3 style grouped
sigmoid gate, a row sum and division); "compiled" is torch.compile of the same functions.
These ops move little data (16 MiB of logits), so the interesting column is the time, not
the % of copy bandwidth.
"""

from __future__ import annotations

from typing import Any

import torch
from bench import Inputs, Row, Timer, bench_case

T, E, K, GROUPS, TOP_GROUPS = 16384, 256, 8, 8, 4
SCALE = 2.5


def _logits() -> Inputs:
    return (torch.randn(T, E, device="cuda"), torch.randn(E, device="cuda") * 0.1)


def _eager_gate(logits: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid scores, top-2-sum group limiting, top-k on biased scores, normalized weights."""
    scores = torch.sigmoid(logits)
    keys = scores + bias
    group_keys = keys.view(T, GROUPS, -1).topk(2, dim=-1).values.sum(-1)
    groups = group_keys.topk(TOP_GROUPS, dim=-1).indices
    keep = torch.zeros_like(group_keys, dtype=torch.bool).scatter_(1, groups, True)
    keys = keys.masked_fill(~keep.repeat_interleave(E // GROUPS, dim=1), float("-inf"))
    idx = keys.topk(K, dim=-1).indices
    weights = scores.gather(1, idx)
    return idx, weights / (weights.sum(-1, keepdim=True) + 1e-20) * SCALE


def _eager_normalize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    denominator = w.sum(-1) + 1e-20
    return denominator, w / denominator[:, None]


def rows(timer: Timer, copy_gb_s: float, tk: Any) -> list[Row]:
    moe = getattr(tk, "moe", None)
    missing = "" if moe is not None else "ours n/a: the wheel has no moe module"

    def ours(name: str) -> Any:
        return getattr(moe, name, None) if moe is not None else None

    topk_gate, gate, normalize = ours("topk_gate"), ours("top2_sum_gate"), ours("normalize_weight")
    shape = f"T={T} E={E} K={K}"
    return [
        bench_case(timer, copy_gb_s, "topk_gate", shape, lambda: (torch.randn(T, E, device="cuda"),),
                   (lambda s: topk_gate(s, K)) if topk_gate else None,
                   lambda s: torch.topk(s, K, dim=-1).indices, missing),
        bench_case(timer, copy_gb_s, "top2_sum_gate sigmoid", f"{shape} groups {TOP_GROUPS}/{GROUPS}", _logits,
                   (lambda lg, b: gate(lg, b, K, TOP_GROUPS, GROUPS, False, 0, SCALE, 0, 1, 0, 1, "sigmoid"))
                   if gate else None, _eager_gate, missing),
        bench_case(timer, copy_gb_s, "normalize_weight", f"T={T} K={K}", lambda: (torch.rand(T, K, device="cuda"),),
                   normalize, _eager_normalize, missing),
    ]
