"""Plain-torch references for mHC's multi-layer recompute (KERNELS.md, "mHC"): TileKernels 1.0.0's test
reference (tests/mhc/test_multilayer_recompute.py: the layers' pre_apply_mix and post chained), here over
TileKernels' torch forms (tile_kernels/torch/mhc.py), and the same chain over the kernels' formulas (each
product and sum rounded to fp32 as kernels/mhc/mix_apply_fwd.py.j2 and post_fwd.py.j2 round them), which
the recompute kernel matches bit for bit."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tests.reference.mhc_mix import pre_apply_mix_ref
from tests.reference.mhc_post import post_fwd_formula, post_ref


def pre_apply_mix_formula(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """mix_apply_fwd.py.j2's arithmetic: bf16(((x0 * mix0 + x1 * mix1) + x2 * mix2) + ...), products in fp32."""
    r = x.float()
    acc = r[..., 0, :] * mix[..., 0, :]
    for k in range(1, r.shape[-2]):
        acc = acc + r[..., k, :] * mix[..., k, :]
    return acc.bfloat16()


def _chain(apply: Callable[..., torch.Tensor], post: Callable[..., torch.Tensor], initial_residual: torch.Tensor,
           pre_mix_list: Sequence[torch.Tensor], layer_output_list: Sequence[torch.Tensor],
           post_mix_list: Sequence[torch.Tensor], comb_mix_list: Sequence[torch.Tensor]
           ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    layer_inputs: list[torch.Tensor] = []
    residuals: list[torch.Tensor] = []
    residual = initial_residual
    for i, pre in enumerate(pre_mix_list):
        layer_inputs.append(apply(residual, pre))
        if i < len(layer_output_list):
            residual = post(layer_output_list[i], residual, post_mix_list[i], comb_mix_list[i])
            residuals.append(residual)
    return layer_inputs, residuals


def multilayer_recompute_ref(initial_residual: torch.Tensor, pre_mix_list: Sequence[torch.Tensor],
                             layer_output_list: Sequence[torch.Tensor], post_mix_list: Sequence[torch.Tensor],
                             comb_mix_list: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """TileKernels' _mhc_multilayer_recompute_ref over its torch forms: (layer inputs, residuals)."""
    return _chain(pre_apply_mix_ref, post_ref, initial_residual, pre_mix_list, layer_output_list, post_mix_list,
                  comb_mix_list)


def multilayer_recompute_formula(initial_residual: torch.Tensor, pre_mix_list: Sequence[torch.Tensor],
                                 layer_output_list: Sequence[torch.Tensor], post_mix_list: Sequence[torch.Tensor],
                                 comb_mix_list: Sequence[torch.Tensor]
                                 ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The same chain over the kernels' formulas: what mhc_multilayer_recompute writes, bit for bit."""
    return _chain(pre_apply_mix_formula, post_fwd_formula, initial_residual, pre_mix_list, layer_output_list,
                  post_mix_list, comb_mix_list)
