"""Plain-torch references of the MoE routing ops (module ``moe``): get_fused_mapping,
expand_to_fused(_with_sf), reduce_fused, group_count, aux_fi. CPU or GPU.

The mapping is integer logic written as a loop over experts with stable ordering, so it is
exact; reduce_fused accumulates in fp32 in k order with one rounding per product and per sum
(torch never fuses ``acc + a * b`` into an FMA), which is what the kernel does.
"""

from __future__ import annotations

import torch

from tests.reference.numeric import fma_f32

FP8_MAX = 448.0


def align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def get_fused_mapping_ref(
    topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
    num_tokens_per_expert) for a buffer of ``num_expanded_tokens`` positions.

    Expert e's entries (flat index i = token * K + k with topk_idx.flat[i] == e) take positions
    expert_start[e], expert_start[e] + 1, ... in ascending i; segments are align(count, alignment)
    long and follow each other in expert order. Positions without an entry hold -1; entries
    whose position would be >= num_expanded_tokens are dropped (token_topk_to_pos -1).
    """
    num_tokens, num_topk = topk_idx.shape
    flat = topk_idx.reshape(-1).long().cpu()
    device = topk_idx.device
    pos_to_expert = torch.full((num_expanded_tokens,), -1, dtype=torch.int32)
    pos_to_token = torch.full((num_expanded_tokens,), -1, dtype=torch.int32)
    pos_to_token_topk = torch.full((num_expanded_tokens,), -1, dtype=torch.int32)
    token_topk_to_pos = torch.full((flat.numel(),), -1, dtype=torch.int32)
    start = torch.zeros(num_experts, dtype=torch.int32)
    padded = torch.zeros(num_experts, dtype=torch.int32)
    offset = 0
    for e in range(num_experts):
        entries = torch.nonzero(flat == e).reshape(-1)  # ascending flat index
        positions = offset + torch.arange(entries.numel())
        keep = positions < num_expanded_tokens
        entries, positions = entries[keep], positions[keep]
        token_topk_to_pos[entries] = positions.int()
        pos_to_expert[positions] = e
        pos_to_token[positions] = (entries // num_topk).int()
        pos_to_token_topk[positions] = entries.int()
        start[e] = offset
        padded[e] = align(int((flat == e).sum()), alignment)
        offset += int(padded[e])
    return tuple(t.to(device) for t in (  # type: ignore[return-value]
        pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos.reshape(num_tokens, num_topk),
        start, start + padded, padded))


def expand_to_fused_ref(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """Row pos = x[t] for pos = token_topk_to_pos[t, k] >= 0; padding rows (pos_to_expert < 0) zero.

    Rows neither reached nor padding are zero here (the kernel leaves them unwritten; a mapping
    from get_fused_mapping has none).
    """
    out = torch.zeros((pos_to_expert.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
    pos = token_topk_to_pos.long()
    routed = pos >= 0
    tokens = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(pos)
    out[pos[routed]] = x[tokens[routed]]
    return out


def expand_to_fused_with_sf_ref(x: torch.Tensor, x_sf: torch.Tensor, token_topk_to_pos: torch.Tensor,
                                pos_to_expert: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(expanded data, expanded row-major scales); fp8 rows are moved as bytes."""
    data = expand_to_fused_ref(x.view(torch.uint8), token_topk_to_pos, pos_to_expert).view(x.dtype)
    return data, expand_to_fused_ref(x_sf, token_topk_to_pos, pos_to_expert)


def reduce_fused_ref(x: torch.Tensor, topk_weights: torch.Tensor | None, token_topk_to_pos: torch.Tensor,
                     x_sf: torch.Tensor | None = None, fp8_format: str = "",
                     sf: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] = sum_k (w[t, k] * x_sf[pos]) * float(x[pos]), fp32 from +0.0 in k order, each step one FMA
    (acc = fma(float(x[pos]), scale, acc)); slots with pos < 0 skipped.

    Output fp32 for fp32 x, else bf16 (round to nearest even); or e4m3 of clamp(acc * sf, +-448).
    """
    num_tokens, num_topk = token_topk_to_pos.shape
    acc = torch.zeros((num_tokens, x.shape[1]), dtype=torch.float32, device=x.device)
    pos = token_topk_to_pos.long()
    for k in range(num_topk):
        routed = pos[:, k] >= 0
        rows = x[pos[:, k].clamp(min=0)].float()
        if topk_weights is not None and x_sf is not None:
            scale = topk_weights[:, k].float() * x_sf[pos[:, k].clamp(min=0)]
        elif topk_weights is not None:
            scale = topk_weights[:, k].float()
        elif x_sf is not None:
            scale = x_sf[pos[:, k].clamp(min=0)]
        else:
            scale = None
        # acc + rows * scale as one FMA (one rounding), as TileKernels' kernel and reference.
        acc = torch.where(routed[:, None], acc + rows if scale is None else fma_f32(rows, scale[:, None], acc), acc)
    if fp8_format == "e4m3":
        value = acc if sf is None else acc * sf.float()
        return value.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return acc if x.dtype == torch.float32 else acc.to(torch.bfloat16)


def group_count_ref(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """int32 (num_groups,): occurrences of each id in [0, num_groups); other ids ignored."""
    flat = group_idx.reshape(-1).long()
    flat = flat[(flat >= 0) & (flat < num_groups)]
    return torch.bincount(flat, minlength=num_groups).to(torch.int32)


def aux_fi_ref(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """f_i = float32(count_i * E) / float32(T * num_aux_topk) (one IEEE division), 0 where count_i = 0."""
    counts = group_count_ref(topk_idx, num_experts)
    numerator = (counts.long() * num_experts).to(torch.float32)
    denominator = torch.tensor(float(topk_idx.shape[0] * num_aux_topk), dtype=torch.float32, device=numerator.device)
    return torch.where(counts > 0, numerator / denominator, torch.zeros_like(numerator))
