"""Checks the mhc ops share (a private helper of the op family)."""

from __future__ import annotations

import torch


def check_out(out: object, shape: tuple[int, ...]) -> None:
    """A ValueError naming ``out`` unless it is None or a contiguous tensor of ``shape`` (viewed flat then)."""
    if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != shape
                            or not out.is_contiguous()):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"out: expected a contiguous tensor of shape {shape}, got {got}")
