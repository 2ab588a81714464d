"""CPU tests of the MoE gating op modules (templates/moe/*.py): argument errors fire before launch.

The op modules are imported inside a stand-in package: the real ``_args`` and ``errors``
modules (copied from tkc/runtime) and a ``_runtime`` whose kernels record the variant selected
and the launch instead of running anything. No build and no GPU is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import stub_package

OPS = ("topk_gate", "topk_group", "gate_top2_sum", "normalize_weight", "mask_indices_by_tp", "unique_group_indices")

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
    "gate scoring": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(scoring_func="tanh")), ValueError,
                     "scoring_func"),
    "gate k > 32": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(num_topk=33, num_groups=0,
                                                                            num_topk_groups=0)),
                    ValueError, "num_topk"),
    "gate k > groups hold": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(  # 1 group of 8 experts
        logits=f32(4, 64), bias=f32(64), num_groups=8, num_topk_groups=1, num_topk=9)), ValueError, "num_topk"),
    "gate groups mismatch": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(num_groups=0)), ValueError,
                             "num_topk_groups"),
    "gate groups divide": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(num_groups=7, num_topk_groups=4)),
                           ValueError, "num_groups"),
    "gate shared": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(use_shared_as_routed=True,
                                                                            num_shared_experts=3)),
                    ValueError, "num_shared_experts"),
    "gate shared needs map": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(use_shared_as_routed=True,
                                                                                      num_shared_experts=1)),
                              ValueError, "num_shared_experts"),
    "gate map rows": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(
        to_physical_map=torch.zeros(255, 2, dtype=torch.int32), logical_count=torch.zeros(255, dtype=torch.int32))),
        ValueError, "to_physical_map"),
    "gate count alone": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(
        logical_count=torch.zeros(256, dtype=torch.int32))), ValueError, "to_physical_map"),
    "gate tp_rank": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(tp_rank=1)), ValueError, "tp_rank"),
    "gate ep ranks": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(num_ep_ranks=0)), ValueError,
                      "num_ep_ranks"),
    "gate too many ep ranks": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(num_ep_ranks=512)),
                               ValueError, "num_ep_ranks"),
    "gate fix_routing_mask": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(fix_routing_mask=f32(4))),
                              NotImplementedError, "fix_routing_mask"),
    "gate unmapped": ("gate_top2_sum", lambda m: m.top2_sum_gate(**gate_args(unmapped_topk_idx=f32(4, 8))),
                      NotImplementedError, "unmapped_topk_idx"),
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
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_arguments_raise_before_any_launch(ops: tuple[dict[str, ModuleType], Any], name: str) -> None:
    modules, runtime = ops
    op, call, error, argument = BAD[name]
    runtime.LAUNCHES.clear()
    with pytest.raises(error, match=rf"\b{argument}\b"):
        call(modules[op])
    assert runtime.LAUNCHES == []


def test_gate_selects_the_ungrouped_variant_when_every_group_is_kept(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    modules["gate_top2_sum"].top2_sum_gate(**gate_args(num_groups=8, num_topk_groups=8))
    ((name, values, args),) = runtime.LAUNCHES
    assert name == "top2_sum_gate" and values["num_groups"] == 0 and values["num_topk_groups"] == 0
    # logits, bias, topk_idx, topk_weights, then the scalars: scale, ep_rank, experts per rank, tp_rank, tp ranks.
    assert args[2].shape == (4, 8) and args[2].dtype == torch.int64 and args[3].dtype == torch.float32
    assert args[4:] == (1.0, 0, 256, 0, 1)


def test_gate_with_map_and_shared_experts(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    to_physical = torch.zeros(258, 3, dtype=torch.int32)
    count = torch.ones(258, dtype=torch.int32)
    idx, weights = modules["gate_top2_sum"].top2_sum_gate(**gate_args(
        use_shared_as_routed=True, num_shared_experts=2, to_physical_map=to_physical, logical_count=count,
        ep_rank=1, num_ep_ranks=2))
    ((_, values, args),) = runtime.LAUNCHES
    assert values["physical_map"] is True and idx.shape == weights.shape == (4, 10)
    assert args[2] is to_physical and args[3] is count
    assert args[6:] == (1.0, 1, (256 + 2) // 2, 0, 1)  # two extra experts count towards the EP split
