"""Plain-torch references for the `quant` kernels (KERNELS.md, "Shared quantization rules").

Everything here runs on CPU or GPU tensors and is bit-exact: the kernels' FP8/FP4 codes and
scale factors must equal these. Two traps a "natural" torch reference falls into, avoided here:
- ``t / 448.0`` on CUDA multiplies by a rounded reciprocal when the divisor is a Python scalar,
  which is not IEEE division; every division below is tensor / tensor.
- The FP4 encode is done with integer logic on the fp32 bit pattern (round the significand to
  the e2m1 step, ties to even), not with the comparison chain the kernel uses, so the two
  implementations check each other.

Scale-factor layouts (KERNELS.md (a), (b), (c)), selected by ``sf_layout``:
- "row_major": float32 (T, G), G = ceil(H / npc), contiguous.
- "col_major" (``use_tma_aligned_col_major_sf``): the same values column-major with the token
  dimension padded to a multiple of 4: strides (1, align(T, 4)).
- "ue8m0" (``use_packed_ue8m0``, needs round_sf): int32 (T, ceil(G/4)) in the col_major layout;
  bits 8k..8k+7 of word w (byte k on a little-endian machine) hold the biased exponent
  (bits >> 23) of group 4w + k's rounded scale; bytes past the last group are 0.
The reference fills the padding of its column-major storage with zeros; the kernels leave it
unwritten, so comparisons look at the logical (T, ...) view only.

Non-finite inputs never pass silently: a group whose amax is NaN or Inf (it holds a NaN or an
Inf) gets sf = NaN (UE8M0 byte 0xFF) and codes 0x7F (the e4m3 NaN) or 0 (e2m1 has no NaN), so
it dequantizes to NaN. ``per_token_cast_ref`` also takes npc == H (one scale per row) and
strided rows (it reads x through its strides), and ``precomputed_sf_cast_ref`` is the
``per_token_cast_with_precomputed_sf`` form: q = cast(x_f32 * (1 / sf)).
"""

from __future__ import annotations

import torch

QMAX: dict[str, float] = {"e4m3": 448.0, "e2m1": 6.0}
# amax is clamped from below so that sf is never zero (and for e2m1 stays a normal float).
AMAX_FLOOR: dict[str, float] = {"e4m3": 1e-4, "e2m1": 6.0 * 2.0**-126}

SF_LAYOUTS: tuple[str, ...] = ("row_major", "col_major", "ue8m0")
E4M3_NAN_CODE = 0x7F  # the e4m3 NaN as the kernels' saturating conversion writes it (either sign of NaN)

# e2m1 code -> value; codes 8..15 are the negatives of 0..7 (8 is -0.0).
FP4_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _check_fmt(fmt: str) -> None:
    if fmt not in QMAX:
        raise ValueError(f"fmt must be one of {sorted(QMAX)}, got {fmt!r}")


def _full(like: torch.Tensor, value: float) -> torch.Tensor:
    return torch.full_like(like, value, dtype=torch.float32)


def round_sf_up(sf: torch.Tensor) -> torch.Tensor:
    """Round positive normal fp32 scales up to a power of two: a non-zero mantissa carries
    into the exponent, then the mantissa is cleared."""
    bits = sf.contiguous().view(torch.int32)
    return ((bits + 0x7FFFFF) & 0x7F800000).view(torch.float32)


def scales(x: torch.Tensor, fmt: str, npc: int, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf, q_scale) of shape (T, G = ceil(H / npc)): sf dequantizes, x_f32 * q_scale quantizes. Where npc
    does not divide H the last group holds the H % npc channels there are (as TileKernels')."""
    _check_fmt(fmt)
    groups = _groups(x.float(), npc)
    return scales_from_amax(groups.abs().amax(dim=-1), fmt, round_sf)


def _groups(values: torch.Tensor, npc: int) -> torch.Tensor:
    """(T, H) -> (T, G, npc), the last group padded with zeros (which change no amax: it is clamped from below)."""
    num_tokens, hidden = values.shape
    padded = torch.nn.functional.pad(values, (0, -hidden % npc))
    return padded.reshape(num_tokens, padded.shape[1] // npc, npc)


def scales_from_amax(amax: torch.Tensor, fmt: str, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf, q_scale) of a group amax: clamp it, sf = amax / qmax (IEEE), and the factor that quantizes.

    A NaN or Inf amax gives NaN for both (torch.maximum keeps NaN; Inf is set to NaN explicitly).
    """
    nonfinite = ~torch.isfinite(amax)
    amax = torch.maximum(amax, _full(amax, AMAX_FLOOR[fmt]))
    sf = amax / _full(amax, QMAX[fmt])
    if round_sf:
        sf = round_sf_up(torch.where(nonfinite, _full(sf, 1.0), sf))
        q_scale = _full(sf, 1.0) / sf
    else:
        q_scale = _full(amax, QMAX[fmt]) / amax
    nan = _full(sf, float("nan"))
    return torch.where(nonfinite, nan, sf), torch.where(nonfinite, nan, q_scale)


def fp4_encode(v: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (int32, 0..15) of fp32 values: round to nearest even, saturate at 6.

    Integer logic on the fp32 bits: with E the unbiased exponent and M the 24-bit significand,
    the e2m1 step is 2^(max(E, 0) - 1); n = M / step rounded to nearest even is the value in
    steps, and the code is n below 1.0 (subnormals 0, 0.5, 1.0) or 2E + n above it.
    """
    bits = v.float().contiguous().view(torch.int32).to(torch.int64)
    mag = bits & 0x7FFFFFFF
    exp = (mag >> 23) - 127
    sig = (mag & 0x7FFFFF) | 0x800000
    # Right shift from the significand to units of the step (>= 22); beyond 40 everything is 0.
    shift = (22 - torch.clamp(exp, max=0)).clamp(max=40)
    n = sig >> shift
    one = torch.ones_like(shift)
    rem = sig & ((one << shift) - 1)
    half = one << (shift - 1)
    n = n + ((rem > half) | ((rem == half) & ((n & 1) == 1))).to(torch.int64)
    code = torch.where(exp >= 0, 2 * exp + n, n).clamp(max=7)
    # The float's sign bit (KERNELS.md): -0.0 and negatives that round to zero give code 8, as TileKernels'.
    negative = bits < 0
    return (code | (negative.to(torch.int64) << 3)).to(torch.int32)


def fp4_pack(codes: torch.Tensor) -> torch.Tensor:
    """(..., 2K) codes -> (..., K) int8: element 2i in the low nibble, 2i + 1 in the high one."""
    if codes.shape[-1] % 2 != 0:
        raise ValueError(f"the last dimension ({codes.shape[-1]}) must be even to pack FP4 pairs")
    packed = (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)
    return packed.to(torch.uint8).view(torch.int8)


def fp4_unpack(q_packed: torch.Tensor) -> torch.Tensor:
    """(..., K) int8/uint8 -> (..., 2K) int32 codes (inverse of fp4_pack)."""
    if q_packed.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"q_packed must be int8 or uint8, got {q_packed.dtype}")
    u = q_packed.view(torch.uint8).to(torch.int32)
    return torch.stack([u & 0xF, u >> 4], dim=-1).reshape(*u.shape[:-1], 2 * u.shape[-1])


def fp4_decode(q_packed: torch.Tensor) -> torch.Tensor:
    """(..., K) packed FP4 -> (..., 2K) float32 values."""
    codes = fp4_unpack(q_packed).long()
    table = torch.tensor(FP4_VALUES, dtype=torch.float32, device=q_packed.device)
    table = torch.cat([table, -table])
    return table[codes]


def align(n: int, alignment: int) -> int:
    """n rounded up to a multiple of alignment."""
    return (n + alignment - 1) // alignment * alignment


def tma_aligned_col_major(t: torch.Tensor) -> torch.Tensor:
    """(T, C) -> the same values stored column-major with T padded to a multiple of 4.

    The result is a view of zero-filled storage (C, align(T, 4)): shape (T, C), strides
    (1, align(T, 4)); TileKernels' ``use_tma_aligned_col_major_sf`` layout.
    """
    if t.dim() != 2:
        raise ValueError(f"expected a 2-D (T, C) tensor, got shape {tuple(t.shape)}")
    num_tokens, cols = t.shape
    storage = t.new_zeros((cols, align(num_tokens, 4)))
    storage[:, :num_tokens] = t.T
    return storage.T[:num_tokens]


def ue8m0_pack(sf: torch.Tensor) -> torch.Tensor:
    """Power-of-two fp32 scales (T, G) -> int32 words (T, ceil(G/4)), contiguous.

    Bits 8k..8k+7 of word w hold the biased exponent (bits >> 23) of sf[:, 4w + k]; bytes past
    the last group are 0. Built with integer arithmetic (no byte reinterpretation), so it does
    not depend on the machine's byte order; the tests pin it against a little-endian view.
    """
    if sf.dtype != torch.float32 or sf.dim() != 2:
        raise ValueError(f"expected float32 (T, G) scales, got {sf.dtype} of shape {tuple(sf.shape)}")
    nan = torch.isnan(sf)
    bits = torch.where(nan, torch.full_like(sf, 2.0**127), sf).contiguous().view(torch.int32).to(torch.int64)
    if bool(((bits & 0x807FFFFF) != 0).any()) or bool((bits == 0).any()):
        raise ValueError("UE8M0 holds positive powers of two only: round the scales first (round_sf)")
    bits = torch.where(nan, torch.full_like(bits, 0xFF << 23), bits)  # NaN is the byte 0xFF
    num_tokens, groups = sf.shape
    words = align(groups, 4) // 4
    exponents = torch.zeros((num_tokens, words * 4), dtype=torch.int64, device=sf.device)
    exponents[:, :groups] = bits >> 23
    shifts = torch.arange(4, device=sf.device) * 8
    packed = (exponents.reshape(num_tokens, words, 4) << shifts).sum(dim=-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)  # as a two's complement int32
    return packed.to(torch.int32)


def ue8m0_unpack(words: torch.Tensor, groups: int) -> torch.Tensor:
    """int32 words (T, ceil(G/4)) -> float32 scales (T, G): byte b decodes to the float of bits b << 23.

    (The byte 0xFF, a NaN scale, decodes to +Inf, as the kernels decode it; any code times it
    is then Inf or NaN.)
    """
    if words.dtype != torch.int32:
        raise TypeError(f"UE8M0 words must be int32, got {words.dtype}")
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(4, device=words.device) * 8
    exponents = ((w.unsqueeze(-1) >> shifts) & 0xFF).reshape(words.shape[0], 4 * words.shape[1])[:, :groups]
    return (exponents << 23).to(torch.int32).view(torch.float32)


def per_token_cast_ref(
    x: torch.Tensor, fmt: str, npc: int, round_sf: bool = False, sf_layout: str = "row_major"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference per-token cast of x (T, H) bf16/fp32: (q, sf).

    q: float8_e4m3fn (T, H) for 'e4m3', int8 (T, H / 2) packed FP4 for 'e2m1';
    sf: float32 (T, ceil(H / npc)), row-major; with sf_layout "col_major" the same values in
    tma_aligned_col_major storage; with "ue8m0" (round_sf only) ue8m0_pack of them, also
    column-major.
    """
    _check_fmt(fmt)
    if sf_layout not in SF_LAYOUTS:
        raise ValueError(f"sf_layout must be one of {SF_LAYOUTS}, got {sf_layout!r}")
    if sf_layout == "ue8m0" and not round_sf:
        raise ValueError("sf_layout 'ue8m0' (use_packed_ue8m0) needs round_sf: UE8M0 holds powers of two")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (num_tokens, hidden), got shape {tuple(x.shape)}")
    sf, q_scale = scales(x, fmt, npc, round_sf)
    q = _encode(x, q_scale, fmt, npc)
    if sf_layout == "col_major":
        sf = tma_aligned_col_major(sf)
    elif sf_layout == "ue8m0":
        sf = tma_aligned_col_major(ue8m0_pack(sf))
    return q, sf


def _encode(x: torch.Tensor, q_scale: torch.Tensor, fmt: str, npc: int) -> torch.Tensor:
    """Codes of x_f32 * q_scale (per group of npc channels)."""
    num_tokens, hidden = x.shape
    scaled = _groups(x.float(), npc) * q_scale.unsqueeze(-1)
    return codes(scaled.reshape(num_tokens, scaled.shape[1] * npc)[:, :hidden], fmt)


def codes(scaled: torch.Tensor, fmt: str) -> torch.Tensor:
    """The codes every cast kernel writes for scaled fp32 values: e4m3 rounded to nearest even and
    saturated at +-448, NaN -> 0x7F; e2m1 packed two per byte, NaN -> 0 (FP4 has no NaN)."""
    nan = torch.isnan(scaled)
    if fmt == "e4m3":
        qmax = QMAX[fmt]
        q = torch.clamp(scaled, -qmax, qmax).to(torch.float8_e4m3fn)  # clamp keeps NaN
        # 0x7F whatever sign torch gave the NaN; out of place, as Inductor cannot write through a dtype view
        # (benchmarks/bench.py compiles these references as its torch.compile baselines)
        return torch.where(nan, E4M3_NAN_CODE, q.view(torch.uint8)).view(torch.float8_e4m3fn)
    return fp4_pack(torch.where(nan, 0, fp4_encode(scaled)))


def precomputed_sf_cast_ref(x: torch.Tensor, fmt: str, npc: int, sf: torch.Tensor) -> torch.Tensor:
    """Codes of x (T, H) cast with given fp32 scales sf (T, ceil(H / npc)), any strides: x_f32 * (1 / sf)."""
    _check_fmt(fmt)
    num_tokens, hidden = x.shape
    if tuple(sf.shape) != (num_tokens, -(-hidden // npc)) or sf.dtype != torch.float32:
        raise ValueError(f"sf must be float32 ({num_tokens}, ceil({hidden} / {npc})), got {sf.dtype} {tuple(sf.shape)}")
    return _encode(x, _full(sf, 1.0) / sf, fmt, npc)


def dequant(q: torch.Tensor, sf: torch.Tensor, fmt: str, npc: int) -> torch.Tensor:
    """float32 (T, H) = decode(q) * sf, each scale applied to its npc channels.

    sf: float32 (T, G = ceil(H / npc)) in either layout, or int32 UE8M0 words (T, ceil(G / 4)).
    """
    _check_fmt(fmt)
    values = q.float() if fmt == "e4m3" else fp4_decode(q)
    hidden = values.shape[-1]
    if sf.dtype == torch.int32:
        sf = ue8m0_unpack(sf, -(-hidden // npc))
    return values * sf.float().repeat_interleave(npc, dim=-1)[..., :hidden]


def cast_error(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - 2 sum(xy) / sum(x^2 + y^2), in float64: 0 for equal tensors, small for close ones."""
    x64, y64 = x.double(), y.double()
    denominator = (x64 * x64 + y64 * y64).sum()
    if denominator == 0:
        return 0.0
    return float(1 - 2 * (x64 * y64).sum() / denominator)
