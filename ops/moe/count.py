"""moe.group_count and moe.aux_fi: per-expert counts of a routing, and the auxiliary-loss f_i.

Both run one block (kernels/moe/count.py.j2) with shared-memory integer counters, so the
result is deterministic and needs no zeroed output; num_topk and the number of groups are read
at run time. Ids outside [0, num_groups) (-1 = masked) are not counted (TileKernels asserts
on ids >= num_groups; this build drops them).
"""

from __future__ import annotations

import operator

import torch

from .._args import matrix, positive_int
from .._op import Plan, empty, launch, op, out
from .._runtime import get_kernel

__all__ = ["aux_fi", "group_count"]

MAX_GROUPS = 1024  # the kernel's shared counters

_count = get_kernel("moe_group_count")
_aux = get_kernel("moe_aux_fi")


def _ids(name: str, t: object) -> torch.Tensor:
    """The ids as the kernels' flat (num_entries,) view (of a contiguous copy where t is not contiguous)."""
    t = matrix(name, t, "(num_tokens, num_topk)")
    if t.dtype != torch.int64:
        raise TypeError(f"{name}: expected dtype torch.int64, got {t.dtype}")
    return t.contiguous().view(-1)


def _groups(name: str, value: object) -> int:
    number = positive_int(name, value)
    if number > MAX_GROUPS:
        raise ValueError(f"{name}: at most {MAX_GROUPS} are built, got {number}")
    return number


# Neither takes out= (TileKernels' signatures), and both launch with a flat view of the ids: no
# dispatch() entries.
@op(outputs=("counts",), out=False)
def group_count(group_idx: torch.Tensor, num_groups: int) -> Plan:
    """int32 (num_groups,): how many entries of group_idx (int64 (num_tokens, num_topk)) hold each id."""
    flat = _ids("group_idx", group_idx)
    num_groups = _groups("num_groups", num_groups)
    return launch(_count.variant(False), flat, out(0), outputs=(empty(torch.int32, num_groups),))


@op(outputs=("fi",), out=False)
def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> Plan:
    """float32 (num_experts,): f_i = count_i * num_experts / (num_tokens * num_aux_topk), 0 where count_i = 0.

    count_i is the number of entries of topk_idx (int64 (num_tokens, num_topk)) equal to i.
    """
    flat = _ids("topk_idx", topk_idx)
    num_experts = _groups("num_experts", num_experts)
    num_aux_topk = positive_int("num_aux_topk", num_aux_topk)
    # The kernel divides by float(num_tokens * num_aux_topk), as TileKernels does; the ctypes
    # float slot rounds the exact product to the same fp32 value. A constant of the launch: while
    # torch.compile traces, it specializes on num_tokens.
    denominator = float(operator.index(topk_idx.shape[0]) * num_aux_topk)
    return launch(_aux.variant(True), flat, out(0), denominator, outputs=(empty(torch.float32, num_experts),))
