"""moe.topk_gate: the num_topk largest scores' expert ids per token (TileKernels' ``topk_gate``).

One prebuilt variant per (num_experts, num_topk) of kernel_specs/moe_gate.yaml; num_tokens is
read from the tensor at run time. Ties go to the lower expert id (a stable descending sort);
NaN scores rank as -inf.
"""

from __future__ import annotations

import torch

from .._args import matrix, out_tensors, positive_int
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

__all__ = ["topk_gate"]

_kernel = get_kernel("topk_gate")
# topk_gate(scores, num_topk, out=topk_idx) in one C call (_runtime.dispatch): keyed by scores' dtype
# and num_experts and num_topk as given, which fix the variant and pass the op's checks; the launcher's
# contract checks both tensors (scores' rows against topk_idx's, topk_idx's width num_topk). An
# allocating call allocates topk_idx as _outputs does: int64 (num_tokens, num_topk).
_FAST = fast_path(inputs=((1,),), outputs=1)


def _outputs(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """Uninitialised int64 (num_tokens, num_topk); also the fake kernel torch.compile traces with."""
    return scores.new_empty((scores.shape[0], num_topk), dtype=torch.int64)


def _topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    return _run(scores, num_topk, None)


def _run(scores: torch.Tensor, num_topk: int, out: torch.Tensor | None) -> torch.Tensor:
    """Launch into out, or into a fresh tensor; the launcher checks every tensor (out: also for overlaps)."""
    num_experts = int(scores.shape[1])
    launch = _kernel.variant(num_experts, num_topk)
    topk_idx = _outputs(scores, num_topk) if out is None else out
    launch(scores, topk_idx)
    return topk_idx


_topk_gate_op = custom_op("topk_gate", fake=_outputs)(_topk_gate)


def topk_gate(scores: torch.Tensor, num_topk: int, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Ids of the num_topk largest scores of each token, in descending score order.

    Args:
        scores: float32 CUDA tensor (num_tokens, num_experts), contiguous.
        num_topk: experts per token, 1 <= num_topk <= num_experts.
        out: an int64 (num_tokens, num_topk) contiguous tensor to write the ids into instead
            (checked by the launcher as topk_idx; not overlapping scores), returned as given.

    Returns:
        int64 (num_tokens, num_topk), contiguous; equal scores are ranked by the lower id.
    """
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        done = dispatch(_FAST, scores, out, num_topk)
        if done is not None:
            return done  # type: ignore[no-any-return]
    scores = matrix("scores", scores, "(num_tokens, num_experts)")
    k = positive_int("num_topk", num_topk)
    if k > scores.shape[1]:
        raise ValueError(f"num_topk: expected at most num_experts ({scores.shape[1]}) experts, got {k}")
    if out is not None:
        (out,) = out_tensors(out, ("topk_idx",))
    if torch.compiler.is_compiling():
        topk_idx = _topk_gate_op(scores, k)
        return topk_idx if out is None else out.copy_(topk_idx)
    topk_idx = _run(scores, k, out)
    # dispatch() had not seen it, or declined: later calls like it may skip the above
    remember(_FAST, _kernel.variant(int(scores.shape[1]), k), (from_input(0), from_out(0)), (), scores, out,
             num_topk, outputs=(output(topk_idx.dtype, size_of(0, 0), k),))
    return topk_idx
