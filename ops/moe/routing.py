"""moe.moe_routing: the product announcement's one-line MoE layer body, over the routing ops.

A thin convenience, not a kernel of its own: get_fused_mapping lays the (token, k) slots out
expert-major, expand_to_fused copies each token's row to its slots, ``experts`` runs on each
expert's contiguous segment of that buffer, and reduce_fused sums each token's rows back,
weighted. Autograd is the existing pair's (reduce.py's ExpandToFused / ReduceFused: the
backward of expand is an unweighted reduce, that of reduce a weighted expand plus the row dot
products for the weights), with torch's autograd through ``experts`` in between.

Built sizes: moe_routing runs every hidden all three bf16 kernels serve (expand, weighted reduce,
unweighted reduce): in kernel_specs/moe_route.yaml any multiple of 256 through their variants for
any hidden, 2048, 4096 and 7168 through those built for the size; the mapping's num_experts is compile-time too (4, 9,
32), and a routing of fewer experts runs the next larger built variant, its extra experts
empty (the layout of the real ones is the same). Other sizes raise VariantNotFoundError
naming the argument.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._args import positive_int
from .._runtime import get_kernel
from ..errors import VariantNotFoundError
from ._fused_mapping import get_fused_mapping
from ._reduce import expand_to_fused_autograd, reduce_fused_autograd

__all__ = ["moe_routing"]

_mapping_kernel = get_kernel("moe_fused_mapping")
_expand_kernel = get_kernel("moe_expand")
_reduce_kernel = get_kernel("moe_reduce")

# The variants one call runs, by their grid values after hidden: expand (dtype, with_sf, sf_layout)
# and reduce (in_dtype, out_dtype, with_weights), forward (weighted) and the backward of expand
# (unweighted, which a weighted variant also runs), each with the multiple of hidden its variant for
# any hidden (grid value 0) needs.
_EXPAND_BF16 = (("bfloat16", False, "row_major"),)
_REDUCE_WEIGHTED = (("bfloat16", "bfloat16", True),)
_REDUCE_UNWEIGHTED = (("bfloat16", "bfloat16", False), ("bfloat16", "bfloat16", True))
_EXPAND_MULTIPLE, _REDUCE_MULTIPLE = 16, 256

Experts = Callable[[int, torch.Tensor], torch.Tensor] | Sequence[Callable[[torch.Tensor], torch.Tensor]]
# The sequences taken as per-expert callables: list, tuple, ModuleList (a str is a Sequence too).
_INDEXED = (list, tuple, torch.nn.ModuleList)


def _serves(kernel: Any, forms: tuple[tuple[object, ...], ...], multiple: int, hidden: int) -> bool:
    """Whether one of ``forms`` is built for ``hidden``, or for any hidden (grid value 0) and hidden is a multiple
    of ``multiple``."""
    return any(kernel.has(hidden, *rest) or (hidden % multiple == 0 and kernel.has(0, *rest)) for rest in forms)


def _sizes(kernel: Any, forms: tuple[tuple[object, ...], ...]) -> set[int]:
    """The hidden sizes one of ``forms`` is built for (0, any hidden, left out)."""
    return {key[0] for key in kernel.variants if tuple(key[1:]) in forms and key[0]}


def _check_hidden(hidden: int) -> None:
    needed = [(_expand_kernel, _EXPAND_BF16, _EXPAND_MULTIPLE), (_reduce_kernel, _REDUCE_WEIGHTED, _REDUCE_MULTIPLE),
              (_reduce_kernel, _REDUCE_UNWEIGHTED, _REDUCE_MULTIPLE)]
    if all(_serves(kernel, forms, multiple, hidden) for kernel, forms, multiple in needed):
        return
    shared = set.intersection(*(_sizes(kernel, forms) for kernel, forms, _ in needed))
    generic = all(any(kernel.has(0, *rest) for rest in forms) for kernel, forms, _ in needed)
    raise VariantNotFoundError(
        f"hidden_states: moe_routing is not built for hidden size {hidden} (built: "
        f"{', '.join(str(h) for h in sorted(shared)) or 'none'}: the sizes the bf16 moe_expand and the weighted and "
        f"unweighted bf16 moe_reduce variants share"
        f"{f', and any multiple of {_REDUCE_MULTIPLE}' if generic else ''}); add it to the hidden grid of kernels "
        f"moe_expand and moe_reduce in {_reduce_kernel.spec} and rebuild (tkc build)")


def _mapping_experts(num_experts: int) -> int:
    """The built num_experts of get_fused_mapping that serves a routing of num_experts experts."""
    if _mapping_kernel.has(num_experts):
        return num_experts
    larger = [key[0] for key in _mapping_kernel.variants if key[0] > num_experts]
    if larger:
        return min(larger)
    raise VariantNotFoundError(
        f"num_experts: moe_routing is not built for {num_experts} experts (get_fused_mapping is built for "
        f"num_experts {', '.join(str(e) for e in sorted(key[0] for key in _mapping_kernel.variants))}, and runs "
        f"fewer experts on the next larger); add it to the grid of kernel moe_fused_mapping in "
        f"{_mapping_kernel.spec} and rebuild (tkc build)")


def _tokens(hidden_states: object) -> torch.Tensor:
    if not isinstance(hidden_states, torch.Tensor):
        raise TypeError(f"hidden_states: expected a torch.Tensor (num_tokens, hidden) or (batch, seq, hidden), got "
                        f"{type(hidden_states).__name__}")
    if hidden_states.dim() not in (2, 3):
        raise ValueError(f"hidden_states: expected a 2-D (num_tokens, hidden) or 3-D (batch, seq, hidden) tensor, "
                         f"got shape {tuple(hidden_states.shape)}")
    if hidden_states.dtype != torch.bfloat16:
        raise TypeError(f"hidden_states: expected dtype torch.bfloat16 (moe_routing runs the bf16 expand and reduce "
                        f"kernels), got {hidden_states.dtype}; pass hidden_states.bfloat16()")
    return hidden_states


def _slots(name: str, t: object, dtype: torch.dtype, lead: tuple[int, ...], num_topk: int | None) -> torch.Tensor:
    """t as the (num_tokens, num_topk) matrix of a routing of tokens ``lead``, or an error naming it."""
    shape = "(batch, seq, k)" if len(lead) == 2 else "(num_tokens, k)"
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor {shape}, got {type(t).__name__}")
    if t.dim() != len(lead) + 1 or tuple(t.shape[:-1]) != lead:
        raise ValueError(f"{name}: expected shape {shape} with leading dimensions {lead} (those of hidden_states), "
                         f"got {tuple(t.shape)}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if t.shape[-1] == 0:
        raise ValueError(f"{name}: k (the last dimension) must be at least 1")
    if num_topk is not None and t.shape[-1] != num_topk:
        raise ValueError(f"{name}: expected shape {(*lead, num_topk)} (that of expert_idx), got "
                         f"{tuple(t.shape)}")
    return t.reshape(-1, t.shape[-1]).contiguous()


def _num_experts(num_experts: object, experts: object, idx: torch.Tensor) -> int:
    if num_experts is not None:
        number = positive_int("num_experts", num_experts)
        if isinstance(experts, _INDEXED) and len(experts) != number:
            raise ValueError(f"num_experts: {number} does not match experts, a sequence of {len(experts)}")
        return number
    if isinstance(experts, _INDEXED):
        return positive_int("experts", len(experts))
    # Not given: the largest id + 1 (a host synchronization), at least 1.
    return max(int(idx.max()) + 1, 1) if idx.numel() else 1


def _apply(experts: Experts, expanded: torch.Tensor, expert_end: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The expanded buffer with each expert's segment replaced by what its expert returns."""
    ends = expert_end[:num_experts].tolist()  # the one host synchronization: segment bounds
    sizes = [end - start for start, end in zip([0, *ends[:-1]], ends)]
    # One split, so that the backward assembles the buffer's gradient once (a slice per expert
    # would each make a full-size zero gradient); the tail is the rows no expert owns.
    *segments, tail = expanded.split([*sizes, int(expanded.shape[0]) - ends[-1]])
    indexed = isinstance(experts, _INDEXED)
    outputs = []
    for expert, segment in enumerate(segments):
        if segment.shape[0] == 0:
            continue  # an expert without tokens is not called
        result = experts[expert](segment) if indexed else experts(expert, segment)  # type: ignore[index, operator]
        if not isinstance(result, torch.Tensor) or result.shape != segment.shape:
            got = tuple(result.shape) if isinstance(result, torch.Tensor) else type(result).__name__
            raise ValueError(f"experts: expert {expert} must return a tensor of its segment's shape "
                             f"{tuple(segment.shape)}, got {got}")
        outputs.append(result.to(expanded.dtype))
    return torch.cat([*outputs, tail])


def moe_routing(
    hidden_states: torch.Tensor,
    expert_idx: torch.Tensor,
    expert_weights: torch.Tensor,
    experts: Experts | None = None,
    *,
    num_experts: int | None = None,
    alignment: int = 1,
) -> torch.Tensor:
    """Send each token through its k experts and sum the results, weighted.

    ``moe_routing(hidden_states, expert_idx, expert_weights, experts=None, *, num_experts=None,
    alignment=1)``: out[t] = sum over k (fp32, in k order) of expert_weights[t, k] *
    expert_{expert_idx[t, k]}(hidden_states[t]), rounded to bf16; slots whose id is -1 (masked)
    or outside [0, num_experts) contribute nothing (and get no gradient), as in get_fused_mapping
    and reduce_fused. A token with every slot masked gets a zero row.

    Args:
        hidden_states: bf16 CUDA tensor (num_tokens, hidden) or (batch, seq, hidden); hidden a
            built size (2048, 4096, 7168 in the default specs).
        expert_idx: int64 (num_tokens, k) or (batch, seq, k), leading dimensions those of
            hidden_states (what topk_gating returns).
        expert_weights: float32, the shape of expert_idx.
        experts: what each expert computes, on its contiguous segment of the expert-major
            buffer, a bf16 (rows, hidden) tensor holding the rows of the tokens routed to it in
            ascending (token, k) order; it must return a tensor of the segment's shape (cast to
            bf16 if it is not). Either a callable ``experts(expert_id, segment)``, or a sequence
            (list, tuple, torch.nn.ModuleList) of per-expert callables, called as
            ``experts[expert_id](segment)``. Experts without tokens are not called. None: the
            identity (out[t] = sum_k w[t, k] * hidden_states[t]).
        num_experts: the number of experts E. Default: len(experts) for a sequence, else the
            largest id in expert_idx + 1 (a host synchronization; pass it to avoid that, and
            under torch.compile). E must be a built num_experts of get_fused_mapping (4, 9, 32)
            or smaller than one.
        alignment: each expert's segment is padded to a multiple of it (>= 1) with zero rows,
            whose expert outputs the reduction ignores; 1 passes experts exactly their rows.

    Returns:
        bf16 tensor of hidden_states' shape. It is differentiable with respect to hidden_states,
        expert_weights and whatever ``experts`` computes with (its parameters).

    Synchronization: with experts given, one host synchronization reads the segment bounds;
    with experts None and num_experts given, none (torch.compile(fullgraph=True) traces it).
    """
    tokens = _tokens(hidden_states)
    lead = tuple(tokens.shape[:-1])
    hidden = operator.index(tokens.shape[-1])
    idx = _slots("expert_idx", expert_idx, torch.int64, lead, None)
    weights = _slots("expert_weights", expert_weights, torch.float32, lead, int(idx.shape[1]))
    if experts is not None and not isinstance(experts, _INDEXED) and not callable(experts):
        raise TypeError(f"experts: expected None, a callable experts(expert_id, segment) or a sequence of per-expert "
                        f"callables, got {type(experts).__name__}")
    align = positive_int("alignment", alignment)
    _check_hidden(hidden)
    count = _num_experts(num_experts, experts, idx)
    mapped = _mapping_experts(count)
    if mapped != count:  # the larger variant would route ids in [count, mapped): drop them as count would
        idx = torch.where(idx < count, idx, -1)
    # force_no_sync: the worst-case buffer (its unused tail is -1, zeroed by expand) instead of a
    # host synchronization to trim it.
    pos_to_expert, _, _, token_topk_to_pos, _, expert_end, _, _ = get_fused_mapping(
        idx, mapped, 0, align, force_no_sync=True)
    expanded = expand_to_fused_autograd(tokens.reshape(-1, hidden).contiguous(), token_topk_to_pos, pos_to_expert)
    if experts is not None:
        expanded = _apply(experts, expanded, expert_end, count)
    out = reduce_fused_autograd(expanded, weights, token_topk_to_pos, pos_to_expert)
    return out.view(*lead, hidden)
