"""moe.top2_sum_gate: DeepSeek-style MoE routing in one kernel (TileKernels' ``top2_sum_gate``).

Per token: scores by sigmoid, sqrt(softplus) or softmax; expert selection on score + bias
(softmax: logit + bias) limited, with groups, to the num_topk_groups groups of largest top-2
key sum; a stable top-k (equal keys ranked by the lower id); weights = unbiased score /
(1e-20 + sum of the k scores) * routed_scaling_factor; shared experts (ids E, E + 1, ...)
appended with weight 1; the optional logical-to-physical map; EP/TP masking (ids of other TP
ranks -1). The kernel's docstring (kernels/moe/top2_sum_gate.py.j2) states the formulas.

Built (kernel_specs/moe_gate.yaml): one variant per (scoring, num_experts, num_topk, groups,
physical_map). The optional ``mask``, ``fix_routing_mask`` and ``unmapped_topk_idx`` tensors
are not built: passing one raises NotImplementedError naming it.
"""

from __future__ import annotations

import operator

import torch

from .._args import matrix, not_built, one_of, positive_int
from .._op import Plan, empty, launch, op, out, size, size_is
from .._runtime import get_kernel
from ..errors import KernelArgumentError

__all__ = ["top2_sum_gate"]

_kernel = get_kernel("top2_sum_gate")
_SCORING = ("sigmoid", "sqrtsoftplus", "softmax")
MAX_TOPK = 32


def _rank(name: str, value: object, size: int, size_name: str) -> int:
    try:
        rank = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}") from None
    if not 0 <= rank < size:
        raise ValueError(f"{name}: expected 0 <= {name} < {size_name} ({size}), got {rank}")
    return rank


def _groups(num_groups: object, num_topk_groups: object, num_experts: int) -> tuple[int, int]:
    """The (num_groups, num_topk_groups) grid values: (0, 0) when routing is not group-limited."""
    groups, top_groups = operator.index(num_groups), operator.index(num_topk_groups)  # type: ignore[arg-type]
    if (groups == 0) != (top_groups == 0) or groups < 0 or top_groups < 0:
        raise ValueError(f"num_topk_groups: num_groups ({groups}) and num_topk_groups ({top_groups}) must be both "
                         "zero or both positive")
    if top_groups > groups:
        raise ValueError(f"num_topk_groups: expected at most num_groups ({groups}), got {top_groups}")
    if groups and num_experts % groups:
        raise ValueError(f"num_groups: num_routed_experts ({num_experts}) must be a multiple of num_groups ({groups})")
    # Keeping every group is no limit at all: the ungrouped variant computes the same result.
    return (0, 0) if groups == top_groups else (groups, top_groups)


def _map_tensor(name: str, t: object, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape[:len(shape)]) != shape or t.dim() != len(shape) + (name == "to_physical_map"):
        want = "(num_logical_experts, num_duplicates)" if name == "to_physical_map" else "(num_logical_experts,)"
        raise KernelArgumentError(f"{name}: expected shape {want} with num_logical_experts = num_routed_experts + "
                                  f"num_shared_experts = {shape[0]}, got {tuple(t.shape)}")
    return t


# Keyed: logits' width (num_routed_experts) and the map's shape (its rows are E + S, its columns set
# experts_per_rank), with every other argument as given. The launcher's contract checks the rest but
# the outputs' width num_topk + S: the kernel reads it from topk_idx, and its lanes write columns
# 0 .. num_topk - 1 of every row, so a narrower out would be written past its rows (the size_is rule).
@op(outputs=("topk_idx", "topk_weights"),
    inputs={"logits": (1,), "bias": (), "to_physical_map": (0, 1), "logical_count": ()})
def top2_sum_gate(
    logits: torch.Tensor,
    bias: torch.Tensor,
    num_topk: int,
    num_topk_groups: int,
    num_groups: int,
    use_shared_as_routed: bool,
    num_shared_experts: int,
    routed_scaling_factor: float,
    ep_rank: int,
    num_ep_ranks: int,
    tp_rank: int,
    num_tp_ranks: int,
    scoring_func: str,
    mask: torch.Tensor | None = None,
    fix_routing_mask: torch.Tensor | None = None,
    to_physical_map: torch.Tensor | None = None,
    logical_count: torch.Tensor | None = None,
    unmapped_topk_idx: torch.Tensor | None = None,
) -> Plan:
    """Route each token to num_topk experts (plus shared experts); returns (topk_idx, topk_weights).

    Args:
        logits: float32 CUDA tensor (num_tokens, num_routed_experts), contiguous; E % 4 == 0.
        bias: float32 (num_routed_experts,), added to the scores for selection only.
        num_topk: routed experts per token, 1 <= num_topk <= min(E, 32).
        num_topk_groups, num_groups: group-limited routing (both 0: none).
        use_shared_as_routed, num_shared_experts: append num_shared_experts (1 or 2) shared
            experts, ids E .. E + S - 1 with weight 1 (needs to_physical_map with S extra columns).
        routed_scaling_factor: multiplies the normalized routed weights.
        ep_rank, num_ep_ranks, tp_rank, num_tp_ranks: expert/tensor-parallel ranks and sizes.
        scoring_func: 'sigmoid', 'sqrtsoftplus' or 'softmax'.
        to_physical_map: int32 (E + S, num_duplicates) physical ids of each logical expert, with
            logical_count int32 (E + S,) the number of valid columns of each row.
        mask, fix_routing_mask, unmapped_topk_idx: not built; must be None.
        out: ``(topk_idx, topk_weights)`` to write into instead of allocating, as this call
            would return them (contiguous; not overlapping the inputs); returned as given.

    Returns:
        ``(topk_idx, topk_weights)``, int64 and float32 (num_tokens, num_topk + S). Ids that live
        on another TP rank are -1 (their weights are kept).
    """
    logits = matrix("logits", logits, "(num_tokens, num_routed_experts)")
    for name, value in (("mask", mask), ("fix_routing_mask", fix_routing_mask),
                        ("unmapped_topk_idx", unmapped_topk_idx)):
        if value is not None:
            raise not_built(name, f"the optional {name} tensor", "top2_sum_gate")
    num_experts = operator.index(logits.shape[1])  # an int, also while torch.compile traces dynamic shapes
    scoring = one_of("scoring_func", scoring_func, _SCORING)
    k = positive_int("num_topk", num_topk)
    if k > min(num_experts, MAX_TOPK):
        raise ValueError(f"num_topk: expected at most min(num_routed_experts, {MAX_TOPK}) = "
                         f"{min(num_experts, MAX_TOPK)}, got {k}")
    groups, top_groups = _groups(num_groups, num_topk_groups, num_experts)
    if groups and k > top_groups * (num_experts // groups):
        raise ValueError(f"num_topk: the {top_groups} groups of {num_experts // groups} experts hold fewer than "
                         f"num_topk ({k}) experts")
    shared = 0
    if use_shared_as_routed:
        shared = positive_int("num_shared_experts", num_shared_experts)
        if shared not in (1, 2) or k % shared or num_experts % (k // shared):
            raise ValueError(f"num_shared_experts: expected 1 or 2, dividing num_topk ({k}) with num_routed_experts "
                             f"a multiple of num_topk // num_shared_experts, got {shared}")
    if (to_physical_map is None) != (logical_count is None):
        missing = "logical_count" if logical_count is None else "to_physical_map"
        raise ValueError(f"{missing}: to_physical_map and logical_count must be passed together")
    num_extra = 0
    maps: tuple[torch.Tensor, ...] = ()
    if to_physical_map is not None:
        maps = (_map_tensor("to_physical_map", to_physical_map, (num_experts + shared,)),
                _map_tensor("logical_count", logical_count, (num_experts + shared,)))
        num_extra = operator.index(to_physical_map.shape[1]) - 1
    if shared > num_extra:
        raise ValueError(f"num_shared_experts: {shared} shared experts need a to_physical_map with at least "
                         f"{shared + 1} columns (got {num_extra + 1 if to_physical_map is not None else 'none'})")
    num_ep_ranks = positive_int("num_ep_ranks", num_ep_ranks)
    num_tp_ranks = positive_int("num_tp_ranks", num_tp_ranks)
    ep = _rank("ep_rank", ep_rank, num_ep_ranks, "num_ep_ranks")
    tp = _rank("tp_rank", tp_rank, num_tp_ranks, "num_tp_ranks")
    experts_per_rank = (num_experts + num_extra) // num_ep_ranks
    if experts_per_rank == 0:
        raise ValueError(f"num_ep_ranks: expected at most num_routed_experts + num_extra_experts "
                         f"({num_experts + num_extra}) ranks, got {num_ep_ranks}")
    width = k + shared  # the kernel's num_physical_topk
    # Grid order: scoring, num_experts, num_topk, num_groups, num_topk_groups, physical_map.
    launcher = _kernel.variant(scoring, num_experts, k, groups, top_groups, to_physical_map is not None)
    return launch(launcher, logits, bias, *maps, out(0), out(1), float(routed_scaling_factor), ep,
                  experts_per_rank, tp, num_tp_ranks,
                  outputs=(empty(torch.int64, size(logits, 0), width), empty(torch.float32, size(logits, 0), width)),
                  rules=(size_is("topk_idx", out(0), 1, width, message=f"expected shape (num_tokens, {width}) "
                                 "(num_topk + num_shared_experts columns)"),))
