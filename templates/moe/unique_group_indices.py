"""moe.inplace_unique_group_indices: within each row, repeats of an earlier group id become -1.

TileKernels' ``inplace_unique_group_indices``; one prebuilt variant per num_topk of
kernel_specs/moe_gate.yaml. The first occurrence of each id in a row is kept, every later one
is overwritten with -1; negative entries are left as they are.
"""

from __future__ import annotations

import torch

from .._args import matrix, positive_int
from .._runtime import custom_op, get_kernel

__all__ = ["inplace_unique_group_indices"]

_kernel = get_kernel("inplace_unique_group_indices")
MAX_GROUPS = 128  # the kernel's set of seen ids is two 64-bit words


def _unique(group_indices: torch.Tensor) -> None:
    _kernel.select(num_topk=int(group_indices.shape[1]))(group_indices)


def _fake(group_indices: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(group_indices)


def _unique_copy(group_indices: torch.Tensor) -> torch.Tensor:
    out = group_indices.clone()
    _unique(out)
    return out


# torch.compile sees a functional op (a deduplicated copy) followed by copy_ into the argument:
# the shared custom_op helper registers ops that mutate nothing.
_unique_op = custom_op("inplace_unique_group_indices", fake=_fake)(_unique_copy)


def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> None:
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
    if torch.compiler.is_compiling():
        group_indices.copy_(_unique_op(group_indices))
        return
    _unique(group_indices)
