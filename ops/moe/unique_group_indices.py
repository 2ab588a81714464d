"""moe.inplace_unique_group_indices: within each row, repeats of an earlier group id become -1.

TileKernels' ``inplace_unique_group_indices``; one prebuilt variant per num_topk of
kernel_specs/moe_gate.yaml. The kernel rewrites the tensor in place.
"""

from __future__ import annotations

import torch

from .._args import matrix, positive_int
from .._op import Plan, launch, op
from .._runtime import get_kernel

__all__ = ["inplace_unique_group_indices"]

_kernel = get_kernel("inplace_unique_group_indices")
MAX_GROUPS = 128  # the kernel's set of seen ids is two 64-bit words


@op(out=False, mutates=True)
def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> Plan:
    """Replace, in place, every repeat of an earlier group id in a row by -1.

    Args:
        group_indices: int64 CUDA tensor (num_tokens, num_topk), contiguous, ids in
            [0, num_groups) or negative; modified in place.
        num_groups: number of groups, at most 128.
    """
    group_indices = matrix("group_indices", group_indices, "(num_tokens, num_topk)")
    groups = positive_int("num_groups", num_groups)
    if groups > MAX_GROUPS:
        raise ValueError(f"num_groups: expected at most {MAX_GROUPS}, got {groups}")
    return launch(_kernel.variant(int(group_indices.shape[1])), group_indices)
