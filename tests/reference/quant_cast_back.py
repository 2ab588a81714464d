"""Plain-torch reference of ``quant.per_token_cast_back`` (KERNELS.md, "Quantization": cast back).

out = cast(decode(q) * sf): decode is exact (e4m3 through torch's own fp8 -> fp32 cast, e2m1
through the value table of tests/reference/quant.py), the product is one fp32 multiply per
element and the cast to bf16 rounds to nearest even, so the kernel must match this bit for bit
on CPU and GPU alike.
"""

from __future__ import annotations

import torch

from tests.reference.quant import dequant, fp4_decode, per_token_cast_ref, ue8m0_unpack

# The input format follows from the codes' dtype, as in the op.
IN_FORMATS: dict[torch.dtype, str] = {torch.float8_e4m3fn: "e4m3", torch.int8: "e2m1"}
OUT_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp32": torch.float32}


def in_format(q: torch.Tensor) -> str:
    """'e4m3' for float8_e4m3fn codes, 'e2m1' for packed FP4 int8 codes."""
    try:
        return IN_FORMATS[q.dtype]
    except KeyError:
        raise TypeError(f"q must be float8_e4m3fn or int8 (packed e2m1), got {q.dtype}") from None


def out_dtype_of(fmt: str | torch.dtype) -> torch.dtype:
    """'bf16' | 'fp32' | torch.bfloat16 | torch.float32 -> the torch dtype."""
    if isinstance(fmt, torch.dtype) and fmt in OUT_DTYPES.values():
        return fmt
    if isinstance(fmt, str) and fmt in OUT_DTYPES:
        return OUT_DTYPES[fmt]
    raise ValueError(f"fmt must be 'bf16' or 'fp32' (or the torch dtype), got {fmt!r}")


def per_token_cast_back_ref(q: torch.Tensor, sf: torch.Tensor, fmt: str | torch.dtype, npc: int) -> torch.Tensor:
    """Reference cast back of (q, sf) to bf16 / fp32 (``fmt``): (T, H) = decode(q) * sf per npc group.

    q: float8_e4m3fn (T, H) or int8 (T, H / 2) packed FP4 (element 2i in the low nibble);
    sf: float32 (T, G) in any strides (row-major or column-major), or int32 UE8M0 words
    (T, ceil(G / 4)) whose byte g % 4 of word g / 4 decodes to the float with bits b << 23; G = ceil(H / npc),
    the last group partial where npc does not divide H (as per_token_cast writes it).
    """
    if q.dim() != 2 or sf.dim() != 2:
        raise ValueError(f"q and sf must be 2-D, got shapes {tuple(q.shape)} and {tuple(sf.shape)}")
    code_fmt = in_format(q)
    hidden = q.shape[1] * (2 if code_fmt == "e2m1" else 1)
    if sf.dtype not in (torch.float32, torch.int32):
        raise TypeError(f"sf must be float32 scales or int32 UE8M0 words, got {sf.dtype}")
    groups = -(-hidden // npc)
    width = (groups + 3) // 4 if sf.dtype == torch.int32 else groups
    if tuple(sf.shape) != (q.shape[0], width):
        raise ValueError(f"sf must have shape ({q.shape[0]}, {width}), got {tuple(sf.shape)}")
    return dequant(q, sf, code_fmt, npc).to(out_dtype_of(fmt))


def per_block_cast_back_ref(
    q: torch.Tensor, sf: torch.Tensor, fmt: str | torch.dtype, block: tuple[int, int]
) -> torch.Tensor:
    """Reference cast back with per-block scales: out[t, c] = decode(q)[t, c] * sf[t // bm, c // bk].

    q as in per_token_cast_back_ref; sf float32 (ceil(T / bm), ceil(H / bk)) in any strides.
    Written independently of the per-token path: the block index of every element, then one
    fp32 multiply and the cast.
    """
    bm, bk = block
    code_fmt = in_format(q)
    values = q.float() if code_fmt == "e4m3" else fp4_decode(q)
    num_tokens, hidden = values.shape
    if sf.dtype != torch.float32 or tuple(sf.shape) != (-(-num_tokens // bm), -(-hidden // bk)):
        raise ValueError(f"sf must be float32 of shape (ceil(T / {bm}), ceil(H / {bk})), got {sf.dtype} {tuple(sf.shape)}")
    rows = torch.arange(num_tokens, device=q.device) // bm
    cols = torch.arange(hidden, device=q.device) // bk
    return (values * sf[rows[:, None], cols[None, :]]).to(out_dtype_of(fmt))


def requant_ref(x: tuple[torch.Tensor, torch.Tensor], x_block_size: tuple[int, int], fmt: str, npc: int,
                round_sf: bool = False, sf_layout: str = "row_major") -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_cast of a quantized pair (KERNELS.md, "Re-quantization"): dequantize first, then cast.

    x = (q, sf) with sf per (bm, bk) = x_block_size block: float32 (ceil(T / bm), ceil(H / bk)) in any strides,
    or its UE8M0 int32 words (ceil(T / bm), ceil(ceil(H / bk) / 4)). The dequantized tensor is
    per_block_cast_back_ref's fp32 one (decode(q) * sf, one fp32 multiply per element), then cast by
    per_token_cast_ref: (q, sf) as it returns them for fmt, npc, round_sf and sf_layout.
    """
    q, sf = x
    hidden = q.shape[1] * (2 if in_format(q) == "e2m1" else 1)
    if sf.dtype == torch.int32:
        sf = ue8m0_unpack(sf, -(-hidden // x_block_size[1]))
    values = per_block_cast_back_ref(q, sf, torch.float32, x_block_size)
    return per_token_cast_ref(values, fmt, npc, round_sf, sf_layout)
