"""mhc.mhc_head_compute_mix / mhc_head_compute_mix_bwd: the mHC head's stream mix and its gradients.

TileKernels' ``mhc_head_compute_mix`` (KERNELS.md, "mHC"; the autograd op in TileKernels' modeling layer,
whose backward is ``mhc_head_compute_mix_bwd`` here). Kernels in kernels/mhc/mix_head_fwd.py.j2 and
mix_head_bwd.py.j2, one variant per mhc_mult of kernel_specs/mhc_mix.yaml; the token count is a runtime
size. The backward's scale and base gradients are partial rows per block of a persistent grid (sized
from the SM count), summed here in torch as TileKernels does.
"""

from __future__ import annotations

import torch

from .._args import real
from .._op import Plan, Result, empty, launch, op, out, result, size
from .._runtime import get_kernel
from ._mix import partial_sums, persistent_blocks

__all__ = ["mhc_head_compute_mix", "mhc_head_compute_mix_bwd"]

_fwd = get_kernel("mhc_head_compute_mix_fwd")
_bwd = get_kernel("mhc_head_compute_mix_bwd")

_BWD_THREADS = 128  # tokens per tile of the backward (kernels/mhc/mix_head_bwd.py.j2, Config.threads)
_BWD_BLOCKS_PER_SM = 4


def _mixes(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape (n0, n1, mhc_mult), got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name}: expected a 3-D tensor (n0, n1, mhc_mult), got shape {tuple(x.shape)}")
    return x


def flat(t: torch.Tensor) -> torch.Tensor:
    """The kernels' (n0 * n1, m) view of an (n0, n1, m) tensor."""
    return t.flatten(0, 1)


@op(outputs=("output_mix",), out=False)
def mhc_head_compute_mix(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                         mhc_pre_eps: float) -> Plan:
    """``sigmoid(input_mix * mhc_scale + mhc_base) + mhc_pre_eps``, rounded as torch's fp32 operations.

    Args:
        input_mix: float32 CUDA tensor (n0, n1, mhc_mult), contiguous.
        mhc_scale: float32 (1,). mhc_base: float32 (mhc_mult,). mhc_pre_eps: a float.

    Returns:
        float32 (n0, n1, mhc_mult).
    """
    x = _mixes("input_mix", input_mix)
    eps = real("mhc_pre_eps", mhc_pre_eps)
    return launch(_fwd.variant(int(x.shape[2])), flat(x), mhc_scale, mhc_base, out(0, view=flat), eps,
                  outputs=(empty(torch.float32, size(x, 0), size(x, 1), size(x, 2)),))


@op(outputs=("input_mix_grad", "mhc_scale_grad", "mhc_base_grad"), out=False)
def mhc_head_compute_mix_bwd(output_mix_grad: torch.Tensor, input_mix: torch.Tensor, mhc_scale: torch.Tensor,
                             mhc_base: torch.Tensor) -> Plan | Result:
    """The gradients of ``mhc_head_compute_mix`` by input_mix, mhc_scale and mhc_base.

    Args:
        output_mix_grad: float32 (n0, n1, mhc_mult), contiguous: the output's gradient.
        input_mix, mhc_scale, mhc_base: the forward's tensors.

    Returns:
        ``(input_mix_grad, mhc_scale_grad, mhc_base_grad)``: float32 like input_mix, (1,) and (mhc_mult,);
        the last two sums over tokens (partial sums per block of a grid sized from the SM count, then over
        the blocks).
    """
    x = _mixes("input_mix", input_mix)
    g = _mixes("output_mix_grad", output_mix_grad)
    if g.shape != x.shape:
        raise ValueError(f"output_mix_grad: expected the shape of input_mix {tuple(x.shape)}, got {tuple(g.shape)}")
    m = int(x.shape[2])
    if x.numel() == 0:  # no tokens: zero sums, nothing to launch
        return result((torch.zeros_like(x), torch.zeros_like(mhc_scale), torch.zeros_like(mhc_base)))
    blocks = persistent_blocks(int(x.shape[0]) * int(x.shape[1]), _BWD_THREADS, _BWD_BLOCKS_PER_SM, x.get_device())
    return launch(_bwd.variant(m), flat(g), flat(x), mhc_scale, mhc_base, out(0, view=flat), out(1), out(2),
                  outputs=(empty(torch.float32, size(x, 0), size(x, 1), size(x, 2)),
                           empty(torch.float32, blocks, 1), empty(torch.float32, blocks, m)),
                  then=partial_sums)
