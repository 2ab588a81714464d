"""GPU tests of the MoE gating ops' API: bad inputs, CUDA graphs, torch.compile, custom ops.

Bad inputs must raise Python exceptions naming the argument (never a CUDA fault); every op
must capture into a CUDA graph (replays rewrite every output byte, checked by poisoning) and
run under torch.compile(fullgraph=True) with results bit-identical to eager calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.gpu.test_moe_gate import assert_same_ids, errors, moe, tie_scores, tile_kernels_aot
from tests.reference.moe_gate import tie_inputs, unique_group_indices_ref

pytestmark = pytest.mark.gpu


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
    "topk_gate E over 256": (lambda: moe.topk_gate(ones(4, 260), 2), ValueError, "scores"),
    "topk_gate E not a multiple of 4": (lambda: moe.topk_gate(ones(4, 50), 2), ValueError, "scores"),
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
    "gate grouped E not built": (lambda: gate_call(logits=ones(4, 128), bias=ones(128)),  # grouped: E 256 only
                                 errors.VariantNotFoundError, "num_experts"),
    "gate E over 256": (lambda: gate_call(logits=ones(4, 260), bias=ones(260), num_groups=0, num_topk_groups=0),
                        ValueError, "logits"),
    "gate bias length": (lambda: gate_call(bias=ones(255)), errors.KernelArgumentError, "bias"),
    "gate bias dtype": (lambda: gate_call(bias=ones(256, dtype=torch.bfloat16)), errors.KernelArgumentError, "bias"),
    "gate logits dtype": (lambda: gate_call(logits=ones(4, 256, dtype=torch.bfloat16)), errors.KernelArgumentError,
                          "logits"),
    "gate scoring": (lambda: gate_call(scoring_func="identity"), ValueError, "scoring_func"),
    "gate groups": (lambda: gate_call(num_groups=0), ValueError, "num_topk_groups"),
    "gate tp_rank": (lambda: gate_call(tp_rank=2, num_tp_ranks=2), ValueError, "tp_rank"),
    "gate ep_rank": (lambda: gate_call(ep_rank=-1), ValueError, "ep_rank"),
    "gate mask length": (lambda: gate_call(mask=torch.ones(5, dtype=torch.bool, device="cuda")), ValueError, "mask"),
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
    # The kernel reads the output width from topk_idx and its lanes write num_topk columns: a
    # narrower out would be written past its rows. Once after a good call of the same signature
    # (the op's per-signature fast path), once with another signature.
    "gate out narrower, after a good call": (
        lambda: (gate_call(), gate_call(out=(ones(4, 4, dtype=torch.int64), ones(4, 4)))),
        errors.KernelArgumentError, "topk_idx"),
    "gate out wider, ungrouped": (lambda: gate_call(num_groups=0, num_topk_groups=0,
                                                     out=(ones(4, 9, dtype=torch.int64), ones(4, 9))),
                                   errors.KernelArgumentError, "topk_idx"),
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
    for op in ("topk_gate", "topk_sum_and_topk_group_idx", "top2_sum_gate",
               "normalize_weight", "mask_indices_by_tp", "inplace_unique_group_indices"):
        assert hasattr(namespace, op), op
