"""Poisoned memory for the GPU tests: outputs that start as garbage, so a kernel that skips an
element cannot pass by the luck of zero-filled fresh memory."""

from __future__ import annotations

import torch

POISON_BYTE = 0x7F  # an e4m3 NaN, an FP4 pair (7, 15) and a bf16/fp32 NaN pattern


def poison_allocator(nbytes: int = 1 << 30) -> None:
    """Leave nbytes of POISON_BYTE in the caching allocator's free blocks, which the next outputs reuse."""
    torch.cuda.synchronize()
    torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(POISON_BYTE)
