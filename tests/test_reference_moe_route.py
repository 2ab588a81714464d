"""CPU tests of the plain-torch MoE routing reference (tests/reference/moe_route.py).

The GPU tests compare the kernels bit for bit against this reference, so it is pinned here by
hand-computed mappings and by properties any fused mapping must have.
"""

from __future__ import annotations

import pytest
import torch

from tests.reference.moe_route import (
    aux_fi_ref,
    expand_to_fused_ref,
    expand_to_fused_with_sf_ref,
    get_fused_mapping_ref,
    group_count_ref,
    reduce_fused_ref,
)

I32 = torch.int32


def test_mapping_by_hand() -> None:
    # 3 tokens, K = 2, E = 3, alignment 4. Expert 0: (0,1), (2,0); expert 1: (0,0), (1,1);
    # expert 2: none; (1,0) is masked and (2,1) is out of range: both dropped.
    topk_idx = torch.tensor([[1, 0], [-1, 1], [0, 7]])
    p2e, p2t, p2tk, tk2p, start, end, count = get_fused_mapping_ref(topk_idx, 3, 8, 4)
    assert p2e.tolist() == [0, 0, -1, -1, 1, 1, -1, -1]
    assert p2t.tolist() == [0, 2, -1, -1, 0, 1, -1, -1]
    assert p2tk.tolist() == [1, 4, -1, -1, 0, 3, -1, -1]
    assert tk2p.tolist() == [[4, 0], [-1, 5], [1, -1]]
    assert start.tolist() == [0, 4, 8] and end.tolist() == [4, 8, 8] and count.tolist() == [4, 4, 0]
    assert all(t.dtype == I32 for t in (p2e, p2t, p2tk, tk2p, start, end, count))


def test_mapping_drops_entries_past_the_buffer() -> None:
    topk_idx = torch.tensor([[1, 0], [0, 1]])
    p2e, _, _, tk2p, start, end, _ = get_fused_mapping_ref(topk_idx, 2, 3, 2)
    assert p2e.tolist() == [0, 0, 1] and tk2p.tolist() == [[2, 0], [1, -1]]
    assert start.tolist() == [0, 2] and end.tolist() == [2, 4]  # the segments do not shrink


@pytest.mark.parametrize("alignment", [1, 3, 128])
def test_mapping_properties(alignment: int) -> None:
    gen = torch.Generator().manual_seed(alignment)
    num_experts, tokens, k = 9, 50, 6
    topk_idx = torch.randint(-1, num_experts, (tokens, k), generator=gen)
    size = tokens * k + num_experts * alignment
    p2e, p2t, p2tk, tk2p, start, end, count = get_fused_mapping_ref(topk_idx, num_experts, size, alignment)
    kept = topk_idx >= 0
    assert ((tk2p >= 0) == kept).all()
    # The inverse maps agree and every kept entry sits in its expert's segment, in (token, k) order.
    flat_pos = tk2p.reshape(-1).long()
    entries = torch.nonzero(kept.reshape(-1)).reshape(-1)
    assert (p2tk[flat_pos[entries]] == entries).all()
    assert (p2t[flat_pos[entries]] == entries // k).all()
    assert (p2e[flat_pos[entries]] == topk_idx.reshape(-1)[entries]).all()
    for e in range(num_experts):
        seg = p2tk[start[e]:end[e]]
        used = seg[seg >= 0]
        assert used.tolist() == sorted(used.tolist()) and int((seg < 0).sum()) == int(count[e]) - used.numel()
        assert int(count[e]) % alignment == 0 and int(count[e]) - used.numel() < alignment
    assert (end - start == count).all() and (start[1:] == end[:-1]).all() and int(start[0]) == 0
    assert int((p2e >= 0).sum()) == int(kept.sum())


def test_expand_by_hand() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16)
    tk2p = torch.tensor([[2, -1], [0, 1]], dtype=I32)
    p2e = torch.tensor([0, 0, 1, -1], dtype=I32)
    assert expand_to_fused_ref(x, tk2p, p2e).tolist() == [[3, 4], [3, 4], [1, 2], [0, 0]]
    data, sf = expand_to_fused_with_sf_ref(x.to(torch.float8_e4m3fn), torch.tensor([[0.5], [2.0]]), tk2p, p2e)
    assert data.float().tolist() == [[3, 4], [3, 4], [1, 2], [0, 0]] and sf.reshape(-1).tolist() == [2, 2, 0.5, 0]


def test_reduce_by_hand_and_in_k_order() -> None:
    x = torch.tensor([[1.0, 10.0], [2.0, 20.0], [4.0, 40.0]], dtype=torch.bfloat16)
    tk2p = torch.tensor([[0, 2], [-1, 1]], dtype=I32)
    w = torch.tensor([[0.5, 0.25], [3.0, 2.0]])
    assert reduce_fused_ref(x, w, tk2p).float().tolist() == [[1.5, 15.0], [4.0, 40.0]]
    assert reduce_fused_ref(x, None, tk2p).float().tolist() == [[5.0, 50.0], [2.0, 20.0]]
    # k order matters in fp32: (2^24 + 1) - 2^24 loses the 1 unless added last.
    big = torch.tensor([[2.0**24], [1.0], [-(2.0**24)]], dtype=torch.float32).to(torch.bfloat16)
    ones = torch.ones(1, 3)
    order_a = reduce_fused_ref(big, ones, torch.tensor([[0, 1, 2]], dtype=I32))
    order_b = reduce_fused_ref(big, ones, torch.tensor([[0, 2, 1]], dtype=I32))
    assert order_a.float().item() == 0.0 and order_b.float().item() == 1.0


def test_reduce_fp8_input_and_output() -> None:
    x = torch.tensor([[1.0, -2.0], [448.0, 3.0]]).to(torch.float8_e4m3fn)
    x_sf = torch.tensor([2.0, 0.5])
    tk2p = torch.tensor([[0, 1]], dtype=I32)
    w = torch.tensor([[1.0, 4.0]])
    # 1 * (1 * 2) + 448 * (4 * 0.5) = 898 in fp32, 896 after rounding to bf16 (8 significant bits).
    assert reduce_fused_ref(x, w, tk2p, x_sf=x_sf).float().tolist() == [[896.0, 2.0]]
    out = reduce_fused_ref(x, w, tk2p, x_sf=x_sf, fp8_format="e4m3", sf=torch.tensor([0.25]))
    assert out.dtype == torch.float8_e4m3fn and out.float().tolist() == [[224.0, 0.5]]  # 898 / 4 = 224.5 -> 224 in e4m3
    clamped = reduce_fused_ref(x, w, tk2p, x_sf=x_sf, fp8_format="e4m3")
    assert clamped.float().tolist() == [[448.0, 2.0]]


def test_reduce_fp32_rows_stay_fp32_and_take_row_scales() -> None:
    # 1 + 2^-20 is exact in fp32 and rounds to 1 in bf16: fp32 rows sum into an fp32 output (TileKernels returns
    # x's dtype), and a row scale applies to bf16 and fp32 rows as to fp8 ones.
    x = torch.tensor([[1.0], [2.0**-20]])
    tk2p = torch.tensor([[0, 1]], dtype=I32)
    out = reduce_fused_ref(x, None, tk2p)
    assert out.dtype == torch.float32 and out.item() == 1.0 + 2.0**-20
    assert reduce_fused_ref(x.bfloat16(), None, tk2p).item() == 1.0
    scaled = reduce_fused_ref(x, torch.tensor([[0.5, 1.0]]), tk2p, x_sf=torch.tensor([4.0, 2.0**20]))
    assert scaled.item() == 3.0


def test_counts_and_aux_fi() -> None:
    idx = torch.tensor([[0, 2], [2, -1], [5, 2]])
    assert group_count_ref(idx, 4).tolist() == [1, 0, 3, 0]
    fi = aux_fi_ref(idx, 4, 2)
    # f_i = count * E / (T * aux_topk) = count * 4 / 6.
    assert fi.tolist() == [torch.tensor(4.0 / 6.0).item(), 0.0, 2.0, 0.0]
    assert aux_fi_ref(idx[:0], 4, 2).tolist() == [0.0] * 4
