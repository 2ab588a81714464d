"""Plain-torch references for the per-channel casts and the lossless FP4 -> FP8 re-cast.

KERNELS.md ("Shared quantization rules", "Quantization") and TileKernels' semantics:
- per-channel casts: one scale per channel and group of ``npt`` tokens; amax skips NaN inputs
  (the kernels' max is fmaxf, which drops a NaN operand, as TileKernels' T.max does); a NaN
  input gives the e4m3 NaN code 0x7F (the conversion's canonical NaN); an Inf input gives its
  group sf = Inf and the factor 0, so its own code is NaN (Inf * 0) and the group's others 0
  (``skip_nan_scales_from_amax``, shared with the SwiGLU casts); the gather of
  ``per_channel_cast_fused`` reads rows through ``pos_to_token``, an index outside
  [0, num_tokens) (-1 in practice) giving a zero row; an FP8 input pair is dequantized first,
  ``v = q.float() * sf`` in fp32.
- lossless: integer logic on the scale exponents, then an exact power-of-two multiply.
Everything runs on CPU or GPU tensors, and is bit-exact: the kernels' codes and scales must
equal these.
"""

from __future__ import annotations

import torch

from tests.reference.quant import AMAX_FLOOR, QMAX, _full, codes, fp4_decode, round_sf_up

FP8_IN_BLOCK = 128  # channels per scale of an FP8 (q, sf) input
FP4_IN_BLOCK = 32  # channels per scale of the lossless re-cast's FP4 input
LOSSLESS_OUT_BLOCKS: tuple[tuple[int, int], ...] = ((1, 128), (32, 32), (128, 128))
LOSSLESS_SHIFT = 6  # out exponent = max input exponent - 6


def gather_rows(
    x: torch.Tensor, pos_to_token: torch.Tensor | None = None, x_sf: torch.Tensor | None = None
) -> torch.Tensor:
    """The fp32 values the fused cast quantizes: (num_tokens_out, hidden).

    x: bf16 / fp32 (T, H), or float8_e4m3fn (T, H) with x_sf fp32 (T, H / 128) (v = x * sf).
    pos_to_token: int32 (num_tokens_out,); row i is v[pos_to_token[i]], or zeros when the index
    is outside [0, T).
    """
    v = x.float()
    if x_sf is not None:
        if x.dtype != torch.float8_e4m3fn:
            raise ValueError(f"a (q, sf) input has float8_e4m3fn data, got {x.dtype}")
        v = v * x_sf.float().repeat_interleave(FP8_IN_BLOCK, dim=1)
    if pos_to_token is None:
        return v
    pos = pos_to_token.long()
    valid = (pos >= 0) & (pos < x.shape[0])
    rows = v[pos.clamp(0, max(x.shape[0] - 1, 0))] if x.shape[0] > 0 else v.new_zeros((pos.shape[0], x.shape[1]))
    return torch.where(valid.unsqueeze(1), rows, torch.zeros_like(rows))


def skip_nan_scales_from_amax(amax: torch.Tensor, round_sf: bool,
                              amax_floor: float = AMAX_FLOOR["e4m3"]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf, factor) of an e4m3 group amax taken with NaN skipped (the per-channel and SwiGLU casts).

    a = max(amax, amax_floor) (1e-4 unless the op's sf_clamp_min replaces it), sf = a / 448 and factor = 448 / a,
    IEEE divisions: an Inf amax gives sf = Inf
    and factor 0. With round_sf, sf rounded up to a power of two and factor = 1 / sf, exact (0 for Inf).
    For finite amax these are tests/reference/quant.py's scales_from_amax; that one turns a
    non-finite amax into NaN, the per-token casts' rule.
    """
    a = torch.maximum(amax, _full(amax, amax_floor))
    sf = a / _full(a, QMAX["e4m3"])
    if round_sf:
        sf = round_sf_up(sf)
        return sf, _full(sf, 1.0) / sf
    return sf, _full(a, QMAX["e4m3"]) / a


def per_channel_scales(v: torch.Tensor, npt: int, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf, q_scale) of fp32 values v (T, H): shape (ceil(T / npt), H); missing rows count as zeros."""
    num_tokens, hidden = v.shape
    groups = -(-num_tokens // npt)
    magnitude = v.abs()
    magnitude = torch.where(torch.isnan(magnitude), torch.zeros_like(magnitude), magnitude)  # fmaxf drops NaN
    padded = magnitude.new_zeros((groups * npt, hidden))
    padded[:num_tokens] = magnitude
    amax = padded.reshape(groups, npt, hidden).amax(dim=1)
    return skip_nan_scales_from_amax(amax, round_sf)


def per_channel_cast_ref(
    x: torch.Tensor,
    round_sf: bool = False,
    npt: int = 128,
    pos_to_token: torch.Tensor | None = None,
    x_sf: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference per_channel_cast / per_channel_cast_fused: (q (T_out, H) e4m3, sf (ceil(T_out / npt), H) fp32)."""
    v = gather_rows(x, pos_to_token, x_sf)
    sf, q_scale = per_channel_scales(v, npt, round_sf)
    scaled = v * q_scale.repeat_interleave(npt, dim=0)[: v.shape[0]]
    return codes(scaled, "e4m3"), sf


def per_channel_cast_and_transpose_ref(x: torch.Tensor, npt: int, round_sf: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference per_channel_cast_and_transpose: (q (H, T) e4m3 contiguous, sf (T / npt, H) fp32)."""
    q, sf = per_channel_cast_ref(x, round_sf, npt)
    return q.T.contiguous(), sf


def per_channel_dequant(q: torch.Tensor, sf: torch.Tensor, npt: int = 128) -> torch.Tensor:
    """float32 (T, H) = q * sf[t // npt] (q (T, H) as per_channel_cast returns it)."""
    return q.float() * sf.repeat_interleave(npt, dim=0)[: q.shape[0]]


def _exponents(sf: torch.Tensor) -> torch.Tensor:
    """bits(sf) >> 23 as uint32 logic (the sign bit included), int64."""
    return (sf.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF) >> 23


def _float_of_bits(bits: torch.Tensor) -> torch.Tensor:
    """int64 holding uint32 bit patterns -> float32 (two's complement reinterpretation)."""
    bits = bits & 0xFFFFFFFF
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)


def per_block_cast_lossless_ref(
    x: torch.Tensor, x_sf: torch.Tensor, out_block: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference per_block_cast_lossless of (x int8 (T, H / 2) packed FP4, x_sf fp32 (T, H / 32)).

    Returns (q e4m3 (T, H), sf fp32 (ceil(T / bm), ceil(H / bk))); see the kernel template for the rule. The
    last block of a row is partial where bk does not divide H (its max over the input blocks there are).
    """
    if out_block not in LOSSLESS_OUT_BLOCKS:
        raise ValueError(f"out_block must be one of {LOSSLESS_OUT_BLOCKS}, got {out_block}")
    block_m, block_k = out_block
    num_tokens, hidden = x.shape[0], 2 * x.shape[1]
    if x_sf.shape != (num_tokens, hidden // FP4_IN_BLOCK):
        raise ValueError(f"x_sf must be (T, H / 32) = {(num_tokens, hidden // FP4_IN_BLOCK)}, got {tuple(x_sf.shape)}")
    e = _exponents(x_sf)  # (T, H / 32)
    per_k = block_k // FP4_IN_BLOCK  # input blocks per output block, along channels
    rows, cols = -(-num_tokens // block_m), -(-e.shape[1] // per_k)
    padded = e.new_zeros((rows * block_m, cols * per_k))  # absent rows and blocks: exponent 0, never the max
    padded[:num_tokens, :e.shape[1]] = e
    block_max = padded.reshape(rows, block_m, cols, per_k).amax(dim=(1, 3))
    out_e = torch.where(block_max >= LOSSLESS_SHIFT, block_max - LOSSLESS_SHIFT, torch.zeros_like(block_max))
    out_e_per_in = out_e.repeat_interleave(block_m, dim=0)[:num_tokens].repeat_interleave(per_k, dim=1)[:, :e.shape[1]]
    factor = _float_of_bits((e - out_e_per_in + 127) << 23)
    scaled = fp4_decode(x) * factor.repeat_interleave(FP4_IN_BLOCK, dim=1)
    return codes(scaled, "e4m3"), _float_of_bits(out_e << 23)


def lossless_dequant(q: torch.Tensor, sf: torch.Tensor, out_block: tuple[int, int]) -> torch.Tensor:
    """float32 (T, H) = q * sf broadcast over (block_m, block_k) blocks."""
    block_m, block_k = out_block
    scale = sf.repeat_interleave(block_m, dim=0)[: q.shape[0]].repeat_interleave(block_k, dim=1)[:, : q.shape[1]]
    return q.float() * scale


def fp4_dequant(x: torch.Tensor, x_sf: torch.Tensor) -> torch.Tensor:
    """float32 (T, H) = fp4(x) * x_sf over 1 x 32 blocks."""
    return fp4_decode(x) * x_sf.repeat_interleave(FP4_IN_BLOCK, dim=1)
