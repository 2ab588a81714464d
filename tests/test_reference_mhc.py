"""CPU tests of the plain-torch mHC expand and Sinkhorn references (tests/reference/mhc.py).

The GPU tests compare the kernels against these, so they are pinned here against independent
formulations: the expand backward against torch autograd of the copy (the same fp32 sum for
mhc_mult streams), the step-by-step Sinkhorn backward against autograd in float64 and float32,
and the forward against the doubly stochastic limit it approaches.
"""

from __future__ import annotations

import pytest
import torch

from tests.reference.mhc import (
    expand_to_mhc_bwd_ref,
    expand_to_mhc_ref,
    sinkhorn_normalize_bwd_autograd,
    sinkhorn_normalize_bwd_ref,
    sinkhorn_normalize_ref,
)


@pytest.mark.parametrize("shape", [(3, 1280), (2, 5, 64), (0, 16)])
@pytest.mark.parametrize("mhc_mult", [1, 2, 4, 8])
def test_expand_copies_and_its_backward_is_the_autograd_sum(shape: tuple[int, ...], mhc_mult: int) -> None:
    gen = torch.Generator().manual_seed(mhc_mult)
    x = torch.randn(shape, generator=gen).to(torch.bfloat16)
    out = expand_to_mhc_ref(x, mhc_mult)
    assert out.shape == (*shape[:-1], mhc_mult, shape[-1]) and out.is_contiguous()
    for j in range(mhc_mult):
        assert torch.equal(out[..., j, :], x)
    g = torch.randn(out.shape, generator=gen).to(torch.bfloat16)
    want = g.double().sum(-2)  # exact for bf16 addends of m <= 8 in float64
    got = expand_to_mhc_bwd_ref(g)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    # One fp32 rounding per add, then one bf16 rounding: within 1 bf16 ulp of the exact sum.
    torch.testing.assert_close(got.double(), want, rtol=2 ** -7, atol=1e-30)
    leaf = x.float().requires_grad_()
    expand_to_mhc_ref(leaf, mhc_mult).backward(g.float())
    assert leaf.grad is not None
    torch.testing.assert_close(got.float(), leaf.grad.to(torch.bfloat16).float(), rtol=2 ** -7, atol=0)


def test_expand_backward_sums_from_positive_zero_in_index_order() -> None:
    # -0 + -0 from +0.0 is +0; 256 + 1 + 1 is 258 in fp32 (0x4381 in bf16), where bf16 adds would stay at 256.
    g = torch.tensor([[[-0.0], [-0.0], [-0.0]], [[1.0], [-1.0], [0.0]], [[2.0 ** 8], [1.0], [1.0]]],
                     dtype=torch.bfloat16)
    got = expand_to_mhc_bwd_ref(g)
    assert torch.equal(got.view(torch.int16), torch.tensor([[0], [0], [0x4381]], dtype=torch.int16))


@pytest.mark.parametrize("repeat", [1, 2, 10])
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_sinkhorn_backward_matches_autograd(repeat: int, eps: float) -> None:
    gen = torch.Generator().manual_seed(repeat)
    x = torch.randn(7, 3, 4, 4, generator=gen, dtype=torch.float64)
    g = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(sinkhorn_normalize_bwd_ref(g, x, repeat, eps),
                               sinkhorn_normalize_bwd_autograd(g, x, repeat, eps), rtol=1e-12, atol=1e-12)
    x32, g32 = x.float(), g.float()
    torch.testing.assert_close(sinkhorn_normalize_bwd_ref(g32, x32, repeat, eps),
                               sinkhorn_normalize_bwd_autograd(g32, x32, repeat, eps), rtol=1e-5, atol=1e-5)


def test_sinkhorn_approaches_doubly_stochastic() -> None:
    x = torch.randn(64, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = sinkhorn_normalize_ref(x, repeat=200, eps=0.0)
    torch.testing.assert_close(y.sum(-1), torch.ones(64, 4, dtype=torch.float64), rtol=0, atol=1e-9)
    torch.testing.assert_close(y.sum(-2), torch.ones(64, 4, dtype=torch.float64), rtol=0, atol=1e-12)
    assert (sinkhorn_normalize_ref(x, repeat=1) > 0).all()
