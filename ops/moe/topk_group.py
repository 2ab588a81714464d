"""moe.topk_sum_and_topk_group_idx: the best groups of experts by their top-1 or top-2 score sum.

TileKernels' ``topk_sum_and_topk_group_idx``; one prebuilt variant per (num_groups,
experts_per_group, num_topk_groups, num_topk_sum) of kernel_specs/moe_gate.yaml; num_tokens
is read at run time. Equal group scores are ranked by the lower group id; NaN scores rank
as -inf.
"""

from __future__ import annotations

import torch

from .._args import positive_int
from .._op import Plan, empty, launch, op, out, size
from .._runtime import get_kernel
from ..errors import KernelArgumentError

__all__ = ["topk_sum_and_topk_group_idx"]

_kernel = get_kernel("topk_sum_and_topk_group_idx")


# No out= (TileKernels' signature), so nothing for dispatch() to key: the kernel takes scores as a
# (num_tokens, num_experts) view, which a remembered call could not replay anyway.
@op(outputs=("group_idx",), out=False)
def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> Plan:
    """Ids of the num_topk_groups groups with the largest sum of their num_topk_sum best scores.

    Args:
        scores: float32 CUDA tensor (num_tokens, num_groups, experts_per_group), contiguous.
        num_topk_sum: 1 or 2 (at most experts_per_group): best scores summed per group.
        num_topk_groups: groups returned per token, 1 <= num_topk_groups <= num_groups.

    Returns:
        int64 (num_tokens, num_topk_groups): group ids in descending group score, equal scores
        ranked by the lower id.
    """
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores: expected a torch.Tensor (num_tokens, num_groups, experts_per_group), "
                        f"got {type(scores).__name__}")
    if scores.dim() != 3:
        raise ValueError(f"scores: expected a 3-D tensor (num_tokens, num_groups, experts_per_group), "
                         f"got shape {tuple(scores.shape)}")
    if not scores.is_contiguous():
        raise KernelArgumentError(f"scores: expected a contiguous tensor, got strides {scores.stride()}; "
                                  "pass scores.contiguous()")
    n_sum = positive_int("num_topk_sum", num_topk_sum)
    n_groups = positive_int("num_topk_groups", num_topk_groups)
    num_groups, per_group = int(scores.shape[1]), int(scores.shape[2])
    if n_sum not in (1, 2) or n_sum > per_group:
        raise ValueError(f"num_topk_sum: expected 1 or 2 and at most experts_per_group ({per_group}), got {n_sum}")
    if n_groups > num_groups:
        raise ValueError(f"num_topk_groups: expected at most num_groups ({num_groups}), got {n_groups}")
    # Grid order: num_groups, experts_per_group, num_topk_groups, num_topk_sum.
    launcher = _kernel.variant(num_groups, per_group, n_groups, n_sum)
    flat = scores.flatten(1)  # the kernel's (num_tokens, num_experts) view
    return launch(launcher, flat, out(0), outputs=(empty(torch.int64, size(flat, 0), n_groups),))
