"""CPU tests of tests/reference/quant_per_channel.py against hand-computed cases and properties.

The GPU tests compare the kernels bit for bit against this reference, so each rule of the
reference is pinned here by numbers worked out by hand (scales, codes, exponents) or by an
independent formulation (dequantization error, exact round trips).
"""

from __future__ import annotations

import pytest
import torch

from tests.reference.quant import E4M3_NAN_CODE, cast_error, per_token_cast_ref
from tests.reference.quant_per_channel import (
    fp4_dequant,
    gather_rows,
    lossless_dequant,
    per_block_cast_lossless_ref,
    per_channel_cast_and_transpose_ref,
    per_channel_cast_ref,
    per_channel_dequant,
)


def random_columns(num_tokens: int, hidden: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    """Gaussian values with per-channel magnitudes over six decades, no exact zeros."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = torch.pow(10.0, torch.empty(1, hidden).uniform_(-3, 3, generator=gen))
    x = torch.randn(num_tokens, hidden, generator=gen) * magnitude
    return torch.where(x == 0, torch.ones_like(x), x).to(dtype)


def codes(q: torch.Tensor) -> list[int]:
    return q.view(torch.uint8).flatten().tolist()


class TestPerChannelCast:
    def test_hand_computed_column(self) -> None:
        # Channel 0: max |x| = 7 in the first 128 tokens, 0.5 in the next; channel 1 all zero.
        x = torch.zeros(256, 2)
        x[3, 0], x[5, 0], x[200, 0] = -7.0, 3.5, 0.5
        q, sf = per_channel_cast_ref(x)
        assert sf.shape == (2, 2)
        assert sf[0, 0].item() == torch.tensor(7.0 / 448.0).item() and sf[1, 0].item() == torch.tensor(0.5 / 448).item()
        assert sf[0, 1].item() == pytest.approx(1e-4 / 448.0, rel=1e-7)  # the amax floor
        # The group maximum maps to +-448 (0x7E / 0xFE), half of it to 224 (0x76).
        assert codes(q[3, 0]) == [0xFE] and codes(q[5, 0]) == [0x76] and codes(q[200, 0]) == [0x7E]
        assert set(codes(q[:, 1])) == {0}

    def test_round_sf_power_of_two(self) -> None:
        x = torch.zeros(128, 1)
        x[0, 0] = 7.0  # sf = 7/448 = 2^-6 * 1.0 -> exactly 2^-6; q = 7 * 64 = 448
        x[1, 0] = 1.0
        q, sf = per_channel_cast_ref(x, round_sf=True)
        assert sf.item() == 2.0**-6
        assert q[0, 0].float().item() == 448.0 and q[1, 0].float().item() == 64.0
        x[0, 0] = 7.5  # sf = 7.5 / 448 rounds up to 2^-5; q = 7.5 * 32 = 240
        q, sf = per_channel_cast_ref(x, round_sf=True)
        assert sf.item() == 2.0**-5 and q[0, 0].float().item() == 240.0

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    @pytest.mark.parametrize("round_sf", [False, True])
    def test_dequantization_error(self, dtype: torch.dtype, round_sf: bool) -> None:
        x = random_columns(256, 64, dtype)
        q, sf = per_channel_cast_ref(x, round_sf)
        assert cast_error(x.float(), per_channel_dequant(q, sf)) < 1e-3

    def test_groups_are_independent(self) -> None:
        x = random_columns(256, 8, torch.float32)
        q, sf = per_channel_cast_ref(x)
        q0, sf0 = per_channel_cast_ref(x[:128])
        q1, sf1 = per_channel_cast_ref(x[128:])
        assert torch.equal(sf, torch.cat([sf0, sf1]))
        assert codes(q) == codes(torch.cat([q0.view(torch.uint8), q1.view(torch.uint8)]))

    def test_partial_last_group(self) -> None:
        """Rows past the end count as zeros: the last group's scale comes from its rows only."""
        x = random_columns(130, 4, torch.float32)
        _, sf = per_channel_cast_ref(x)
        assert sf.shape == (2, 4)
        expected = torch.maximum(x[128:].abs().amax(dim=0), torch.tensor(1e-4)) / torch.tensor(448.0)
        assert torch.equal(sf[1], expected)

    def test_nan_is_skipped_by_amax_and_coded_as_nan(self) -> None:
        x = random_columns(128, 4, torch.float32)
        clean_q, clean_sf = per_channel_cast_ref(torch.where(torch.arange(128).unsqueeze(1) == 7, 0.0, x))
        x[7, 2] = float("nan")
        x[7, 0], x[7, 1], x[7, 3] = 0.0, 0.0, 0.0
        q, sf = per_channel_cast_ref(x)
        assert torch.equal(sf, clean_sf)
        assert codes(q[7, 2]) == [E4M3_NAN_CODE]
        assert codes(q[:7]) == codes(clean_q[:7]) and codes(q[8:]) == codes(clean_q[8:])

    def test_negative_nan_gets_the_canonical_code(self) -> None:
        x = torch.ones(128, 1)
        x[0, 0] = -float("nan")
        q, _ = per_channel_cast_ref(x)
        assert codes(q[0]) == [E4M3_NAN_CODE]


class TestFused:
    def test_gather_with_zero_rows(self) -> None:
        x = random_columns(10, 8, torch.float32)
        pos = torch.tensor([3, -1, 9, 0, 10, -7] + [1] * 10, dtype=torch.int32)
        v = gather_rows(x, pos)
        assert torch.equal(v[0], x[3]) and torch.equal(v[2], x[9]) and torch.equal(v[3], x[0])
        for zero_row in (1, 4, 5):  # -1, past the end, other negatives
            assert torch.equal(v[zero_row], torch.zeros(8))
        q, sf = per_channel_cast_ref(x, pos_to_token=pos)
        ref_q, ref_sf = per_channel_cast_ref(v)
        assert q.shape == (16, 8) and sf.shape == (1, 8)
        assert torch.equal(sf, ref_sf) and codes(q) == codes(ref_q)

    def test_fp8_pair_is_dequantized_first(self) -> None:
        x = random_columns(128, 256, torch.float32)
        q8, sf8 = per_token_cast_ref(x, "e4m3", 128)
        v = gather_rows(q8, x_sf=sf8)
        # Channel 130's block scale is sf8[:, 1]; the value is exactly q * sf.
        assert torch.equal(v[:, 130], q8[:, 130].float() * sf8[:, 1])
        q, sf = per_channel_cast_ref(q8, x_sf=sf8)
        assert cast_error(x, per_channel_dequant(q, sf)) < 2e-3

    def test_empty_input_with_gather(self) -> None:
        x = torch.zeros(0, 8)
        q, sf = per_channel_cast_ref(x, pos_to_token=torch.full((16,), -1, dtype=torch.int32))
        assert q.shape == (16, 8) and set(codes(q)) == {0}
        assert torch.equal(sf, torch.full((1, 8), 1e-4) / torch.tensor(448.0))


class TestTranspose:
    @pytest.mark.parametrize("npt", [32, 128])
    def test_is_the_transposed_per_channel_cast(self, npt: int) -> None:
        x = random_columns(256, 64)
        q, sf = per_channel_cast_and_transpose_ref(x, npt)
        ref_q, ref_sf = per_channel_cast_ref(x, npt=npt)
        assert q.shape == (64, 256) and q.is_contiguous() and sf.shape == (256 // npt, 64)
        assert torch.equal(sf, ref_sf) and codes(q) == codes(ref_q.T.contiguous())

    def test_groups_of_32(self) -> None:
        x = torch.ones(64, 1)
        x[40, 0] = 14.0  # group 1 (tokens 32..63): amax 14, sf = 14 / 448 = 2^-5
        _, sf = per_channel_cast_and_transpose_ref(x, 32)
        one_over_448 = (torch.ones(1) / torch.tensor([448.0])).item()  # fp32 division
        assert sf.flatten().tolist() == [one_over_448, 2.0**-5]


def fp4_pair(num_tokens: int, hidden: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """FP4 codes and power-of-two 1 x 32 scales whose ratios within any 128 x 128 block stay <= 2^9."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen)
    floor = x.abs().max() / 2**9
    x = torch.sign(x) * torch.maximum(x.abs(), floor)
    return per_token_cast_ref(x, "e2m1", 32, round_sf=True)


class TestLossless:
    def test_hand_computed_blocks(self) -> None:
        # Four 1 x 32 input blocks of one row: scales 2^-3, 2^2, 2^0, 2^-1 (exponents 124, 129, 127, 126).
        codes_row = torch.zeros(1, 64, dtype=torch.uint8)
        codes_row[0, 0] = 0x07  # element 0: 6.0 (low nibble); element 1: 0
        codes_row[0, 16] = 0x90  # element 32: 0; element 33: -0.5 (code 9, high nibble)
        x = codes_row.view(torch.int8)
        x_sf = torch.tensor([[2.0**-3, 2.0**2, 1.0, 0.5]])
        q, sf = per_block_cast_lossless_ref(x, x_sf, (1, 128))
        assert sf.tolist() == [[2.0 ** (129 - 127 - 6)]]  # out exponent 123: 2^-4
        # element 0: 6 * 2^(124 - 123) = 12; element 33: -0.5 * 2^(129 - 123) = -32.
        assert q[0, 0].float().item() == 12.0 and q[0, 33].float().item() == -32.0
        assert torch.equal(lossless_dequant(q, sf, (1, 128)), fp4_dequant(x, x_sf))

    def test_exponent_floor(self) -> None:
        x = torch.full((1, 64), 0x77, dtype=torch.uint8).view(torch.int8)  # every element 6.0
        tiny = torch.full((1, 4), 2.0**-124)  # exponent 3 < 6: the out exponent floors at 0
        q, sf = per_block_cast_lossless_ref(x, tiny, (1, 128))
        assert sf.tolist() == [[0.0]]
        assert set(q.float().flatten().tolist()) == {6.0 * 2.0**3}

    @pytest.mark.parametrize("out_block", [(1, 128), (32, 32), (128, 128)])
    @pytest.mark.parametrize("num_tokens", [1, 33, 130])
    def test_round_trip_is_exact(self, out_block: tuple[int, int], num_tokens: int) -> None:
        x, x_sf = fp4_pair(num_tokens, 256)
        q, sf = per_block_cast_lossless_ref(x, x_sf, out_block)
        rows = -(-num_tokens // out_block[0])
        assert q.shape == (num_tokens, 256) and sf.shape == (rows, 256 // out_block[1])
        assert torch.equal(lossless_dequant(q, sf, out_block), fp4_dequant(x, x_sf))

    @pytest.mark.parametrize("out_block", [(1, 128), (128, 128)])
    def test_partial_channel_block(self, out_block: tuple[int, int]) -> None:
        """hidden 576: the last 128-channel block holds two input blocks; its scale is their largest alone."""
        x, x_sf = fp4_pair(3, 576)
        x_sf[:, 16:] = 2.0**-30  # the remainder's scales far below the rest: an absent block counted would show
        q, sf = per_block_cast_lossless_ref(x, x_sf, out_block)
        assert sf.shape == (-(-3 // out_block[0]), 5) and q.shape == (3, 576)
        assert bool((sf[:, 4] == 2.0 ** (-30 - 6)).all())
        assert torch.equal(lossless_dequant(q, sf, out_block), fp4_dequant(x, x_sf))

    def test_partial_row_block_ignores_absent_rows(self) -> None:
        x, x_sf = fp4_pair(33, 128)
        x_sf[32] = 2.0**-20  # the second 32-row block holds row 32 only
        _, sf = per_block_cast_lossless_ref(x, x_sf, (32, 32))
        assert sf[1].tolist() == [2.0 ** (-20 - 6)] * 4

    def test_scale_ratio_limit(self) -> None:
        """Exact down to 2^-14 of the block's largest scale (0.5 * 2^-8 is e4m3's 2^-9); 2^-15 rounds."""
        x = torch.full((1, 64), 0x11, dtype=torch.uint8).view(torch.int8)  # every element 0.5
        x_sf = torch.tensor([[1.0, 2.0**-14, 1.0, 1.0]])
        q, sf = per_block_cast_lossless_ref(x, x_sf, (1, 128))
        assert torch.equal(lossless_dequant(q, sf, (1, 128)), fp4_dequant(x, x_sf))
        x_sf = torch.tensor([[1.0, 2.0**-15, 1.0, 1.0]])
        q, sf = per_block_cast_lossless_ref(x, x_sf, (1, 128))
        exact = fp4_dequant(x, x_sf)
        got = lossless_dequant(q, sf, (1, 128))
        assert torch.equal(got[:, :32], exact[:, :32])
        assert set(got[0, 32:64].tolist()) == {0.0}  # 2^-10: the tie between 0 and 2^-9 goes to 0
