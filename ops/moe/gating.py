"""moe.topk_gating: the product announcement's one-line MoE gate, over topk_gate and normalize_weight.

A thin convenience, not a kernel of its own: softmax scores in torch (fp32), the expert ids
from the prebuilt ``topk_gate`` kernel, the selected scores gathered in torch and, by default,
renormalized to sum to one by the prebuilt ``normalize_weight`` kernel (the Mixtral-style
softmax -> top-k -> renormalize gate). The weights carry autograd back to the logits: softmax
and gather through torch, normalize_weight through ``NormalizeWeight`` (a torch backward,
since the kernel has none). The ids are integers: no gradient.

Built sizes are those of topk_gate and normalize_weight (kernel_specs/moe_gate.yaml: E in
{16, 64, 72, 256} or any other multiple of 4 up to 256 through topk_gate's variant for any E,
k in {1, 2, 6, 8}); other sizes raise VariantNotFoundError naming the argument and the built
values.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from .._args import positive_int
from .._runtime import get_kernel
from ..errors import VariantNotFoundError
from ._normalize_weight import normalize_weight
from ._topk_gate import ANY_E_MULTIPLE, topk_gate, variant_for

__all__ = ["NormalizeWeight", "topk_gating"]

_topk_kernel = get_kernel("topk_gate")
_normalize_kernel = get_kernel("normalize_weight")
_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class NormalizeWeight(torch.autograd.Function):
    """normalize_weight's normalized weights (float32 (T, K)) with a backward.

    n = w / d with d = 1e-20 + sum_k w[k], so dn_j / dw_i = (delta_ij - n_j) / d and the
    gradient of w is (g - sum_j g_j * n_j) / d, row by row.
    """

    @staticmethod
    def forward(ctx: Any, topk_weights: torch.Tensor) -> torch.Tensor:
        denominator, normalized = normalize_weight(topk_weights)
        ctx.save_for_backward(denominator, normalized)
        return normalized  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        denominator, normalized = ctx.saved_tensors
        grad = grad.float()
        return (grad - (grad * normalized).sum(-1, keepdim=True)) / denominator[:, None]


def _built(kernel: Any, position: int) -> str:
    """The values of grid key ``position`` that kernel's variants were built for, for an error message."""
    return ", ".join(str(v) for v in sorted({key[position] for key in kernel.variants}))


def _topk_built_experts() -> str:
    """topk_gate's num_experts values, its variants for any E spelled out, for an error message."""
    named = [str(v) for v in sorted({key[0] for key in _topk_kernel.variants} - {0})]
    capacities = {key[2] for key in _topk_kernel.variants if key[0] == 0}
    if capacities:
        named.append(f"any multiple of {ANY_E_MULTIPLE} up to {max(capacities)}")
    return ", ".join(named)


def topk_gating(gate_logits: torch.Tensor, k: int, *, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick k experts per token from router logits: ``(expert_idx, expert_weights)``.

    ``topk_gating(gate_logits, k, *, normalize=True)``. Semantics, per token:
    scores = softmax(float32(gate_logits)) over the experts; expert_idx = the k largest scores'
    ids in descending score order, equal scores ranked by the lower id (moe.topk_gate);
    expert_weights = the scores of those ids, divided by (1e-20 + their sum) when normalize
    (moe.normalize_weight: each token's weights sum to one, so moe_routing with identity
    experts gives back the input), else the softmax probabilities themselves.

    Args:
        gate_logits: CUDA tensor (num_tokens, num_experts) or (batch, seq, num_experts),
            float32, bfloat16 or float16, any strides; num_experts a built value (in the default
            specs 16, 64, 72, 256, or any other multiple of 4 up to 256).
        k: experts per token, 1 <= k <= num_experts; a built value (1, 2, 6, 8).
        normalize: renormalize the k selected scores to sum to one (default), or keep them as
            softmax probabilities over all experts.

    Returns:
        ``(expert_idx, expert_weights)``, both of shape gate_logits.shape[:-1] + (k,) and
        contiguous: expert_idx int64 (what get_fused_mapping and moe_routing take),
        expert_weights float32 (what reduce_fused takes). expert_weights is differentiable
        with respect to gate_logits; expert_idx is not.
    """
    if not isinstance(gate_logits, torch.Tensor):
        raise TypeError(f"gate_logits: expected a torch.Tensor (num_tokens, num_experts) or (batch, seq, "
                        f"num_experts), got {type(gate_logits).__name__}")
    if gate_logits.dim() not in (2, 3):
        raise ValueError(f"gate_logits: expected a 2-D (num_tokens, num_experts) or 3-D (batch, seq, num_experts) "
                         f"tensor, got shape {tuple(gate_logits.shape)}")
    if gate_logits.dtype not in _LOGIT_DTYPES:
        raise TypeError(f"gate_logits: expected a float32, bfloat16 or float16 tensor, got {gate_logits.dtype}")
    num_topk = positive_int("k", k)
    num_experts = operator.index(gate_logits.shape[-1])
    if num_topk > num_experts:
        raise ValueError(f"k: expected at most num_experts ({num_experts}, gate_logits' last dimension), "
                         f"got {num_topk}")
    if variant_for(_topk_kernel, num_experts, num_topk) is None:
        raise VariantNotFoundError(
            f"gate_logits: topk_gating is not built for num_experts={num_experts} with k={num_topk} (topk_gate is "
            f"built for num_experts {_topk_built_experts()} and num_topk {_built(_topk_kernel, 1)}); add them to "
            f"the grid of kernel topk_gate in {_topk_kernel.spec} and rebuild (tkc build)")
    if normalize and not _normalize_kernel.has(num_topk):
        raise VariantNotFoundError(
            f"k: normalize_weight is not built for num_topk={num_topk} (built: {_built(_normalize_kernel, 0)}); add "
            f"it to the grid of kernel normalize_weight in {_normalize_kernel.spec} and rebuild, or pass "
            "normalize=False")
    lead = tuple(gate_logits.shape[:-1])
    scores = torch.softmax(gate_logits.reshape(-1, num_experts).float(), dim=-1)  # contiguous fp32 (T, E)
    expert_idx = topk_gate(scores, num_topk)
    expert_weights = scores.gather(1, expert_idx)
    if normalize:
        expert_weights = NormalizeWeight.apply(expert_weights)
    return expert_idx.view(*lead, num_topk), expert_weights.view(*lead, num_topk)
