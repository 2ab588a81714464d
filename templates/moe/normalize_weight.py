"""moe.normalize_weight: per-token routing weights divided by their sum (plus 1e-20).

TileKernels' ``normalize_weight``; one prebuilt variant per num_topk of
kernel_specs/moe_gate.yaml. denominator[t] = ((1e-20 + w[t, 0]) + w[t, 1]) + ... in fp32,
and normalized[t, k] = w[t, k] / denominator[t] (IEEE division).
"""

from __future__ import annotations

import torch

from .._args import copied_into, matrix, out_tensors
from .._runtime import custom_op, get_kernel

__all__ = ["normalize_weight"]

_kernel = get_kernel("normalize_weight")


def _outputs(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (denominator (T,), normalized (T, K)); also the fake kernel for torch.compile."""
    num_tokens = topk_weights.shape[0]
    return (topk_weights.new_empty((num_tokens,), dtype=torch.float32),
            topk_weights.new_empty(tuple(topk_weights.shape), dtype=torch.float32))


def _launch(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _run(topk_weights, None)


def _run(topk_weights: torch.Tensor, out: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch into out, or into fresh tensors; the launcher checks every tensor (out: also for overlaps)."""
    num_topk = int(topk_weights.shape[1])
    launch = _kernel.variant(num_topk)
    if out is None:
        denominator, normalized = _outputs(topk_weights)
    else:
        denominator, normalized = out_tensors(out, ("denominator", "normalized_weights"))
    launch(topk_weights, denominator, normalized)
    return denominator, normalized


_normalize_weight_op = custom_op("normalize_weight", fake=_outputs)(_launch)


def normalize_weight(topk_weights: torch.Tensor, *,
                     out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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
    if torch.compiler.is_compiling():
        result = _normalize_weight_op(topk_weights)
        return result if out is None else copied_into(out, ("denominator", "normalized_weights"), result)  # type: ignore[no-any-return]
    return _run(topk_weights, out)
