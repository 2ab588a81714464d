"""moe.mask_indices_by_tp: keep the expert ids of one tensor-parallel rank, remapped; others -1.

TileKernels' ``mask_indices_by_tp``; one prebuilt variant per (num_topk, index dtype) of
kernel_specs/moe_gate.yaml. With per_gpu = n // num_ep_ranks and per_dp = num_tp_ranks *
per_gpu, id v is kept when v >= 0 and (v // per_gpu) % num_tp_ranks == tp_rank, and becomes
v' - (v' // per_dp) * (per_dp - per_gpu) with v' = v - tp_rank * per_gpu.
"""

from __future__ import annotations

import operator

import torch

from .._args import matrix, positive_int
from .._op import Plan, empty, launch, op, out, size
from .._runtime import dtype_name, get_kernel

__all__ = ["mask_indices_by_tp"]

_kernel = get_kernel("mask_indices_by_tp")
_INT32_MAX = 2**31 - 1


# No out= (TileKernels' signature): no dispatch() entry (that would be inputs={"indices": (1,)}).
@op(outputs=("masked_indices",), out=False)
def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int,
                       num_tp_ranks: int) -> Plan:
    """Mask expert ids to those of TP rank ``tp_rank``, remapped to the rank's local range.

    Args:
        indices: int64 or int32 CUDA tensor (num_tokens, num_topk), contiguous; -1 entries stay -1.
        n: experts over all ranks; num_ep_ranks: expert-parallel size (n // num_ep_ranks >= 1).
        tp_rank: this device's tensor-parallel rank, 0 <= tp_rank < num_tp_ranks.
        num_tp_ranks: tensor-parallel size.

    Returns:
        A new tensor like ``indices``: -1 for ids of other TP ranks, the remapped id otherwise.
    """
    indices = matrix("indices", indices, "(num_tokens, num_topk)")
    n = positive_int("n", n)
    num_ep_ranks = positive_int("num_ep_ranks", num_ep_ranks)
    num_tp_ranks = positive_int("num_tp_ranks", num_tp_ranks)
    try:
        rank = operator.index(tp_rank)
    except TypeError:
        raise TypeError(f"tp_rank: expected an int, got {type(tp_rank).__name__}") from None
    if not 0 <= rank < num_tp_ranks:
        raise ValueError(f"tp_rank: expected 0 <= tp_rank < num_tp_ranks ({num_tp_ranks}), got {rank}")
    per_gpu = n // num_ep_ranks
    if per_gpu == 0:
        raise ValueError(f"num_ep_ranks: expected at most n ({n}) ranks, got {num_ep_ranks}")
    per_dp = per_gpu * num_tp_ranks
    if per_dp > _INT32_MAX:
        raise ValueError(f"n: n // num_ep_ranks * num_tp_ranks must fit in int32, got {per_dp}")
    num_topk = operator.index(indices.shape[1])  # an int, also while torch.compile traces dynamic shapes
    return launch(_kernel.variant(num_topk, dtype_name(indices.dtype)), indices, out(0), per_gpu, per_dp,
                  num_tp_ranks, rank, outputs=(empty(indices.dtype, size(indices, 0), num_topk),))
