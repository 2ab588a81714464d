"""engram.fused_weight: the fp32 product of the gate's two RMSNorm weights (TileKernels' ``fused_weight``).

hc_mult and hidden are runtime sizes; kernel_specs/engram.yaml builds a variant with 16-byte stores
(hidden % 4 == 0) and one for any other hidden. Exact: a product of two bf16 values fits fp32's
mantissa, so the result is bit-identical to ``weight_hidden.float() * weight_embed.float()``.
"""

from __future__ import annotations

import torch

from .._args import matrix
from .._op import Plan, empty, launch, op, out, size
from .._runtime import get_kernel

__all__ = ["fused_weight"]

_kernel = get_kernel("engram_fused_weight")


# hidden is keyed (dimension 1): it picks the vector width, so a call is replayed only for its own hidden.
@op(outputs=("weight_fused",), inputs={"weight_hidden": (1,), "weight_embed": ()})
def fused_weight(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> Plan:
    """Compute weight_hidden * weight_embed in fp32.

    Args:
        weight_hidden: bfloat16 CUDA tensor (hc_mult, hidden_size), contiguous.
        weight_embed: bfloat16 (hc_mult, hidden_size), contiguous, on the same device.
        out: the float32 (hc_mult, hidden_size) tensor to write into instead (contiguous, overlapping
            neither weight); returned as given.

    Returns:
        float32 (hc_mult, hidden_size): ``weight_hidden.float() * weight_embed.float()``, exactly.
    """
    weight_hidden = matrix("weight_hidden", weight_hidden, "(hc_mult, hidden_size)")
    matrix("weight_embed", weight_embed, "(hc_mult, hidden_size)")
    vec = 4 if int(weight_hidden.shape[1]) % 4 == 0 else 1
    return launch(_kernel.variant(vec), weight_hidden, weight_embed, out(0),
                  outputs=(empty(torch.float32, size(weight_hidden, 0), size(weight_hidden, 1)),))
