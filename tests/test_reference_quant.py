"""CPU tests of the plain-torch quantization reference (tests/reference/quant.py).

The GPU tests compare kernels bit for bit against this reference, so the reference itself is
pinned here against independent formulations: the e2m1 comparison chain of KERNELS.md, the
exact value tables of both formats, and torch's own fp8 cast.
"""

from __future__ import annotations

import pytest
import torch

from tests.reference.quant import (
    AMAX_FLOOR,
    FP4_VALUES,
    QMAX,
    align,
    cast_error,
    dequant,
    fp4_decode,
    fp4_encode,
    fp4_pack,
    fp4_unpack,
    per_token_cast_ref,
    precomputed_sf_cast_ref,
    round_sf_up,
    scales,
    tma_aligned_col_major,
    ue8m0_pack,
    ue8m0_unpack,
)

# (fmt, npc) pairs of the spec grid; dequantization error bounds of 1 - 2 sum(xy)/sum(x^2 + y^2)
# on Gaussian data: e4m3 keeps 3 mantissa bits, e2m1 only 1.
FORMATS = [("e4m3", 32), ("e4m3", 64), ("e4m3", 128), ("e2m1", 16), ("e2m1", 32)]
ERROR_BOUND = {"e4m3": 1e-3, "e2m1": 2e-2}


def comparison_encode(v: torch.Tensor) -> torch.Tensor:
    """KERNELS.md's e2m1 rule, the one the kernel implements: a chain of midpoint comparisons."""
    a = v.abs()
    code = sum((c).to(torch.int32) for c in (a > 0.25, a >= 0.75, a > 1.25, a >= 1.75, a > 2.5, a >= 3.5, a > 5.0))
    return code | ((v < 0).to(torch.int32) << 3)


def random_rows(num_tokens: int, hidden: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Gaussian rows with per-row magnitudes over six decades, no exact zeros."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = torch.pow(10.0, torch.empty(num_tokens, 1).uniform_(-3, 3, generator=gen))
    x = torch.randn(num_tokens, hidden, generator=gen) * magnitude
    return torch.where(x == 0, torch.ones_like(x), x).to(dtype)


class TestFp4Encode:
    def test_every_representable_value(self) -> None:
        values = torch.tensor(FP4_VALUES)
        assert fp4_encode(values).tolist() == list(range(8))
        # Negative values carry the float's sign bit, -0.0 and negatives that round to zero included (KERNELS.md).
        assert fp4_encode(-values[1:]).tolist() == list(range(9, 16))
        assert fp4_encode(torch.tensor([-0.0, 0.0, -1e-3])).tolist() == [8, 0, 8]

    @pytest.mark.parametrize(
        ("tie", "lower"),
        # (midpoint, code just below it): the midpoint itself takes the even one of lower, lower + 1.
        [(0.25, 0), (0.75, 1), (1.25, 2), (1.75, 3), (2.5, 4), (3.5, 5), (5.0, 6)],
    )
    def test_ties_round_to_even(self, tie: float, lower: int) -> None:
        t = torch.tensor([tie])
        below, above = t.nextafter(torch.zeros(1)), t.nextafter(torch.full((1,), 9.0))
        even = lower + (lower % 2)
        assert fp4_encode(below).item() == lower
        assert fp4_encode(t).item() == even
        assert fp4_encode(above).item() == lower + 1
        assert fp4_encode(-t).item() == even | 8

    def test_saturates_at_six(self) -> None:
        v = torch.tensor([5.0001, 6.0, 7.0, 8.0, 1e30, float("inf")])
        assert fp4_encode(v).tolist() == [7] * 6
        assert fp4_encode(-v).tolist() == [15] * 6

    def test_small_values(self) -> None:
        tiny = torch.tensor([1e-45, 1e-38, 1e-10, 0.1, 0.25])  # subnormal fp32 included
        assert fp4_encode(tiny).tolist() == [0] * 5
        assert fp4_encode(-tiny).tolist() == [8] * 5  # negative values keep the sign bit

    def test_matches_comparison_chain(self) -> None:
        gen = torch.Generator().manual_seed(1)
        v = torch.randn(1 << 16, generator=gen) * 3
        # Every fp32 on a fine grid around each tie, and random values over a wide range.
        grid = torch.linspace(-7, 7, 14001)
        for values in (
            v,
            grid,
            torch.tensor(
                [t + s * d for t in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0) for s in (-1, 0, 1) for d in (1e-7, 1e-6)]
            ),
        ):
            assert torch.equal(fp4_encode(values), comparison_encode(values))

    def test_pack_layout_and_round_trip(self) -> None:
        codes = torch.arange(16, dtype=torch.int32).repeat(3).reshape(3, 16)
        packed = fp4_pack(codes)
        assert packed.dtype == torch.int8 and packed.shape == (3, 8)
        # Element 2i in the low nibble, 2i + 1 in the high nibble.
        assert packed.view(torch.uint8)[0, 0].item() == 0x10
        assert packed.view(torch.uint8)[0, 7].item() == 0xFE
        assert torch.equal(fp4_unpack(packed), codes)
        decoded = fp4_decode(packed)[0]
        expected = torch.tensor(FP4_VALUES + tuple(-v for v in FP4_VALUES))
        assert torch.equal(decoded, expected)
        assert torch.signbit(decoded[8])  # code 8 is -0.0


class TestScales:
    def test_round_sf_is_smallest_power_of_two_not_below(self) -> None:
        gen = torch.Generator().manual_seed(2)
        sf = torch.pow(2.0, torch.empty(10000).uniform_(-120, 120, generator=gen))
        sf = torch.cat([sf, torch.pow(2.0, torch.arange(-126.0, 127.0))])  # exact powers stay put
        rounded = round_sf_up(sf)
        mantissa = rounded.view(torch.int32) & 0x7FFFFF
        assert torch.all(mantissa == 0)
        assert torch.all(rounded >= sf)
        assert torch.all(rounded / 2 < sf)
        assert torch.equal(round_sf_up(rounded), rounded)

    @pytest.mark.parametrize(("fmt", "npc"), FORMATS)
    @pytest.mark.parametrize("round_sf", [False, True])
    def test_scale_definition(self, fmt: str, npc: int, round_sf: bool) -> None:
        x = random_rows(16, 256, torch.float32)
        sf, q_scale = scales(x, fmt, npc, round_sf)
        amax = x.reshape(16, -1, npc).abs().amax(-1).clamp_min(AMAX_FLOOR[fmt]).double()
        if round_sf:
            assert torch.all((sf.view(torch.int32) & 0x7FFFFF) == 0)
            assert torch.equal(q_scale * sf, torch.ones_like(sf))  # 1 / power of two is exact
        else:
            # float32(amax / qmax) computed in float64 then rounded: the IEEE quotient.
            assert torch.equal(sf, (amax / QMAX[fmt]).float())
            assert torch.equal(q_scale, (QMAX[fmt] / amax).float())

    @pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
    def test_amax_floor(self, fmt: str) -> None:
        x = torch.full((2, 64), 1e-39)  # fp32 subnormal, below both floors
        sf, _ = scales(x, fmt, 32, round_sf=False)
        expected = torch.tensor(AMAX_FLOOR[fmt], dtype=torch.float32) / torch.tensor(QMAX[fmt])
        assert torch.equal(sf, expected.expand(2, 2))


class TestPerTokenCast:
    def test_e4m3_boundaries(self) -> None:
        # amax == 448 gives q_scale == 1: the values pass through unscaled.
        row = torch.tensor([448.0, -448.0, -432.0, 240.0, 232.0, 1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10])
        x = torch.cat([row, torch.zeros(32 - row.numel())]).reshape(1, 32)
        x[0, -1] = 1.0  # no exact zeros needed here, but keep one ordinary value
        q, sf = per_token_cast_ref(x, "e4m3", 32)
        assert sf.item() == 1.0
        got = q.float()[0, : row.numel()].tolist()
        # +-448 and 240 exact; the ties -432 (-416 | -448), 232 (224 | 240), 1.0625
        # (1 | 1.125) and 1.1875 (1.125 | 1.25) go to the even mantissa; subnormal ties 2^-10
        # (0 | 2^-9) -> 0 and 3 * 2^-10 (2^-9 | 2^-8) -> 2^-8.
        assert got == [448.0, -448.0, -448.0, 240.0, 224.0, 1.0, 1.25, 0.0, 2.0**-8]

    def test_e4m3_clamps_before_cast(self) -> None:
        # amax just over the floor: q_scale rounds up so x * q_scale can exceed 448 slightly.
        x = random_rows(64, 128, torch.float32, seed=3)
        q, _ = per_token_cast_ref(x, "e4m3", 32)
        assert not torch.isnan(q.float()).any()
        assert q.float().abs().max().item() == 448.0

    @pytest.mark.parametrize(("fmt", "npc"), FORMATS)
    @pytest.mark.parametrize("round_sf", [False, True])
    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    def test_shapes_and_dequant_error(self, fmt: str, npc: int, round_sf: bool, dtype: torch.dtype) -> None:
        x = random_rows(33, 2048, dtype, seed=4)
        q, sf = per_token_cast_ref(x, fmt, npc, round_sf)
        assert sf.shape == (33, 2048 // npc) and sf.dtype == torch.float32
        if fmt == "e4m3":
            assert q.shape == (33, 2048) and q.dtype == torch.float8_e4m3fn
        else:
            assert q.shape == (33, 1024) and q.dtype == torch.int8
        assert cast_error(x.float(), dequant(q, sf, fmt, npc)) < ERROR_BOUND[fmt]

    def test_e2m1_codes_follow_comparison_chain(self) -> None:
        x = random_rows(8, 512, torch.bfloat16, seed=5)
        q, sf = per_token_cast_ref(x, "e2m1", 16, round_sf=True)
        scaled = x.float().reshape(8, -1, 16) * (1.0 / sf).unsqueeze(-1)
        assert torch.equal(fp4_unpack(q), comparison_encode(scaled.reshape(8, 512)))

    def test_zero_tokens(self) -> None:
        q, sf = per_token_cast_ref(torch.empty(0, 256, dtype=torch.bfloat16), "e2m1", 32)
        assert q.shape == (0, 128) and sf.shape == (0, 8)

    def test_argument_errors(self) -> None:
        with pytest.raises(ValueError, match="fmt"):
            per_token_cast_ref(torch.ones(1, 32), "e5m2", 32)
        with pytest.raises(ValueError, match="2-D"):
            per_token_cast_ref(torch.ones(32), "e4m3", 32)

    def test_a_partial_last_group_scales_the_channels_it_has(self) -> None:
        # H = 48, npc = 32: G = 2, the second group holds channels 32..47 only (TileKernels' hidden 576, npc 128).
        x = torch.cat([torch.full((1, 32), 448.0), torch.full((1, 16), 2.0)], dim=1)
        q, sf = per_token_cast_ref(x, "e4m3", 32)
        assert q.shape == (1, 48) and torch.equal(sf, torch.tensor([[448.0, 2.0]]) / 448.0)
        assert q.float().tolist() == [[448.0] * 48]

    def test_cast_error_measure(self) -> None:
        x = torch.randn(1000, dtype=torch.float64)
        assert cast_error(x, x) == 0.0
        assert cast_error(x, -x) == pytest.approx(2.0)
        assert cast_error(torch.zeros(3), torch.zeros(3)) == 0.0


class TestScaleLayouts:
    @pytest.mark.parametrize("num_tokens", [0, 1, 3, 4, 5, 127])
    def test_tma_aligned_col_major_strides(self, num_tokens: int) -> None:
        t = torch.randn(num_tokens, 6)
        col = tma_aligned_col_major(t)
        padded = align(num_tokens, 4)
        assert col.shape == (num_tokens, 6) and torch.equal(col, t)
        if num_tokens > 0:
            assert col.stride() == (1, padded)
        # The storage holds 6 columns of align(T, 4) tokens; the padding is zero.
        assert col.untyped_storage().nbytes() == 6 * padded * 4
        storage = torch.empty(0).set_(col.untyped_storage()).view(6, padded)
        assert torch.all(storage[:, num_tokens:] == 0)
        # Element (t, g) of the view is element g * align(T, 4) + t of the storage.
        if num_tokens > 0:
            assert torch.equal(storage[:, :num_tokens], t.T)

    def test_ue8m0_pack_known_words(self) -> None:
        sf = torch.tensor([[1.0, 2.0, 0.5, 2.0**-126, 1.0, 1.0, 1.0, 2.0**8]])
        words = ue8m0_pack(sf)
        assert words.dtype == torch.int32 and words.shape == (1, 2)
        # Biased exponents 127, 128, 126, 1 -> 0x017E807F; 127, 127, 127, 135 -> 0x877F7F7F (< 0 as int32).
        assert words[0, 0].item() == 0x017E807F
        assert words[0, 1].item() == 0x877F7F7F - 2**32

    def test_ue8m0_pack_matches_little_endian_bytes(self) -> None:
        gen = torch.Generator().manual_seed(6)
        sf = torch.pow(2.0, torch.randint(-126, 128, (9, 56), generator=gen).float())
        words = ue8m0_pack(sf)
        assert words.shape == (9, 14)
        # An independent formulation: the exponent bytes side by side, read as little-endian words.
        exponents = (sf.view(torch.int32) >> 23).to(torch.uint8)
        assert torch.equal(words, exponents.view(torch.int32))
        assert torch.equal(ue8m0_unpack(words, 56), sf)

    def test_ue8m0_missing_bytes_are_zero(self) -> None:
        sf = torch.full((3, 6), 4.0)  # G % 4 == 2: word 1 holds two groups
        words = ue8m0_pack(sf)
        assert words.shape == (3, 2)
        assert torch.all(words[:, 0] == 0x81818181 - 2**32)
        assert torch.all(words[:, 1] == 0x8181)
        assert torch.equal(ue8m0_unpack(words, 6), sf)

    @pytest.mark.parametrize("bad", [3.0, 0.0, -2.0, 1.5])
    def test_ue8m0_refuses_non_powers_of_two(self, bad: float) -> None:
        with pytest.raises(ValueError, match="power"):
            ue8m0_pack(torch.tensor([[1.0, bad]]))

    @pytest.mark.parametrize(("fmt", "npc"), [("e4m3", 128), ("e2m1", 32)])
    @pytest.mark.parametrize("num_tokens", [0, 1, 3, 33])
    def test_layouts_hold_the_row_major_scales(self, fmt: str, npc: int, num_tokens: int) -> None:
        x = random_rows(num_tokens, 2048, torch.bfloat16, seed=7)
        padded = align(num_tokens, 4)
        for round_sf in (False, True):
            q, sf = per_token_cast_ref(x, fmt, npc, round_sf)
            q_col, sf_col = per_token_cast_ref(x, fmt, npc, round_sf, sf_layout="col_major")
            assert torch.equal(q_col.view(torch.uint8), q.view(torch.uint8))
            assert sf_col.shape == sf.shape and sf_col.dtype == torch.float32
            assert torch.equal(sf_col.view(torch.int32), sf.view(torch.int32))
            if num_tokens > 1:
                assert sf_col.stride() == (1, padded)
        q_ue, sf_ue = per_token_cast_ref(x, fmt, npc, True, sf_layout="ue8m0")
        assert torch.equal(q_ue.view(torch.uint8), q.view(torch.uint8))
        assert sf_ue.dtype == torch.int32 and sf_ue.shape == (num_tokens, 2048 // npc // 4)
        if num_tokens > 1:
            assert sf_ue.stride() == (1, padded)
        assert torch.equal(sf_ue, ue8m0_pack(sf))
        assert torch.equal(ue8m0_unpack(sf_ue, 2048 // npc), sf)
        # dequant decodes the words: the same values as with the fp32 scales.
        assert torch.equal(dequant(q_ue, sf_ue, fmt, npc), dequant(q, sf, fmt, npc))
        if num_tokens:
            assert cast_error(x.float(), dequant(q_ue, sf_ue, fmt, npc)) < ERROR_BOUND[fmt]

    def test_ue8m0_extreme_exponents(self) -> None:
        # The e2m1 floor gives sf = 2^-126 (byte 1); huge rows give bytes >= 128 (negative words).
        x = torch.cat([torch.full((1, 128), 1e-39), torch.full((1, 128), 3e38)])
        _, sf = per_token_cast_ref(x, "e2m1", 32, True)
        _, words = per_token_cast_ref(x, "e2m1", 32, True, sf_layout="ue8m0")
        assert sf[0, 0].item() == 2.0**-126 and words[0, 0].item() == 0x01010101
        assert words[1, 0].item() < 0
        assert torch.equal(ue8m0_unpack(words, 4), sf)

    def test_layout_errors(self) -> None:
        with pytest.raises(ValueError, match="use_packed_ue8m0.*round_sf"):
            per_token_cast_ref(torch.ones(1, 128), "e4m3", 128, sf_layout="ue8m0")
        with pytest.raises(ValueError, match="sf_layout"):
            per_token_cast_ref(torch.ones(1, 128), "e4m3", 128, sf_layout="column_major")


class TestNonFinite:
    """A NaN or Inf never passes silently: its group's scale is NaN and the group decodes to NaN."""

    @pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
    @pytest.mark.parametrize("round_sf", [False, True])
    def test_bad_group_gets_nan_scale_and_fixed_codes(self, bad: float, round_sf: bool) -> None:
        x = random_rows(2, 128, torch.float32)
        x[1, 37] = bad  # group 1 of row 1 (npc 32)
        for fmt in ("e4m3", "e2m1"):
            q, sf = per_token_cast_ref(x, fmt, 32, round_sf)
            clean_q, clean_sf = per_token_cast_ref(x[:1], fmt, 32, round_sf)
            assert torch.isnan(sf[1, 1]) and int(torch.isnan(sf).sum()) == 1
            assert torch.equal(sf[0], clean_sf[0]) and torch.equal(q[0].view(torch.uint8), clean_q[0].view(torch.uint8))
            if fmt == "e4m3":
                assert q[1, 32:64].view(torch.uint8).tolist() == [0x7F] * 32
            else:
                assert q[1, 16:32].view(torch.uint8).tolist() == [0] * 16
            assert bool(torch.isnan(dequant(q, sf, fmt, 32)[1, 32:64]).all())

    def test_ue8m0_byte_of_a_nan_scale_is_ff(self) -> None:
        x = random_rows(3, 512, torch.float32)
        x[2, 130] = float("nan")  # group 1 of row 2 (npc 128): byte 1 of word 0
        _, words = per_token_cast_ref(x, "e4m3", 128, True, "ue8m0")
        assert (int(words[2, 0]) >> 8) & 0xFF == 0xFF
        assert int(words[2, 0]) & 0xFF != 0xFF

    def test_nan_code_is_positive_for_negative_inputs(self) -> None:
        x = -random_rows(1, 64, torch.float32).abs()
        x[0, 0] = float("nan")
        q, _ = per_token_cast_ref(x, "e4m3", 32)
        assert q[0, :32].view(torch.uint8).tolist() == [0x7F] * 32
        assert 0x7F not in q[0, 32:].view(torch.uint8).tolist()


class TestPerRowAndStrides:
    def test_one_scale_per_row(self) -> None:
        x = torch.tensor([[1.0, -448.0, 2.0, 0.5], [0.0, 0.0, 0.0, 3e-5]])
        q, sf = per_token_cast_ref(x, "e4m3", 4)
        assert sf.shape == (2, 1)
        # Row 0: amax 448, sf 1, codes exact; row 1: amax floor 1e-4 (> 3e-5), scale 448 / 1e-4.
        assert sf[0, 0].item() == 1.0
        assert q[0].float().tolist() == [1.0, -448.0, 2.0, 0.5]
        assert sf[1, 0].item() == torch.tensor(1e-4) .div(torch.tensor(448.0)).item()
        assert q[1, 3].float().item() == torch.tensor(3e-5 * (448.0 / torch.tensor(1e-4).item())).to(torch.float8_e4m3fn).float().item()

    def test_strided_rows_equal_contiguous(self) -> None:
        wide = random_rows(5, 384, torch.bfloat16)
        x = wide[:, :256]
        assert not x.is_contiguous()
        for fmt, npc in (("e4m3", 128), ("e2m1", 16), ("e4m3", 256)):
            q, sf = per_token_cast_ref(x, fmt, npc)
            q_c, sf_c = per_token_cast_ref(x.contiguous(), fmt, npc)
            assert torch.equal(q.view(torch.uint8), q_c.view(torch.uint8)) and torch.equal(sf, sf_c)


class TestPrecomputedSf:
    @pytest.mark.parametrize(("fmt", "npc"), FORMATS)
    def test_power_of_two_scales_reproduce_the_cast(self, fmt: str, npc: int) -> None:
        """With round_sf, 1 / sf is exact and equals the cast's q_scale: the codes agree."""
        x = random_rows(7, 256, torch.bfloat16)
        q, sf = per_token_cast_ref(x, fmt, npc, round_sf=True)
        assert torch.equal(precomputed_sf_cast_ref(x, fmt, npc, sf).view(torch.uint8), q.view(torch.uint8))

    def test_uses_the_reciprocal_of_sf(self) -> None:
        """Codes are x * fl(1 / sf) (TileKernels' cast-only form), not x / sf: 2800 / 7 = 400 is the
        e4m3 tie between 384 and 416 (to even: 384), while 2800 * fl(1/7) lies just above it (416)."""
        x = torch.tensor([[2800.0] + [0.0] * 31])
        q = precomputed_sf_cast_ref(x, "e4m3", 32, torch.tensor([[7.0]]))
        assert q[0, 0].float().item() == 416.0
        assert (x[0, 0] / torch.tensor(7.0)).to(torch.float8_e4m3fn).float().item() == 384.0

    def test_shape_mismatch_is_refused(self) -> None:
        with pytest.raises(ValueError, match="sf"):
            precomputed_sf_cast_ref(torch.ones(2, 64), "e4m3", 32, torch.ones(2, 3))
