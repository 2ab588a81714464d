"""Argument checks and layouts shared by the mHC mix ops (mix_split, mix_head, mix_apply)."""

from __future__ import annotations

import torch

from .._runtime import sm_count


def tokens(name: str, x: object, cols: int, shape: str) -> torch.Tensor:
    """``x`` (n0, n1, cols) as the kernels' (n0 * n1, cols) rows, or a TypeError / ValueError naming it."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {shape}, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[2] != cols:
        raise ValueError(f"{name}: expected a 3-D tensor {shape} = (n0, n1, {cols}), got shape {tuple(x.shape)}")
    return x.flatten(0, 1)


def rows(t: torch.Tensor) -> torch.Tensor:
    """The kernels' view of an output (n0, n1, a, b): (n0 * n1, a * b)."""
    return t.flatten(0, 1).flatten(1)


def persistent_blocks(num_tokens: int, tokens_per_block: int, blocks_per_sm: int, device: int) -> int:
    """Blocks of a backward's persistent grid (rows of its partial sums): at least 1, at most one per tile."""
    if device < 0:
        return 1  # a tensor elsewhere: the launcher refuses it by name
    tiles = -(-num_tokens // tokens_per_block)
    return max(1, min(tiles, sm_count(device) * blocks_per_sm))


def partial_sums(x_grad: torch.Tensor, scale_partial: torch.Tensor, base_partial: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward's result: the input gradient and the partial rows summed (TileKernels' ``.sum(0)``)."""
    return x_grad, scale_partial.sum(0), base_partial.sum(0)
