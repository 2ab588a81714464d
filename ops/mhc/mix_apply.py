"""mhc.mhc_pre_apply_mix / mhc_pre_apply_mix_bwd: the mHC layer input (the streams mixed by pre), and its gradients.

TileKernels' ``mhc_pre_apply_mix`` (KERNELS.md, "mHC"; the autograd op in TileKernels' modeling layer,
whose backward is ``mhc_pre_apply_mix_bwd`` here). Kernels in kernels/mhc/mix_apply_fwd.py.j2 and
mix_apply_bwd.py.j2; the token count and hidden are runtime sizes, with a 16-byte-vector variant for
hidden % 8 == 0 and one for any other hidden (kernel_specs/mhc_mix.yaml).
"""

from __future__ import annotations

import torch

from .._op import Plan, empty, launch, op, out, size
from .._runtime import get_kernel
from ._shapes import mixes, streams, tokens

__all__ = ["mhc_pre_apply_mix", "mhc_pre_apply_mix_bwd"]

_fwd = get_kernel("mhc_pre_apply_mix_fwd")
_bwd = get_kernel("mhc_pre_apply_mix_bwd")


def _streams(x: object, mix: object) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., m, hidden) and mix (..., m, 1) checked against each other, or a TypeError / ValueError."""
    for name, t in (("x", x), ("mix", mix)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    assert isinstance(x, torch.Tensor) and isinstance(mix, torch.Tensor)
    if x.dim() < 2:
        raise ValueError(f"x: expected a tensor (..., mhc_mult, hidden), got shape {tuple(x.shape)}")
    want = (*x.shape[:-1], 1)
    if tuple(mix.shape) != want:
        raise ValueError(f"mix: expected shape {want} (..., mhc_mult, 1) for x of shape {tuple(x.shape)}, "
                         f"got {tuple(mix.shape)}")
    return x, mix





def _variant(x: torch.Tensor) -> tuple[int, int]:
    return int(x.shape[-2]), 8 if int(x.shape[-1]) % 8 == 0 else 1


@op(outputs=("out",))
def mhc_pre_apply_mix(x: torch.Tensor, mix: torch.Tensor) -> Plan:
    """The layer input ``(x * mix).sum(-2)`` in bf16.

    Each product rounds to fp32, the m products are added in stream order, the sum rounds once to bf16.

    Args:
        x: bfloat16 CUDA tensor (..., mhc_mult, hidden), contiguous.
        mix: float32 (..., mhc_mult, 1), contiguous.
        out: (keyword) the bfloat16 (..., hidden) tensor to write into instead (contiguous); returned as given.

    Returns:
        bfloat16 (..., hidden).
    """
    x, mix = _streams(x, mix)
    dims = [size(x, d) for d in range(x.dim() - 2)] + [size(x, x.dim() - 1)]
    return launch(_fwd.variant(*_variant(x)), streams(x), mixes(mix), out(0, view=tokens),
                  outputs=(empty(torch.bfloat16, *dims),))


@op(outputs=("x_grad", "mix_grad"), out=False)
def mhc_pre_apply_mix_bwd(o_grad: torch.Tensor, x: torch.Tensor, mix: torch.Tensor,
                          x_grad: torch.Tensor | None = None) -> Plan:
    """The gradients of ``mhc_pre_apply_mix`` by x and mix.

    Args:
        o_grad: bfloat16 (..., hidden), contiguous: the output's gradient.
        x, mix: the forward's inputs.
        x_grad: None, or a bfloat16 tensor like x holding the gradient of x accumulated so far (TileKernels'
            ``grad_from_mhc_post``), which the result adds to (a new tensor: x_grad is only read).

    Returns:
        ``(x_grad, mix_grad)``: bfloat16 like x, ``bf16(x_grad + o_grad * mix)`` (the product rounded to fp32
        first; without x_grad, torch's ``bf16(o_grad * mix)``), and float32 like mix, ``sum over hidden of
        o_grad * x`` in fp32.
    """
    x, mix = _streams(x, mix)
    if not isinstance(o_grad, torch.Tensor) or tuple(o_grad.shape) != (*x.shape[:-2], x.shape[-1]):
        got = tuple(o_grad.shape) if isinstance(o_grad, torch.Tensor) else type(o_grad).__name__
        raise ValueError(f"o_grad: expected shape {(*x.shape[:-2], x.shape[-1])} (..., hidden), got {got}")
    if x_grad is not None and (not isinstance(x_grad, torch.Tensor) or x_grad.shape != x.shape):
        got = tuple(x_grad.shape) if isinstance(x_grad, torch.Tensor) else type(x_grad).__name__
        raise ValueError(f"x_grad: expected None or the shape of x {tuple(x.shape)}, got {got}")
    accumulate = x_grad is not None
    acc = x_grad if x_grad is not None else x  # not read without accumulate: any tensor of x's layout
    return launch(_bwd.variant(*_variant(x)), tokens(o_grad), streams(x), mixes(mix), streams(acc),
                  out(0, view=streams), out(1, view=mixes), int(accumulate),
                  outputs=(empty(torch.bfloat16, *(size(x, d) for d in range(x.dim()))),
                           empty(torch.float32, *(size(mix, d) for d in range(mix.dim())))))
