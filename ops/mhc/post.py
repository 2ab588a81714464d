"""mhc.mhc_post_fwd / mhc_post_bwd: the layer output merged back into the m residual streams, and its gradients.

TileKernels' ``mhc_post`` (KERNELS.md, "mHC"): its kernels module (``tile_kernels.mhc.post_kernel``)
exports ``mhc_post_fwd`` and ``mhc_post_bwd``, whose names the ops here keep; the autograd op ``mhc_post``
is in ``modeling.mhc.ops``, which also adds TileKernels' ``fuse_grad_acc`` to the backward (a side effect
on residual's storage that an op cannot replay). Kernels in kernels/mhc/post_fwd.py.j2 and post_bwd.py.j2;
the token count and hidden are runtime sizes, with a 16-byte-vector variant for hidden % 8 == 0 and one for
any other hidden (kernel_specs/mhc_post.yaml). Leading dimensions (TileKernels' (n0, n1)) are flattened
into tokens through views.
"""

from __future__ import annotations

import torch

from .._op import Empty, Plan, empty, launch, op, out, size
from .._runtime import get_kernel
from ._shapes import mixes, streams, tokens

__all__ = ["mhc_post_bwd", "mhc_post_fwd"]

_fwd = get_kernel("mhc_post_fwd")
_bwd = get_kernel("mhc_post_bwd")


def _inputs(x: object, residual: object, post_layer_mix: object, comb_res_mix: object
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (..., hidden), residual (..., m, hidden), post (..., m, 1) and comb (..., m, m) checked against each
    other, or a TypeError / ValueError naming the argument."""
    named = (("x", x), ("residual", residual), ("post_layer_mix", post_layer_mix), ("comb_res_mix", comb_res_mix))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    assert isinstance(x, torch.Tensor) and isinstance(residual, torch.Tensor)
    assert isinstance(post_layer_mix, torch.Tensor) and isinstance(comb_res_mix, torch.Tensor)
    if residual.dim() < 2:
        raise ValueError(f"residual: expected a tensor (..., mhc_mult, hidden), got shape {tuple(residual.shape)}")
    *lead, m, h = residual.shape
    for name, t, want in (("x", x, (*lead, h)), ("post_layer_mix", post_layer_mix, (*lead, m, 1)),
                          ("comb_res_mix", comb_res_mix, (*lead, m, m))):
        if tuple(t.shape) != tuple(want):
            raise ValueError(f"{name}: expected shape {tuple(want)} for residual of shape {tuple(residual.shape)}, "
                             f"got {tuple(t.shape)}")
    return x, residual, post_layer_mix, comb_res_mix





def _variant(residual: torch.Tensor) -> tuple[int, int]:
    return int(residual.shape[-2]), 8 if int(residual.shape[-1]) % 8 == 0 else 1


def _like(t: torch.Tensor, dtype: torch.dtype) -> Empty:
    return empty(dtype, *(size(t, d) for d in range(t.dim())))


@op(outputs=("out",), positional_out=True)  # TileKernels' mhc_post_fwd takes out as its fifth argument
def mhc_post_fwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
                 comb_res_mix: torch.Tensor) -> Plan:
    """The streams after the layer: ``out[..., n, :] = post[..., n] * x + sum_k comb[..., k, n] * residual[..., k, :]``.

    In fp32 from the bf16 inputs (the post product rounded on its own, the comb products summed in stream
    order, then the two added), rounded once to bf16: TileKernels' ``mhc_post_ref``.

    Args:
        x: bfloat16 CUDA tensor (..., hidden), contiguous: the layer's output.
        residual: bfloat16 (..., mhc_mult, hidden), contiguous: the streams.
        post_layer_mix: float32 (..., mhc_mult, 1), contiguous.
        comb_res_mix: float32 (..., mhc_mult, mhc_mult), contiguous.
        out: the bfloat16 tensor like residual to write into instead (contiguous; positional too, as in
            TileKernels); returned as given.

    Returns:
        bfloat16 (..., mhc_mult, hidden).
    """
    x, residual, post, comb = _inputs(x, residual, post_layer_mix, comb_res_mix)
    return launch(_fwd.variant(*_variant(residual)), tokens(x), streams(residual), mixes(post), streams(comb),
                  out(0, view=streams), outputs=(_like(residual, torch.bfloat16),))


@op(outputs=("x_grad", "residual_grad", "post_layer_mix_grad", "comb_res_mix_grad"), out=False)
def mhc_post_bwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                 d_o: torch.Tensor) -> Plan:
    """The gradients of ``mhc_post_fwd`` by its four inputs (TileKernels' ``mhc_post_bwd`` without
    ``fuse_grad_acc``, which ``modeling.mhc.ops.mhc_post_bwd`` adds).

    Args:
        x, residual, post_layer_mix, comb_res_mix: the forward's inputs.
        d_o: bfloat16 (..., mhc_mult, hidden), contiguous: the output's gradient.

    Returns:
        ``(x_grad, residual_grad, post_layer_mix_grad, comb_res_mix_grad)``: bfloat16 like x,
        ``bf16(sum_n d_o[n] * post[n])``; bfloat16 like residual, ``bf16(sum_n comb[k, n] * d_o[n])``; float32
        like post, ``sum over hidden of d_o[n] * x``; float32 like comb, ``sum over hidden of residual[k] * d_o[n]``
        (all in fp32, the bf16 outputs rounded once).
    """
    x, residual, post, comb = _inputs(x, residual, post_layer_mix, comb_res_mix)
    if not isinstance(d_o, torch.Tensor) or d_o.shape != residual.shape:
        got = tuple(d_o.shape) if isinstance(d_o, torch.Tensor) else type(d_o).__name__
        raise ValueError(f"d_o: expected the shape of residual {tuple(residual.shape)}, got {got}")
    return launch(_bwd.variant(*_variant(residual)), streams(d_o), tokens(x), streams(residual), mixes(post),
                  streams(comb), out(0, view=tokens), out(1, view=streams), out(2, view=mixes), out(3, view=streams),
                  outputs=(_like(x, torch.bfloat16), _like(residual, torch.bfloat16),
                           _like(post, torch.float32), _like(comb, torch.float32)))
