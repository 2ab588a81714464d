"""Plain-torch reference of the E5M6 per-token cast and cast back (KERNELS.md, "Quantization": E5M6).

E5M6 is the top 12 bits of an IEEE fp16: 1 sign, 5 exponent bits (bias 15), 6 mantissa bits;
largest finite value 0 11110 111111 = 65024. One scale per token (npc = H):
  amax = max(max |x|, 1e-4)      (NaN elements are ignored, as the kernel's fmaxf does)
  sf   = amax / 65024            IEEE division
  v    = x_f32 * (65024 / amax)  or, with round_sf, sf rounded up to a power of two
                                 (bits (b + 0x7FFFFF) & 0x7F800000) and v = x_f32 * 2^-e
  code = encode(v)

The encode, TileKernels' rule, and what it means. Round v toward zero to fp16 (h16), shift right
by 4 (h = the top 12 bits), then add 1 when (h & 1) + (bits(v) & 0x1FFFF) > 2^16:
- For |v| in the fp16 normal range [2^-14, 65504], fp16 keeps 10 of fp32's 23 mantissa bits and
  E5M6 keeps 6, so the 17 low fp32 bits are exactly the bits dropped: with r = those bits, the
  rule adds 1 when r > 2^16 (above the half-way point) or r == 2^16 and h is odd (a tie, to
  even). That is round-to-nearest-even of v to 6 mantissa bits; a carry out of the mantissa
  moves into the exponent (e.g. 1.9921875 -> 2.0), which the 12-bit addition does by itself.
- Below 2^-14 (fp16 subnormals and values that truncate to 0) the low 17 fp32 bits are not the
  dropped bits; the rule is applied anyway (a quirk kept for bit-exactness with TileKernels):
  the truncated code gets +1 when the low 17 bits of v's pattern exceed 2^16 - lsb.
- Finite |v| > 65504 truncate to the fp16 maximum 65504 (0x7BF after the shift; the rule may
  then carry it to 0x7C0 = inf). Unreachable from the cast, where |v| <= 65024 (1 + 2^-22).
- inf -> sign | 0x7C0 (never rounded: its low bits are 0). NaN -> 0x7FF (an fp16 NaN, sign
  dropped as fp16 conversion does) and never rounded: this is where tkc departs from TileKernels,
  whose carry turns the canonical NaN 0x7FF into 0x800 (-0.0), silently.

Packing: eight codes h0..h7 into three uint32 words
  w0 = h0 << 20 | h1 << 8 | h2 >> 4
  w1 = h2 << 28 | h3 << 16 | h4 << 4 | h5 >> 8
  w2 = h5 << 24 | h6 << 12 | h7
(the 96-bit big-endian concatenation h0..h7 cut into words), each word stored little-endian:
q is uint8 (T, 1.5 H), byte 12 g + 4 k + b = bits 8 b .. 8 b + 7 of word k of group g.

Everything is integer logic on int64 copies of the fp32 patterns, written from the fields
(sign, exponent, mantissa) rather than the kernel's shifted-pattern formulation, so the two check
each other. Decoding: a code is the fp16 with bits code << 4, exactly.
"""

from __future__ import annotations

import torch

E5M6_MAX = 65024.0
AMAX_FLOOR = 1e-4
NAN_CODE = 0x7FF
INF_CODE = 0x7C0


def _bits(v: torch.Tensor) -> torch.Tensor:
    """The fp32 bit patterns of v as int64 in [0, 2^32)."""
    return v.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def fp16_rz_bits(v: torch.Tensor) -> torch.Tensor:
    """fp16 bit patterns (int64) of fp32 values rounded toward zero; NaN -> 0x7FFF."""
    bits = _bits(v)
    sign = (bits >> 31) << 15
    a = bits & 0x7FFFFFFF
    exponent = a >> 23
    mantissa = a & 0x7FFFFF
    normal = ((exponent - 112) << 10) | (mantissa >> 13)  # 2^-14 <= |v| < 65536
    # |v| < 2^-14: the subnormal field floor(|v| * 2^24) = (1.m as a 24-bit integer) >> (126 - E)
    shift = (126 - exponent).clamp(0, 63)
    subnormal = torch.where(exponent == 0, torch.zeros_like(a), (mantissa | 0x800000) >> shift)
    magnitude = torch.where(exponent >= 113, normal, subnormal)
    magnitude = torch.where(a > 0x477FE000, torch.full_like(a, 0x7BFF), magnitude)  # > 65504: max
    magnitude = torch.where(a == 0x7F800000, torch.full_like(a, 0x7C00), magnitude)
    return torch.where(a > 0x7F800000, torch.full_like(a, 0x7FFF), sign | magnitude)


def e5m6_encode(v: torch.Tensor) -> torch.Tensor:
    """12-bit E5M6 codes (int64) of fp32 values (see the module docstring for the rule)."""
    bits = _bits(v)
    code = fp16_rz_bits(v) >> 4
    round_up = ((code & 1) + (bits & 0x1FFFF)) > 0x10000
    finite = (bits & 0x7F800000) != 0x7F800000
    code = code + (round_up & finite).to(torch.int64)
    return torch.where((bits & 0x7FFFFFFF) > 0x7F800000, torch.full_like(code, NAN_CODE), code)


def e5m6_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of 12-bit codes: the fp16 with bits code << 4 (exact)."""
    half_bits = ((codes.to(torch.int64) & 0xFFF) << 4).to(torch.int32)
    return half_bits.to(torch.int16).view(torch.float16).float()


def e5m6_pack(codes: torch.Tensor) -> torch.Tensor:
    """uint8 (..., 1.5 H) of codes (..., H), H % 8 == 0: three little-endian words per 8 codes."""
    *lead, hidden = codes.shape
    if hidden % 8 != 0:
        raise ValueError(f"hidden ({hidden}) must be a multiple of 8")
    h = [c.to(torch.int64) & 0xFFF for c in codes.reshape(*lead, hidden // 8, 8).unbind(-1)]
    words = [
        (h[0] << 20) | (h[1] << 8) | (h[2] >> 4),
        ((h[2] << 28) | (h[3] << 16) | (h[4] << 4) | (h[5] >> 8)) & 0xFFFFFFFF,
        ((h[5] << 24) | (h[6] << 12) | h[7]) & 0xFFFFFFFF,
    ]
    byte_list = [(w >> (8 * b)) & 0xFF for w in words for b in range(4)]
    return torch.stack(byte_list, dim=-1).reshape(*lead, hidden // 8 * 12).to(torch.uint8)


def e5m6_unpack(q: torch.Tensor) -> torch.Tensor:
    """int64 codes (..., H) of packed uint8 (..., 1.5 H): the inverse of e5m6_pack."""
    *lead, width = q.shape
    if width % 12 != 0:
        raise ValueError(f"packed width ({width}) must be a multiple of 12")
    b = q.to(torch.int64).reshape(*lead, width // 12, 3, 4)
    w = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    w0, w1, w2 = w.unbind(-1)
    h = [w0 >> 20, w0 >> 8, (w0 << 4) | (w1 >> 28), w1 >> 16, w1 >> 4, (w1 << 8) | (w2 >> 24), w2 >> 12, w2]
    return (torch.stack(h, dim=-1) & 0xFFF).reshape(*lead, width // 12 * 8)


def scales(x: torch.Tensor, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf, q_scale), float32 (T, 1): sf dequantizes, x_f32 * q_scale quantizes."""
    magnitude = x.float().abs()
    magnitude = torch.where(torch.isnan(magnitude), torch.zeros_like(magnitude), magnitude)
    amax = magnitude.amax(dim=-1, keepdim=True)
    amax = torch.maximum(amax, torch.full_like(amax, AMAX_FLOOR))
    e5m6_max = torch.full_like(amax, E5M6_MAX)
    sf = amax / e5m6_max  # tensor / tensor: IEEE division on CPU and CUDA
    if not round_sf:
        return sf, e5m6_max / amax
    sf_bits = (_bits(sf) + 0x7FFFFF) & 0x7F800000
    # 1 / 2^e, as the kernel forms it: 0x7F000000 - bits (equal to 1 / sf for every finite amax);
    # an Inf amax gives sf = Inf and factor +0, as 65024 / Inf is without round_sf.
    q_scale_bits = 0x7F000000 - torch.clamp(sf_bits, max=0x7F000000)
    as_float = lambda b: b.to(torch.int32).view(torch.float32)  # noqa: E731
    return as_float(sf_bits), as_float(q_scale_bits)


def per_token_cast_e5m6_ref(
    x: torch.Tensor, round_sf: bool = False, use_tma_aligned_col_major_sf: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q uint8 (T, 1.5 H), sf float32 (T, 1)) of x bf16/fp32 (T, H).

    With use_tma_aligned_col_major_sf, sf has strides (1, align(T, 4)) (same values).
    """
    sf, q_scale = scales(x, round_sf)
    q = e5m6_pack(e5m6_encode(x.float() * q_scale))
    if use_tma_aligned_col_major_sf:
        padded = (x.shape[0] + 3) // 4 * 4
        storage = torch.zeros(1, padded, dtype=torch.float32, device=x.device)
        storage[0, : x.shape[0]] = sf[:, 0]
        sf = storage.as_strided((x.shape[0], 1), (1, padded))
    return q, sf


def cast_back_e5m6_ref(q: torch.Tensor, sf: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """out (T, H) = cast(decode(q) * sf): one fp32 multiply, then round to nearest even."""
    return (e5m6_decode(e5m6_unpack(q)) * sf.float().reshape(-1, 1)).to(out_dtype)
