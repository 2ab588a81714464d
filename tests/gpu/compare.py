"""Bit-exact comparison of quantized outputs with a reference, shared by the cast tests."""

from __future__ import annotations

import torch


def assert_same_codes_and_scales(q: torch.Tensor, sf: torch.Tensor, ref_q: torch.Tensor,
                                 ref_sf: torch.Tensor) -> None:
    """Codes compared as bytes, fp32 scales as int32 bits; counts of differences in the message."""
    assert q.shape == ref_q.shape and q.dtype == ref_q.dtype and q.is_contiguous()
    assert sf.shape == ref_sf.shape and sf.dtype == torch.float32 and sf.is_contiguous()
    wrong_sf = int((sf.view(torch.int32) != ref_sf.view(torch.int32)).sum())
    assert wrong_sf == 0, f"{wrong_sf} of {sf.numel()} scale factors differ from the reference"
    wrong_q = int((q.view(torch.uint8) != ref_q.view(torch.uint8)).sum())
    assert wrong_q == 0, f"{wrong_q} of {q.numel()} code bytes differ from the reference"
