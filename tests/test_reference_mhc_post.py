"""CPU checks of tests/reference/mhc_post.py: the kernels' forward and backward formulas agree with
TileKernels' mhc_post_ref and its torch autograd, within TileKernels' test tolerances (tests/mhc/test_post.py:
torch's bf16 defaults for the output and the bf16 gradients, rtol / atol 1e-4 for the fp32 gradients of
post_layer_mix and comb_res_mix), over its input domain (randn everywhere)."""

from __future__ import annotations

import pytest
import torch

from tests.reference import mhc_post as ref
from tests.reference.mhc_mix import autograd


def _data(n0: int, n1: int, h: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    m = 4
    x = torch.randn(n0, n1, h, generator=g).bfloat16()
    residual = torch.randn(n0, n1, m, h, generator=g).bfloat16()
    post = torch.randn(n0, n1, m, 1, generator=g)
    comb = torch.randn(n0, n1, m, m, generator=g)
    d_o = torch.randn(n0, n1, m, h, generator=g).bfloat16()
    return x, residual, post, comb, d_o


@pytest.mark.parametrize(("n0", "n1", "h"), [(1, 1, 1280), (2, 13, 2560), (1, 3, 7168), (1, 5, 1283)])
def test_forward_formula_is_the_reference(n0: int, n1: int, h: int) -> None:
    x, residual, post, comb, _ = _data(n0, n1, h, n0 * 31 + n1 + h)
    torch.testing.assert_close(ref.post_fwd_formula(x, residual, post, comb), ref.post_ref(x, residual, post, comb))


@pytest.mark.parametrize(("n0", "n1", "h"), [(1, 1, 1280), (2, 13, 2560), (1, 3, 7168), (1, 5, 1283)])
def test_backward_formula_is_autograd(n0: int, n1: int, h: int) -> None:
    x, residual, post, comb, d_o = _data(n0, n1, h, n0 * 17 + n1 + h)
    want = autograd(ref.post_ref, (x, residual, post, comb), (d_o,))
    got = ref.post_bwd_formula(x, residual, post, comb, d_o)
    assert [t.dtype for t in got] == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[3], want[3], rtol=1e-4, atol=1e-4)
