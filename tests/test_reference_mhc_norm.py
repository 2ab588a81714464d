"""CPU checks of tests/reference/mhc_norm.py: the kernels' forward and backward formulas (TF32 weights and
dots' gradient, float64 sums) agree with TileKernels' mhc_pre_norm_fn_ref and its torch autograd within
TileKernels' test tolerances (tests/mhc/test_norm_fn.py: atol = rtol = 1e-3 for the mixes, torch's bf16
defaults for the residual's gradient, atol 3e-2 / rtol 1e-3 for fn's), over its input domain (its data
generator: randn streams and weights scaled per stream, fn * 1e-4, an optional weight near 1)."""

from __future__ import annotations

import pytest
import torch

from tests.reference import mhc_norm as ref


def _data(n1: int, hidden: int, weighted: bool, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    m = 4
    per_stream = 1 + torch.arange(m).mul(0.01)
    residual = (torch.randn(1, n1, m, hidden, generator=g) * per_stream.view(1, 1, -1, 1)).bfloat16()
    fn = (torch.randn(m * (m + 2), m, hidden, generator=g) * 1e-4 * per_stream.view(1, -1, 1)).flatten(1, 2)
    weight = torch.randn(m * hidden, generator=g) * 0.1 + 1.0 if weighted else None
    mixes_grad = torch.randn(1, n1, m * (m + 2), generator=g)
    return residual, fn, weight, mixes_grad  # type: ignore[return-value]


def test_round_to_tf32_keeps_19_bits_rounding_half_away() -> None:
    x = torch.tensor([1.0, 1.0 + 2**-11, 1.0 + 2**-11 - 2**-23, -(1.0 + 2**-11), 3.0 + 2**-9])
    got = ref.round_to_tf32(x)
    assert got.tolist() == [1.0, 1.0 + 2**-10, 1.0, -(1.0 + 2**-10), 3.0 + 2**-9]
    assert bool(((got.view(torch.int32) & 0x1FFF) == 0).all())


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(("n1", "hidden"), [(1, 1280), (13, 2560), (5, 7168)])
def test_forward_formula_is_the_reference(n1: int, hidden: int, weighted: bool) -> None:
    residual, fn, weight, _ = _data(n1, hidden, weighted, n1 + hidden)
    mixes, dots, sqrsum = ref.norm_fn_formula(residual, fn, weight, 1e-6)
    want = ref.norm_fn_ref(residual, fn, weight, 1e-6)
    torch.testing.assert_close(mixes.float().view(want.shape), want, atol=1e-3, rtol=1e-3)
    assert dots.shape == (n1, 24) and sqrsum.shape == (n1,)
    torch.testing.assert_close(sqrsum, residual.double().square().sum((-1, -2)).flatten())


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(("n1", "hidden"), [(13, 1280), (64, 2560), (7, 7168)])
def test_backward_formula_is_autograd(n1: int, hidden: int, weighted: bool) -> None:
    residual, fn, weight, mixes_grad = _data(n1, hidden, weighted, 3 * n1 + hidden)
    r_grad, f_grad, w_grad = ref.autograd_norm_fn(residual, fn, weight, 1e-6, mixes_grad)
    x_grad, fn_eff_grad = ref.norm_fn_bwd_formula(mixes_grad, residual, fn, weight, 1e-6)
    assert r_grad is not None and f_grad is not None
    torch.testing.assert_close(x_grad.bfloat16().view_as(residual), r_grad)
    # The merge's chain rule, as the modeling layer applies it to the kernels' gradient of the merged weights.
    fn_grad = fn_eff_grad.float() * (1 if weight is None else weight)
    torch.testing.assert_close(fn_grad, f_grad, atol=3e-2, rtol=1e-3)
    if weight is not None:
        assert w_grad is not None
        torch.testing.assert_close((fn_eff_grad.float() * fn).sum(0), w_grad, atol=1e-3, rtol=1e-3)


def test_backward_formula_adds_the_accumulated_gradient() -> None:
    residual, fn, _, mixes_grad = _data(3, 256, False, 7)
    before = torch.randn(residual.shape).bfloat16()
    alone, _ = ref.norm_fn_bwd_formula(mixes_grad, residual, fn, None, 1e-6)
    added, _ = ref.norm_fn_bwd_formula(mixes_grad, residual, fn, None, 1e-6, before)
    torch.testing.assert_close(added, alone + before.double().reshape(alone.shape), rtol=0, atol=1e-12)
