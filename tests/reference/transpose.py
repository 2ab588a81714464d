"""Plain-torch references of the transpose ops (module ``transpose``); CPU or GPU, any dtype."""

from __future__ import annotations

import torch


def batched_transpose_ref(x: torch.Tensor) -> torch.Tensor:
    """(B, M, N) -> (B, N, M), contiguous."""
    return x.transpose(-1, -2).contiguous()


def transpose_ref(x: torch.Tensor) -> torch.Tensor:
    """(M, N) -> (N, M), contiguous."""
    return x.transpose(-1, -2).contiguous()
