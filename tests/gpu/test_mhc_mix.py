"""GPU tests of ``tile_kernels_aot.mhc``'s mix ops against tests/reference/mhc_mix.py.

Tolerances are TileKernels 1.0.0's (tests/mhc): pre_split_mixes rtol 1e-5 / atol 2e-5 (forward and
backward), head_compute_mix rtol 1e-4 / atol 1e-5, pre_apply_mix rtol 1e-3 / atol 1e-2. Token counts
0, 1, 13 and TileKernels' 1024 x {1, 2}; hidden as TileKernels' tests (1280, 2560, 7680) plus one that is
not a multiple of 8. Outputs come from a poisoned caching allocator (tests/gpu/poison.py).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.gpu.poison import poison_allocator
from tests.reference import mhc_mix as ref

tile_kernels_aot, _, errors, runtime = installed_package()
mhc = importlib.import_module("tile_kernels_aot.mhc")

pytestmark = pytest.mark.gpu

SHAPES = [(1, 0), (1, 1), (1, 13), (2, 1024), (1, 4096)]


@pytest.mark.parametrize(("n0", "n1"), SHAPES)
def test_pre_split_mixes(n0: int, n1: int) -> None:
    m = 4
    x = torch.randn(n0, n1, 24, device="cuda")
    scale, base = torch.randn(3, device="cuda"), torch.randn(24, device="cuda")
    grads = tuple(torch.randn(n0, n1, m, k, device="cuda") for k in (1, 1, m))
    poison_allocator()
    got = mhc.mhc_pre_split_mixes(x, scale, base, m, 2.0, 1e-2)
    for a, b in zip(got, ref.pre_split_mixes_ref(x, scale, base, m, 2.0, 1e-2), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5)
    want = ref.autograd(ref.pre_split_mixes_ref, (x, scale, base), grads, m, 2.0, 1e-2)
    poison_allocator()
    got = mhc.mhc_pre_split_mixes_bwd(*grads, x, scale, base, m, 2.0)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b if b is not None else torch.zeros_like(a), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize(("n0", "n1"), SHAPES)
def test_head_compute_mix(n0: int, n1: int) -> None:
    x = torch.randn(n0, n1, 4, device="cuda")
    scale, base, grad = torch.randn(1, device="cuda"), torch.randn(4, device="cuda"), torch.randn_like(x)
    poison_allocator()
    torch.testing.assert_close(mhc.mhc_head_compute_mix(x, scale, base, 1e-2),
                               ref.head_compute_mix_ref(x, scale, base, 1e-2), rtol=1e-4, atol=1e-5)
    want = ref.autograd(ref.head_compute_mix_ref, (x, scale, base), (grad,), 1e-2)
    poison_allocator()
    for a, b in zip(mhc.mhc_head_compute_mix_bwd(grad, x, scale, base), want, strict=True):
        torch.testing.assert_close(a, b if b is not None else torch.zeros_like(a), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hidden", [1280, 2560, 7680, 1284])
@pytest.mark.parametrize(("n0", "n1"), SHAPES)
def test_pre_apply_mix(n0: int, n1: int, hidden: int) -> None:
    x = torch.randn(n0, n1, 4, hidden, dtype=torch.bfloat16, device="cuda").sigmoid()
    mix = torch.randn(n0, n1, 4, 1, device="cuda").softmax(-2)
    o_grad = torch.randn(n0, n1, hidden, dtype=torch.bfloat16, device="cuda")
    poison_allocator()
    torch.testing.assert_close(mhc.mhc_pre_apply_mix(x, mix), ref.pre_apply_mix_ref(x, mix), rtol=1e-3, atol=1e-2)
    want = ref.autograd(ref.pre_apply_mix_ref, (x, mix), (o_grad,))
    poison_allocator()
    x_grad, mix_grad = mhc.mhc_pre_apply_mix_bwd(o_grad, x, mix)
    torch.testing.assert_close(x_grad, want[0], rtol=1e-3, atol=1e-2)
    torch.testing.assert_close(mix_grad, want[1], rtol=1e-3, atol=1e-2)
    acc = torch.randn_like(x)
    x_grad, _ = mhc.mhc_pre_apply_mix_bwd(o_grad, x, mix, acc)
    torch.testing.assert_close(x_grad, ref.pre_apply_mix_bwd_formula(o_grad, x, mix, acc)[0], rtol=1e-3, atol=1e-2)
