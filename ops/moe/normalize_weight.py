"""moe.normalize_weight: per-token routing weights divided by their sum (plus 1e-20).

TileKernels' ``normalize_weight``; one prebuilt variant per num_topk of
kernel_specs/moe_gate.yaml. denominator[t] = ((1e-20 + w[t, 0]) + w[t, 1]) + ... in fp32,
and normalized[t, k] = w[t, k] / denominator[t] (IEEE division).
"""

from __future__ import annotations

import torch

from .._args import matrix
from .._op import Plan, empty, launch, op, out, size
from .._runtime import get_kernel

__all__ = ["normalize_weight"]

_kernel = get_kernel("normalize_weight")


@op(outputs=("denominator", "normalized_weights"), inputs={"topk_weights": (1,)})
def normalize_weight(topk_weights: torch.Tensor) -> Plan:
    """Normalize each token's top-k weights to sum to one.

    Args:
        topk_weights: float32 CUDA tensor (num_tokens, num_topk), contiguous.
        out: ``(denominator, normalized_weights)`` to write into instead, as this call would
            return them (contiguous; not overlapping topk_weights); returned as given.

    Returns:
        ``(denominator, normalized_weights)``: float32 (num_tokens,) holding 1e-20 + the row sum,
        and float32 (num_tokens, num_topk) holding topk_weights / denominator.
    """
    topk_weights = matrix("topk_weights", topk_weights, "(num_tokens, num_topk)")
    num_topk = int(topk_weights.shape[1])
    return launch(_kernel.variant(num_topk), topk_weights, out(0), out(1),
                  outputs=(empty(torch.float32, size(topk_weights, 0)),
                           empty(torch.float32, size(topk_weights, 0), num_topk)))
