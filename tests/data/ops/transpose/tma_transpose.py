"""Test op over the TMA transpose kernel (not shipped: it exists to test the loader)."""

import torch

from .._runtime import dtype_name, get_kernel

_kernel = get_kernel("tma_transpose")

__all__ = ["tma_transpose"]


def tma_transpose(x: torch.Tensor, scale: float = 1.0, tile: int = 64) -> torch.Tensor:
    """y[b] = scale * x[b].T for x (B, M, N)."""
    launch = _kernel.select(dtype=dtype_name(x.dtype), tile=tile)
    y = torch.empty(x.shape[0], x.shape[2], x.shape[1], dtype=x.dtype, device=x.device)
    launch(x, y, scale)
    return y
