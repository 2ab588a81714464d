"""Exact fp32 arithmetic the kernels use and torch has no operator for."""

from __future__ import annotations

import torch


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | float) -> torch.Tensor:
    """fp32 a * b + c rounded once (a fused multiply-add), from float64: the product is exact there, and the sum's
    float64 rounding can only mislead the final rounding when it lands exactly between two floats (then the sign of
    its exact error, by TwoSum, says which way the exact value lies)."""
    p = a.double() * b.double()
    c64 = c.double().expand_as(p) if isinstance(c, torch.Tensor) else torch.full_like(p, c)
    s = p + c64
    t = s - p
    err = (p - (s - t)) + (c64 - t)
    r = s.float()
    above = r.double() > s
    down = torch.where(above, torch.nextafter(r, torch.full_like(r, -torch.inf)), r)
    up = torch.where(above, r, torch.nextafter(r, torch.full_like(r, torch.inf)))
    tie = (down.double() + up.double()) / 2 == s
    return torch.where(tie & (err > 0), up, torch.where(tie & (err < 0), down, r))
