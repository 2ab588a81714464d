"""mhc.sinkhorn_normalize and its backward over (..., mhc, mhc) fp32 matrices.

TileKernels 1.0.0 exposes ``sinkhorn_normalize(x, repeat=10, eps=1e-6)`` (an autograd function in
``tile_kernels.modeling.mhc.ops``) over its ``_mhc_sinkhorn_fwd`` / ``_mhc_sinkhorn_bwd`` kernels;
here ``sinkhorn_normalize`` is the forward kernel's op and ``sinkhorn_normalize_bwd`` the backward's,
which recomputes the forward from x (``modeling.mhc`` adds the autograd). num_tokens is a runtime size
and repeat / eps runtime scalars; kernel_specs/mhc.yaml builds mhc = 4. Leading dimensions are
flattened into tokens (exactly one leading dimension takes the dispatch fast path).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._args import not_built, positive_int, real
from .._op import Plan, Result, empty, launch, op, result, size
from .._op import out as output
from .._runtime import get_kernel
from ._shapes import check_out

__all__ = ["sinkhorn_normalize", "sinkhorn_normalize_bwd"]

_kernel = get_kernel("mhc_sinkhorn")
BUILT_MHC = (4,)  # kernel_specs/mhc.yaml's grid


def _matrices(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape (..., mhc, mhc), got {type(x).__name__}")
    if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{name}: expected a tensor of shape (..., mhc, mhc), got shape {tuple(x.shape)}")
    if int(x.shape[-1]) not in BUILT_MHC:
        raise not_built(name, f"mhc = {int(x.shape[-1])} (the matrices' side)", "mhc_sinkhorn")
    return x


def _plan(variant: Callable[..., None], inputs: list[torch.Tensor], repeat: int, eps: float) -> Plan:
    """The launch over (num_tokens, mhc, mhc) tensors."""
    x = inputs[-1]
    return launch(variant, *inputs, output(0), repeat, eps,
                  outputs=(empty(torch.float32, size(x, 0), size(x, 1), size(x, 2)),))


def _matrices3(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, *t.shape[-2:])


@op(outputs=("out",), inputs={"x": (1, 2)})
def sinkhorn_normalize(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6, *,
                       out: torch.Tensor | None = None) -> Plan | Result:
    """Sinkhorn-normalize each (mhc, mhc) matrix of x toward a doubly stochastic one.

    ``y = softmax(x, -1) + eps; y = y / (y.sum(-2) + eps)``, then ``repeat - 1`` times
    ``y = y / (y.sum(-1) + eps); y = y / (y.sum(-2) + eps)`` (TileKernels' sinkhorn_normalize_ref).

    Args:
        x: float32 CUDA tensor (..., mhc, mhc), contiguous; mhc = 4 is built.
        repeat: the number of row / column rounds (a positive int).
        eps: added to every softmax output and every sum.
        out: the float32 tensor of x's shape to write into instead (contiguous, not overlapping x).

    Returns:
        float32, x's shape.
    """
    x = _matrices("x", x)
    repeat, eps = positive_int("repeat", repeat), real("eps", eps)
    if x.dim() == 3:
        return _plan(_kernel.variant("fwd", int(x.shape[-1])), [x], repeat, eps)
    # Other leading dimensions: the same op over the flattened matrices, viewed back.
    check_out(out, tuple(x.shape))
    flat = sinkhorn_normalize(_matrices3(x), repeat, eps, out=None if out is None else _matrices3(out))
    return result(out if out is not None else flat.view(x.shape))


@op(outputs=("grad_input",), inputs={"grad_output": (1, 2), "x": (1, 2)})
def sinkhorn_normalize_bwd(grad_output: torch.Tensor, x: torch.Tensor, repeat: int = 10,
                           eps: float = 1e-6, *, out: torch.Tensor | None = None) -> Plan | Result:
    """The backward of sinkhorn_normalize: the gradient with respect to x given grad_output.

    Args:
        grad_output: float32 CUDA tensor (..., mhc, mhc), contiguous: the gradient of the output.
        x: float32 (..., mhc, mhc) of the same shape, contiguous: the forward's input.
        repeat, eps: the forward's.
        out: the float32 tensor of x's shape to write into instead.

    Returns:
        float32, x's shape.
    """
    grad_output = _matrices("grad_output", grad_output)
    x = _matrices("x", x)
    if grad_output.shape != x.shape:
        raise ValueError(f"grad_output: expected x's shape {tuple(x.shape)}, got {tuple(grad_output.shape)}")
    repeat, eps = positive_int("repeat", repeat), real("eps", eps)
    if x.dim() == 3:
        return _plan(_kernel.variant("bwd", int(x.shape[-1])), [grad_output, x], repeat, eps)
    check_out(out, tuple(x.shape))
    flat = sinkhorn_normalize_bwd(_matrices3(grad_output), _matrices3(x), repeat, eps,
                                  out=None if out is None else _matrices3(out))
    return result(out if out is not None else flat.view(x.shape))
