"""CPU tests of the plain-torch Engram references (tests/reference/engram.py).

The GPU tests compare the kernels bit for bit against these references, so they are pinned here
against independent formulations: Python integers for the hash (wrap-around products, XOR, floor
modulo), a float64 sum for fused_weight's exactness, and the summation order of grad_w_reduce
written out by hand on small cases (P below, at and above the slice count).
"""

from __future__ import annotations

import random

import pytest
import torch

from tests.reference.engram import (
    GRAD_W_SLICES,
    calc_diff,
    engram_hash_ref,
    fused_weight_ref,
    grad_w_reduce_ref,
    grad_w_reduce_torch_ref,
    make_offsets,
    slice_sum,
)


def wrap64(x: int) -> int:
    return (x + 2**63) % 2**64 - 2**63


def wrap32(x: int) -> int:
    return (x + 2**31) % 2**32 - 2**31


def hash_by_hand(ids: list[list[int]], mult: list[list[int]], vocab: list[list[list[int]]],
                 offsets: list[list[int]]) -> list[list[list[int]]]:
    """The hash with Python integers: exact products wrapped to int64, Python's floor %."""
    out = []
    for layer, m in enumerate(mult):
        rows = []
        for token in ids:
            h, row = 0, []
            for i, (t, k) in enumerate(zip(token, m)):
                h = wrap64(h ^ wrap64(t * k))
                if i > 0:
                    tables = vocab[layer][i - 1]
                    row += [wrap32(h % v + offsets[layer][(i - 1) * len(tables) + j]) for j, v in enumerate(tables)]
            rows.append(row)
        out.append(rows)
    return out


@pytest.mark.parametrize(("n", "tables", "layers"), [(2, 1, 1), (3, 8, 2), (4, 2, 3), (3, 16, 1)])
def test_hash_matches_python_integers_with_overflow_and_negative_divisors(n: int, tables: int, layers: int) -> None:
    rng = random.Random(n * 100 + tables)
    ids = [[rng.choice([0, 1, -1, 2**31 - 1, -(2**31), rng.randrange(-(2**31), 2**31)]) for _ in range(n)]
           for _ in range(37)]
    # Multipliers that overflow the product (and wrap negative), negative ones, small ones.
    mult = [[rng.choice([rng.randrange(-(2**63), 2**63), 2**63 - 1, -(2**63), rng.randrange(1, 100000)])
             for _ in range(n)] for _ in range(layers)]
    vocab = [[[rng.choice([rng.randrange(1, 2**31), -rng.randrange(1, 2**31), 1, 2**31 - 1, -(2**31)])
               for _ in range(tables)] for _ in range(n - 1)] for _ in range(layers)]
    offsets = [[rng.randrange(-(2**31), 2**31) for _ in range((n - 1) * tables)] for _ in range(layers)]
    got = engram_hash_ref(torch.tensor(ids, dtype=torch.int32), torch.tensor(mult, dtype=torch.int64),
                          torch.tensor(vocab, dtype=torch.int32), torch.tensor(offsets, dtype=torch.int32))
    assert got.dtype == torch.int32 and got.shape == (layers, 37, (n - 1) * tables)
    assert got.tolist() == hash_by_hand(ids, mult, vocab, offsets)


def test_hash_of_no_tokens_is_empty() -> None:
    vocab = torch.full((2, 2, 8), 1000, dtype=torch.int32)
    got = engram_hash_ref(torch.zeros(0, 3, dtype=torch.int32), torch.ones(2, 3, dtype=torch.int64), vocab,
                          make_offsets(vocab))
    assert got.shape == (2, 0, 16) and got.dtype == torch.int32


def test_offsets_are_exclusive_prefix_sums_per_layer() -> None:
    vocab = torch.tensor([[[3, 5], [7, 11]], [[1, 2], [4, 8]]], dtype=torch.int32)
    assert make_offsets(vocab).tolist() == [[0, 3, 8, 15], [0, 1, 3, 7]]
    assert make_offsets(vocab).dtype == torch.int32


def test_fused_weight_is_exact() -> None:
    g = torch.Generator().manual_seed(0)
    wh = (torch.randn(4, 1000, generator=g) * 100).bfloat16()
    we = (torch.randn(4, 1000, generator=g) * 100).bfloat16()
    got = fused_weight_ref(wh, we)
    assert got.dtype == torch.float32
    assert torch.equal(got.double(), wh.double() * we.double())  # 16 significant bits: no rounding


def by_hand(partial: torch.Tensor) -> torch.Tensor:
    """The slice order spelled out with Python floats rounded to fp32 after every add."""
    def f32(x: float) -> float:
        return torch.tensor(x, dtype=torch.float32).item()

    p = partial.shape[0]
    rows = -(-p // GRAD_W_SLICES)
    flat = partial.reshape(p, -1).tolist()
    out = []
    for c in range(len(flat[0])):
        total = None
        for k in range(GRAD_W_SLICES):
            s = 0.0
            for r in range(k * rows, min((k + 1) * rows, p)):
                s = f32(s + flat[r][c])
            total = s if total is None else f32(total + s)
        out.append(total)
    return torch.tensor(out, dtype=torch.float32).reshape(partial.shape[1:])


@pytest.mark.parametrize("num_partials", [1, 3, 4, 7, 9, 132])
def test_slice_sum_follows_the_kernel_order(num_partials: int) -> None:
    g = torch.Generator().manual_seed(num_partials)
    # Magnitudes 2^-20..2^20: fp32 sums whose value depends on the order.
    partial = torch.randn(num_partials, 2, 5, generator=g) * torch.pow(2.0, torch.randint(-20, 21, (num_partials, 2, 5),
                                                                                          generator=g).float())
    assert torch.equal(slice_sum(partial), by_hand(partial))


def test_slice_sum_where_the_order_decides() -> None:
    # 1 + 2^-24 + 2^-24 + ...: the value depends on the order, here the kernel's.
    partial = torch.tensor([1.0] + [2.0**-24] * 7).reshape(8, 1, 1)
    # Slices of 2 rows: (1 + 2^-24) rounds to 1, (2^-24 + 2^-24) = 2^-23 three times: 1 + 3 * 2^-23.
    assert slice_sum(partial).item() == 1 + 3 * 2.0**-23


def test_grad_w_reduce_ref_rounds_the_product_before_the_add() -> None:
    g = torch.Generator().manual_seed(1)
    partial = torch.randn(7, 2, 64, generator=g)
    wh, we = torch.randn(2, 64, generator=g).bfloat16(), torch.randn(2, 64, generator=g).bfloat16()
    gh, ge = torch.randn(2, 64, generator=g), torch.randn(2, 64, generator=g)
    want_h, want_e = gh.clone(), ge.clone()
    s = slice_sum(partial)
    want_h = want_h + (s * we.float())
    want_e = want_e + (s * wh.float())
    grad_w_reduce_ref(partial, wh, we, gh, ge)
    assert torch.equal(gh, want_h) and torch.equal(ge, want_e)
    # TileKernels' form differs only in the sum order: far inside its tolerance.
    th, te = torch.zeros(2, 64), torch.zeros(2, 64)
    grad_w_reduce_torch_ref(partial, wh, we, th, te)
    rh, re = torch.zeros(2, 64), torch.zeros(2, 64)
    grad_w_reduce_ref(partial, wh, we, rh, re)
    assert calc_diff(th, rh) < 1e-10 and calc_diff(te, re) < 1e-10


def test_grad_w_reduce_ref_without_partials_adds_nothing() -> None:
    gh = torch.tensor([[-0.0, 1.0]])
    ge = torch.tensor([[2.0, -0.0]])
    w = torch.tensor([[float("inf"), 1.0]]).bfloat16()
    grad_w_reduce_ref(torch.zeros(0, 1, 2), w, w, gh, ge)
    assert torch.equal(gh.view(torch.int32), torch.tensor([[-0.0, 1.0]]).view(torch.int32))  # -0.0 kept
    assert torch.equal(ge.view(torch.int32), torch.tensor([[2.0, -0.0]]).view(torch.int32))


def test_calc_diff() -> None:
    x = torch.randn(100)
    assert calc_diff(x, x) == pytest.approx(0.0, abs=1e-15)
    assert calc_diff(x, -x) == pytest.approx(2.0)
    assert calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
