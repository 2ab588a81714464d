"""moe.normalize_weight: per-token routing weights divided by their sum (plus 1e-20).

TileKernels' ``normalize_weight``; one prebuilt variant per num_topk of
kernel_specs/moe_gate.yaml. denominator[t] = ((1e-20 + w[t, 0]) + w[t, 1]) + ... in fp32,
and normalized[t, k] = w[t, k] / denominator[t] (IEEE division).
"""

from __future__ import annotations

import torch

from .._args import copied_into, matrix, out_tensors
from .._runtime import (
    custom_op,
    dispatch,
    fast_path,
    from_input,
    from_out,
    get_kernel,
    output,
    remember,
    size_of,
)

__all__ = ["normalize_weight"]

_kernel = get_kernel("normalize_weight")
# normalize_weight(topk_weights, out=(denominator, normalized_weights)) in one C call (_runtime.dispatch):
# keyed by topk_weights' dtype and num_topk, which fix the variant; the launcher's contract checks
# every tensor (the outputs' rows and width against topk_weights'), which is all the op checks. An
# allocating call allocates both as _outputs does: float32 (num_tokens,) and (num_tokens, num_topk).
_FAST = fast_path(inputs=((1,),), outputs=2)


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
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        done = dispatch(_FAST, topk_weights, out)
        if done is not None:
            return done  # type: ignore[no-any-return]
    topk_weights = matrix("topk_weights", topk_weights, "(num_tokens, num_topk)")
    if torch.compiler.is_compiling():
        result = _normalize_weight_op(topk_weights)
        return result if out is None else copied_into(out, ("denominator", "normalized_weights"), result)  # type: ignore[no-any-return]
    denominator, normalized = _run(topk_weights, out)
    # dispatch() had not seen it, or declined: later calls like it may skip the above
    remember(_FAST, _kernel.variant(int(topk_weights.shape[1])), (from_input(0), from_out(0), from_out(1)), (),
             topk_weights, out, outputs=(output(denominator.dtype, size_of(0, 0)),
                                         output(normalized.dtype, size_of(0, 0), normalized.shape[1])))
    return denominator, normalized
