"""CPU tests of the MoE gating op modules (ops/moe/*.py): argument errors fire before launch.

The op modules are imported inside a stand-in package: the real ``_args`` and ``errors``
modules (copied from tkc/runtime) and a ``_runtime`` whose kernels record the variant selected
and the launch instead of running anything. No build and no GPU is needed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import stub_package

OPS = ("topk_gate", "topk_group", "top2_sum_gate", "normalize_weight", "mask_indices_by_tp", "unique_group_indices",
       "count")

@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], Any]]:
    with stub_package(tmp_path_factory.mktemp("moe_ops"), "moe_ops_pkg", "moe", OPS) as stubbed:
        yield stubbed


def f32(*shape: int) -> torch.Tensor:
    return torch.zeros(shape)


def gate_args(**changes: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(logits=f32(4, 256), bias=f32(256), num_topk=8, num_topk_groups=4, num_groups=8,
                                use_shared_as_routed=False, num_shared_experts=0, routed_scaling_factor=1.0,
                                ep_rank=0, num_ep_ranks=1, tp_rank=0, num_tp_ranks=1, scoring_func="sigmoid")
    args.update(changes)
    return args


BAD: dict[str, tuple[str, Callable[[Any], Any], type[Exception], str]] = {
    "topk k > E": ("topk_gate", lambda m: m.topk_gate(f32(4, 16), 17), ValueError, "num_topk"),
    "topk k bool": ("topk_gate", lambda m: m.topk_gate(f32(4, 16), True), ValueError, "num_topk"),
    "topk not tensor": ("topk_gate", lambda m: m.topk_gate([[0.0]], 1), TypeError, "scores"),
    "topk out tuple": ("topk_gate", lambda m: m.topk_gate(f32(4, 16), 2, out=(f32(4, 2),)), TypeError, "out"),
    "group 2-D": ("topk_group", lambda m: m.topk_sum_and_topk_group_idx(f32(4, 256), 2, 4), ValueError, "scores"),
    "group sum": ("topk_group", lambda m: m.topk_sum_and_topk_group_idx(f32(4, 8, 32), 3, 4), ValueError,
                  "num_topk_sum"),
    "group sum > per group": ("topk_group", lambda m: m.topk_sum_and_topk_group_idx(f32(4, 8, 1), 2, 4),
                              ValueError, "num_topk_sum"),
    "group count": ("topk_group", lambda m: m.topk_sum_and_topk_group_idx(f32(4, 8, 32), 2, 9), ValueError,
                    "num_topk_groups"),
    "gate scoring": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(scoring_func="tanh")), ValueError,
                     "scoring_func"),
    "gate k > 32": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(num_topk=33, num_groups=0,
                                                                            num_topk_groups=0)),
                    ValueError, "num_topk"),
    "gate k > groups hold": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(  # 1 group of 8 experts
        logits=f32(4, 64), bias=f32(64), num_groups=8, num_topk_groups=1, num_topk=9)), ValueError, "num_topk"),
    "gate groups mismatch": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(num_groups=0)), ValueError,
                             "num_topk_groups"),
    "gate groups divide": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(num_groups=7, num_topk_groups=4)),
                           ValueError, "num_groups"),
    "gate shared": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(use_shared_as_routed=True,
                                                                            num_shared_experts=3)),
                    ValueError, "num_shared_experts"),
    "gate shared needs map": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(use_shared_as_routed=True,
                                                                                      num_shared_experts=1)),
                              ValueError, "num_shared_experts"),
    "gate map rows": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(
        to_physical_map=torch.zeros(255, 2, dtype=torch.int32), logical_count=torch.zeros(255, dtype=torch.int32))),
        ValueError, "to_physical_map"),
    "gate count alone": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(
        logical_count=torch.zeros(256, dtype=torch.int32))), ValueError, "to_physical_map"),
    "gate tp_rank": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(tp_rank=1)), ValueError, "tp_rank"),
    "gate ep ranks": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(num_ep_ranks=0)), ValueError,
                      "num_ep_ranks"),
    "gate too many ep ranks": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(num_ep_ranks=512)),
                               ValueError, "num_ep_ranks"),
    "gate fix_routing_mask alone": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(
        fix_routing_mask=torch.ones(4, dtype=torch.bool))), ValueError, "fix_routing_mask"),
    "gate fix_routing_mask dtype": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(
        fix_routing_mask=f32(4), unmapped_topk_idx=torch.zeros(4, 8, dtype=torch.int64))), ValueError,
        "fix_routing_mask"),
    "gate unmapped dtype": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(unmapped_topk_idx=f32(4, 8))),
                            ValueError, "unmapped_topk_idx"),
    "gate unmapped width": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(
        unmapped_topk_idx=torch.zeros(4, 9, dtype=torch.int64))), ValueError, "unmapped_topk_idx"),
    "gate experts not a multiple of 4": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(
        logits=f32(4, 18), bias=f32(18), num_topk=2, num_groups=0, num_topk_groups=0)), ValueError, "logits"),
    "gate too many experts": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(
        logits=f32(4, 260), bias=f32(260), num_groups=0, num_topk_groups=0)), ValueError, "logits"),
    "normalize 3-D": ("normalize_weight", lambda m: m.normalize_weight(f32(2, 2, 2)), ValueError, "topk_weights"),
    "normalize out one tensor": ("normalize_weight", lambda m: m.normalize_weight(f32(2, 2), out=f32(2)), TypeError,
                                 "out"),
    "mask tp_rank": ("mask_indices_by_tp", lambda m: m.mask_indices_by_tp(f32(4, 8).long(), 256, 8, -1, 2),
                     ValueError, "tp_rank"),
    "mask n": ("mask_indices_by_tp", lambda m: m.mask_indices_by_tp(f32(4, 8).long(), 0, 8, 0, 2), ValueError, "n"),
    "mask ranks": ("mask_indices_by_tp", lambda m: m.mask_indices_by_tp(f32(4, 8).long(), 4, 8, 0, 1), ValueError,
                   "num_ep_ranks"),
    "unique groups": ("unique_group_indices", lambda m: m.inplace_unique_group_indices(f32(4, 8).long(), 129),
                      ValueError, "num_groups"),
    "unique 1-D": ("unique_group_indices", lambda m: m.inplace_unique_group_indices(f32(8).long(), 8), ValueError,
                   "group_indices"),
    "group not tensor": ("topk_group", lambda m: m.topk_sum_and_topk_group_idx([[0.0]], 2, 4), TypeError, "scores"),
    "group strided": ("topk_group", lambda m: m.topk_sum_and_topk_group_idx(f32(4, 32, 8).transpose(1, 2), 2, 4),
                      ValueError, "scores"),
    "gate mask": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(mask=f32(4))), ValueError, "mask"),
    "gate mask length": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(mask=torch.ones(5, dtype=torch.bool))),
                         ValueError, "mask"),
    "gate 1-D logits": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(logits=f32(256))), ValueError,
                        "logits"),
    "gate k float": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(num_topk=8.0)), TypeError, "num_topk"),
    "gate map count rows": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(
        to_physical_map=torch.zeros(256, 2, dtype=torch.int32), logical_count=torch.zeros(255, dtype=torch.int32))),
        ValueError, "logical_count"),
    "gate out one tensor": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(), out=f32(4, 8).long()),
                            TypeError, "out"),
    "gate out narrower": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(), out=(
        f32(4, 4).long(), f32(4, 4))), ValueError, "topk_idx"),
    "gate out wider": ("top2_sum_gate", lambda m: m.top2_sum_gate(**gate_args(num_groups=0, num_topk_groups=0), out=(
        f32(4, 9).long(), f32(4, 9))), ValueError, "topk_idx"),
    "mask not tensor": ("mask_indices_by_tp", lambda m: m.mask_indices_by_tp([[0]], 256, 8, 0, 2), TypeError,
                        "indices"),
    "mask tp ranks": ("mask_indices_by_tp", lambda m: m.mask_indices_by_tp(f32(4, 8).long(), 256, 8, 0, 0),
                      ValueError, "num_tp_ranks"),
    "mask per_dp int32": ("mask_indices_by_tp", lambda m: m.mask_indices_by_tp(f32(4, 8).long(), 2**40, 1, 0, 4),
                          ValueError, "n"),
    "count dtype": ("count", lambda m: m.group_count(f32(4, 8), 4), TypeError, "group_idx"),
    "count 1-D": ("count", lambda m: m.group_count(f32(8).long(), 4), ValueError, "group_idx"),
    "count groups": ("count", lambda m: m.group_count(f32(4, 8).long(), 1025), ValueError, "num_groups"),
    "fi experts": ("count", lambda m: m.aux_fi(f32(4, 8).long(), 0, 2), ValueError, "num_experts"),
    "fi topk": ("count", lambda m: m.aux_fi(f32(4, 8).long(), 4, True), ValueError, "num_aux_topk"),
    "fi ids": ("count", lambda m: m.aux_fi(f32(4, 8).int(), 4, 2), TypeError, "topk_idx"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_arguments_raise_before_any_launch(ops: tuple[dict[str, ModuleType], Any], name: str) -> None:
    modules, runtime = ops
    op, call, error, argument = BAD[name]
    runtime.LAUNCHES.clear()
    with pytest.raises(error, match=rf"\b{argument}\b"):
        call(modules[op])
    assert runtime.LAUNCHES == []


@pytest.mark.parametrize(("experts", "grid"), [
    (64, dict(num_experts=64, capacity=256)),  # built for its E
    (32, dict(num_experts=0, capacity=128)), (128, dict(num_experts=0, capacity=128)),  # one sweep a lane holds it
    (132, dict(num_experts=0, capacity=256)), (252, dict(num_experts=0, capacity=256))])
def test_topk_gate_takes_the_smallest_variant_for_any_e_that_holds_e(ops: tuple[dict[str, ModuleType], Any],
                                                                      experts: int, grid: dict[str, int]) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    modules["topk_gate"].topk_gate(f32(4, experts), 6)
    ((name, values, _),) = runtime.LAUNCHES
    assert name == "topk_gate" and values == dict(num_topk=6, **grid)


def test_gate_selects_the_ungrouped_variant_when_every_group_is_kept(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    modules["top2_sum_gate"].top2_sum_gate(**gate_args(num_groups=8, num_topk_groups=8))
    ((name, values, args),) = runtime.LAUNCHES
    assert name == "top2_sum_gate" and values["num_groups"] == 0 and values["num_topk_groups"] == 0
    # logits, bias, topk_idx, topk_weights, then the scalars: scale, ep_rank, experts per rank, tp_rank, tp ranks.
    assert args[2].shape == (4, 8) and args[2].dtype == torch.int64 and args[3].dtype == torch.float32
    assert args[4:] == (1.0, 0, 256, 0, 1)


def test_gate_with_masks_runs_the_masked_kernel_into_unmapped_topk_idx(
        ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    gate = modules["top2_sum_gate"]
    mask = torch.tensor([True, False, True, True])
    runtime.LAUNCHES.clear()
    idx, weights = gate.top2_sum_gate(**gate_args(mask=mask))
    ((name, values, args),) = runtime.LAUNCHES
    assert name == "top2_sum_gate_masked" and values["masks"] is True and values["physical_map"] is False
    # logits, bias, map / count / fix / unmapped placeholders, mask; topk_idx, topk_weights, no unmapped rows
    assert args[4] is mask and [tuple(args[i].shape) for i in (2, 3, 5, 6)] == [(0, 1), (0,), (0,), (0, 8)]
    assert args[7] is idx and args[8] is weights and tuple(args[9].shape) == (0, 8)
    assert args[10:] == (1.0, 0, 256, 0, 1)
    # Fixed routing: the kernel reads a copy of unmapped_topk_idx and writes the caller's tensor.
    unmapped = torch.randint(0, 256, (4, 8))
    fixed = torch.tensor([False, True, False, True])
    runtime.LAUNCHES.clear()
    out = (torch.empty(4, 8, dtype=torch.int64), torch.empty(4, 8))
    got = gate.top2_sum_gate(**gate_args(fix_routing_mask=fixed, unmapped_topk_idx=unmapped), out=out)
    ((_, _, args),) = runtime.LAUNCHES
    assert got[0] is out[0] and got[1] is out[1] and args[9] is unmapped and args[5] is fixed
    assert args[6] is not unmapped and torch.equal(args[6], unmapped)
    runtime.LAUNCHES.clear()
    gate.top2_sum_gate(**gate_args(unmapped_topk_idx=unmapped))  # written only: no copy to read
    ((_, _, args),) = runtime.LAUNCHES
    assert args[9] is unmapped and tuple(args[6].shape) == (0, 8)


def test_gate_with_map_and_shared_experts(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    to_physical = torch.zeros(258, 3, dtype=torch.int32)
    count = torch.ones(258, dtype=torch.int32)
    idx, weights = modules["top2_sum_gate"].top2_sum_gate(**gate_args(
        use_shared_as_routed=True, num_shared_experts=2, to_physical_map=to_physical, logical_count=count,
        ep_rank=1, num_ep_ranks=2))
    ((_, values, args),) = runtime.LAUNCHES
    assert values["physical_map"] is True and idx.shape == weights.shape == (4, 10)
    assert args[2] is to_physical and args[3] is count
    assert args[6:] == (1.0, 1, (256 + 2) // 2, 0, 1)  # two extra experts count towards the EP split


# --- top2_sum_gate through the op layer: the launch, and what dispatch() is given and remembers ---------

MAPPED = dict(use_shared_as_routed=True, num_shared_experts=2, ep_rank=1, num_ep_ranks=2)


def _maps() -> dict[str, torch.Tensor]:
    return dict(to_physical_map=torch.zeros(258, 3, dtype=torch.int32), logical_count=torch.ones(258, dtype=torch.int32))


def _spelled(fn: Callable[..., Any]) -> str:
    """fn's signature without annotations: names, kinds and defaults."""
    signature = inspect.signature(fn)
    return str(signature.replace(parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                                 return_annotation=signature.empty))


def _records(runtime: Any) -> None:
    for record in (runtime.LAUNCHES, runtime.REMEMBERED, runtime.DISPATCHED):
        record.clear()


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("with_out", [False, True])
def test_gate_calls_are_remembered_with_out_s_width(ops: tuple[dict[str, ModuleType], Any], mapped: bool,
                                                    with_out: bool) -> None:
    modules, runtime = ops
    gate = modules["top2_sum_gate"]
    args = gate_args(**MAPPED, **_maps()) if mapped else gate_args()
    width = 10 if mapped else 8
    out = (torch.empty(4, width, dtype=torch.int64), torch.empty(4, width)) if with_out else None
    _records(runtime)
    idx, weights = gate.top2_sum_gate(**args, out=out)
    if with_out:
        assert idx is out[0] and weights is out[1]
    ((_, values, launched),) = runtime.LAUNCHES
    assert values["physical_map"] is mapped
    tensors = (args["logits"], args["bias"], *((args["to_physical_map"], args["logical_count"]) if mapped else ()))
    assert all(a is t for a, t in zip(launched, tensors)) and launched[len(tensors)] is idx
    # dispatch() is asked first with (logits, bias, to_physical_map, logical_count, out, the other arguments).
    ((fast, call),) = runtime.DISPATCHED
    assert fast[0] == (((1,), (), (0, 1), ()), 2)
    assert call[:5] == (args["logits"], args["bias"], args.get("to_physical_map"), args.get("logical_count"), out)
    assert call[5:] == (8, 4, 8, mapped, 2 if mapped else 0, 1.0, 1 if mapped else 0, 2 if mapped else 1, 0, 1,
                        "sigmoid", None, None, None)
    ((remembered_fast, launcher, arguments, rules, remembered_call, outputs),) = runtime.REMEMBERED
    assert remembered_fast is fast and all(a is b for a, b in zip(remembered_call, call, strict=True))
    assert launcher is gate._kernel.variant("sigmoid", 256, 8, 8, 4, mapped)
    # The kernel reads the width from topk_idx and the contract leaves it free: dispatch() re-checks it.
    assert rules == (("size_is", len(tensors), 1, width),)
    assert [(a.kind, a.index) for a in arguments[:len(tensors) + 2]] == [
        *(("input", i) for i in range(len(tensors))), ("out", 0), ("out", 1)]
    assert arguments[len(tensors) + 2:] == (1.0, 1, 129, 0, 1) if mapped else (1.0, 0, 256, 0, 1)
    if with_out:
        assert outputs is None
    else:  # an allocating call allocates (num_tokens, num_topk + S) from logits' rows
        assert [(o.dtype, o.dims) for o in outputs] == [(torch.int64, ((0, 0, 1, 0, 1), width)),
                                                       (torch.float32, ((0, 0, 1, 0, 1), width))]
        assert idx.shape == weights.shape == (4, width)


def test_gate_out_of_another_width_is_refused_on_every_call(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    gate = modules["top2_sum_gate"]
    errors = __import__("moe_ops_pkg.errors", fromlist=["KernelArgumentError"])
    gate.top2_sum_gate(**gate_args(), out=(torch.empty(4, 8, dtype=torch.int64), torch.empty(4, 8)))
    _records(runtime)
    for width in (4, 9, 4):  # narrower: the lanes would write past the rows; wider: more shared slots
        expected = rf"^topk_idx: expected shape \(num_tokens, 8\) \(num_topk \+ num_shared_experts columns\), got shape \(4, {width}\)$"
        with pytest.raises(errors.KernelArgumentError, match=expected):
            gate.top2_sum_gate(**gate_args(), out=(torch.empty(4, width, dtype=torch.int64), torch.empty(4, width)))
    assert runtime.LAUNCHES == [] and runtime.REMEMBERED == []


def test_gate_keeps_its_signature(ops: tuple[dict[str, ModuleType], Any]) -> None:
    gate = ops[0]["top2_sum_gate"].top2_sum_gate
    assert _spelled(gate) == (
        "(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed, num_shared_experts, "
        "routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks, scoring_func, mask=None, "
        "fix_routing_mask=None, to_physical_map=None, logical_count=None, unmapped_topk_idx=None, *, out=None)")
    assert gate.__doc__.startswith("Route each token to num_topk experts")


# --- the ops without out=: topk_sum_and_topk_group_idx, mask_indices_by_tp, group_count, aux_fi ----------

PLAIN = {  # op module, name, argument names of the public op (TileKernels' signature: no out)
    "topk_sum_and_topk_group_idx": ("topk_group", "(scores, num_topk_sum, num_topk_groups)"),
    "mask_indices_by_tp": ("mask_indices_by_tp", "(indices, n, num_ep_ranks, tp_rank, num_tp_ranks)"),
    "group_count": ("count", "(group_idx, num_groups)"),
    "aux_fi": ("count", "(topk_idx, num_experts, num_aux_topk)"),
}


@pytest.mark.parametrize("name", list(PLAIN))
def test_ops_without_out_keep_their_signature(ops: tuple[dict[str, ModuleType], Any], name: str) -> None:
    module, signature = PLAIN[name]
    fn = getattr(ops[0][module], name)
    assert _spelled(fn) == signature
    with pytest.raises(TypeError, match="out"):
        fn(torch.zeros(4, 8, 32), 2, 4, out=torch.empty(4, 4, dtype=torch.int64))


def test_topk_group_launches_the_flat_scores(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    for tokens, n_sum in ((4, 2), (0, 1)):
        _records(runtime)
        scores = torch.rand(tokens, 8, 32)
        group_idx = modules["topk_group"].topk_sum_and_topk_group_idx(scores, n_sum, 4)
        ((name, values, (flat, launched_idx)),) = runtime.LAUNCHES
        assert name == "topk_sum_and_topk_group_idx"
        assert values == dict(num_groups=8, experts_per_group=32, num_topk_groups=4, num_topk_sum=n_sum)
        assert flat.shape == (tokens, 256) and flat.data_ptr() == scores.data_ptr() and flat.is_contiguous()
        assert launched_idx is group_idx and group_idx.shape == (tokens, 4) and group_idx.dtype == torch.int64
        assert runtime.DISPATCHED == [] and runtime.REMEMBERED == []


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_mask_launches_the_rank_s_ranges(ops: tuple[dict[str, ModuleType], Any], dtype: torch.dtype) -> None:
    modules, runtime = ops
    _records(runtime)
    indices = torch.zeros(5, 6, dtype=dtype)
    masked = modules["mask_indices_by_tp"].mask_indices_by_tp(indices, 256, 8, 1, 2)
    ((name, values, args),) = runtime.LAUNCHES
    assert name == "mask_indices_by_tp" and values == dict(num_topk=6, dtype=str(dtype).removeprefix("torch."))
    # indices, masked, per_gpu = 256 // 8, per_dp = per_gpu * num_tp_ranks, num_tp_ranks, tp_rank
    assert args[0] is indices and args[1] is masked and args[2:] == (32, 64, 2, 1)
    assert masked.shape == (5, 6) and masked.dtype == dtype and masked.is_contiguous()
    assert runtime.DISPATCHED == [] and runtime.REMEMBERED == []


def test_counts_launch_the_flat_ids(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    aux = modules["count"]
    ids = torch.arange(24).view(4, 6) % 5
    for given in (ids, ids.t().contiguous().t()):  # a strided tensor is counted from a contiguous copy
        _records(runtime)
        counts = aux.group_count(given, 5)
        ((name, values, (flat, launched)),) = runtime.LAUNCHES
        assert (name, values) == ("moe_group_count", {"aux": False})
        assert flat.shape == (24,) and torch.equal(flat, ids.view(-1)) and launched is counts
        assert counts.shape == (5,) and counts.dtype == torch.int32
    _records(runtime)
    fi = aux.aux_fi(ids, 16, 3)
    ((name, values, (flat, launched, denominator)),) = runtime.LAUNCHES
    assert (name, values) == ("moe_aux_fi", {"aux": True}) and torch.equal(flat, ids.view(-1)) and launched is fi
    assert type(denominator) is float and denominator == 4 * 3  # num_tokens * num_aux_topk
    assert fi.shape == (16,) and fi.dtype == torch.float32
    assert runtime.DISPATCHED == [] and runtime.REMEMBERED == []
