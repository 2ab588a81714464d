"""CPU tests of the plain-torch MoE gating reference (tests/reference/moe_gate.py).

The GPU tests compare the kernels' ids bit for bit against this reference, so it is pinned
here on small hand-computed cases (ties, NaN, group limiting, shared experts, the physical map,
EP/TP masking) and against independent formulations (torch.topk on distinct values, a Python
loop for the deduplication).
"""

from __future__ import annotations

import pytest
import torch

from tests.reference.moe_gate import (
    EPS,
    MIN_KEY_GAP,
    TIE_BIAS,
    TIE_LOGITS,
    mask_indices_by_tp_ref,
    normalize_weight_ref,
    scores_of,
    tie_gaps,
    tie_inputs,
    top2_sum_gate_ref,
    topk_gate_ref,
    topk_sum_and_topk_group_idx_ref,
    unique_group_indices_ref,
)


def ids(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64)


def test_topk_gate_descending_ties_to_lower_id() -> None:
    scores = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0], [-1.0, -2.0, 5.0, -1.0]])
    assert torch.equal(topk_gate_ref(scores, 3), ids([[1, 2, 3], [0, 1, 2], [2, 0, 3]]))


def test_topk_gate_nan_ranks_below_minus_infinity_ties() -> None:
    scores = torch.tensor([[float("nan"), 1.0, float("-inf"), 0.0]])
    # NaN reads as -inf, and then the lower id (0) wins the tie with expert 2.
    assert torch.equal(topk_gate_ref(scores, 4), ids([[1, 3, 0, 2]]))


def test_topk_gate_matches_torch_topk_on_distinct_scores() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.stack([torch.randperm(72, generator=g).float() for _ in range(16)])
    assert torch.equal(topk_gate_ref(scores, 8), torch.topk(scores, 8).indices)


def test_group_idx_top1_and_top2_sums() -> None:
    scores = torch.tensor([[[1.0, 5.0], [3.0, 3.0], [6.0, 0.0], [2.0, 2.0]]])
    # top-2 sums 6, 6, 6, 4: the three equal groups in id order.
    assert torch.equal(topk_sum_and_topk_group_idx_ref(scores, 2, 3), ids([[0, 1, 2]]))
    # top-1: 5, 3, 6, 2.
    assert torch.equal(topk_sum_and_topk_group_idx_ref(scores, 1, 2), ids([[2, 0]]))


def test_group_sum_is_largest_plus_second_in_fp32() -> None:
    # 2^24 + 1 is not a float32: the sum rounds once, the same for every order of two terms.
    scores = torch.tensor([[[2.0**24, 1.0, 0.0], [2.0**24, 0.5, 0.75]]])
    assert torch.equal(topk_sum_and_topk_group_idx_ref(scores, 2, 2), ids([[0, 1]]))


def test_normalize_weight_sums_from_eps_in_order() -> None:
    w = torch.tensor([[1.0, 3.0], [0.0, 0.0], [2.0**-80, 2.0**-80]])
    denominator, normalized = normalize_weight_ref(w)
    eps = torch.tensor(EPS, dtype=torch.float32)
    assert torch.equal(denominator, torch.stack([eps + 1.0 + 3.0, eps, eps + 2.0**-80 + 2.0**-80]))
    assert torch.equal(normalized[0], torch.tensor([0.25, 0.75]))
    assert torch.equal(normalized[1], torch.zeros(2))
    assert torch.allclose(normalized[2], torch.full((2,), 2.0**-80) / (eps + 2.0**-79))


def gate(logits: list[list[float]], bias: list[float], k: int, scoring: str, *, groups: tuple[int, int] = (0, 0),
         shared: int = 0, scale: float = 1.0, ranks: tuple[int, int, int, int] = (0, 1, 0, 1),
         mapping: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    top_groups, num_groups = groups
    ep_rank, num_ep, tp_rank, num_tp = ranks
    m, c = mapping if mapping is not None else (None, None)
    return top2_sum_gate_ref(torch.tensor(logits), torch.tensor(bias), k, top_groups, num_groups, shared, scale,
                             ep_rank, num_ep, tp_rank, num_tp, scoring, m, c)


def test_gate_selects_on_biased_score_and_weights_unbiased() -> None:
    idx, w = gate([[0.0, 0.0, 0.0, 0.0]], [0.0, 0.0, 1.0, 0.0], 2, "sigmoid", scale=2.0)
    assert torch.equal(idx, ids([[2, 0]]))  # bias lifts expert 2; then the tie goes to id 0
    # Unbiased sigmoid(0) = 0.5 for both: 0.5 / (1e-20 + 1.0) * 2 = 1.0.
    assert torch.equal(w, torch.tensor([[1.0, 1.0]]))


def test_gate_softmax_selects_on_biased_logits() -> None:
    idx, w = gate([[2.0, 1.0, 0.0, 1.0]], [0.0, 0.0, 2.5, 0.0], 2, "softmax")
    assert torch.equal(idx, ids([[2, 0]]))  # keys 2, 1, 2.5, 1
    p = torch.softmax(torch.tensor([2.0, 1.0, 0.0, 1.0]), 0)
    assert torch.allclose(w, (torch.stack([p[2], p[0]]) / (p[2] + p[0]))[None], rtol=1e-6, atol=0)


def test_gate_sqrtsoftplus_scores() -> None:
    idx, w = gate([[30.0, 0.0, -1.0, 0.5]], [0.0] * 4, 2, "sqrtsoftplus")
    assert torch.equal(idx, ids([[0, 3]]))
    s0, s3 = 30.0**0.5, torch.log1p(torch.exp(torch.tensor(0.5))).sqrt()  # softplus(30) = 30 (threshold 20)
    assert torch.allclose(w, torch.tensor([[s0, float(s3)]]) / (s0 + s3), rtol=1e-6, atol=0)


def test_gate_group_limited_routing() -> None:
    # 4 groups of 2 experts; top-2 sums 0, 6, 4, 2: groups 1 and 2 win although expert 0 is best.
    logits = [[10.0, -10.0, 3.0, 3.0, 2.0, 2.0, 1.0, 1.0]]
    idx, _ = gate(logits, [0.0] * 8, 3, "softmax", groups=(2, 4))
    assert torch.equal(idx, ids([[2, 3, 4]]))
    idx_all_groups, _ = gate(logits, [0.0] * 8, 3, "softmax", groups=(4, 4))
    assert torch.equal(idx_all_groups, gate(logits, [0.0] * 8, 3, "softmax")[0])
    assert torch.equal(idx_all_groups, ids([[0, 2, 3]]))


def test_gate_shared_experts_and_physical_map() -> None:
    # E = 4, K = 2, one shared expert (logical id 4); each logical expert e has copies e and e + 5.
    to_physical = torch.tensor([[e, e + 5] for e in range(5)], dtype=torch.int32)
    count = torch.tensor([2, 2, 1, 2, 2], dtype=torch.int32)
    logits = [[1.0, 0.0, 3.0, 2.0], [1.0, 0.0, 3.0, 2.0]]
    idx, w = gate(logits, [0.0] * 4, 2, "sigmoid", shared=1, mapping=(to_physical, count))
    # Token 0 takes duplicate (0 + 0 * 23333) % count = 0, token 1 duplicate 23333 % 2 = 1
    # (expert 2 has one copy only: always duplicate 0).
    assert torch.equal(idx, ids([[2, 3, 4], [2, 8, 9]]))
    assert torch.equal(w[:, 2], torch.ones(2))
    assert torch.allclose(w[:, :2].sum(1), torch.ones(2), rtol=1e-6, atol=0)


def test_gate_tp_masking_packs_local_ids() -> None:
    # 8 experts, 4 EP ranks (2 experts each), 2 TP ranks: TP rank 1 owns EP ranks 1 and 3.
    logits = [[float(e) for e in range(8)]]
    idx, _ = gate(logits, [0.0] * 8, 8, "sigmoid", ranks=(0, 4, 1, 2))
    # Descending ids 7..0 -> 7: 3, 6: 2, 3: 1, 2: 0, the others -1.
    assert torch.equal(idx, ids([[3, 2, -1, -1, 1, 0, -1, -1]]))


def test_mask_indices_by_tp() -> None:
    indices = ids([[0, 1, 2, 3, 4, 5, 6, 7, -1]])
    assert torch.equal(mask_indices_by_tp_ref(indices, 8, 4, 0, 2), ids([[0, 1, -1, -1, 2, 3, -1, -1, -1]]))
    assert torch.equal(mask_indices_by_tp_ref(indices, 8, 4, 1, 2), ids([[-1, -1, 0, 1, -1, -1, 2, 3, -1]]))
    assert torch.equal(mask_indices_by_tp_ref(indices.int(), 8, 8, 0, 1), indices.int())


@pytest.mark.parametrize("seed", range(3))
def test_unique_group_indices_matches_a_loop(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(-1, 6, (32, 8), generator=g)
    expected = rows.clone()
    for r in range(rows.shape[0]):
        seen: set[int] = set()
        for k in range(rows.shape[1]):
            v = int(rows[r, k])
            if v >= 0 and v in seen:
                expected[r, k] = -1
            seen.add(v)
    assert torch.equal(unique_group_indices_ref(rows), expected)
    assert torch.equal(unique_group_indices_ref(ids([[3, 1, 3, -1, 1, -1, 2]])), ids([[3, 1, -1, -1, -1, -1, 2]]))


@pytest.mark.parametrize("scoring", ["sigmoid", "sqrtsoftplus"])
def test_tie_inputs_keep_distinct_keys_apart(scoring: str) -> None:
    """The GPU tests' tie inputs: equal keys only from equal (logit, bias), others >= 1e-3 apart."""
    key_gap, sum_gap = tie_gaps(scoring)
    assert key_gap >= MIN_KEY_GAP and sum_gap >= MIN_KEY_GAP, (key_gap, sum_gap)


def test_tie_inputs_are_exact_softmax_keys() -> None:
    """Softmax selects on logit + bias: every key and top-2 sum of the tie inputs is exact in fp32."""
    keys = torch.tensor(TIE_LOGITS, dtype=torch.float64)[:, None] + torch.tensor(TIE_BIAS, dtype=torch.float64)
    sums = keys.flatten()[:, None] + keys.flatten()[None, :]
    for values in (keys, sums):
        assert torch.equal(values.float().double(), values)


def test_tie_inputs_share_bias_within_groups() -> None:
    logits, bias = tie_inputs(5, 64, 8, device="cpu", generator=torch.Generator().manual_seed(1))
    assert logits.shape == (5, 64) and set(logits.unique().tolist()) <= set(TIE_LOGITS)
    assert (bias.view(8, 8) == bias.view(8, 8)[:, :1]).all() and set(bias.tolist()) <= set(TIE_BIAS)


@pytest.mark.parametrize("scoring", ["sigmoid", "sqrtsoftplus"])
def test_equal_logits_score_equal_anywhere_in_the_tensor(scoring: str) -> None:
    """Ties must survive torch's vectorized body / scalar tail split (4001 x 16 has a tail)."""
    logits, bias = tie_inputs(4001, 16, 1, device="cpu", generator=torch.Generator().manual_seed(0))
    keys = scores_of(logits, scoring) + bias
    for value in TIE_LOGITS:
        for b in TIE_BIAS:
            same = keys[(logits == value) & (bias == b)]
            assert same.numel() == 0 or bool((same == same[0]).all()), (value, b)
