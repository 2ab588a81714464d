"""moe.top2_sum_gate: DeepSeek-style MoE routing in one kernel (TileKernels' ``top2_sum_gate``).

Per token: scores by sigmoid, sqrt(softplus) or softmax; expert selection on score + bias
(softmax: logit + bias) limited, with groups, to the num_topk_groups groups of largest top-2
key sum; a stable top-k (equal keys ranked by the lower id); weights = unbiased score /
(1e-20 + sum of the k scores) * routed_scaling_factor; shared experts (ids E, E + 1, ...)
appended with weight 1; the optional logical-to-physical map; EP/TP masking (ids of other TP
ranks -1). The kernel's docstring (kernels/moe/top2_sum_gate.py.j2) states the formulas.

Built (kernel_specs/moe_gate.yaml): one variant per (scoring, num_experts, num_topk, groups,
physical_map), num_experts 0 for any E up to 256 (a multiple of 4) where no variant is built for
the call's E. TileKernels' optional ``mask`` (False: the token is not routed: ids -1, weights 0),
``fix_routing_mask`` (True: the token takes the ids in ``unmapped_topk_idx`` instead of selecting)
and ``unmapped_topk_idx`` (written with each token's logical ids, before the map and the TP
masking; -1 for tokens the mask leaves out) run the kernel top2_sum_gate_masked, built for any E
and for the grouped routing, which writes unmapped_topk_idx as one more output of the launch.
"""

from __future__ import annotations

import operator

import torch

from .._args import matrix, one_of, placeholders, positive_int
from .._op import Plan, Result, empty, launch, op, result, size, size_is
from .._op import out as output
from .._runtime import get_kernel
from ..errors import KernelArgumentError

__all__ = ["top2_sum_gate"]

_kernel = get_kernel("top2_sum_gate")
_masked = get_kernel("top2_sum_gate_masked")
_SCORING = ("sigmoid", "sqrtsoftplus", "softmax")
MAX_TOPK = 32
MAX_EXPERTS = 256  # what the variant for any E reads (kernels/moe/top2_sum_gate.py.j2)


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
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Plan | Result:
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
        mask: optional bool (num_tokens,): False leaves the token unrouted (ids -1, weights 0, its
            unmapped_topk_idx row -1).
        fix_routing_mask: optional bool (num_tokens,), with unmapped_topk_idx: True takes the token's
            (logical) ids from unmapped_topk_idx instead of selecting them; its weights are computed
            from them as for selected ids (an id outside 0 .. E - 1 gets an unspecified weight).
        unmapped_topk_idx: optional int64 (num_tokens, num_topk), unit column stride: written in place
            with each token's logical ids (before the map and the TP masking).
        out: ``(topk_idx, topk_weights)`` to write into instead of allocating, as this call
            would return them (contiguous; not overlapping the inputs); returned as given.

    Returns:
        ``(topk_idx, topk_weights)``, int64 and float32 (num_tokens, num_topk + S). Ids that live
        on another TP rank are -1 (their weights are kept).
    """
    logits = matrix("logits", logits, "(num_tokens, num_routed_experts)")
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
    if num_experts % 4 or num_experts > MAX_EXPERTS:
        raise ValueError(f"logits: num_routed_experts ({num_experts}) must be a multiple of 4 and at most "
                         f"{MAX_EXPERTS}")
    physical = to_physical_map is not None
    options = (float(routed_scaling_factor), ep, experts_per_rank, tp, num_tp_ranks)
    if mask is not None or fix_routing_mask is not None or unmapped_topk_idx is not None:
        return result(_routed_with_masks(logits, bias, maps, mask, fix_routing_mask, unmapped_topk_idx, scoring, k,
                                         groups, top_groups, width, options, out))
    # Grid order: scoring, num_experts, num_topk, num_groups, num_topk_groups, physical_map. Ungrouped: the
    # variant built for this E where there is one, else the one for any E (grid value 0).
    launcher = None if groups else _kernel.find(scoring, num_experts, k, 0, 0, physical)
    if launcher is None:
        launcher = _kernel.variant(scoring, num_experts if groups else 0, k, groups, top_groups, physical)
    return launch(launcher, logits, bias, *maps, output(0), output(1), *options,
                  outputs=(empty(torch.int64, size(logits, 0), width), empty(torch.float32, size(logits, 0), width)),
                  rules=(size_is("topk_idx", output(0), 1, width, message=f"expected shape (num_tokens, {width}) "
                                 "(num_topk + num_shared_experts columns)"),))


def _flags(name: str, t: object, num_tokens: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.bool or t.dim() != 1 or t.shape[0] != num_tokens:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: expected a bool tensor of shape ({num_tokens},) (one flag per token), got {got}")
    return t


# device index, num_topk -> tensors of no elements for the masked kernel's absent tensors: to_physical_map (0, 1),
# logical_count (0,), mask (0,), fix_routing_mask (0,), unmapped_topk_idx (0, num_topk). One set per device and K
# serves every call (the plan's constants), distinct tensors since dispatch replays inputs by position.
_nothing: dict[object, tuple[torch.Tensor, ...]] = {}


def _placeholders(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    return placeholders(_nothing, logits, ((0, 1), torch.int32), ((0,), torch.int32), ((0,), torch.bool),
                        ((0,), torch.bool), ((0, k), torch.int64), key=k)


def _routed_with_masks(logits: torch.Tensor, bias: torch.Tensor, maps: tuple[torch.Tensor, ...],
                       mask: torch.Tensor | None, fix_routing_mask: torch.Tensor | None,
                       unmapped_topk_idx: torch.Tensor | None, scoring: str, k: int, groups: int, top_groups: int,
                       width: int, options: tuple[float, int, int, int, int],
                       given: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """top2_sum_gate through the masked kernel, whose third output is unmapped_topk_idx itself (the caller's tensor,
    written in place; where fixed routing also reads it, the kernel reads a copy)."""
    num_tokens = int(logits.shape[0])
    if mask is not None:
        mask = _flags("mask", mask, num_tokens)
    if fix_routing_mask is not None:
        if unmapped_topk_idx is None:
            raise ValueError("fix_routing_mask: fixed routing reads the ids in unmapped_topk_idx; pass it too")
        fix_routing_mask = _flags("fix_routing_mask", fix_routing_mask, num_tokens)
    fixed_topk_idx = None
    if unmapped_topk_idx is not None:
        u = unmapped_topk_idx
        if not isinstance(u, torch.Tensor) or u.dtype != torch.int64 or tuple(u.shape) != (num_tokens, k):
            got = f"{u.dtype} {tuple(u.shape)}" if isinstance(u, torch.Tensor) else type(u).__name__
            raise ValueError(f"unmapped_topk_idx: expected an int64 tensor of shape ({num_tokens}, {k}) "
                             f"(num_tokens, num_topk), got {got}")
        if fix_routing_mask is not None:
            fixed_topk_idx = u.clone()  # read while the launch writes u: the launcher refuses the overlap
    no_map, no_count, no_mask, no_fix, no_unmapped = _placeholders(logits, k)
    if given is None:
        given = (logits.new_empty((num_tokens, width), dtype=torch.int64),
                 logits.new_empty((num_tokens, width), dtype=torch.float32))
    written = no_unmapped if unmapped_topk_idx is None else unmapped_topk_idx
    fix = no_fix if fix_routing_mask is None else fix_routing_mask
    fixed = no_unmapped if fixed_topk_idx is None else fixed_topk_idx
    idx, weights, _ = _gate_masked(logits, bias, *(maps or (no_map, no_count)), no_mask if mask is None else mask, fix,
                                   fixed, scoring, k, groups, top_groups, bool(maps), unmapped_topk_idx is not None,
                                   *options, out=(*given, written))
    return idx, weights


# The masked kernel, every tensor an input (the device's placeholders where the call has none); its outputs are
# always given (top2_sum_gate allocates them), unmapped_topk_idx with 0 rows where the call has none.
@op(outputs=("topk_idx", "topk_weights", "unmapped_topk_idx"), name="top2_sum_gate_masked",
    inputs={"logits": (1,), "bias": (), "to_physical_map": (0, 1), "logical_count": (), "mask": (),
            "fix_routing_mask": (), "fixed_topk_idx": ()})
def _gate_masked(logits: torch.Tensor, bias: torch.Tensor, to_physical_map: torch.Tensor,
                 logical_count: torch.Tensor, mask: torch.Tensor, fix_routing_mask: torch.Tensor,
                 fixed_topk_idx: torch.Tensor, scoring: str, k: int, groups: int, top_groups: int, physical: bool,
                 unmapped: bool, routed_scaling_factor: float, ep_rank: int, experts_per_rank: int, tp_rank: int,
                 num_tp_ranks: int) -> Plan:
    num_experts = int(logits.shape[1])
    width = (k + int(to_physical_map.shape[0]) - num_experts) if physical else k
    launcher = _masked.variant(scoring, num_experts if groups else 0, k, groups, top_groups, physical, True)
    return launch(launcher, logits, bias, to_physical_map, logical_count, mask, fix_routing_mask, fixed_topk_idx,
                  output(0), output(1), output(2), routed_scaling_factor, ep_rank, experts_per_rank, tp_rank,
                  num_tp_ranks,
                  outputs=(empty(torch.int64, size(logits, 0), width), empty(torch.float32, size(logits, 0), width),
                           empty(torch.int64, size(logits, 0, times=int(unmapped)), k)),
                  rules=(size_is("topk_idx", output(0), 1, width, message=f"expected shape (num_tokens, {width}) "
                                 "(num_topk + num_shared_experts columns)"),),
                  constants=_placeholders(logits, k))
