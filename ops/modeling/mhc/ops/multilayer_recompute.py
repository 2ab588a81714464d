"""modeling.mhc.ops.multilayer_recompute: TileKernels' ``mhc_multilayer_recompute``, re-exported as there.

TileKernels' modeling module exports the kernel module's function itself (no autograd: it runs inside a
backward pass, writing the caller's tensors); here that is the op ``mhc.mhc_multilayer_recompute``.
"""

from __future__ import annotations

from ....mhc import mhc_multilayer_recompute

__all__ = ["mhc_multilayer_recompute"]
