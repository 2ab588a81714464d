"""CPU tests of the plain-torch cast-back reference (tests/reference/quant_cast_back.py).

The GPU tests compare the kernel bit for bit against this reference, so it is pinned here
against independent formulations: float64 products (exact for these operands) rounded once to
fp32, an integer round-to-nearest-even to bf16, the e2m1 value table and nibble order, and the
round trip with the per-token cast reference within the dequantization error bounds.
"""

from __future__ import annotations

import pytest
import torch

from tests.reference.quant import FP4_VALUES, cast_error, fp4_pack, per_token_cast_ref
from tests.reference.quant_cast_back import (
    in_format,
    out_dtype_of,
    per_block_cast_back_ref,
    per_token_cast_back_ref,
)

# (fmt, npc) pairs of the spec grid and the round-trip error bounds of KERNELS.md.
FORMATS = [("e4m3", 32), ("e4m3", 64), ("e4m3", 128), ("e2m1", 16), ("e2m1", 32)]
ERROR_BOUND = {"e4m3": 1e-3, "e2m1": 2e-2}
OUT = {"bf16": torch.bfloat16, "fp32": torch.float32}


def random_rows(num_tokens: int, hidden: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Gaussian rows with per-row magnitudes over six decades, no exact zeros."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = torch.pow(10.0, torch.empty(num_tokens, 1).uniform_(-3, 3, generator=gen))
    x = torch.randn(num_tokens, hidden, generator=gen) * magnitude
    return torch.where(x == 0, torch.ones_like(x), x).to(dtype)


def random_scales(num_tokens: int, groups: int, seed: int = 1) -> torch.Tensor:
    """Positive fp32 scales over a wide range, including subnormal products with small codes."""
    gen = torch.Generator().manual_seed(seed)
    return torch.pow(2.0, torch.empty(num_tokens, groups).uniform_(-140, 120, generator=gen))


def all_e4m3_codes(num_tokens: int, hidden: int, seed: int = 2) -> torch.Tensor:
    """Random e4m3 bytes, every non-NaN code (0x7F and 0xFF are NaN) equally likely."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (num_tokens, hidden), generator=gen, dtype=torch.int32)
    codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)
    return codes.to(torch.uint8).view(torch.float8_e4m3fn)


def all_e2m1_bytes(num_tokens: int, width: int, seed: int = 3) -> torch.Tensor:
    """Random packed FP4 bytes: every byte is a valid pair of codes."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, (num_tokens, width), generator=gen, dtype=torch.int8)


def bf16_rne(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 by integer round to nearest even on the bit pattern (finite inputs)."""
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.to(torch.int32).to(torch.int16).view(torch.bfloat16)


class TestDecode:
    def test_e2m1_table_and_nibble_order(self) -> None:
        codes = torch.arange(16, dtype=torch.int32).reshape(1, 16)
        q = fp4_pack(codes)  # byte i holds codes 2i (low nibble) and 2i + 1 (high nibble)
        assert q.view(torch.uint8)[0, 0].item() == 0x10
        out = per_token_cast_back_ref(q, torch.ones(1, 1), "fp32", 16)
        expected = torch.tensor(FP4_VALUES + tuple(-v for v in FP4_VALUES))
        assert torch.equal(out[0], expected)
        assert torch.signbit(out[0, 8])  # code 8 is -0.0

    def test_kernel_e2m1_formula(self) -> None:
        """The kernel's decode: sign to bit 31, magnitude bits to 22..24, times 2^126 (exact)."""
        code = torch.arange(16, dtype=torch.int32)
        bits = ((code & 8) << 28) | ((code & 7) << 22)
        value = bits.view(torch.float32) * torch.tensor(2.0**126)
        table = torch.tensor(FP4_VALUES + tuple(-v for v in FP4_VALUES))
        assert torch.equal(value.view(torch.int32), table.view(torch.int32))  # -0.0 included

    def test_e4m3_every_code(self) -> None:
        codes = torch.arange(256, dtype=torch.int32)
        codes = codes[(codes & 0x7F) != 0x7F].to(torch.uint8).view(torch.float8_e4m3fn).reshape(2, 127)
        out = per_token_cast_back_ref(codes, torch.ones(2, 1), "fp32", 127)
        assert torch.equal(out, codes.float())
        assert out.abs().max().item() == 448.0 and out[out != 0].abs().min().item() == 2.0**-9


class TestProduct:
    @pytest.mark.parametrize(("fmt", "npc"), FORMATS)
    def test_one_rounding_of_the_exact_product(self, fmt: str, npc: int) -> None:
        hidden = 512
        q = all_e4m3_codes(8, hidden) if fmt == "e4m3" else all_e2m1_bytes(8, hidden // 2)
        sf = random_scales(8, hidden // npc)
        out = per_token_cast_back_ref(q, sf, "fp32", npc)
        # A code (<= 4 significant bits) times an fp32 (24 bits) is exact in float64, so
        # rounding the float64 product once gives the IEEE fp32 product.
        decoded = per_token_cast_back_ref(q, torch.ones(8, hidden // npc), "fp32", npc).double()
        exact = decoded * sf.double().repeat_interleave(npc, dim=-1)
        assert torch.equal(out.view(torch.int32), exact.float().view(torch.int32))

    @pytest.mark.parametrize(("fmt", "npc"), FORMATS)
    def test_bf16_rounds_to_nearest_even(self, fmt: str, npc: int) -> None:
        hidden = 512
        q = all_e4m3_codes(8, hidden) if fmt == "e4m3" else all_e2m1_bytes(8, hidden // 2)
        sf = random_scales(8, hidden // npc, seed=5)
        fp32 = per_token_cast_back_ref(q, sf, "fp32", npc)
        bf16 = per_token_cast_back_ref(q, sf, "bf16", npc)
        assert bf16.dtype == torch.bfloat16
        assert torch.equal(bf16.view(torch.int16), bf16_rne(fp32).view(torch.int16))

    def test_bf16_ties(self) -> None:
        # sf = 1 + 2^-8 times 1.0 is a tie between two bf16 values: it goes to the even one (1.0),
        # and 1 + 3 * 2^-8 goes up to 1 + 2^-6.
        q = torch.ones(1, 32).to(torch.float8_e4m3fn)
        sf = torch.tensor([[1 + 2.0**-8]])
        assert per_token_cast_back_ref(q, sf, "bf16", 32)[0, 0].item() == 1.0
        sf = torch.tensor([[1 + 3 * 2.0**-8]])
        assert per_token_cast_back_ref(q, sf, "bf16", 32)[0, 0].item() == 1 + 2.0**-6


class TestRoundTrip:
    @pytest.mark.parametrize(("fmt", "npc"), FORMATS)
    @pytest.mark.parametrize("round_sf", [False, True])
    @pytest.mark.parametrize("out", ["bf16", "fp32"])
    def test_cast_then_cast_back(self, fmt: str, npc: int, round_sf: bool, out: str) -> None:
        x = random_rows(33, 2048, OUT[out], seed=4)
        q, sf = per_token_cast_ref(x, fmt, npc, round_sf)
        y = per_token_cast_back_ref(q, sf, out, npc)
        assert y.shape == x.shape and y.dtype == OUT[out]
        assert cast_error(x.float(), y.float()) < ERROR_BOUND[fmt]

    @pytest.mark.parametrize(("fmt", "npc"), [("e4m3", 128), ("e2m1", 32)])
    @pytest.mark.parametrize("sf_layout", ["col_major", "ue8m0"])
    def test_scale_layouts_decode_alike(self, fmt: str, npc: int, sf_layout: str) -> None:
        """Column-major fp32 scales and UE8M0 words give the row-major result, bit for bit."""
        x = random_rows(13, 2048, torch.bfloat16, seed=6)
        q, sf = per_token_cast_ref(x, fmt, npc, round_sf=True)
        q2, sf2 = per_token_cast_ref(x, fmt, npc, round_sf=True, sf_layout=sf_layout)
        assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8))
        assert sf2.dtype == (torch.int32 if sf_layout == "ue8m0" else torch.float32) and sf2.stride(0) == 1
        for out in OUT:
            bits = torch.int16 if out == "bf16" else torch.int32
            want = per_token_cast_back_ref(q, sf, out, npc).view(bits)
            assert torch.equal(per_token_cast_back_ref(q2, sf2, out, npc).view(bits), want)

    def test_representable_values_come_back_exactly(self) -> None:
        # Powers of two in each group with amax 448 (scale 1): e4m3 holds them exactly.
        row = torch.pow(2.0, -torch.arange(32.0) % 8) * 448 / 2**7
        row[0] = 448.0
        x = row.repeat(4, 4)
        q, sf = per_token_cast_ref(x, "e4m3", 32)
        assert torch.equal(per_token_cast_back_ref(q, sf, "fp32", 32), x)


class TestArguments:
    def test_formats(self) -> None:
        assert in_format(torch.empty(0, dtype=torch.float8_e4m3fn)) == "e4m3"
        assert in_format(torch.empty(0, dtype=torch.int8)) == "e2m1"
        assert out_dtype_of("bf16") == torch.bfloat16 and out_dtype_of(torch.float32) == torch.float32
        with pytest.raises(TypeError, match="q"):
            in_format(torch.empty(0, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="fmt"):
            out_dtype_of("fp16")

    def test_zero_and_one_token(self) -> None:
        for num_tokens in (0, 1):
            q = torch.zeros(num_tokens, 1024, dtype=torch.int8)
            out = per_token_cast_back_ref(q, torch.ones(num_tokens, 128), "bf16", 16)
            assert out.shape == (num_tokens, 2048) and out.dtype == torch.bfloat16

    def test_scale_shape_must_match(self) -> None:
        q = torch.zeros(4, 256, dtype=torch.float8_e4m3fn)
        with pytest.raises(ValueError, match="sf"):
            per_token_cast_back_ref(q, torch.ones(4, 4), "fp32", 32)
        with pytest.raises(ValueError, match="sf"):
            per_token_cast_back_ref(q, torch.ones(3, 8), "fp32", 32)
        with pytest.raises(TypeError, match="sf"):
            per_token_cast_back_ref(q, torch.ones(4, 8, dtype=torch.float64), "fp32", 32)
        with pytest.raises(ValueError, match="sf"):  # UE8M0 words: ceil(8 / 4) per token
            per_token_cast_back_ref(q, torch.ones(4, 8, dtype=torch.int32), "fp32", 32)


class TestPerBlock:
    def test_hand_computed_blocks(self) -> None:
        """Two token blocks x two channel blocks of 32: each quarter takes its own scale."""
        q = torch.full((40, 64), 1.5).to(torch.float8_e4m3fn)
        q[33, 40] = -448.0
        sf = torch.tensor([[1.0, 2.0], [0.25, 3.0]])
        out = per_block_cast_back_ref(q, sf, "fp32", (32, 32))
        assert out[0, 0].item() == 1.5 and out[31, 63].item() == 3.0
        assert out[32, 0].item() == 0.375 and out[39, 32].item() == 4.5 and out[33, 40].item() == -1344.0

    @pytest.mark.parametrize("block", [(32, 32), (32, 128), (128, 32), (128, 128)])
    @pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
    def test_equals_per_token_scales_spread_over_the_block(self, fmt: str, block: tuple[int, int]) -> None:
        """What the op does (spread block scales to per-token ones) gives the same bits."""
        bm, bk = block
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(300, 512, generator=gen)
        q, _ = per_token_cast_ref(x, fmt, 32)
        sf = torch.rand(-(-300 // bm), 512 // bk, generator=gen) + 0.1
        spread = sf.repeat_interleave(bm, dim=0)[:300].repeat_interleave(bk // 32, dim=1)
        for out in ("bf16", "fp32"):
            got = per_block_cast_back_ref(q, sf, out, block)
            assert torch.equal(got, per_token_cast_back_ref(q, spread, out, 32))

    def test_wrong_scale_shape_is_refused(self) -> None:
        q = torch.zeros(33, 64, dtype=torch.float8_e4m3fn)
        with pytest.raises(ValueError, match="sf"):
            per_block_cast_back_ref(q, torch.ones(1, 2), "bf16", (32, 32))  # needs ceil(33 / 32) = 2 rows
