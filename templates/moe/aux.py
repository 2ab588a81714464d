"""moe.group_count and moe.aux_fi: per-expert counts of a routing, and the auxiliary-loss f_i.

Both run one block (templates/moe/count.py.j2) with shared-memory integer counters, so the
result is deterministic and needs no zeroed output; num_topk and the number of groups are read
at run time. Ids outside [0, num_groups) (-1 = masked) are not counted (TileKernels asserts
on ids >= num_groups; this build drops them).
"""

from __future__ import annotations

import torch

from .._args import matrix, positive_int
from .._runtime import custom_op, get_kernel

__all__ = ["aux_fi", "group_count"]

MAX_GROUPS = 1024  # the kernel's shared counters

_count = get_kernel("moe_group_count")
_aux = get_kernel("moe_aux_fi")


def _ids(name: str, t: object) -> torch.Tensor:
    t = matrix(name, t, "(num_tokens, num_topk)")
    if t.dtype != torch.int64:
        raise TypeError(f"{name}: expected dtype torch.int64, got {t.dtype}")
    return t.contiguous()


def _groups(name: str, value: object) -> int:
    number = positive_int(name, value)
    if number > MAX_GROUPS:
        raise ValueError(f"{name}: at most {MAX_GROUPS} are built, got {number}")
    return number


def _group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    out = torch.empty((num_groups,), dtype=torch.int32, device=group_idx.device)
    _count.select(aux=False)(group_idx.view(-1), out)
    return out


def _fake_group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    return group_idx.new_empty((num_groups,), dtype=torch.int32)


_group_count_op = custom_op("moe_group_count", fake=_fake_group_count)(_group_count)


def group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """int32 (num_groups,): how many entries of group_idx (int64 (num_tokens, num_topk)) hold each id."""
    group_idx = _ids("group_idx", group_idx)
    num_groups = _groups("num_groups", num_groups)
    if torch.compiler.is_compiling():
        return _group_count_op(group_idx, num_groups)
    return _group_count(group_idx, num_groups)


def _aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    out = torch.empty((num_experts,), dtype=torch.float32, device=topk_idx.device)
    # The kernel divides by float(num_tokens * num_aux_topk), as TileKernels does; the ctypes
    # float slot rounds the exact product to the same fp32 value.
    _aux.select(aux=True)(topk_idx.view(-1), out, float(topk_idx.shape[0] * num_aux_topk))
    return out


def _fake_aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    return topk_idx.new_empty((num_experts,), dtype=torch.float32)


_aux_fi_op = custom_op("moe_aux_fi", fake=_fake_aux_fi)(_aux_fi)


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """float32 (num_experts,): f_i = count_i * num_experts / (num_tokens * num_aux_topk), 0 where count_i = 0.

    count_i is the number of entries of topk_idx (int64 (num_tokens, num_topk)) equal to i.
    """
    topk_idx = _ids("topk_idx", topk_idx)
    num_experts = _groups("num_experts", num_experts)
    num_aux_topk = positive_int("num_aux_topk", num_aux_topk)
    if torch.compiler.is_compiling():
        return _aux_fi_op(topk_idx, num_experts, num_aux_topk)
    return _aux_fi(topk_idx, num_experts, num_aux_topk)
