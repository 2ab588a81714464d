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
from collections.abc import Callable
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

TOPK = built("topk_gate")


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("v", TOPK, ids=vid)
def test_topk_gate(v: dict[str, Any], num_tokens: int) -> None:
    scores = tie_scores(num_tokens, v["num_experts"])
    assert_same_ids(moe.topk_gate(scores, v["num_topk"]), topk_gate_ref(scores, v["num_topk"]))


@pytest.mark.parametrize("v", TOPK, ids=vid)
def test_topk_gate_distinct_scores_nan_and_poison(v: dict[str, Any]) -> None:
    scores = torch.randn(4001, v["num_experts"], device="cuda")
    scores[::7, ::5] = float("nan")  # NaN ranks as -inf: every id stays a real expert id
    scores[1::7] = float("-inf")
    out = torch.full((4001, v["num_topk"]), POISON_ID, dtype=torch.int64, device="cuda")
    runtime.get_kernel("topk_gate").select(**v)(scores, out)
    assert_same_ids(out, topk_gate_ref(scores, v["num_topk"]))
    # Rows without NaN or ties: the same ids as torch.topk (an independent ranking).
    plain = scores[2::7]
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

GATE = built("top2_sum_gate")


def shared_count(num_experts: int, num_topk: int) -> int:
    """The most shared experts (2, 1 or 0) TileKernels allows for (E, K)."""
    for s in (2, 1):
        if num_topk % s == 0 and num_experts % (num_topk // s) == 0:
            return s
    return 0


def gate_inputs(v: dict[str, Any], num_tokens: int) -> dict[str, Any]:
    """Tie inputs and, for physical_map variants, a random map with 1..3 copies per expert."""
    e, k = v["num_experts"], v["num_topk"]
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


@pytest.mark.parametrize("v", [v for v in GATE if v["num_experts"] in (72, 256) and v["num_topk"] in (6, 8)], ids=vid)
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
    e = v["num_experts"]
    per_rank = (e + (args["to_physical_map"].shape[1] - 1 if v["physical_map"] else 0)) // args["num_ep_ranks"]
    tensors = [args["logits"], args["bias"]]
    if v["physical_map"]:
        tensors += [args["to_physical_map"], args["logical_count"]]
    launch = runtime.get_kernel("top2_sum_gate").select(**v)
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


# --- bad inputs: Python exceptions that name the argument, never a CUDA fault ---------------


def ones(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.ones(shape, dtype=dtype, device="cuda")


def gate_call(**changes: Any) -> Any:
    args: dict[str, Any] = dict(logits=ones(4, 256), bias=ones(256), num_topk=8, num_topk_groups=4, num_groups=8,
                                use_shared_as_routed=False, num_shared_experts=0, routed_scaling_factor=1.0,
                                ep_rank=0, num_ep_ranks=1, tp_rank=0, num_tp_ranks=1, scoring_func="sigmoid")
    args.update(changes)
    return moe.top2_sum_gate(**args)


BAD_CALLS: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "topk_gate k > E": (lambda: moe.topk_gate(ones(4, 16), 17), ValueError, "num_topk"),
    "topk_gate k = 0": (lambda: moe.topk_gate(ones(4, 16), 0), ValueError, "num_topk"),
    "topk_gate E not built": (lambda: moe.topk_gate(ones(4, 48), 2), errors.VariantNotFoundError, "num_experts"),
    "topk_gate bf16": (lambda: moe.topk_gate(ones(4, 64, dtype=torch.bfloat16), 2), errors.KernelArgumentError,
                       "scores"),
    "topk_gate 1-D": (lambda: moe.topk_gate(ones(64), 2), ValueError, "scores"),
    "topk_gate cpu": (lambda: moe.topk_gate(torch.ones(4, 64), 2), errors.KernelError, "scores"),
    "group 2-D": (lambda: moe.topk_sum_and_topk_group_idx(ones(4, 256), 2, 4), ValueError, "scores"),
    "group sum 3": (lambda: moe.topk_sum_and_topk_group_idx(ones(4, 8, 32), 3, 4), ValueError, "num_topk_sum"),
    "group too many": (lambda: moe.topk_sum_and_topk_group_idx(ones(4, 8, 32), 2, 9), ValueError,
                       "num_topk_groups"),
    "group not built": (lambda: moe.topk_sum_and_topk_group_idx(ones(4, 4, 16), 2, 2),
                        errors.VariantNotFoundError, "num_groups"),
    "group non-contiguous": (lambda: moe.topk_sum_and_topk_group_idx(ones(4, 32, 8).transpose(1, 2), 2, 4),
                             errors.KernelArgumentError, "scores"),
    "gate k > E": (lambda: gate_call(logits=ones(4, 16), bias=ones(16), num_topk=17, num_groups=0,
                                     num_topk_groups=0), ValueError, "num_topk"),
    "gate E not built": (lambda: gate_call(logits=ones(4, 128), bias=ones(128), num_groups=0, num_topk_groups=0),
                         errors.VariantNotFoundError, "num_experts"),
    "gate bias length": (lambda: gate_call(bias=ones(255)), errors.KernelArgumentError, "bias"),
    "gate bias dtype": (lambda: gate_call(bias=ones(256, dtype=torch.bfloat16)), errors.KernelArgumentError, "bias"),
    "gate logits dtype": (lambda: gate_call(logits=ones(4, 256, dtype=torch.bfloat16)), errors.KernelArgumentError,
                          "logits"),
    "gate scoring": (lambda: gate_call(scoring_func="identity"), ValueError, "scoring_func"),
    "gate groups": (lambda: gate_call(num_groups=0), ValueError, "num_topk_groups"),
    "gate tp_rank": (lambda: gate_call(tp_rank=2, num_tp_ranks=2), ValueError, "tp_rank"),
    "gate ep_rank": (lambda: gate_call(ep_rank=-1), ValueError, "ep_rank"),
    "gate mask": (lambda: gate_call(mask=torch.ones(4, dtype=torch.bool, device="cuda")), NotImplementedError, "mask"),
    "gate shared without map": (lambda: gate_call(use_shared_as_routed=True, num_shared_experts=1), ValueError,
                                "num_shared_experts"),
    "gate map rows": (lambda: gate_call(to_physical_map=ones(255, 2, dtype=torch.int32),
                                        logical_count=ones(255, dtype=torch.int32)), errors.KernelArgumentError,
                      "to_physical_map"),
    "gate map alone": (lambda: gate_call(to_physical_map=ones(256, 2, dtype=torch.int32)), ValueError,
                       "logical_count"),
    "gate count dtype": (lambda: gate_call(to_physical_map=ones(256, 2, dtype=torch.int32),
                                           logical_count=ones(256, dtype=torch.int64)), errors.KernelArgumentError,
                         "logical_count"),
    "normalize 1-D": (lambda: moe.normalize_weight(ones(8)), ValueError, "topk_weights"),
    "normalize k not built": (lambda: moe.normalize_weight(ones(4, 5)), errors.VariantNotFoundError, "num_topk"),
    "normalize dtype": (lambda: moe.normalize_weight(ones(4, 8, dtype=torch.float16)), errors.KernelArgumentError,
                        "topk_weights"),
    "mask tp_rank": (lambda: moe.mask_indices_by_tp(ones(4, 8, dtype=torch.int64), 256, 8, 2, 2), ValueError,
                     "tp_rank"),
    "mask ep ranks": (lambda: moe.mask_indices_by_tp(ones(4, 8, dtype=torch.int64), 4, 8, 0, 1), ValueError,
                      "num_ep_ranks"),
    "mask dtype": (lambda: moe.mask_indices_by_tp(ones(4, 8), 256, 8, 0, 1), errors.VariantNotFoundError, "dtype"),
    "unique num_groups": (lambda: moe.inplace_unique_group_indices(ones(4, 8, dtype=torch.int64), 129),
                          ValueError, "num_groups"),
    "unique dtype": (lambda: moe.inplace_unique_group_indices(ones(4, 8, dtype=torch.int32), 8),
                     errors.KernelArgumentError, "group_indices"),
    "unique non-contiguous": (lambda: moe.inplace_unique_group_indices(ones(8, 4, dtype=torch.int64).t(), 8),
                              errors.KernelArgumentError, "group_indices"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_input_names_the_argument(name: str) -> None:
    call, error, argument = BAD_CALLS[name]
    with pytest.raises(error, match=rf"\b{argument}\b"):
        call()
    torch.cuda.synchronize()  # nothing was launched that could fault


# --- CUDA graphs and torch.compile ----------------------------------------------------------


def _unique_copy(g: torch.Tensor) -> tuple[torch.Tensor]:
    out = g.clone()
    moe.inplace_unique_group_indices(out, 8)
    return (out,)


def graph_ops() -> dict[str, tuple[Callable[[torch.Tensor], Any], Callable[[], torch.Tensor]]]:
    """op name -> (function of one tensor, fresh input maker)."""
    bias = tie_inputs(1, 256, 32)[1]
    to_physical = torch.randperm(257 * 2, device="cuda").view(257, 2).int()
    count = torch.randint(1, 3, (257,), device="cuda", dtype=torch.int32)
    return {
        "topk_gate": (lambda s: (moe.topk_gate(s, 8),), lambda: tie_scores(513, 256)),
        "topk_sum_and_topk_group_idx": (lambda s: (moe.topk_sum_and_topk_group_idx(s.view(-1, 8, 32), 2, 4),),
                                        lambda: tie_scores(513, 256)),
        "top2_sum_gate grouped": (lambda s: gate_call(logits=s, bias=bias, ep_rank=1, num_ep_ranks=8, tp_rank=1,
                                                      num_tp_ranks=2), lambda: tie_inputs(513, 256, 32)[0]),
        "top2_sum_gate mapped": (lambda s: gate_call(logits=s, bias=bias, use_shared_as_routed=True,
                                                     num_shared_experts=1, to_physical_map=to_physical,
                                                     logical_count=count, scoring_func="softmax"),
                                 lambda: tie_inputs(513, 256, 32)[0]),
        "normalize_weight": (lambda w: moe.normalize_weight(w), lambda: torch.rand(513, 8, device="cuda")),
        "mask_indices_by_tp": (lambda i: (moe.mask_indices_by_tp(i, 256, 8, 1, 2),),
                               lambda: torch.randint(-1, 256, (513, 8), device="cuda")),
        "inplace_unique_group_indices": (_unique_copy, lambda: torch.randint(-1, 8, (513, 8), device="cuda")),
    }


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


@pytest.mark.parametrize("name", list(graph_ops()))
def test_cuda_graph_capture_and_replay(name: str) -> None:
    fn, make = graph_ops()[name]
    static_x = make()
    fn(static_x)  # warm-up: cubin loads stay out of the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(static_x)
    for _ in range(2):
        static_x.copy_(make())
        expected = fn(static_x)
        for o in static_out:
            o.view(torch.uint8).fill_(0x7F)  # poison: replay must rewrite every byte
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(static_out, expected, strict=True):
            assert torch.equal(_bits(got), _bits(want)), name


@pytest.mark.parametrize("name", list(graph_ops()))
def test_torch_compile_fullgraph_matches_eager(name: str) -> None:
    fn, make = graph_ops()[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    for _ in range(2):
        x = make()
        for got, want in zip(compiled(x.clone()), fn(x.clone()), strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype
            assert torch.equal(_bits(got), _bits(want)), name


def test_inplace_unique_under_compile_mutates_its_argument() -> None:
    torch._dynamo.reset()

    def dedup(g: torch.Tensor) -> torch.Tensor:
        moe.inplace_unique_group_indices(g, 8)
        return g

    g = torch.randint(-1, 8, (513, 8), device="cuda")
    expected = unique_group_indices_ref(g)
    torch.compile(dedup, fullgraph=True)(g)
    assert_same_ids(g, expected)


def test_custom_ops_are_registered() -> None:
    for name in moe.__all__:
        assert getattr(moe, name)  # op modules load (and register their custom ops) on first use
    namespace = getattr(torch.ops, tile_kernels_aot._build_info.PACKAGE)
    for op in ("topk_gate", "topk_sum_and_topk_group_idx", "top2_sum_gate", "top2_sum_gate_mapped",
               "normalize_weight", "mask_indices_by_tp", "inplace_unique_group_indices"):
        assert hasattr(namespace, op), op
