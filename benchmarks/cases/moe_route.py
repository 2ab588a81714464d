"""MoE routing: get_fused_mapping, expand_to_fused, reduce_fused and the whole gate -> mapping ->
expand -> reduce chain, against plain-torch equivalents (eager and torch.compile).

Shape: T = 16384 tokens, K = 8, H = 7168 bf16, E = 32 local experts (the largest built),
alignment 128. The chain is expert parallelism as deployed: the gate picks K of E_GLOBAL = 256
experts per token, and this rank (rank 0 of 8) maps, expands and reduces the pairs routed to
its 32 local experts (ids outside [0, 32) are dropped by the mapping). The gate step is
``tk.moe.topk_gate`` when the wheel has it, else torch.topk (the row note says which). Host
overhead per call is measured separately, at tiny sizes, by benchmarks/runtime_overhead.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from bench import Row, Timer, bench_case

T, K, H, E, ALIGN = 16384, 8, 7168, 32, 128
E_GLOBAL = 256  # experts the gate chooses from; this rank owns ids 0 .. E - 1
N = (T * K + (ALIGN - 1) * E + ALIGN - 1) // ALIGN * ALIGN  # the no-sync worst-case buffer


def torch_mapping(topk_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch (token_topk_to_pos, pos_to_expert) with the same layout, sort-based, no sync."""
    flat = topk_idx.reshape(-1)
    valid = (flat >= 0) & (flat < E)
    key = torch.where(valid, flat, E)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=E + 1)[:E]
    padded = (counts + ALIGN - 1) // ALIGN * ALIGN
    start = torch.cumsum(padded, 0) - padded
    first = torch.cumsum(counts, 0) - counts
    sorted_key = key[order]
    kept = sorted_key < E
    expert = sorted_key.clamp(max=E - 1)
    pos = start[expert] + torch.arange(flat.numel(), device=flat.device) - first[expert]
    token_topk_to_pos = torch.full_like(flat, -1, dtype=torch.int32)
    token_topk_to_pos[order] = torch.where(kept, pos, -1).int()
    pos_to_expert = torch.full((N,), -1, dtype=torch.int32, device=flat.device)
    pos_to_expert[pos[kept]] = expert[kept].int()
    return token_topk_to_pos.view(topk_idx.shape), pos_to_expert


def torch_expand(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    out = torch.zeros((pos_to_expert.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
    pos = token_topk_to_pos.long()
    routed = pos >= 0
    tokens = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(pos)
    out[pos[routed]] = x[tokens[routed]]
    return out


def torch_reduce(x: torch.Tensor, w: torch.Tensor, token_topk_to_pos: torch.Tensor) -> torch.Tensor:
    pos = token_topk_to_pos.long()
    acc = torch.zeros((pos.shape[0], x.shape[1]), dtype=torch.float32, device=x.device)
    for k in range(pos.shape[1]):
        acc = acc + x[pos[:, k].clamp(min=0)].float() * (w[:, k] * (pos[:, k] >= 0))[:, None]
    return acc.to(torch.bfloat16)


def rows(timer: Timer, copy_gb_s: float, tk: Any) -> list[Row]:
    moe: Any = getattr(tk, "moe", None)
    has = moe is not None and hasattr(moe, "get_fused_mapping")
    missing = "" if has else "ours n/a: the wheel has no moe routing ops"
    gate_name = "tk.moe.topk_gate" if has and hasattr(moe, "topk_gate") else "torch.topk"

    def gate(scores: torch.Tensor) -> torch.Tensor:
        if gate_name == "torch.topk":
            return scores.topk(K, dim=1).indices
        return moe.topk_gate(scores, K)  # type: ignore[union-attr]

    def make_ids(experts: int = E) -> tuple[torch.Tensor]:
        return (torch.rand((T, experts), device="cuda").topk(K, dim=1).indices,)

    def routed_inputs(experts: int = E) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        (ids,) = make_ids(experts)
        tk2p, p2e = torch_mapping(ids)
        return ids, tk2p, p2e

    def make_expand(experts: int = E) -> tuple[torch.Tensor, ...]:
        _, tk2p, p2e = routed_inputs(experts)
        return torch.randn((T, H), device="cuda", dtype=torch.bfloat16), tk2p, p2e

    def make_expand_ep() -> tuple[torch.Tensor, ...]:
        # The chain's expand alone: ids of E_GLOBAL experts, so about an eighth of the pairs are local and most of the
        # N rows are padding to zero (tuning sweep 49: the two routings favour different kernel forms).
        return make_expand(E_GLOBAL)

    def make_reduce() -> tuple[torch.Tensor, ...]:
        _, tk2p, _ = routed_inputs()
        return torch.randn((N, H), device="cuda", dtype=torch.bfloat16), torch.rand((T, K), device="cuda"), tk2p

    def make_chain() -> tuple[torch.Tensor, ...]:
        return torch.rand((T, E_GLOBAL), device="cuda"), torch.randn((T, H), device="cuda", dtype=torch.bfloat16), \
            torch.rand((T, K), device="cuda")

    def ours_chain(scores: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # Experts of other ranks as -1 (what TileKernels' mapping takes; ids >= E would index past its counters).
        ids = gate(scores)
        ids = torch.where(ids < E, ids, -1)
        p2e, _, _, tk2p, *_ = moe.get_fused_mapping(ids, E, N, ALIGN)  # type: ignore[union-attr]
        return moe.reduce_fused(moe.expand_to_fused(x, tk2p, p2e), w, tk2p)  # type: ignore[union-attr]

    def torch_chain(scores: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        tk2p, p2e = torch_mapping(scores.topk(K, dim=1).indices)
        return torch_reduce(torch_expand(x, tk2p, p2e), w, tk2p)

    cases: list[tuple[str, str, Callable[[], tuple[torch.Tensor, ...]], Any, Any]] = [
        ("get_fused_mapping", f"T={T} K={K} E={E} align={ALIGN}", make_ids,
         (lambda ids: moe.get_fused_mapping(ids, E, N, ALIGN)[:7]) if has else None,  # type: ignore[union-attr]
         lambda ids: torch_mapping(ids)),
        ("expand_to_fused", f"T={T} K={K} H={H} bf16", make_expand, moe.expand_to_fused if has else None,
         torch_expand),
        ("expand_to_fused", f"T={T} K={K} H={H} bf16, {E} of {E_GLOBAL} experts local", make_expand_ep,
         moe.expand_to_fused if has else None, torch_expand),
        ("reduce_fused", f"T={T} K={K} H={H} bf16", make_reduce, moe.reduce_fused if has else None, torch_reduce),
        ("gate -> mapping -> expand -> reduce", f"T={T} K={K} H={H} E={E_GLOBAL} (local {E})", make_chain,
         ours_chain if has else None, torch_chain),
    ]
    out = []
    for op, shape, make, ours, eager in cases:
        row = bench_case(timer, copy_gb_s, op, shape, make, ours, eager, missing)
        notes = [row.note] if row.note else []
        if op.startswith("gate"):
            notes.append(f"gate: {gate_name} (torch chain: torch.topk)")
        out.append(dataclasses.replace(row, note="; ".join(notes)))
    return out
