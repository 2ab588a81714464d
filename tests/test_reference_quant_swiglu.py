"""CPU tests of the fused SwiGLU + cast references (tests/reference/quant_swiglu.py).

The GPU tests compare the kernels against these references, so they are pinned here against
hand-computed values, float64 autograd (for the backward formulas) and the per-token cast.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.reference.quant import per_token_cast_ref
from tests.reference.quant_swiglu import (
    expert_major_routing,
    row_weights,
    swiglu,
    swiglu_backward_ref,
    swiglu_forward_and_per_channel_cast_and_transpose_ref,
    swiglu_forward_and_per_token_cast_ref,
    swiglu_forward_ref,
)


def _silu(v: float) -> float:
    return v / (1 + math.exp(-v))


def test_swiglu_hand_computed() -> None:
    x = torch.tensor([[2.0, 0.0, -100.0, 5.0, 3.0, 4.0, 1.0, -7.0]], dtype=torch.bfloat16)
    y = swiglu(x, None)
    expected = [_silu(2.0) * 3.0, 0.0, _silu(-100.0) * 1.0, _silu(5.0) * -7.0]
    assert torch.allclose(y.double(), torch.tensor([expected], dtype=torch.float64), rtol=1e-6, atol=1e-30)
    # Clamp c = 1: xl = min(xl, 1), xr = clamp(xr, -1, 1).
    y = swiglu(x, 1.0)
    expected = [_silu(1.0) * 1.0, 0.0, _silu(-100.0) * 1.0, _silu(1.0) * -1.0]
    assert torch.allclose(y.double(), torch.tensor([expected], dtype=torch.float64), rtol=1e-6, atol=1e-30)


def test_row_weights_positions() -> None:
    w = torch.tensor([[0.5, 2.0], [3.0, 4.0]])
    pos = torch.tensor([3, -1, 0, 4, 1], dtype=torch.int32)  # 4 is out of range (T * K = 4)
    got = row_weights(5, pos, w, torch.device("cpu")).flatten().tolist()
    assert got == [4.0, 0.0, 0.5, 0.0, 2.0]
    assert row_weights(3, None, None, torch.device("cpu")).flatten().tolist() == [1.0, 1.0, 1.0]


def test_forward_weights_scale_rows() -> None:
    x = torch.randn(3, 256).bfloat16()
    pos = torch.tensor([1, -1, 0], dtype=torch.int32)
    w = torch.tensor([[0.25, -2.0]])
    y = swiglu_forward_ref(x, pos, w)
    plain = swiglu(x, None)
    assert torch.equal(y[0], plain[0] * -2.0) and torch.equal(y[2], plain[2] * 0.25)
    assert torch.equal(y[1], torch.zeros(128))


@pytest.mark.parametrize("npc", [128, 256])
@pytest.mark.parametrize("round_sf", [False, True])
def test_forward_cast_is_the_per_token_cast_of_y(npc: int, round_sf: bool) -> None:
    x = torch.randn(7, 512).bfloat16()
    q, sf = swiglu_forward_and_per_token_cast_ref(x, npc, round_sf=round_sf, clamp=0.5)
    ref_q, ref_sf = per_token_cast_ref(swiglu(x, 0.5), "e4m3", npc, round_sf)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(sf, ref_sf)
    assert sf.shape == (7, 256 // npc)


def test_forward_cast_of_a_constant_group() -> None:
    # xl = 2 and xr = 3 everywhere: y = silu(2) * 3 in every channel, so every code is +448
    # and sf = y / 448 (IEEE division).
    x = torch.cat([torch.full((1, 128), 2.0), torch.full((1, 128), 3.0)], dim=1).bfloat16()
    q, sf = swiglu_forward_and_per_token_cast_ref(x, 128)
    y = torch.tensor(2.0) / (1 + torch.exp(torch.tensor(-2.0))) * 3.0
    assert torch.equal(q.float(), torch.full((1, 128), 448.0))
    assert torch.equal(sf, (y / torch.tensor(448.0)).reshape(1, 1))


def _backward_inputs(rows: int, hidden: int, npc: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    xq, x_sf = per_token_cast_ref(torch.randn(rows, 2 * hidden) * 2, "e4m3", npc)
    grad_out = torch.randn(rows, hidden).bfloat16()
    weight = torch.rand(2, 3)
    pos = torch.tensor([4, 0, -1, 2, 5, 1][:rows], dtype=torch.int32)
    token_topk_to_pos = torch.full((2, 3), -1, dtype=torch.int32)
    for row, p in enumerate(pos.tolist()):
        if p >= 0:
            token_topk_to_pos.view(-1)[p] = row
    return xq, x_sf, grad_out, weight, pos, token_topk_to_pos


@pytest.mark.parametrize("clamp", [None, 0.5])
def test_backward_matches_float64_autograd(clamp: float | None) -> None:
    hidden, npc = 256, 32
    xq, x_sf, grad_out, weight, pos, ttp = _backward_inputs(6, hidden, npc)
    out, (q, q_sf), x_grad, weight_grad, grad = swiglu_backward_ref(
        xq, x_sf, grad_out, weight, pos, ttp, npc, clamp=clamp)

    full = (xq.double() * x_sf.double().repeat_interleave(npc, dim=1)).requires_grad_(True)
    w = weight.double().requires_grad_(True)
    row_w = torch.zeros(6, 1, dtype=torch.float64)
    row_w = row_w.index_put((torch.nonzero(pos >= 0).flatten(),), w.reshape(-1)[pos[pos >= 0].long()].unsqueeze(1))
    left, right = full[:, :hidden], full[:, hidden:]
    if clamp is not None:
        left, right = torch.clamp(left, max=clamp), torch.clamp(right, -clamp, clamp)
    act = torch.nn.functional.silu(left) * right
    (act * row_w * grad_out.double()).sum().backward()

    assert torch.allclose(grad.double(), full.grad, rtol=1e-5, atol=1e-6)
    assert torch.allclose(weight_grad.double(), w.grad, rtol=1e-5, atol=1e-5)
    assert torch.allclose(out.double(), (act * row_w).detach(), rtol=1e-2, atol=1e-6)
    assert torch.equal(x_grad, grad.bfloat16())
    # The padding row (pos -1) has weight 0: zero activation and gradient.
    assert torch.equal(out[2].float(), torch.zeros(hidden)) and torch.equal(grad[2], torch.zeros(2 * hidden))
    # Pairs without a row (token_topk_to_pos -1) get 0.
    assert weight_grad.view(-1)[3] == 0
    ref_q, ref_sf = per_token_cast_ref(grad, "e4m3", npc)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(q_sf, ref_sf)


def test_backward_clamped_elements_get_zero_gradient() -> None:
    hidden, npc = 128, 128
    xq, x_sf, grad_out, weight, pos, ttp = _backward_inputs(2, hidden, npc)
    *_, grad = swiglu_backward_ref(xq, x_sf, grad_out, weight, pos, ttp, npc, clamp=0.25)
    full = xq.float() * x_sf.repeat_interleave(npc, dim=1)
    assert bool((grad[:, :hidden][full[:, :hidden] > 0.25] == 0).all())
    assert bool((grad[:, hidden:][full[:, hidden:].abs() > 0.25] == 0).all())
    assert bool((grad[:, :hidden][full[:, :hidden] < 0.2] != 0).any())


@pytest.mark.parametrize("npt", [32, 128])
@pytest.mark.parametrize("round_sf", [False, True])
def test_per_channel_cast_hand_and_transpose(npt: int, round_sf: bool) -> None:
    x = torch.randn(256, 128).bfloat16()
    q_t, sf = swiglu_forward_and_per_channel_cast_and_transpose_ref(x, npt, round_sf, clamp=10.0)
    q, sf2 = swiglu_forward_and_per_channel_cast_and_transpose_ref(x, npt, round_sf, without_transpose=True,
                                                                   clamp=10.0)
    assert q_t.shape == (64, 256) and q.shape == (256, 64) and sf.shape == (256 // npt, 64)
    assert torch.equal(q_t.view(torch.uint8), q.t().contiguous().view(torch.uint8)) and torch.equal(sf, sf2)
    # The scale of channel j, token group b is the max |bf16 activation| of the group / 448.
    act = swiglu(x, 10.0).bfloat16().float()
    amax = act.abs().reshape(256 // npt, npt, 64).amax(dim=1).clamp(min=1e-4)
    expected = amax / torch.full_like(amax, 448.0)
    if round_sf:
        expected = ((expected.view(torch.int32) + 0x7FFFFF) & 0x7F800000).view(torch.float32)
    assert torch.equal(sf, expected)
    # The largest element of a group quantizes to 448 (without round_sf).
    if not round_sf:
        assert bool((q.float().abs().reshape(256 // npt, npt, 64).amax(dim=1) == 448).all())


@pytest.mark.parametrize(("num_tokens", "num_topk"), [(0, 2), (1, 6), (37, 2)])
def test_expert_major_routing_is_consistent(num_tokens: int, num_topk: int) -> None:
    p2e, p2t, t2p = expert_major_routing(num_tokens, num_topk, alignment=16, device="cpu")
    rows = p2e.shape[0]
    assert rows % 16 == 0 and p2t.shape == (rows,) and t2p.shape == (num_tokens, num_topk)
    # Every (token, k) pair owns exactly one row, and the two maps invert each other.
    assert bool((t2p >= 0).all())
    assert torch.equal(p2t[t2p.reshape(-1).long()], torch.arange(num_tokens * num_topk, dtype=torch.int32))
    assert int((p2t >= 0).sum()) == num_tokens * num_topk and torch.equal(p2t < 0, p2e < 0)
    # Expert-major: the experts of the real rows never decrease, and a token's k experts differ.
    real = p2e[p2e >= 0]
    assert bool((real[1:] >= real[:-1]).all())
    experts_of_token = p2e[t2p.long()]
    assert all(len(set(row.tolist())) == num_topk for row in experts_of_token)

