"""mhc.mhc_pre_split_mixes / mhc_pre_split_mixes_bwd: one mHC layer's pre, post and comb mixes, and their gradients.

TileKernels' ``mhc_pre_split_mixes`` (KERNELS.md, "mHC"; the autograd op in TileKernels' modeling layer,
whose backward is ``mhc_pre_split_mixes_bwd`` here). Kernels in kernels/mhc/mix_split_fwd.py.j2 and
mix_split_bwd.py.j2, one variant per mhc_mult of kernel_specs/mhc_mix.yaml; the token count is a runtime
size. The backward's scale and base gradients come out of the kernel as one partial row per block of its
persistent grid (sized from the device's SM count) and are summed here in torch, as TileKernels does.
"""

from __future__ import annotations

import torch

from .._args import positive_int, real
from .._op import Plan, Result, empty, launch, op, out, result, size
from .._runtime import get_kernel
from ._mix import partial_sums, persistent_blocks, rows, tokens

__all__ = ["mhc_pre_split_mixes", "mhc_pre_split_mixes_bwd"]

_fwd = get_kernel("mhc_pre_split_mixes_fwd")
_bwd = get_kernel("mhc_pre_split_mixes_bwd")


@op(outputs=("pre_layer_mix", "post_layer_mix", "comb_res_mix"), out=False)
def mhc_pre_split_mixes(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int,
                        mhc_post_mult_value: float, mhc_pre_eps: float) -> Plan:
    """Split raw mHC mixes into the layer's pre, post and comb mixes.

    With m = mhc_mult and lin = input_mixes * [scale[0]] * m ++ [scale[1]] * m ++ [scale[2]] * m^2 + mhc_base:
    pre = sigmoid(lin[..., :m]) + mhc_pre_eps, post = sigmoid(lin[..., m:2m]) * mhc_post_mult_value,
    comb = lin[..., 2m:] as (m, m). Each product and sum rounds as torch's fp32 operations do.

    Args:
        input_mixes: float32 CUDA tensor (n0, n1, 2m + m^2), contiguous.
        mhc_scale: float32 (3,). mhc_base: float32 (2m + m^2,). Both contiguous, on the same device.
        mhc_mult: m. mhc_post_mult_value, mhc_pre_eps: floats.

    Returns:
        ``(pre_layer_mix, post_layer_mix, comb_res_mix)``: float32 (n0, n1, m, 1), (n0, n1, m, 1),
        (n0, n1, m, m), contiguous.
    """
    m = positive_int("mhc_mult", mhc_mult)
    flat = tokens("input_mixes", input_mixes, 2 * m + m * m, "(n0, n1, 2 * mhc_mult + mhc_mult ** 2)")
    pmv, eps = real("mhc_post_mult_value", mhc_post_mult_value), real("mhc_pre_eps", mhc_pre_eps)
    mixes = (size(input_mixes, 0), size(input_mixes, 1))
    return launch(_fwd.variant(m), flat, mhc_scale, mhc_base, out(0, view=rows), out(1, view=rows),
                  out(2, view=rows), pmv, eps,
                  outputs=(empty(torch.float32, *mixes, m, 1), empty(torch.float32, *mixes, m, 1),
                           empty(torch.float32, *mixes, m, m)))


_BWD_THREADS = 128  # tokens per tile of the backward (kernels/mhc/mix_split_bwd.py.j2, Config.threads)
_BWD_BLOCKS_PER_SM = 4


@op(outputs=("input_mixes_grad", "mhc_scale_grad", "mhc_base_grad"), out=False)
def mhc_pre_split_mixes_bwd(pre_layer_mix_grad: torch.Tensor, post_layer_mix_grad: torch.Tensor,
                            comb_res_mix_grad: torch.Tensor, input_mixes: torch.Tensor, mhc_scale: torch.Tensor,
                            mhc_base: torch.Tensor, mhc_mult: int, mhc_post_mult_value: float) -> Plan | Result:
    """The gradients of ``mhc_pre_split_mixes`` by input_mixes, mhc_scale and mhc_base.

    Args:
        pre_layer_mix_grad, post_layer_mix_grad: float32 (n0, n1, m, 1), contiguous: the outputs' gradients.
        comb_res_mix_grad: float32 (n0, n1, m, m), contiguous.
        input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value: the forward's arguments.

    Returns:
        ``(input_mixes_grad, mhc_scale_grad, mhc_base_grad)``: float32 like input_mixes, (3,) and (2m + m^2,).
        The scale and base gradients are sums over tokens, in the kernel's order: partial sums per block of a
        grid sized from the SM count, then summed over the blocks.
    """
    m = positive_int("mhc_mult", mhc_mult)
    flat = tokens("input_mixes", input_mixes, 2 * m + m * m, "(n0, n1, 2 * mhc_mult + mhc_mult ** 2)")
    pmv = real("mhc_post_mult_value", mhc_post_mult_value)
    grads = []
    for name, g, shape in (("pre_layer_mix_grad", pre_layer_mix_grad, (m, 1)),
                           ("post_layer_mix_grad", post_layer_mix_grad, (m, 1)),
                           ("comb_res_mix_grad", comb_res_mix_grad, (m, m))):
        want = (*input_mixes.shape[:2], *shape)
        if not isinstance(g, torch.Tensor) or tuple(g.shape) != want:
            got = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            raise ValueError(f"{name}: expected shape {want} (n0, n1, {shape[0]}, {shape[1]}), got {got}")
        grads.append(rows(g))
    if flat.shape[0] == 0:  # no tokens: zero sums, nothing to launch
        return result((torch.zeros_like(input_mixes), torch.zeros_like(mhc_scale), torch.zeros_like(mhc_base)))
    blocks = persistent_blocks(int(flat.shape[0]), _BWD_THREADS, _BWD_BLOCKS_PER_SM, flat.get_device())
    return launch(_bwd.variant(m), *grads, flat, mhc_scale, mhc_base, out(0, view=rows_of_mixes), out(1), out(2),
                  pmv,
                  outputs=(empty(torch.float32, size(input_mixes, 0), size(input_mixes, 1), size(input_mixes, 2)),
                           empty(torch.float32, blocks, 3), empty(torch.float32, blocks, 2 * m + m * m)),
                  then=partial_sums)


def rows_of_mixes(t: torch.Tensor) -> torch.Tensor:
    """The kernel's (n0 * n1, 2m + m^2) view of input_mixes_grad."""
    return t.flatten(0, 1)
