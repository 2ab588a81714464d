"""Checks and kernel views the mhc ops share (a private helper of the op family).

The views are module-level functions: ops pass them as ``out(i, view=...)``, which torch.compile keys by.
"""

from __future__ import annotations

import torch


def check_out(out: object, shape: tuple[int, ...]) -> None:
    """A ValueError naming ``out`` unless it is None or a contiguous tensor of ``shape`` (viewed flat then)."""
    if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != shape
                            or not out.is_contiguous()):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"out: expected a contiguous tensor of shape {shape}, got {got}")


def streams(t: torch.Tensor) -> torch.Tensor:
    """The kernels' (num_tokens, m, k) view of a (..., m, k) tensor (streams, comb, their gradients)."""
    return t.reshape(-1, t.shape[-2], t.shape[-1])


def mixes(t: torch.Tensor) -> torch.Tensor:
    """The kernels' (num_tokens, m) view of a (..., m, 1) mix."""
    return t.reshape(-1, t.shape[-2])


def tokens(t: torch.Tensor) -> torch.Tensor:
    """The kernels' (num_tokens, hidden) view of a (..., hidden) tensor."""
    return t.reshape(-1, t.shape[-1])
