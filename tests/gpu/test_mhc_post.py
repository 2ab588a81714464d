"""GPU tests of ``tile_kernels_aot.mhc``'s mhc_post_fwd / mhc_post_bwd and of
``tile_kernels_aot.modeling.mhc.ops.mhc_post`` against tests/reference/mhc_post.py.

Tolerances are TileKernels 1.0.0's (tests/mhc/test_post.py): torch's bf16 defaults for the output and the
bf16 gradients of x and residual, rtol / atol 1e-4 for the fp32 gradients of post_layer_mix and comb_res_mix.
The output and the bf16 gradients are also compared bit for bit with the kernels' formulas (the same fp32
roundings in the same order; torch's separate elementwise ops do not fuse into FMAs). Inputs randn as there;
token counts 0, 1, 13 and TileKernels' 4096 x {1, 2}; hidden as TileKernels' tests (1280, 2560, 7168) plus
one that is not a multiple of 8 (the vec-1 variant). Outputs come from a poisoned caching allocator
(tests/gpu/poison.py).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.gpu.poison import poison_allocator
from tests.reference import mhc_post as ref
from tests.reference.mhc_mix import autograd

tile_kernels_aot, _, errors, runtime = installed_package()
mhc = importlib.import_module("tile_kernels_aot.mhc")
modeling_ops = importlib.import_module("tile_kernels_aot.modeling.mhc.ops")

pytestmark = pytest.mark.gpu

SHAPES = [(1, 0), (1, 1), (1, 13), (1, 4096), (2, 4096)]
EXACT = {"rtol": 0.0, "atol": 0.0}
FP32_GRAD = {"rtol": 1e-4, "atol": 1e-4}


def _data(n0: int, n1: int, h: int) -> tuple[torch.Tensor, ...]:
    m = 4
    return (torch.randn(n0, n1, h, dtype=torch.bfloat16, device="cuda"),
            torch.randn(n0, n1, m, h, dtype=torch.bfloat16, device="cuda"),
            torch.randn(n0, n1, m, 1, device="cuda"),
            torch.randn(n0, n1, m, m, device="cuda"),
            torch.randn(n0, n1, m, h, dtype=torch.bfloat16, device="cuda"))


@pytest.mark.parametrize("hidden", [1280, 2560, 7168, 1283])
@pytest.mark.parametrize(("n0", "n1"), SHAPES)
def test_mhc_post_ops(n0: int, n1: int, hidden: int) -> None:
    x, residual, post, comb, d_o = _data(n0, n1, hidden)
    poison_allocator()
    out = mhc.mhc_post_fwd(x, residual, post, comb)
    torch.testing.assert_close(out, ref.post_ref(x, residual, post, comb))
    torch.testing.assert_close(out, ref.post_fwd_formula(x, residual, post, comb), **EXACT)
    want = autograd(ref.post_ref, (x, residual, post, comb), (d_o,))
    formula = ref.post_bwd_formula(x, residual, post, comb, d_o)
    poison_allocator()
    got = mhc.mhc_post_bwd(x, residual, post, comb, d_o)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], **FP32_GRAD)
    torch.testing.assert_close(got[3], want[3], **FP32_GRAD)
    torch.testing.assert_close(got[0], formula[0], **EXACT)
    torch.testing.assert_close(got[1], formula[1], **EXACT)


@pytest.mark.parametrize("hidden", [1280, 7168])
def test_mhc_post_fwd_writes_out(hidden: int) -> None:
    x, residual, post, comb, _ = _data(1, 13, hidden)
    given = torch.full_like(residual, float("nan"))
    assert mhc.mhc_post_fwd(x, residual, post, comb, out=given) is given
    torch.testing.assert_close(given, ref.post_fwd_formula(x, residual, post, comb), **EXACT)


@pytest.mark.parametrize("hidden", [1280, 2560, 7168])
@pytest.mark.parametrize("n0", [1, 2])
def test_mhc_post_autograd_as_tilekernels_tests_it(n0: int, hidden: int) -> None:
    """TileKernels' test_mhc_post_comprehensive: mhc_post against mhc_post_ref, both through autograd."""
    x, residual, post, comb, d_o = _data(n0, 4096, hidden)

    def run(fn: object) -> tuple[torch.Tensor, ...]:
        leaves = [t.clone().requires_grad_() for t in (x, residual, post, comb)]
        out = fn(*leaves)  # type: ignore[operator]
        torch.autograd.backward([out], [d_o])
        return (out, *(t.grad for t in leaves))

    poison_allocator()
    got, want = run(modeling_ops.mhc_post), run(ref.post_ref)
    for a, b, tol in zip(got, want, ({}, {}, {}, FP32_GRAD, FP32_GRAD), strict=True):
        torch.testing.assert_close(a, b, **tol)


def test_mhc_post_bwd_leaves_the_residual_gradient_for_pre_apply_mix() -> None:
    """fuse_grad_acc: the residual's gradient on its storage, which mhc_pre_apply_mix's backward adds to."""
    x, residual, post, comb, d_o = _data(1, 13, 1280)
    grads = modeling_ops.mhc_post_bwd(x, residual, post, comb, d_o)
    assert residual.untyped_storage().grad_from_mhc_post is grads[1]  # type: ignore[attr-defined]
    fresh = residual.clone()
    modeling_ops.mhc_post_bwd(x, fresh, post, comb, d_o, fuse_grad_acc=False)
    assert not hasattr(fresh.untyped_storage(), "grad_from_mhc_post")
