"""moe.top2_sum_gate: DeepSeek-style MoE routing in one kernel (TileKernels' ``top2_sum_gate``).

Per token: scores by sigmoid, sqrt(softplus) or softmax; expert selection on score + bias
(softmax: logit + bias) limited, with groups, to the num_topk_groups groups of largest top-2
key sum; a stable top-k (equal keys ranked by the lower id); weights = unbiased score /
(1e-20 + sum of the k scores) * routed_scaling_factor; shared experts (ids E, E + 1, ...)
appended with weight 1; the optional logical-to-physical map; EP/TP masking (ids of other TP
ranks -1). The kernel's docstring (templates/moe/top2_sum_gate.py.j2) states the formulas.

Built (kernel_specs/moe_gate.yaml): one variant per (scoring, num_experts, num_topk, groups,
physical_map). The optional ``mask``, ``fix_routing_mask`` and ``unmapped_topk_idx`` tensors
are not built: passing one raises NotImplementedError naming it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch

from .._args import matrix, not_built, one_of, out_tensors, positive_int
from .._runtime import (
    custom_op,
    dispatch,
    fast_path,
    from_input,
    from_out,
    get_kernel,
    output,
    remember,
    size_is,
    size_of,
)
from ..errors import KernelArgumentError

__all__ = ["top2_sum_gate"]

_kernel = get_kernel("top2_sum_gate")
_SCORING = ("sigmoid", "sqrtsoftplus", "softmax")
MAX_TOPK = 32
# top2_sum_gate(..., out=(topk_idx, topk_weights)) in one C call (_runtime.dispatch), called as
# dispatch(_FAST, logits, bias, to_physical_map, logical_count, out, *the other arguments): keyed by
# num_routed_experts (logits' width), the map's shape (its rows are num_routed_experts +
# num_shared_experts, its columns set experts_per_rank) and every scalar as given, which fix the
# variant and its scalar arguments; the optional tensors that are not built are options (None, or
# not keyed at all). Checked by the launcher's contract and out's width (_out_tensors' check). An
# allocating call allocates both outputs as _outputs does: (num_tokens, num_topk + S), S fixed by the key.
_FAST = fast_path(inputs=((1,), (), (0, 1), ()), outputs=2)


def _rank(name: str, value: object, size: int, size_name: str) -> int:
    try:
        rank = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}") from None
    if not 0 <= rank < size:
        raise ValueError(f"{name}: expected 0 <= {name} < {size_name} ({size}), got {rank}")
    return rank


def _outputs(logits: torch.Tensor, num_physical_topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (logits.shape[0], num_physical_topk)
    return logits.new_empty(shape, dtype=torch.int64), logits.new_empty(shape, dtype=torch.float32)


def _select(logits: torch.Tensor, scoring: str, num_topk: int, num_groups: int, num_topk_groups: int,
            mapped: bool) -> Callable[..., None]:
    # Grid order: scoring, num_experts, num_topk, num_groups, num_topk_groups, physical_map.
    return _kernel.variant(scoring, int(logits.shape[1]), num_topk, num_groups, num_topk_groups, mapped)


def _gate(logits: torch.Tensor, bias: torch.Tensor, scoring: str, num_topk: int, num_groups: int,
          num_topk_groups: int, num_physical_topk: int, routed_scaling_factor: float, ep_rank: int,
          experts_per_rank: int, tp_rank: int, num_tp_ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    launch = _select(logits, scoring, num_topk, num_groups, num_topk_groups, False)
    topk_idx, topk_weights = _outputs(logits, num_physical_topk)
    launch(logits, bias, topk_idx, topk_weights, routed_scaling_factor, ep_rank, experts_per_rank, tp_rank,
           num_tp_ranks)
    return topk_idx, topk_weights


def _gate_mapped(logits: torch.Tensor, bias: torch.Tensor, to_physical_map: torch.Tensor,
                 logical_count: torch.Tensor, scoring: str, num_topk: int, num_groups: int, num_topk_groups: int,
                 num_physical_topk: int, routed_scaling_factor: float, ep_rank: int, experts_per_rank: int,
                 tp_rank: int, num_tp_ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    launch = _select(logits, scoring, num_topk, num_groups, num_topk_groups, True)
    topk_idx, topk_weights = _outputs(logits, num_physical_topk)
    launch(logits, bias, to_physical_map, logical_count, topk_idx, topk_weights, routed_scaling_factor, ep_rank,
           experts_per_rank, tp_rank, num_tp_ranks)
    return topk_idx, topk_weights


def _fake(logits: torch.Tensor, bias: torch.Tensor, scoring: str, num_topk: int, num_groups: int,
          num_topk_groups: int, num_physical_topk: int, routed_scaling_factor: float, ep_rank: int,
          experts_per_rank: int, tp_rank: int, num_tp_ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _outputs(logits, num_physical_topk)


def _fake_mapped(logits: torch.Tensor, bias: torch.Tensor, to_physical_map: torch.Tensor,
                 logical_count: torch.Tensor, scoring: str, num_topk: int, num_groups: int, num_topk_groups: int,
                 num_physical_topk: int, routed_scaling_factor: float, ep_rank: int, experts_per_rank: int,
                 tp_rank: int, num_tp_ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _outputs(logits, num_physical_topk)


# What torch.compile sees: one opaque op per argument list (with and without the map).
_gate_op = custom_op("top2_sum_gate", fake=_fake)(_gate)
_gate_mapped_op = custom_op("top2_sum_gate_mapped", fake=_fake_mapped)(_gate_mapped)


def _gate_into(out: object, compiling: bool, logits: torch.Tensor, bias: torch.Tensor,
               to_physical_map: torch.Tensor | None, logical_count: torch.Tensor | None,
               args: tuple[object, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate into the caller's (topk_idx, topk_weights); the launcher checks them like any tensor
    (shapes (T, num_topk + S), and no overlap with the inputs). While compiling, the custom op's
    result is copied into them."""
    topk_idx, topk_weights = _out_tensors(out, args[4])  # type: ignore[arg-type]
    mapped = to_physical_map is not None
    inputs = (logits, bias, to_physical_map, logical_count) if mapped else (logits, bias)
    if compiling:
        op = _gate_mapped_op if mapped else _gate_op
        idx, weights = op(*inputs, *args)
        return topk_idx.copy_(idx), topk_weights.copy_(weights)
    scoring, k, groups, top_groups, _, *scalars = args
    launch = _select(logits, scoring, k, groups, top_groups, mapped)  # type: ignore[arg-type]
    launch(*inputs, topk_idx, topk_weights, *scalars)
    return topk_idx, topk_weights


def _remember_fast(launch: Callable[..., None], scalars: tuple[object, ...], width: int,
                   result: tuple[torch.Tensor, torch.Tensor], *call: object) -> None:
    """Let dispatch() take later calls like ``call`` (logits, bias, to_physical_map, logical_count, out, the
    other arguments as given) straight to launch, with its scalar arguments and out's width; an allocating
    call (out None) allocates ``result``'s tensors as it did: one row per token of logits, width columns."""
    inputs = (0, 1, 2, 3) if call[2] is not None else (0, 1)
    arguments = (*map(from_input, inputs), from_out(0), from_out(1), *scalars)
    outputs = tuple(output(t.dtype, size_of(0, 0), width) for t in result)
    remember(_FAST, launch, arguments, (size_is(len(inputs), 1, width),), *call, outputs=outputs)


def _out_tensors(out: object, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The caller's (topk_idx, topk_weights), each num_topk + num_shared_experts wide.

    The kernel reads that width from topk_idx (the contract leaves it free), and its lanes write
    columns 0 .. num_topk - 1 of every row: a narrower out would be written past its rows.
    """
    topk_idx, topk_weights = out_tensors(out, ("topk_idx", "topk_weights"))
    if topk_idx.dim() != 2 or topk_idx.shape[1] != width:
        raise KernelArgumentError(f"topk_idx: expected shape (num_tokens, {width}) (num_topk + num_shared_experts "
                                  f"columns), got {tuple(topk_idx.shape)}")
    return topk_idx, topk_weights


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


# Eager calls without the optional tensors, keyed by the width of logits and every scalar
# argument as given -> (launcher, its scalar arguments, outputs per token). A key is stored only
# after the full checks passed and the launcher accepted the call, so a hit skips the checks; the
# tensors are the launcher's to check on every call. Only exact types are keyed (ints, the bool,
# the str, a float or int factor): 8.0 == 8 and True == 1 hash alike, but the checks refuse them.
_CALLS: dict[tuple[object, ...], tuple[Callable[..., None], tuple[object, ...], int]] = {}


def _key(logits: object, num_topk: object, num_topk_groups: object, num_groups: object,
         use_shared_as_routed: object, num_shared_experts: object, routed_scaling_factor: object,
         ep_rank: object, num_ep_ranks: object, tp_rank: object, num_tp_ranks: object,
         scoring_func: object) -> tuple[object, ...] | None:
    """The cache key of a call with plainly typed arguments and a 2-D logits tensor, else None."""
    if not (type(logits) is torch.Tensor and logits.dim() == 2 and type(num_topk) is int
            and type(num_topk_groups) is int and type(num_groups) is int and type(use_shared_as_routed) is bool
            and type(num_shared_experts) is int and type(routed_scaling_factor) in (float, int)
            and type(ep_rank) is int and type(num_ep_ranks) is int and type(tp_rank) is int
            and type(num_tp_ranks) is int and type(scoring_func) is str):
        return None
    return (logits.shape[1], num_topk, num_topk_groups, num_groups, use_shared_as_routed, num_shared_experts,
            routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks, scoring_func)


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
) -> tuple[torch.Tensor, torch.Tensor]:
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
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        done = dispatch(_FAST, logits, bias, to_physical_map, logical_count, out, num_topk, num_topk_groups,
                        num_groups, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank,
                        num_ep_ranks, tp_rank, num_tp_ranks, scoring_func, mask, fix_routing_mask, unmapped_topk_idx)
        if done is not None:
            return done  # type: ignore[no-any-return]
    key = None
    if mask is None and fix_routing_mask is None and to_physical_map is None and logical_count is None \
            and unmapped_topk_idx is None:
        key = _key(logits, num_topk, num_topk_groups, num_groups, use_shared_as_routed, num_shared_experts,
                   routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks, scoring_func)
        hit = None if key is None else _CALLS.get(key)
        if hit is not None and not torch.compiler.is_compiling():
            launch, scalars, width = hit
            if out is None:
                topk_idx, topk_weights = _outputs(logits, width)
            else:
                topk_idx, topk_weights = _out_tensors(out, width)
            launch(logits, bias, topk_idx, topk_weights, *scalars)
            # dispatch() had not seen it, or declined
            _remember_fast(launch, scalars, width, (topk_idx, topk_weights), logits, bias, to_physical_map,
                           logical_count, out, num_topk, num_topk_groups, num_groups, use_shared_as_routed,
                           num_shared_experts, routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks,
                           scoring_func, mask, fix_routing_mask, unmapped_topk_idx)
            return topk_idx, topk_weights
    logits = matrix("logits", logits, "(num_tokens, num_routed_experts)")
    for name, value in (("mask", mask), ("fix_routing_mask", fix_routing_mask),
                        ("unmapped_topk_idx", unmapped_topk_idx)):
        if value is not None:
            raise not_built(name, f"the optional {name} tensor", "top2_sum_gate")
    num_experts = int(logits.shape[1])
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
    if to_physical_map is not None:
        to_physical_map = _map_tensor("to_physical_map", to_physical_map, (num_experts + shared,))
        logical_count = _map_tensor("logical_count", logical_count, (num_experts + shared,))
        num_extra = int(to_physical_map.shape[1]) - 1
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
    scale = float(routed_scaling_factor)
    p = k + shared
    args = (scoring, k, groups, top_groups, p, scale, ep, experts_per_rank, tp, num_tp_ranks)
    compiling = torch.compiler.is_compiling()
    if out is not None:
        result = _gate_into(out, compiling, logits, bias, to_physical_map, logical_count, args)
    elif to_physical_map is not None:
        assert logical_count is not None
        gate_mapped = _gate_mapped_op if compiling else _gate_mapped
        result = gate_mapped(logits, bias, to_physical_map, logical_count, *args)
    else:
        result = (_gate_op if compiling else _gate)(logits, bias, *args)
    if not compiling:  # the launcher accepted it: dispatch() had not seen it, or declined
        launch = _select(logits, scoring, k, groups, top_groups, to_physical_map is not None)
        _remember_fast(launch, args[5:], p, result, logits, bias, to_physical_map, logical_count, out, num_topk,
                       num_topk_groups, num_groups, use_shared_as_routed, num_shared_experts, routed_scaling_factor,
                       ep_rank, num_ep_ranks, tp_rank, num_tp_ranks, scoring_func, mask, fix_routing_mask,
                       unmapped_topk_idx)
        if key is not None:  # later calls may skip the checks (key: no map, so this very launcher)
            _CALLS[key] = (launch, args[5:], p)
    return result  # type: ignore[no-any-return]
