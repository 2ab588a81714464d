"""GPU tests of the MoE gating ops of ``tile_kernels_aot.moe`` against tests/reference/moe_gate.py.

Tolerances: ids (topk_gate, group ids, top2_sum_gate ids, masking, deduplication) and
normalize_weight are compared exactly (same fp32 operations in the same order). The
top2_sum_gate weights are ratios of transcendental scores (sigmoid, log1p / exp / sqrt, exp)
that CUDA's libm and torch may round differently by a few ulp; each weight carries about 8
roundings, so they are compared with rtol 2e-6 (about 16 ulp) and atol 1e-7.

Inputs are fresh random draws with deliberate ties: scores rounded to a handful of values, and
for top2_sum_gate the tie inputs of the reference (equal keys come only from equal
(logit, bias) pairs, distinct keys are >= 1e-3 apart), so the lower-id tie rule is exercised
on every row while fp32 rounding cannot reorder distinct keys. Every built variant runs at
num_tokens 0, 1, 4001 and 16384. Launchers are also called directly on outputs poisoned with
-7 / NaN, which catches any element a kernel fails to write.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.reference.moe_gate import (
    mask_indices_by_tp_ref,
    normalize_weight_ref,
    tie_inputs,
    top2_sum_gate_ref,
    topk_gate_ref,
    topk_sum_and_topk_group_idx_ref,
    unique_group_indices_ref,
)

tile_kernels_aot, _, errors, runtime = installed_package()
moe = importlib.import_module("tile_kernels_aot.moe")

pytestmark = pytest.mark.gpu

TOKENS = [0, 1, 4001, 16384]
WEIGHT_RTOL, WEIGHT_ATOL = 2e-6, 1e-7
POISON_ID = -7


def built(kernel: str) -> list[dict[str, Any]]:
    k = runtime.get_kernel(kernel)
    return [dict(zip(k.keys, v)) for v in k.variants]


def vid(v: dict[str, Any]) -> str:
    return "-".join(f"{k}={val}" for k, val in v.items())


def tie_scores(num_tokens: int, num_experts: int) -> torch.Tensor:
    """Scores in {-1, -0.75, ..., 0.75}: about num_experts / 8 equal scores per value and row."""
    return torch.randint(-4, 4, (num_tokens, num_experts), device="cuda").float() / 4


def assert_same_ids(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    wrong = (got != want).any(dim=-1).nonzero().flatten()
    assert wrong.numel() == 0, (f"{wrong.numel()} of {got.shape[0]} rows differ; first row {int(wrong[0])}: "
                                f"got {got[wrong[0]].tolist()}, want {want[wrong[0]].tolist()}")


# --- topk_gate ------------------------------------------------------------------------------

# The variants for any E (grid value 0) at E without a variant of their own, up to each one's capacity: TileKernels'
# 32, 36, 96, 108, 128 and the largest, 256 - 4; each case carries the E it runs at ("experts").
TOPK = [{**v, "experts": e} for v in built("topk_gate")
        for e in ((32, 36, 96, 108, 128, 252) if v["num_experts"] == 0 else (v["num_experts"],))
        if e <= v["capacity"]]


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("v", TOPK, ids=vid)
def test_topk_gate(v: dict[str, Any], num_tokens: int) -> None:
    scores = tie_scores(num_tokens, v["experts"])
    assert_same_ids(moe.topk_gate(scores, v["num_topk"]), topk_gate_ref(scores, v["num_topk"]))


@pytest.mark.parametrize("v", TOPK, ids=vid)
def test_topk_gate_distinct_scores_nan_and_poison(v: dict[str, Any]) -> None:
    scores = torch.randn(4001, v["experts"], device="cuda")
    scores[::7, ::5] = float("nan")  # NaN ranks as -inf: every id stays a real expert id
    scores[1::7] = float("-inf")
    # Rows 2::7 hold a random permutation of distinct values: random normal rows tie now and then (two equal
    # fp32 draws among a row's top k), and torch.topk orders ties in no stated way.
    plain_rows = scores[2::7].shape[0]
    scores[2::7] = torch.rand(plain_rows, v["experts"], device="cuda").argsort(dim=-1).float() - 100.5
    out = torch.full((4001, v["num_topk"]), POISON_ID, dtype=torch.int64, device="cuda")
    runtime.get_kernel("topk_gate").select(**grid(v))(scores, out)
    assert_same_ids(out, topk_gate_ref(scores, v["num_topk"]))
    # Rows without NaN or ties: the same ids as torch.topk (an independent ranking).
    plain = scores[2::7]
    assert bool((plain.sort(dim=-1).values.diff(dim=-1) > 0).all())  # no ties
    assert_same_ids(out[2::7], torch.topk(plain, v["num_topk"]).indices)


# --- topk_sum_and_topk_group_idx ------------------------------------------------------------

GROUP = built("topk_sum_and_topk_group_idx")


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("v", GROUP, ids=vid)
def test_topk_sum_and_topk_group_idx(v: dict[str, Any], num_tokens: int) -> None:
    scores = tie_scores(num_tokens, v["num_groups"] * v["experts_per_group"])
    scores = scores.view(num_tokens, v["num_groups"], v["experts_per_group"])
    got = moe.topk_sum_and_topk_group_idx(scores, v["num_topk_sum"], v["num_topk_groups"])
    assert_same_ids(got, topk_sum_and_topk_group_idx_ref(scores, v["num_topk_sum"], v["num_topk_groups"]))


@pytest.mark.parametrize("v", GROUP, ids=vid)
def test_topk_group_poisoned_output(v: dict[str, Any]) -> None:
    scores = torch.randn(4001, v["num_groups"] * v["experts_per_group"], device="cuda")
    out = torch.full((4001, v["num_topk_groups"]), POISON_ID, dtype=torch.int64, device="cuda")
    runtime.get_kernel("topk_sum_and_topk_group_idx").select(**v)(scores, out)
    ref = topk_sum_and_topk_group_idx_ref(scores.view(4001, v["num_groups"], -1), v["num_topk_sum"],
                                          v["num_topk_groups"])
    assert_same_ids(out, ref)


# --- top2_sum_gate --------------------------------------------------------------------------

# E without a variant of their own (TileKernels' tests use them): the variant built for any E (grid value 0) runs
# them. Each case carries the E it runs at ("experts") beside its variant's grid values.
GENERIC_EXPERTS = (16, 36, 144, 252)
GATE = [{**v, "experts": e} for v in built("top2_sum_gate")
        for e in (GENERIC_EXPERTS if v["num_experts"] == 0 else (v["num_experts"],))
        if v["num_topk"] <= e]


def grid(v: dict[str, Any]) -> dict[str, Any]:
    """A case's grid values (what select() takes)."""
    return {key: value for key, value in v.items() if key != "experts"}


def shared_count(num_experts: int, num_topk: int) -> int:
    """The most shared experts (2, 1 or 0) TileKernels allows for (E, K)."""
    for s in (2, 1):
        if num_topk % s == 0 and num_experts % (num_topk // s) == 0:
            return s
    return 0


def gate_inputs(v: dict[str, Any], num_tokens: int) -> dict[str, Any]:
    """Tie inputs and, for physical_map variants, a random map with 1..3 copies per expert."""
    e, k = v.get("experts", v["num_experts"]), v["num_topk"]
    group_size = e // v["num_groups"] if v["num_groups"] else 1
    logits, bias = tie_inputs(num_tokens, e, group_size)
    args: dict[str, Any] = dict(logits=logits, bias=bias, num_topk=k, num_topk_groups=v["num_topk_groups"],
                                num_groups=v["num_groups"], use_shared_as_routed=False, num_shared_experts=0,
                                routed_scaling_factor=2.5, ep_rank=0, num_ep_ranks=1, tp_rank=0, num_tp_ranks=1,
                                scoring_func=v["scoring"])
    if v["physical_map"]:
        shared = shared_count(e, k)
        args.update(use_shared_as_routed=shared > 0, num_shared_experts=shared, ep_rank=3, num_ep_ranks=8)
        logical, copies = e + shared, 3
        args["to_physical_map"] = torch.randperm(logical * copies, device="cuda").view(logical, copies).int()
        args["logical_count"] = torch.randint(1, copies + 1, (logical,), device="cuda", dtype=torch.int32)
    return args


def gate_ref(args: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    shared = args["num_shared_experts"] if args["use_shared_as_routed"] else 0
    return top2_sum_gate_ref(args["logits"], args["bias"], args["num_topk"], args["num_topk_groups"],
                             args["num_groups"], shared, args["routed_scaling_factor"], args["ep_rank"],
                             args["num_ep_ranks"], args["tp_rank"], args["num_tp_ranks"], args["scoring_func"],
                             args.get("to_physical_map"), args.get("logical_count"))


def assert_gate_matches(args: dict[str, Any], idx: torch.Tensor, weights: torch.Tensor) -> None:
    ref_idx, ref_weights = gate_ref(args)
    assert_same_ids(idx, ref_idx)
    torch.testing.assert_close(weights, ref_weights, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL)


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("v", GATE, ids=vid)
def test_top2_sum_gate(v: dict[str, Any], num_tokens: int) -> None:
    args = gate_inputs(v, num_tokens)
    assert_gate_matches(args, *moe.top2_sum_gate(**args))


@pytest.mark.parametrize("v", [v for v in GATE if v["experts"] in (72, 144, 256) and v["num_topk"] in (6, 8)], ids=vid)
@pytest.mark.parametrize("ranks", [(5, 8, 1, 2), (2, 4, 3, 4)], ids=["ep8-tp2-rank1", "ep4-tp4-rank3"])
def test_top2_sum_gate_ep_tp_masking(v: dict[str, Any], ranks: tuple[int, int, int, int]) -> None:
    args = gate_inputs(v, 4001)
    args.update(ep_rank=ranks[0], num_ep_ranks=ranks[1], tp_rank=ranks[2], num_tp_ranks=ranks[3])
    idx, weights = moe.top2_sum_gate(**args)
    assert_gate_matches(args, idx, weights)


@pytest.mark.parametrize("v", [v for v in GATE if v["physical_map"] or v["num_groups"]], ids=vid)
def test_top2_sum_gate_poisoned_outputs(v: dict[str, Any]) -> None:
    """Direct launch on poisoned outputs: every routed and shared slot is written."""
    args = gate_inputs(v, 4001)
    ref_idx, ref_weights = gate_ref(args)
    idx = torch.full_like(ref_idx, POISON_ID)
    weights = torch.full_like(ref_weights, float("nan"))
    e = v["experts"]
    per_rank = (e + (args["to_physical_map"].shape[1] - 1 if v["physical_map"] else 0)) // args["num_ep_ranks"]
    tensors = [args["logits"], args["bias"]]
    if v["physical_map"]:
        tensors += [args["to_physical_map"], args["logical_count"]]
    launch = runtime.get_kernel("top2_sum_gate").select(**grid(v))
    launch(*tensors, idx, weights, args["routed_scaling_factor"], args["ep_rank"], per_rank, 0, 1)
    assert not torch.isnan(weights).any(), "some weights were never written"
    assert_same_ids(idx, ref_idx)
    torch.testing.assert_close(weights, ref_weights, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL)


@pytest.mark.parametrize("scoring", ["sigmoid", "sqrtsoftplus", "softmax"])
def test_top2_sum_gate_all_groups_kept_is_ungrouped(scoring: str) -> None:
    args = gate_inputs(dict(scoring=scoring, num_experts=256, num_topk=8, num_groups=0, num_topk_groups=0,
                            physical_map=False), 4001)
    ungrouped = moe.top2_sum_gate(**args)
    args.update(num_groups=8, num_topk_groups=8)
    grouped = moe.top2_sum_gate(**args)
    assert torch.equal(grouped[0], ungrouped[0]) and torch.equal(grouped[1], ungrouped[1])


@pytest.mark.parametrize("scoring", ["sigmoid", "sqrtsoftplus", "softmax"])
def test_top2_sum_gate_gaussian_logits(scoring: str) -> None:
    """Realistic logits (no ties) at the production shape (E = 256, K = 8).

    softmax selects on logit + bias, computed identically in fp32 by kernel and reference: ids
    are exact. sigmoid / sqrtsoftplus keys may differ in the last bit from torch's, which can
    swap two experts whose keys are within a few ulp: such rows are allowed (at most 1 in 1000)
    only when the swapped experts' float64 keys are within 1e-6 of each other.
    """
    # Group-limited for softmax only: with inexact keys a near-tie of two group sums would swap
    # whole groups, which this test could not tell from a bug.
    grouped = scoring == "softmax"
    args = gate_inputs(dict(scoring=scoring, num_experts=256, num_topk=8, num_groups=8 if grouped else 0,
                            num_topk_groups=4 if grouped else 0, physical_map=False), 16384)
    args["logits"] = torch.randn_like(args["logits"]) * 2
    args["bias"] = torch.randn_like(args["bias"]) * 0.1
    idx, weights = moe.top2_sum_gate(**args)
    ref_idx, ref_weights = gate_ref(args)
    torch.testing.assert_close(weights.sum(1), torch.full((16384,), 2.5, device="cuda"), rtol=1e-5, atol=0)
    if scoring == "softmax":
        assert_same_ids(idx, ref_idx)
        torch.testing.assert_close(weights, ref_weights, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL)
        return
    rows = (idx != ref_idx).any(dim=1)
    assert int(rows.sum()) <= 16, f"{int(rows.sum())} of 16384 rows pick other experts than the reference"
    logits64 = args["logits"][rows].double()
    keys = (torch.sigmoid(logits64) if scoring == "sigmoid" else torch.nn.functional.softplus(logits64).sqrt())
    keys = keys + args["bias"].double()
    got, want = keys.gather(1, idx[rows]), keys.gather(1, ref_idx[rows])
    assert torch.allclose(got, want, rtol=0, atol=1e-6), "rows differ by more than a near-tie of keys"
    same = ~rows
    torch.testing.assert_close(weights[same], ref_weights[same], rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL)


# --- top2_sum_gate with mask, fix_routing_mask and unmapped_topk_idx ---------------------------

MASKED = [{**v, "experts": e} for v in built("top2_sum_gate_masked")
          for e in ((16, 36, 72, 256) if v["num_experts"] == 0 else (v["num_experts"],)) if v["num_topk"] <= e]


def masked_inputs(v: dict[str, Any], num_tokens: int, generator: torch.Generator) -> dict[str, Any]:
    args = gate_inputs(v, num_tokens)
    e, k = v["experts"], v["num_topk"]
    args["mask"] = torch.rand(num_tokens, device="cuda", generator=generator) < 0.8
    args["fix_routing_mask"] = torch.rand(num_tokens, device="cuda", generator=generator) < 0.3
    # Fixed ids: distinct experts per row (a row of the reference's own selection would hide a bug).
    args["unmapped_topk_idx"] = torch.rand(num_tokens, e, device="cuda", generator=generator).argsort(1)[:, :k]
    return args


def masked_ref(args: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    unmapped = args["unmapped_topk_idx"].clone()
    shared = args["num_shared_experts"] if args["use_shared_as_routed"] else 0
    idx, weights = top2_sum_gate_ref(args["logits"], args["bias"], args["num_topk"], args["num_topk_groups"],
                                     args["num_groups"], shared, args["routed_scaling_factor"], args["ep_rank"],
                                     args["num_ep_ranks"], args["tp_rank"], args["num_tp_ranks"],
                                     args["scoring_func"], args.get("to_physical_map"), args.get("logical_count"),
                                     args.get("mask"), args.get("fix_routing_mask"), unmapped)
    return idx, weights, unmapped


@pytest.mark.parametrize("num_tokens", [0, 1, 13, 4001])
@pytest.mark.parametrize("v", MASKED, ids=vid)
def test_top2_sum_gate_masks(v: dict[str, Any], num_tokens: int) -> None:
    args = masked_inputs(v, num_tokens, torch.Generator(device="cuda").manual_seed(num_tokens + v["experts"]))
    ref_idx, ref_weights, ref_unmapped = masked_ref(args)
    idx, weights = moe.top2_sum_gate(**args)
    assert_same_ids(idx, ref_idx)
    assert_same_ids(args["unmapped_topk_idx"], ref_unmapped)
    torch.testing.assert_close(weights, ref_weights, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL)


@pytest.mark.parametrize("which", ["mask", "fix_routing_mask", "unmapped_topk_idx"])
def test_top2_sum_gate_each_optional_tensor_alone(which: str) -> None:
    v = dict(scoring="softmax", num_experts=0, experts=144, num_topk=8, num_groups=0, num_topk_groups=0,
             physical_map=True)
    args = masked_inputs(v, 4001, torch.Generator(device="cuda").manual_seed(5))
    keep = {"mask": ("mask",), "fix_routing_mask": ("fix_routing_mask", "unmapped_topk_idx"),
            "unmapped_topk_idx": ("unmapped_topk_idx",)}[which]
    for name in ("mask", "fix_routing_mask", "unmapped_topk_idx"):
        if name not in keep:
            del args[name]
    if "unmapped_topk_idx" in args and "fix_routing_mask" not in args:
        args["unmapped_topk_idx"] = torch.full_like(args["unmapped_topk_idx"], POISON_ID)  # written only
    ref_args = {**args, "unmapped_topk_idx": args["unmapped_topk_idx"].clone()} if "unmapped_topk_idx" in args \
        else {**args, "unmapped_topk_idx": torch.empty(4001, 8, dtype=torch.int64, device="cuda")}
    ref_idx, ref_weights, ref_unmapped = masked_ref(ref_args)
    idx, weights = moe.top2_sum_gate(**args)
    assert_same_ids(idx, ref_idx)
    torch.testing.assert_close(weights, ref_weights, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL)
    if "unmapped_topk_idx" in args:
        assert_same_ids(args["unmapped_topk_idx"], ref_unmapped)
    if which == "mask":  # unrouted tokens: every slot, shared ones included, -1 with weight 0
        off = ~args["mask"]
        assert bool((idx[off] == -1).all()) and bool((weights[off] == 0).all())


def test_top2_sum_gate_masks_strided_unmapped_and_a_cuda_graph() -> None:
    v = dict(scoring="sigmoid", num_experts=0, experts=72, num_topk=6, num_groups=0, num_topk_groups=0,
             physical_map=False)
    args = masked_inputs(v, 257, torch.Generator(device="cuda").manual_seed(9))
    wide = torch.full((257, 10), POISON_ID, dtype=torch.int64, device="cuda")
    wide[:, 2:8] = args["unmapped_topk_idx"]
    args["unmapped_topk_idx"] = wide[:, 2:8]  # row stride 10, as a slice of a wider buffer
    ref_idx, ref_weights, ref_unmapped = masked_ref(args)
    out = (torch.empty_like(ref_idx), torch.empty_like(ref_weights))
    moe.top2_sum_gate(**{**args, "unmapped_topk_idx": wide[:, 2:8].clone()}, out=out)  # warm up off the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moe.top2_sum_gate(**args, out=out)
    graph.replay()
    assert_same_ids(out[0], ref_idx)
    torch.testing.assert_close(out[1], ref_weights, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL)
    assert_same_ids(wide[:, 2:8], ref_unmapped)
    assert bool((wide[:, :2] == POISON_ID).all()) and bool((wide[:, 8:] == POISON_ID).all())


@pytest.mark.parametrize("unmapped", [False, True])
def test_top2_sum_gate_masks_under_torch_compile(unmapped: bool) -> None:
    v = dict(scoring="sqrtsoftplus", num_experts=256, experts=256, num_topk=8, num_groups=8, num_topk_groups=4,
             physical_map=False)
    args = masked_inputs(v, 513, torch.Generator(device="cuda").manual_seed(3))
    if not unmapped:
        del args["fix_routing_mask"], args["unmapped_topk_idx"]
    ref = masked_ref({**args, "unmapped_topk_idx": args.get("unmapped_topk_idx", torch.empty(
        513, 8, dtype=torch.int64, device="cuda")).clone()})
    compiled = torch.compile(lambda a: moe.top2_sum_gate(**a), fullgraph=True)
    idx, weights = compiled(args)
    assert_same_ids(idx, ref[0])
    torch.testing.assert_close(weights, ref[1], rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL)
    if unmapped:
        assert_same_ids(args["unmapped_topk_idx"], ref[2])


def test_top2_sum_gate_masks_bad_tensors_name_the_argument() -> None:
    v = dict(scoring="sigmoid", num_experts=0, experts=72, num_topk=6, num_groups=0, num_topk_groups=0,
             physical_map=False)
    args = gate_inputs(v, 13)
    with pytest.raises(ValueError, match="mask"):
        moe.top2_sum_gate(**args, mask=torch.ones(12, dtype=torch.bool, device="cuda"))
    with pytest.raises(ValueError, match="fix_routing_mask"):
        moe.top2_sum_gate(**args, fix_routing_mask=torch.ones(13, dtype=torch.bool, device="cuda"))
    with pytest.raises(errors.KernelArgumentError, match="unmapped_topk_idx"):
        moe.top2_sum_gate(**args, unmapped_topk_idx=torch.zeros(13, 12, dtype=torch.int64, device="cuda")[:, ::2])


# --- normalize_weight, mask_indices_by_tp, inplace_unique_group_indices ----------------------

NORMALIZE = built("normalize_weight")
MASK = built("mask_indices_by_tp")
UNIQUE = built("inplace_unique_group_indices")
INDEX_DTYPES = {"int64": torch.int64, "int32": torch.int32}


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("v", NORMALIZE, ids=vid)
def test_normalize_weight(v: dict[str, Any], num_tokens: int) -> None:
    w = torch.rand(num_tokens, v["num_topk"], device="cuda") * torch.pow(10.0, torch.randint(
        -30, 3, (num_tokens, 1), device="cuda").float())
    denominator, normalized = moe.normalize_weight(w)
    ref_denominator, ref_normalized = normalize_weight_ref(w)
    assert torch.equal(denominator.view(torch.int32), ref_denominator.view(torch.int32))
    assert torch.equal(normalized.view(torch.int32), ref_normalized.view(torch.int32))


@pytest.mark.parametrize("v", NORMALIZE, ids=vid)
def test_normalize_weight_poisoned_outputs(v: dict[str, Any]) -> None:
    w = torch.rand(4001, v["num_topk"], device="cuda")
    denominator = torch.full((4001,), float("nan"), device="cuda")
    normalized = torch.full_like(w, float("nan"))
    runtime.get_kernel("normalize_weight").select(**v)(w, denominator, normalized)
    ref_denominator, ref_normalized = normalize_weight_ref(w)
    assert torch.equal(denominator, ref_denominator) and torch.equal(normalized, ref_normalized)


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("v", MASK, ids=vid)
@pytest.mark.parametrize("ranks", [(256, 8, 1, 2), (72, 4, 3, 4), (256, 1, 0, 1)], ids=["n256-ep8-tp1of2",
                                                                                       "n72-ep4-tp3of4", "identity"])
def test_mask_indices_by_tp(v: dict[str, Any], num_tokens: int, ranks: tuple[int, int, int, int]) -> None:
    n, ep, tp_rank, tp = ranks
    indices = torch.randint(-1, n, (num_tokens, v["num_topk"]), device="cuda", dtype=INDEX_DTYPES[v["dtype"]])
    got = moe.mask_indices_by_tp(indices, n, ep, tp_rank, tp)
    assert_same_ids(got, mask_indices_by_tp_ref(indices, n, ep, tp_rank, tp))
    if num_tokens and tp == 1:
        assert torch.equal(got, indices)


@pytest.mark.parametrize("v", MASK, ids=vid)
def test_mask_indices_poisoned_output(v: dict[str, Any]) -> None:
    indices = torch.randint(-1, 256, (4001, v["num_topk"]), device="cuda", dtype=INDEX_DTYPES[v["dtype"]])
    out = torch.full_like(indices, POISON_ID)
    runtime.get_kernel("mask_indices_by_tp").select(**v)(indices, out, 32, 64, 2, 1)
    assert_same_ids(out, mask_indices_by_tp_ref(indices, 256, 8, 1, 2))


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("v", UNIQUE, ids=vid)
@pytest.mark.parametrize("num_groups", [8, 128])
def test_inplace_unique_group_indices(v: dict[str, Any], num_tokens: int, num_groups: int) -> None:
    group_indices = torch.randint(-1, num_groups, (num_tokens, v["num_topk"]), device="cuda")
    if num_groups == 128 and num_tokens:
        group_indices[:, 0] = 127  # ids in the second 64-bit word of the kernel's set
        group_indices[:, -1] = 127  # a repeat of it (the same slot when num_topk == 1)
    expected = unique_group_indices_ref(group_indices)
    assert moe.inplace_unique_group_indices(group_indices, num_groups) is None
    assert_same_ids(group_indices, expected)
