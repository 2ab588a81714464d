"""CPU tests of the E5M6 reference (tests/reference/quant_e5m6.py).

The GPU tests compare the kernels bit for bit against this reference, so it is pinned here by
hand-computed codes (the maximum 65024, ties to even, the carry into the exponent, fp16
subnormals, signs, zeros, inf, NaN), by independent formulations (torch's fp16 cast for the
round-toward-zero step, the kernel's shifted-pattern formula for the whole encode, fp16 field
arithmetic for the decode) and by a round trip.
"""

from __future__ import annotations

import pytest
import torch

from tests.reference.quant import cast_error
from tests.reference.quant_e5m6 import (
    AMAX_FLOOR,
    E5M6_MAX,
    INF_CODE,
    NAN_CODE,
    cast_back_e5m6_ref,
    e5m6_decode,
    e5m6_encode,
    e5m6_pack,
    e5m6_unpack,
    fp16_rz_bits,
    per_token_cast_e5m6_ref,
    scales,
)


def codes(*values: float) -> list[int]:
    return e5m6_encode(torch.tensor(values, dtype=torch.float32)).tolist()


def from_bits(*patterns: int) -> torch.Tensor:
    return bits_to_float(torch.tensor(patterns, dtype=torch.int64))


def bits_to_float(patterns: torch.Tensor) -> torch.Tensor:
    """fp32 values of int64 bit patterns in [0, 2^32)."""
    return torch.where(patterns >= 1 << 31, patterns - (1 << 32), patterns).to(torch.int32).view(torch.float32)


# --- encode: hand-computed codes ------------------------------------------------------------


def test_maximum_and_signs() -> None:
    # 65024 = 1.111111b * 2^15: exponent 30, mantissa 63 -> 0 11110 111111
    assert codes(65024.0, -65024.0) == [0x7BF, 0xFBF]
    assert codes(1.0, -1.0, 2.0, 0.5) == [0x3C0, 0xBC0, 0x400, 0x380]


def test_zeros_keep_their_sign() -> None:
    assert codes(0.0, -0.0) == [0x000, 0x800]


def test_ties_round_to_even() -> None:
    step = 2.0**-6  # E5M6 spacing in [1, 2)
    # 1 + step/2: tie between codes 0x3C0 (even) and 0x3C1 -> 0x3C0
    # 1 + 3 step/2: tie between 0x3C1 (odd) and 0x3C2 -> 0x3C2
    assert codes(1 + step / 2, 1 + 3 * step / 2, -(1 + 3 * step / 2)) == [0x3C0, 0x3C2, 0xBC2]
    # just above / below the tie
    assert codes(1 + step / 2 + 2.0**-23, 1 + 3 * step / 2 - 2.0**-22) == [0x3C1, 0x3C1]


def test_round_up_carries_into_the_exponent() -> None:
    # 2 - 2^-8 lies above the midpoint between 1.984375 (0x3FF) and 2.0 (0x400)
    assert codes(2.0 - 2.0**-8, 2.0 - 2.0**-7 - 2.0**-9) == [0x400, 0x3FF]


def test_fp16_subnormals() -> None:
    # E5M6 subnormals are k * 2^-20 (fp16 bits k << 4); 2^-14 is the smallest normal
    assert codes(2.0**-14, 2.0**-20, 3 * 2.0**-20, -(2.0**-20)) == [0x040, 0x001, 0x003, 0x801]
    # 2^-15 + 2^-20 (fp16 subnormal 0x210 -> code 0x021)
    assert codes(2.0**-15 + 2.0**-20) == [0x021]
    # below the subnormal step: truncated to 0, and the low fp32 bits of these are 0
    assert codes(2.0**-21, 2.0**-24, 1e-30, -(2.0**-24)) == [0, 0, 0, 0x800]


def test_subnormal_rounding_uses_the_low_fp32_bits() -> None:
    """Below 2^-14 the rule reads bits that are not the dropped ones (TileKernels' quirk)."""
    v = from_bits(0x35800000 | 0x10001)  # 2^-20 * (1 + tiny): truncates to code 1, low bits > 2^16
    assert e5m6_encode(v).tolist() == [0x002]
    v = from_bits(0x35800000 | 0x0FFFF)
    assert e5m6_encode(v).tolist() == [0x001]


def test_inf_and_nan() -> None:
    assert codes(float("inf"), float("-inf")) == [INF_CODE, 0x800 | INF_CODE]
    nan_patterns = from_bits(0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF)
    assert e5m6_encode(nan_patterns).tolist() == [NAN_CODE] * 4
    assert torch.isnan(e5m6_decode(torch.tensor([NAN_CODE]))).all()


def test_beyond_the_fp16_range_truncates_to_65504_first() -> None:
    # 65504 rounds (low bits 0x1E000 > 2^16) past 65024 to inf; 70000 truncates to 65504 and its
    # own low bits are below 2^16, so it stays at the maximum. Unreachable from the cast.
    assert codes(65504.0, 70000.0, 65280.0, 65279.0) == [INF_CODE, 0x7BF, INF_CODE, 0x7BF]


# --- encode: independent formulations -------------------------------------------------------


def sample_patterns() -> torch.Tensor:
    """Every 2^16 high half with several low halves: all exponents, signs, specials, ties."""
    high = torch.arange(1 << 16, dtype=torch.int64) << 16
    lows = torch.tensor([0, 1, 0x7FFF, 0x8000, 0xFFFF, 0x5A5A, 0xDFFF, 0xE000, 0xE001, 0xFFFE], dtype=torch.int64)
    return (high[:, None] | lows[None, :]).reshape(-1)


def test_rz_matches_torch_fp16_rounding_stepped_toward_zero() -> None:
    v = bits_to_float(sample_patterns())
    finite = torch.isfinite(v) & (v.abs() <= 65504)
    v = v[finite]
    nearest = v.to(torch.float16)  # round to nearest even
    bits = nearest.view(torch.int16).to(torch.int64) & 0xFFFF
    too_big = nearest.float().abs() > v.abs()
    # one fp16 step toward zero: the magnitude's bit pattern minus 1 (0 stays 0)
    expected = torch.where(too_big, bits - 1, bits)
    assert torch.equal(fp16_rz_bits(v), expected)


def kernel_formula(v: torch.Tensor) -> torch.Tensor:
    """The kernel's encode (kernels/quant/per_token_cast_e5m6.py.j2) in torch: its common case
    e5m6_code_fast where is_common holds, the general e5m6_code elsewhere."""
    bits = v.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    a = bits & 0x7FFFFFFF
    common = ((a - 0x38800000) & 0xFFFFFFFF) <= 0x477FE000 - 0x38800000
    lsb = (a >> 17) & 1
    fast = ((bits >> 20) & 0x800) | ((((a + 0xFFFF + lsb) & 0xFFFFFFFF) >> 17) - 0x1C00)
    return torch.where(common, fast, kernel_general_formula(v))


def kernel_general_formula(v: torch.Tensor) -> torch.Tensor:
    """The kernel's general encode (e5m6_code) in torch."""
    bits = v.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    a = bits & 0x7FFFFFFF
    sign = (bits >> 20) & 0x800
    exponent = a >> 23
    normal = torch.clamp_max(((a >> 17) - 0x1C00) & 0xFFFFFFFF, 0x7BF)
    shift = torch.clamp_max(130 - torch.clamp_max(exponent, 130), 31)
    subnormal = ((a & 0x7FFFFF) | 0x800000) >> shift
    finite = torch.where(a >= 0x38800000, normal, subnormal)
    round_up = (((finite & 1) + (a & 0x1FFFF)) > 0x10000).to(torch.int64)
    magnitude = torch.where(a == 0x7F800000, torch.full_like(a, 0x7C0), finite + round_up)
    return torch.where(a > 0x7F800000, torch.full_like(a, 0x7FF), sign | magnitude)


def test_reference_matches_the_kernel_formulas() -> None:
    v = bits_to_float(sample_patterns())
    assert torch.equal(e5m6_encode(v), kernel_formula(v))
    assert torch.equal(e5m6_encode(v), kernel_general_formula(v))


def test_normal_range_is_round_to_nearest_even() -> None:
    """In the fp16 normal range, encode == round to nearest even onto the E5M6 grid."""
    v = torch.empty(50_000).uniform_(1, 2) * torch.pow(2.0, torch.randint(-14, 16, (50_000,)).float())
    v = torch.where(torch.rand(50_000) < 0.5, -v, v)
    v = v[v.abs() < 65024]
    c = e5m6_encode(v)
    decoded = e5m6_decode(c)
    error = (decoded.double() - v.double()).abs()
    # neighbours of the decoded value on the E5M6 grid: exponent of v's magnitude, 6 mantissa bits
    step = torch.pow(2.0, torch.floor(torch.log2(v.abs().double())) - 6)
    assert (error <= step / 2).all()
    at_tie = error == step / 2
    assert ((c[at_tie] & 1) == 0).all()


def test_decode_matches_fp16_fields() -> None:
    c = torch.arange(4096)
    sign = torch.where(c >= 0x800, -1.0, 1.0).double()
    exponent = (c >> 6) & 0x1F
    mantissa = (c & 0x3F).double()
    value = torch.where(
        exponent == 0, mantissa / 64 * 2.0**-14, (1 + mantissa / 64) * torch.pow(2.0, exponent.double() - 15)
    )
    value = torch.where(exponent == 31, torch.where(mantissa == 0, torch.inf, torch.nan), value) * sign
    decoded = e5m6_decode(c).double()
    assert torch.equal(torch.isnan(decoded), torch.isnan(value))
    ok = ~torch.isnan(value)
    assert torch.equal(decoded[ok], value[ok])
    assert torch.equal(torch.signbit(decoded[ok]), torch.signbit(value[ok]))
    # every finite code round-trips through encode
    finite = torch.isfinite(decoded)
    assert torch.equal(e5m6_encode(decoded[finite].float()), c[finite])


# --- packing --------------------------------------------------------------------------------


def test_packing_matches_the_word_formulas() -> None:
    h = [0xABC, 0x123, 0x456, 0x789, 0xDEF, 0x0F1, 0x2A3, 0xB4C]
    w0 = (h[0] << 20) | (h[1] << 8) | (h[2] >> 4)
    w1 = ((h[2] << 28) | (h[3] << 16) | (h[4] << 4) | (h[5] >> 8)) & 0xFFFFFFFF
    w2 = ((h[5] << 24) | (h[6] << 12) | h[7]) & 0xFFFFFFFF
    assert (w0, w1, w2) == (0xABC12345, 0x6789DEF0, 0xF12A3B4C)
    q = e5m6_pack(torch.tensor([h]))
    expected = [b for w in (w0, w1, w2) for b in w.to_bytes(4, "little")]
    assert q.dtype == torch.uint8 and q.tolist() == [expected]
    assert e5m6_unpack(q).tolist() == [h]


def test_pack_unpack_round_trip() -> None:
    c = torch.randint(0, 4096, (3, 64))
    q = e5m6_pack(c)
    assert q.shape == (3, 96)
    assert torch.equal(e5m6_unpack(q), c)
    with pytest.raises(ValueError, match="multiple of 8"):
        e5m6_pack(torch.zeros(1, 12, dtype=torch.int64))


# --- scales and the whole cast --------------------------------------------------------------


def test_scales_hand_computed() -> None:
    x = torch.tensor([[1.0, -130048.0, 3.0], [0.0, 0.0, 0.0], [1e-6, float("nan"), -2e-6]])
    sf, q_scale = scales(x, round_sf=False)
    one = torch.ones(1)
    assert sf[0, 0] == 2.0 and q_scale[0, 0] == 0.5  # amax 130048 = 2 * 65024
    floor = torch.tensor([AMAX_FLOOR], dtype=torch.float32)
    assert sf[1, 0] == (floor / (E5M6_MAX * one))[0]  # zero row: amax floored at 1e-4
    assert sf[2, 0] == sf[1, 0]  # NaN ignored, 2e-6 floored
    sf_r, q_scale_r = scales(x, round_sf=True)
    assert sf_r[0, 0] == 2.0 and q_scale_r[0, 0] == 0.5  # already a power of two
    assert sf_r[1, 0] == 2.0**-29 and q_scale_r[1, 0] == 2.0**29  # 1e-4 / 65024 = 1.54e-9 -> 2^-29


@pytest.mark.parametrize("round_sf", [False, True])
def test_inf_amax_gives_an_inf_scale_and_a_zero_factor(round_sf: bool) -> None:
    """65024 / Inf = +0, and round_sf's exponent negation is clamped to the same +0 (not -Inf)."""
    x = torch.tensor([[1.0, float("inf"), -3.0, 0.0, 2.0, 5.0, -1.0, 7.0]])
    sf, q_scale = scales(x, round_sf=round_sf)
    assert torch.isinf(sf).all() and sf[0, 0] > 0
    assert q_scale[0, 0] == 0.0 and not torch.signbit(q_scale[0, 0])
    q, _ = per_token_cast_e5m6_ref(x, round_sf=round_sf)
    assert e5m6_unpack(q).tolist() == [[0, 0x7FF, 0x800, 0, 0, 0, 0x800, 0]]  # +-0, NaN for Inf * 0


def test_cast_row_at_the_maximum() -> None:
    x = torch.tensor([[65024.0, -65024.0, 1.0, 0.0, -0.0, 32512.0, 2.0**-10, 5.0]])
    q, sf = per_token_cast_e5m6_ref(x)
    assert sf.tolist() == [[1.0]]
    assert e5m6_unpack(q).tolist() == [[0x7BF, 0xFBF, 0x3C0, 0, 0x800, 0x7BF - 0x40, 0x140, 0x450]]


def test_nan_input_is_a_nan_code() -> None:
    x = torch.randn(2, 16)
    x[0, 3] = float("nan")
    q, sf = per_token_cast_e5m6_ref(x)
    assert torch.isfinite(sf).all()
    out = cast_back_e5m6_ref(q, sf, torch.float32)
    assert torch.isnan(out[0, 3]) and torch.isnan(out).sum() == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("round_sf", [False, True])
def test_round_trip_error(dtype: torch.dtype, out_dtype: torch.dtype, round_sf: bool) -> None:
    magnitude = torch.pow(10.0, torch.empty(16, 1).uniform_(-3, 3))
    x = (torch.randn(16, 2048) * magnitude).to(dtype)
    q, sf = per_token_cast_e5m6_ref(x, round_sf=round_sf)
    assert q.shape == (16, 3072) and sf.shape == (16, 1)
    out = cast_back_e5m6_ref(q, sf, out_dtype)
    assert out.dtype == out_dtype
    assert cast_error(x.float(), out.float()) < 1e-4
    # each element within half an E5M6 step (2^-7 relative) plus the bf16 rounding of out
    tolerance = 2.0**-7 + (2.0**-8 if out_dtype == torch.bfloat16 else 0.0)
    assert ((out.float() - x.float()).abs() <= tolerance * x.float().abs() + sf * 2.0**-20).all()


def test_col_major_scales_have_tma_strides() -> None:
    x = torch.randn(5, 16)
    q, sf = per_token_cast_e5m6_ref(x, use_tma_aligned_col_major_sf=True)
    row_q, row_sf = per_token_cast_e5m6_ref(x)
    assert sf.stride() == (1, 8) and torch.equal(sf, row_sf) and torch.equal(q, row_q)


def test_empty_input() -> None:
    q, sf = per_token_cast_e5m6_ref(torch.empty(0, 2048))
    assert q.shape == (0, 3072) and sf.shape == (0, 1)
    assert cast_back_e5m6_ref(q, sf, torch.bfloat16).shape == (0, 2048)
