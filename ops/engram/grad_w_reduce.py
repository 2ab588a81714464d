"""engram.grad_w_reduce: the gate backward's per-block weight gradients summed into both RMSNorm weights'
gradients, in place (TileKernels' ``grad_w_reduce``).

num_partials (P, any P >= 0; the gate backward sizes it from the SM count), hc_mult and hidden are
runtime sizes; kernel_specs/engram.yaml builds a variant with 16-byte vectors (hidden % 4 == 0) and one
for any other hidden.
"""

from __future__ import annotations

import torch

from .._args import matrix
from .._op import Plan, launch, op
from .._runtime import get_kernel
from ..errors import KernelArgumentError

__all__ = ["grad_w_reduce"]

_kernel = get_kernel("engram_grad_w_reduce")
SLICES = 4  # the kernel's slices of the partials (kernels/engram/grad_w_reduce.py.j2, Config.slices)


@op(out=False, mutates=("grad_weight_hidden", "grad_weight_embed"))
def grad_w_reduce(grad_w_partial: torch.Tensor, weight_hidden: torch.Tensor, weight_embed: torch.Tensor,
                  grad_weight_hidden: torch.Tensor, grad_weight_embed: torch.Tensor) -> list[Plan]:
    """Reduce grad_w_partial over its first dimension and accumulate into the weight gradients, in place.

    With s = sum over p of grad_w_partial[p] (fp32):
    ``grad_weight_hidden += s * weight_embed.float()`` and ``grad_weight_embed += s * weight_hidden.float()``.
    Summation order: the P partials in 4 contiguous slices of ceil(P / 4) rows, each summed in row order from
    +0.0, the slice sums added in slice order; each product is rounded before the add (as torch rounds it).
    P = 0 adds nothing (no launch).

    Args:
        grad_w_partial: float32 CUDA tensor (P, hc_mult, hidden_size), contiguous.
        weight_hidden: bfloat16 (hc_mult, hidden_size), contiguous.
        weight_embed: bfloat16 (hc_mult, hidden_size), contiguous.
        grad_weight_hidden: float32 (hc_mult, hidden_size), contiguous; modified in place.
        grad_weight_embed: float32 (hc_mult, hidden_size), contiguous; modified in place. The two
            gradients may overlap neither each other nor any input.
    """
    if not isinstance(grad_w_partial, torch.Tensor):
        raise TypeError(f"grad_w_partial: expected a torch.Tensor, got {type(grad_w_partial).__name__}")
    if grad_w_partial.dim() != 3:
        raise ValueError("grad_w_partial: expected a 3-D tensor (num_partials, hc_mult, hidden_size), got shape "
                         f"{tuple(grad_w_partial.shape)}")
    weights = {"weight_hidden": weight_hidden, "weight_embed": weight_embed,
               "grad_weight_hidden": grad_weight_hidden, "grad_weight_embed": grad_weight_embed}
    for name, t in weights.items():
        matrix(name, t, "(hc_mult, hidden_size)")
    hidden = int(grad_w_partial.shape[2])
    if grad_w_partial.shape[0] == 0:
        # Nothing to add, so nothing to launch; the shapes are still checked (the launcher would have).
        for name, t in weights.items():
            if t.shape != grad_w_partial.shape[1:]:
                raise KernelArgumentError(f"{name}: expected shape {tuple(grad_w_partial.shape[1:])} "
                                          f"(hc_mult, hidden_size) of grad_w_partial, got {tuple(t.shape)}")
        return []
    # The launcher checks dtypes, devices, that all five agree on (hc_mult, hidden) and that the gradients
    # overlap nothing else.
    return [launch(_kernel.variant(4 if hidden % 4 == 0 else 1), grad_w_partial, weight_hidden, weight_embed,
                   grad_weight_hidden, grad_weight_embed)]
