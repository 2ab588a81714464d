"""Host-side helpers of the quantization API (TileKernels' ``tile_kernels.quant.common``)."""

import torch

# FP4 E2M1 codes 0..15 (sign, two exponent bits with bias 1, one mantissa bit): code 8 is -0.0.
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode packed FP4 E2M1 codes, two per byte (low nibble first), to ``out_dtype``.

    ``x``: int8 or uint8 of shape (..., L), as the e2m1 casts return their data; the result has
    shape (..., 2 * L). Exact for every floating ``out_dtype``: each code is a small dyadic number.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"unpack_from_e2m1fn_x2: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"unpack_from_e2m1fn_x2: x must be int8 or uint8 (packed FP4 codes), got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("unpack_from_e2m1fn_x2: x must have at least one dimension (its last one doubles)")
    if not out_dtype.is_floating_point:
        raise TypeError(f"unpack_from_e2m1fn_x2: out_dtype must be a floating dtype, got {out_dtype}")
    codes = x.view(torch.uint8).to(torch.int64)
    table = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=x.device)
    pairs = torch.stack([table[codes & 0xF], table[codes >> 4]], dim=-1)
    return pairs.reshape(*x.shape[:-1], 2 * x.shape[-1]).to(out_dtype)


__all__ = ["unpack_from_e2m1fn_x2"]
