"""moe.topk_gate: the num_topk largest scores' expert ids per token (TileKernels' ``topk_gate``).

One prebuilt variant per (num_experts, num_topk) of kernel_specs/moe_gate.yaml, and per num_topk one for
any num_experts that is a multiple of 4 (a runtime size) up to each built capacity, 128 and 256; num_tokens
is read from the tensor at run time. Ties go to the lower expert id (a stable descending sort);
NaN scores rank as -inf.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._args import matrix, positive_int
from .._op import Plan, empty, launch, op, out, size
from .._runtime import get_kernel

__all__ = ["topk_gate"]

_kernel = get_kernel("topk_gate")
FIXED = 256  # the capacity key of the variants built for one E (grid order: num_experts, num_topk, capacity)
ANY_E_MULTIPLE = 4  # the variants for any E take E a multiple of this (the spec's requires)


def variant_for(kernel: Any, num_experts: int, num_topk: int) -> Callable[..., None] | None:
    """The launcher of ``kernel``'s variants that topk_gate runs for (E, k), or None: the one built for E, else the
    variant for any E with the smallest capacity that holds E (E a multiple of ANY_E_MULTIPLE)."""
    launcher = kernel.find(num_experts, num_topk, FIXED)
    if launcher is not None or num_experts % ANY_E_MULTIPLE:
        return launcher
    holding = [key[2] for key in kernel.variants if key[0] == 0 and key[1] == num_topk and num_experts <= key[2]]
    return kernel.find(0, num_topk, min(holding)) if holding else None


@op(outputs=("topk_idx",), inputs={"scores": (1,)})
def topk_gate(scores: torch.Tensor, num_topk: int) -> Plan:
    """Ids of the num_topk largest scores of each token, in descending score order.

    Args:
        scores: float32 CUDA tensor (num_tokens, num_experts), contiguous.
        num_topk: experts per token, 1 <= num_topk <= num_experts.
        out: an int64 (num_tokens, num_topk) contiguous tensor to write the ids into instead
            (checked by the launcher as topk_idx; not overlapping scores), returned as given.

    Returns:
        int64 (num_tokens, num_topk), contiguous; equal scores are ranked by the lower id.
    """
    scores = matrix("scores", scores, "(num_tokens, num_experts)")
    k = positive_int("num_topk", num_topk)
    num_experts = int(scores.shape[1])
    if k > num_experts:
        raise ValueError(f"num_topk: expected at most num_experts ({num_experts}) experts, got {k}")
    # The variant built for this E, else the one for any E that holds it (grid value 0); for any other E the largest
    # one's launcher refuses scores by its requires (a multiple of 4, at most 256), naming it.
    launcher = variant_for(_kernel, num_experts, k) or _kernel.variant(0, k, FIXED)
    return launch(launcher, scores, out(0),
                  outputs=(empty(torch.int64, size(scores, 0), k),))
