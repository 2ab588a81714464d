"""Types of the quantization API (TileKernels' ``tile_kernels.quant.types``)."""

import torch

# A quantized tensor and its scale factors, as the casts return and the re-quantizing casts take them.
QuantTensor = tuple[torch.Tensor, torch.Tensor]

__all__ = ["QuantTensor"]
