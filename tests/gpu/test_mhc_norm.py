"""GPU tests of ``tile_kernels_aot.mhc``'s mhc_pre_norm_fn / _fwd / _bwd and of
``tile_kernels_aot.modeling.mhc.ops.mhc_pre_norm_fn`` against tests/reference/mhc_norm.py.

Tolerances: TileKernels 1.0.0's (tests/mhc/test_norm_fn.py) against its reference with TF32 matmuls allowed,
as there: atol = rtol = 1e-3 for the mixes, torch's bf16 defaults for the residual's gradient, atol 3e-2 /
rtol 1e-3 for fn's; the RMSNorm weight's gradient, which TileKernels does not test, atol = rtol = 1e-3.
Against the kernels' own formula (the same TF32 roundings, float64 sums): the TF32 weights bit for bit, the
mixes, dots and sums of squares within fp32 summation error (rtol 1e-4, atol 1e-5; the GEMM sums 4 * hidden
terms), the residual's gradient within one bf16 rounding (torch's bf16 defaults) and fn's within rtol 1e-4 /
atol 1e-2 (sums over 4001 tokens of terms near 1, the formula's og from the kernels' own sums of squares: an
rsqrt one ulp apart still moves an og across a TF32 rounding step now and then, 2^-10 of a term). Inputs from TileKernels' data generator; token
counts 0, 1, 13, 4001 and TileKernels' 4096 / 8192 (and 13 / 48 / 512 of its split-K test); hidden as its
tests (1280, 2560, 4096, 7168) plus 1283 (K % 8 == 4: the 8-byte-vector variant). Outputs come from a
poisoned caching allocator (tests/gpu/poison.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.gpu.poison import poison_allocator
from tests.reference import mhc_norm as ref

tile_kernels_aot, _, errors, runtime = installed_package()
mhc = importlib.import_module("tile_kernels_aot.mhc")
modeling_ops = importlib.import_module("tile_kernels_aot.modeling.mhc.ops")

pytestmark = pytest.mark.gpu

TOKENS = [0, 1, 13, 4001]
HIDDENS = [1280, 2560, 7168, 1283]
MIXES = {"atol": 1e-3, "rtol": 1e-3}
FN_GRAD = {"atol": 3e-2, "rtol": 1e-3}
WEIGHT_GRAD = {"atol": 1e-3, "rtol": 1e-3}
FORMULA = {"atol": 1e-5, "rtol": 1e-4}
FORMULA_FN_GRAD = {"atol": 1e-2, "rtol": 1e-4}


def _data(n1: int, hidden: int, weighted: bool, n0: int = 1) -> tuple[torch.Tensor, ...]:
    """TileKernels' generate_norm_fn_test_data (with n0 leading rows)."""
    m = 4
    per_stream = 1 + torch.arange(m, device="cuda").mul(0.01)
    residual = (torch.randn(n0, n1, m, hidden, device="cuda") * per_stream.view(1, 1, -1, 1)).bfloat16()
    fn = (torch.randn(m * (m + 2), m, hidden, device="cuda") * 1e-4 * per_stream.view(1, -1, 1)).flatten(1, 2)
    weight = torch.randn(m * hidden, device="cuda") * 0.1 + 1.0 if weighted else None
    mixes_grad = torch.randn(n0, n1, m * (m + 2), device="cuda")
    return residual, fn, weight, mixes_grad  # type: ignore[return-value]


@pytest.fixture
def tf32_reference() -> Iterator[None]:
    """TileKernels' test computes its reference with TF32 matmuls."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_forward(num_tokens: int, hidden: int, weighted: bool, tf32_reference: None) -> None:
    residual, fn, weight, _ = _data(num_tokens, hidden, weighted)
    poison_allocator()
    mixes = mhc.mhc_pre_norm_fn(residual, fn, weight, 1e-6)
    assert mixes.shape == (1, num_tokens, 24) and mixes.dtype == torch.float32
    torch.testing.assert_close(mixes, ref.norm_fn_ref(residual, fn, weight, 1e-6), **MIXES)
    want_mixes, want_dots, want_sqrsum = ref.norm_fn_formula(residual, fn, weight, 1e-6)
    torch.testing.assert_close(mixes.view(-1, 24).double(), want_mixes, **FORMULA)
    poison_allocator()
    flat, fn_eff, dots_sum, sqrsum = mhc.mhc_pre_norm_fn_fwd(residual, fn, weight, 1e-6)
    assert torch.equal(flat.view_as(mixes), mixes)  # the same launches
    assert torch.equal(fn_eff.view(torch.int32), ref.fn_eff(fn, weight).view(torch.int32))
    torch.testing.assert_close(dots_sum.double(), want_dots, **FORMULA)
    torch.testing.assert_close(sqrsum.double(), want_sqrsum, rtol=1e-5, atol=0.0)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_backward(num_tokens: int, hidden: int, accumulate: bool) -> None:
    residual, fn, _, mixes_grad = _data(num_tokens, hidden, False)
    before = torch.randn(residual.shape, device="cuda").bfloat16() if accumulate else None
    _, fn_eff, dots_sum, sqrsum = mhc.mhc_pre_norm_fn_fwd(residual, fn, None, 1e-6)
    want_x, want_fn = ref.norm_fn_bwd_formula(mixes_grad, residual, fn, None, 1e-6, before, sqrsum)
    poison_allocator()
    x_grad, fn_grad = mhc.mhc_pre_norm_fn_bwd(mixes_grad, residual, fn_eff, dots_sum, sqrsum, 1e-6, before)
    assert x_grad.shape == (num_tokens, 4 * hidden) and x_grad.dtype == torch.bfloat16
    torch.testing.assert_close(x_grad, want_x.bfloat16())
    torch.testing.assert_close(fn_grad.double(), want_fn, **FORMULA_FN_GRAD)
    if num_tokens == 0:
        assert torch.equal(fn_grad, torch.zeros_like(fn_grad))


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("hidden", [1280, 2560, 7168])
@pytest.mark.parametrize("n1", [4096, 8192])
def test_autograd_as_tilekernels_tests_it(n1: int, hidden: int, weighted: bool) -> None:
    """TileKernels' test_correctness: mhc_pre_norm_fn against mhc_pre_norm_fn_ref, both through autograd, the
    residual's gradient accumulated into mhc_post's (zeroed) gradient tensor."""
    residual, fn, weight, mixes_grad = _data(n1, hidden, weighted)
    leaves = [residual.clone().requires_grad_(), fn.clone().requires_grad_()]
    w = None if weight is None else weight.clone().requires_grad_()
    poison_allocator()
    out = modeling_ops.mhc_pre_norm_fn(leaves[0], leaves[1], w, 1e-6)
    residual_grad = leaves[0].untyped_storage().grad_from_mhc_post = torch.zeros_like(leaves[0])
    torch.autograd.backward([out], [mixes_grad])
    assert not hasattr(leaves[0].untyped_storage(), "grad_from_mhc_post") and leaves[0].grad is None
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        want = ref.autograd_norm_fn(residual, fn, weight, 1e-6, mixes_grad)
        want_out = ref.norm_fn_ref(residual, fn, weight, 1e-6)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    torch.testing.assert_close(out, want_out, **MIXES)
    torch.testing.assert_close(residual_grad, want[0])
    torch.testing.assert_close(leaves[1].grad, want[1], **FN_GRAD)
    if w is not None:
        torch.testing.assert_close(w.grad, want[2], **WEIGHT_GRAD)


@pytest.mark.parametrize("hidden", [1280, 2560, 4096, 7168])
@pytest.mark.parametrize("n1", [13, 48, 512])
def test_split_k_as_tilekernels_tests_it(n1: int, hidden: int, tf32_reference: None) -> None:
    """TileKernels' test_split_k_correctness: n_splits=16 (the split count is the op's own choice)."""
    residual, fn, _, _ = _data(n1, hidden, False)
    poison_allocator()
    out = modeling_ops.mhc_pre_norm_fn(residual, fn, None, 1e-6, n_splits=16)
    torch.testing.assert_close(out, ref.norm_fn_ref(residual, fn, None, 1e-6), **MIXES)


@pytest.mark.parametrize("n0", [1, 2])
def test_autograd_without_fused_accumulation(n0: int) -> None:
    """fuse_grad_acc=False: the residual's gradient comes back through autograd; mhc_post's tensor is left."""
    residual, fn, _, mixes_grad = _data(13, 1280, False, n0)
    leaf = residual.clone().requires_grad_()
    out = modeling_ops.mhc_pre_norm_fn(leaf, fn, None, 1e-6, fuse_grad_acc=False)
    torch.autograd.backward([out], [mixes_grad])
    want = ref.autograd_norm_fn(residual, fn, None, 1e-6, mixes_grad)[0]
    assert leaf.grad is not None and leaf.grad.shape == residual.shape
    torch.testing.assert_close(leaf.grad, want)
