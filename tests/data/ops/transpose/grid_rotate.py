"""Test op over the grid_rotate kernels (not shipped: they exist to test the loader)."""

import torch

from .._runtime import get_kernel, sm_count

_kernel = get_kernel("grid_rotate")

__all__ = ["grid_rotate", "sm_count"]


def grid_rotate(x: torch.Tensor, cluster: int = 1) -> torch.Tensor:
    """cluster 1: y[r] = 2 * x[(r + 1) % rows] through a grid barrier; cluster 2: y = 2 * x in clusters of 2."""
    launch = _kernel.select(cluster=cluster)
    tmp = torch.empty_like(x)
    y = torch.empty_like(x)
    launch(x, tmp, y)
    return y
