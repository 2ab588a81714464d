"""CPU tests of the plain-torch per-block quantization reference (tests/reference/quant_per_block.py).

The GPU tests compare the per_block_cast kernel bit for bit against this reference, so it is
pinned here against the per-token reference (1-row blocks are per-token groups), against a
block-by-block loop, and by its dequantization error.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.reference.quant import AMAX_FLOOR, QMAX, cast_error, per_token_cast_ref, round_sf_up
from tests.reference.quant_per_block import (
    block_scales,
    per_block_cast_ref,
    per_block_cast_with_precomputed_sf_ref,
    per_block_dequant,
)

FORMATS = ("e4m3", "e2m1")
BLOCKS = [(32, 32), (32, 128), (128, 32), (128, 128)]
ERROR_BOUND = {"e4m3": 1e-3, "e2m1": 2e-2}


def random_rows(num_tokens: int, hidden: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    """Gaussian rows with per-row magnitudes over two decades, no exact zeros."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = torch.pow(10.0, torch.empty(num_tokens, 1).uniform_(-1, 1, generator=gen))
    x = torch.randn(num_tokens, hidden, generator=gen) * magnitude
    return torch.where(x == 0, torch.ones_like(x), x).to(dtype)


def loop_reference(x: torch.Tensor, fmt: str, block_size: tuple[int, int], round_sf: bool) -> torch.Tensor:
    """sf computed block by block with Python slicing (handles the partial last block by itself)."""
    block_m, block_k = block_size
    num_tokens, hidden = x.shape
    rows = []
    for r in range(0, num_tokens, block_m):
        row = []
        for c in range(0, hidden, block_k):
            amax = x[r : r + block_m, c : c + block_k].float().abs().max().reshape(1)
            amax = torch.maximum(amax, torch.tensor([AMAX_FLOOR[fmt]]))
            sf = amax / torch.tensor([QMAX[fmt]])
            row.append(round_sf_up(sf) if round_sf else sf)
        rows.append(torch.cat(row))
    return torch.stack(rows) if rows else torch.empty(0, hidden // block_k)


@pytest.mark.parametrize("round_sf", [False, True])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_row_blocks_are_per_token_groups(fmt: str, round_sf: bool, dtype: torch.dtype) -> None:
    x = random_rows(37, 512, dtype)
    for npc in (32, 128):
        q, sf = per_block_cast_ref(x, fmt, (1, npc), round_sf)
        ref_q, ref_sf = per_token_cast_ref(x, fmt, npc, round_sf)
        assert torch.equal(sf.view(torch.int32), ref_sf.view(torch.int32))
        assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))


@pytest.mark.parametrize("round_sf", [False, True])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block_size", BLOCKS, ids=str)
def test_scales_match_a_block_loop(block_size: tuple[int, int], fmt: str, round_sf: bool) -> None:
    x = random_rows(161, 256)  # 161 = 5 * 32 + 1 = 128 + 33: partial last blocks for both block_m
    _, sf = per_block_cast_ref(x, fmt, block_size, round_sf)
    expected = loop_reference(x, fmt, block_size, round_sf)
    assert sf.shape == (-(-161 // block_size[0]), 256 // block_size[1])
    assert torch.equal(sf.view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("round_sf", [False, True])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block_size", BLOCKS, ids=str)
def test_dequantization_error(block_size: tuple[int, int], fmt: str, round_sf: bool) -> None:
    # Blocks mix rows of different magnitudes, so keep the spread small (as in real activations).
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(300, 1024, generator=gen).to(torch.bfloat16)
    q, sf = per_block_cast_ref(x, fmt, block_size, round_sf)
    assert cast_error(x.float(), per_block_dequant(q, sf, fmt, block_size)) < ERROR_BOUND[fmt]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block_size", BLOCKS, ids=str)
def test_partial_last_block(block_size: tuple[int, int], fmt: str) -> None:
    """The last row of blocks sees only the rows that exist: it equals the cast of those rows alone."""
    block_m, _ = block_size
    x = random_rows(block_m + 5, 256)
    x[block_m:] *= 1e-3  # the partial block's rows are far smaller than the full block's
    q, sf = per_block_cast_ref(x, fmt, block_size)
    assert sf.shape[0] == 2
    tail_q, tail_sf = per_block_cast_ref(x[block_m:], fmt, block_size)
    head_q, head_sf = per_block_cast_ref(x[:block_m], fmt, block_size)
    assert torch.equal(sf[1:].view(torch.int32), tail_sf.view(torch.int32))
    assert torch.equal(sf[:1].view(torch.int32), head_sf.view(torch.int32))
    assert torch.equal(q.view(torch.uint8), torch.cat([head_q, tail_q]).view(torch.uint8))


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_input(fmt: str) -> None:
    x = torch.empty(0, 256, dtype=torch.bfloat16)
    q, sf = per_block_cast_ref(x, fmt, (32, 128))
    assert q.shape == (0, 256 if fmt == "e4m3" else 128)
    assert sf.shape == (0, 2)


@pytest.mark.parametrize("fmt", FORMATS)
def test_amax_floor_and_block_maximum(fmt: str) -> None:
    """An all-zero block takes the floor; a block holding +-qmax scales exactly by 1 (or to 2^0)."""
    x = torch.zeros(64, 64)
    x[40, 50] = -QMAX[fmt]
    for round_sf in (False, True):
        sf, q_scale = block_scales(x, fmt, (32, 32), round_sf)
        floor_sf = torch.tensor([AMAX_FLOOR[fmt]]) / torch.tensor([QMAX[fmt]])
        if round_sf:
            floor_sf = round_sf_up(floor_sf)
        for i, j in itertools.product(range(2), range(2)):
            if (i, j) == (1, 1):
                assert sf[i, j].item() == 1.0 and q_scale[i, j].item() == 1.0
            else:
                assert sf[i, j].view(torch.int32).item() == floor_sf.view(torch.int32).item()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block_size", BLOCKS, ids=str)
def test_precomputed_power_of_two_scales_reproduce_the_cast(block_size: tuple[int, int], fmt: str) -> None:
    """With round_sf scales (powers of two) 1 / sf is exact, so the precomputed form equals the full cast."""
    x = random_rows(161, 256)
    q, sf = per_block_cast_ref(x, fmt, block_size, round_sf=True)
    q2 = per_block_cast_with_precomputed_sf_ref(x, fmt, block_size, sf)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8))


def test_precomputed_scales_divide() -> None:
    """q = x * (1 / sf): with sf = 0.5 everywhere the codes are those of 2x."""
    x = random_rows(40, 128, torch.float32)
    sf = torch.full((2, 4), 0.5)
    q = per_block_cast_with_precomputed_sf_ref(x, "e4m3", (32, 32), sf)
    assert torch.equal(q.view(torch.uint8), torch.clamp(2 * x, -448, 448).to(torch.float8_e4m3fn).view(torch.uint8))
    with pytest.raises(ValueError, match="sf must have shape"):
        per_block_cast_with_precomputed_sf_ref(x, "e4m3", (32, 32), sf[:1])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block_size", [(32, 128), (128, 128)], ids=str)
def test_partial_last_channel_block(block_size: tuple[int, int], fmt: str) -> None:
    """hidden 576 = 4.5 blocks of 128: the last block of a row holds 64 channels, its scale their amax alone, and
    the cast of x equals the casts of its whole blocks and of the 64-channel remainder side by side."""
    x = random_rows(block_size[0] + 7, 576)
    x[:, 512:] *= 1e-3  # the remainder far smaller than the rest: any absent channel counted would show
    q, sf = per_block_cast_ref(x, fmt, block_size)
    assert sf.shape == (2, 5)
    head_q, head_sf = per_block_cast_ref(x[:, :512], fmt, block_size)
    tail_q, tail_sf = per_block_cast_ref(x[:, 512:], fmt, (block_size[0], 64))
    assert torch.equal(sf.view(torch.int32), torch.cat([head_sf, tail_sf], dim=1).view(torch.int32))
    assert torch.equal(q.view(torch.uint8), torch.cat([head_q, tail_q], dim=1).view(torch.uint8))
    assert per_block_dequant(q, sf, fmt, block_size).shape == x.shape
