"""Plain-torch reference for ``quant.per_block_cast`` (KERNELS.md, "Shared quantization rules").

One scale per (block_m tokens x block_k channels) block of x (T, H); the last row of blocks
may be partial (T need not be a multiple of block_m), as may the last block of a row (H need not
be a multiple of block_k: G = ceil(H / block_k) blocks): absent rows and channels take no part in
the amax. Bit-exact, on CPU or GPU tensors: the amax floor, the IEEE tensor / tensor divisions,
the power-of-two round-up and the FP4 encode all come from tests/reference/quant.py. A block
holding a NaN or an Inf gets sf = NaN and NaN codes (e2m1: code 0 under the NaN scale), the
per-token casts' rule (torch's amax keeps NaN; scales_from_amax turns a non-finite amax into NaN).
"""

from __future__ import annotations

import torch

from tests.reference.quant import (
    _check_fmt,
    _full,
    codes,
    fp4_decode,
    scales_from_amax,
)


def _blocks(x: torch.Tensor, block_size: tuple[int, int]) -> tuple[int, int, int, int]:
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (num_tokens, hidden), got shape {tuple(x.shape)}")
    block_m, block_k = block_size
    num_tokens, hidden = x.shape
    return num_tokens, hidden, block_m, block_k


def block_scales(
    x: torch.Tensor, fmt: str, block_size: tuple[int, int], round_sf: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf, q_scale) of shape (ceil(T / block_m), ceil(H / block_k)): sf dequantizes, x_f32 * q_scale quantizes."""
    _check_fmt(fmt)
    num_tokens, hidden, block_m, block_k = _blocks(x, block_size)
    row_blocks, col_blocks = -(-num_tokens // block_m), -(-hidden // block_k)
    # Absent rows and channels of the last blocks are padded with zeros: |x| >= 0, so they never raise an amax.
    magnitudes = torch.nn.functional.pad(x.float().abs(),
                                         (0, col_blocks * block_k - hidden, 0, row_blocks * block_m - num_tokens))
    amax = magnitudes.reshape(row_blocks, block_m, col_blocks, block_k).amax(dim=(1, 3))
    return scales_from_amax(amax, fmt, round_sf)


def expand_blocks(s: torch.Tensor, num_tokens: int, block_size: tuple[int, int], hidden: int | None = None
                  ) -> torch.Tensor:
    """Per-block values (ceil(T / bm), ceil(H / bk)) -> per-element (T, H); H defaults to whole blocks."""
    block_m, block_k = block_size
    return s.repeat_interleave(block_m, dim=0)[:num_tokens].repeat_interleave(block_k, dim=1)[:, :hidden]


def per_block_cast_ref(
    x: torch.Tensor, fmt: str, block_size: tuple[int, int], round_sf: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference per-block cast of x (T, H) bf16/fp32: (q, sf).

    q: float8_e4m3fn (T, H) for 'e4m3', int8 (T, H / 2) packed FP4 for 'e2m1';
    sf: float32 (ceil(T / block_m), ceil(H / block_k)), row-major.
    """
    sf, q_scale = block_scales(x, fmt, block_size, round_sf)
    return codes(x.float() * expand_blocks(q_scale, x.shape[0], block_size, x.shape[1]), fmt), sf


def per_block_cast_with_precomputed_sf_ref(
    x: torch.Tensor, fmt: str, block_size: tuple[int, int], sf: torch.Tensor
) -> torch.Tensor:
    """Reference cast of x (T, H) with given per-block scales: q = x_f32 * (1 / sf), 1 / sf an IEEE division."""
    _check_fmt(fmt)
    num_tokens, hidden, block_m, block_k = _blocks(x, block_size)
    expected = (-(-num_tokens // block_m), -(-hidden // block_k))
    if tuple(sf.shape) != expected:
        raise ValueError(f"sf must have shape {expected}, got {tuple(sf.shape)}")
    sf = sf.float()
    return codes(x.float() * expand_blocks(_full(sf, 1.0) / sf, num_tokens, block_size, hidden), fmt)


def per_block_dequant(q: torch.Tensor, sf: torch.Tensor, fmt: str, block_size: tuple[int, int]) -> torch.Tensor:
    """float32 (T, H) = decode(q) * sf, each scale applied to its block."""
    _check_fmt(fmt)
    values = q.float() if fmt == "e4m3" else fp4_decode(q)
    return values * expand_blocks(sf.float(), values.shape[0], block_size, values.shape[1])
