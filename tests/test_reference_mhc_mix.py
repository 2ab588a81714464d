"""CPU checks of tests/reference/mhc_mix.py: the kernels' backward formulas agree with torch autograd
of TileKernels' references, within TileKernels' test tolerances (rtol 1e-5 / atol 2e-5 for the split,
1e-4 / 1e-5 for the head, 1e-3 / 1e-2 for the apply)."""

from __future__ import annotations

import pytest
import torch

from tests.reference import mhc_mix as ref


@pytest.mark.parametrize(("n0", "n1"), [(1, 1), (2, 13), (1, 1024)])
def test_split_backward_formula_is_autograd(n0: int, n1: int) -> None:
    g = torch.Generator().manual_seed(n0 * 7 + n1)
    m = 4
    x, scale, base = (torch.randn(s, generator=g) for s in ((n0, n1, 24), (3,), (24,)))
    grads = tuple(torch.randn(s, generator=g) for s in ((n0, n1, m, 1), (n0, n1, m, 1), (n0, n1, m, m)))
    want = ref.autograd(ref.pre_split_mixes_ref, (x, scale, base), grads, m, 2.0, 1e-2)
    got = ref.pre_split_mixes_bwd_formula(*grads, x, scale, base, m, 2.0)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize(("n0", "n1"), [(1, 1), (2, 13), (1, 1024)])
def test_head_backward_formula_is_autograd(n0: int, n1: int) -> None:
    g = torch.Generator().manual_seed(n0 * 5 + n1)
    x, scale, base, grad = (torch.randn(s, generator=g) for s in ((n0, n1, 4), (1,), (4,), (n0, n1, 4)))
    want = ref.autograd(ref.head_compute_mix_ref, (x, scale, base), (grad,), 1e-2)
    got = ref.head_compute_mix_bwd_formula(grad, x, scale, base)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hidden", [1280, 2560, 7680])
def test_apply_backward_formula_is_autograd(hidden: int) -> None:
    g = torch.Generator().manual_seed(hidden)
    x = torch.randn(1, 3, 4, hidden, generator=g).bfloat16().sigmoid()
    mix = torch.randn(1, 3, 4, 1, generator=g).softmax(-2)
    o_grad = torch.randn(1, 3, hidden, generator=g).bfloat16()
    want = ref.autograd(ref.pre_apply_mix_ref, (x, mix), (o_grad,))
    got = ref.pre_apply_mix_bwd_formula(o_grad, x, mix)
    torch.testing.assert_close(got[0], want[0], rtol=1e-3, atol=1e-2)
    torch.testing.assert_close(got[1], want[1], rtol=1e-3, atol=1e-2)
