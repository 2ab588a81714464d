"""GPU tests of ``tile_kernels_aot.mhc``'s expand and Sinkhorn ops against tests/reference/mhc.py.

Tolerances: expand_to_mhc is a copy and its backward sums in the reference's order (fp32 from +0.0,
one bf16 rounding): both compared bit for bit, for every built vector width, mhc_mult 2, 4, 8,
TileKernels' hiddens (1280, 2560, 7168) plus one that needs the scalar variant, and token counts
0, 1, 13 and 4001 (with leading dimensions as TileKernels' tests pass them). sinkhorn_normalize and
its backward are held to TileKernels' test tolerance (torch.testing.assert_close's fp32 defaults,
rtol 1.3e-6, atol 1e-5) against the forward reference and torch autograd through it: the kernel's
sums and expf may round differently from torch's.

Outputs come from a poisoned caching allocator (tests/gpu/poison.py) or are poisoned ``out=`` tensors,
so an element a kernel fails to write cannot pass by the luck of fresh memory.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.gpu.poison import POISON_BYTE, poison_allocator
from tests.reference.mhc import (
    expand_to_mhc_bwd_ref,
    expand_to_mhc_ref,
    sinkhorn_normalize_bwd_autograd,
    sinkhorn_normalize_ref,
)

tile_kernels_aot, _, errors, runtime = installed_package()
mhc = importlib.import_module("tile_kernels_aot.mhc")

pytestmark = pytest.mark.gpu

TOKENS = [0, 1, 13, 4001]
HIDDENS = [1280, 2560, 7168, 100]  # 100: not a multiple of 8, the vec 1 variant


def assert_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    assert got.is_contiguous()
    wrong = (got.view(torch.int16) != want.view(torch.int16)).nonzero()
    assert wrong.numel() == 0, f"{wrong.shape[0]} of {got.numel()} elements differ; first at {wrong[0].tolist()}"


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("mhc_mult", [2, 4, 8])
def test_expand(num_tokens: int, hidden: int, mhc_mult: int) -> None:
    x = torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16)
    g = torch.randn(num_tokens, mhc_mult, hidden, device="cuda").to(torch.bfloat16)
    poison_allocator()
    assert_bits(mhc.expand_to_mhc(x, mhc_mult), expand_to_mhc_ref(x, mhc_mult))
    poison_allocator()
    assert_bits(mhc.expand_to_mhc_bwd(g), expand_to_mhc_bwd_ref(g))


@pytest.mark.parametrize("n0", [1, 2])
@pytest.mark.parametrize("hidden", [1280, 7168])
def test_expand_leading_dims_and_out(n0: int, hidden: int) -> None:
    """TileKernels' (n0, n1, h) inputs, and out= tensors that start poisoned."""
    x = torch.randn(n0, 1024, hidden, device="cuda").to(torch.bfloat16)
    out = torch.full((n0, 1024, 4, hidden * 2), POISON_BYTE, dtype=torch.uint8, device="cuda").view(torch.bfloat16)
    assert mhc.expand_to_mhc(x, 4, out=out) is out
    assert_bits(out, expand_to_mhc_ref(x, 4))
    grad = torch.empty(n0, 1024, hidden, device="cuda", dtype=torch.bfloat16)
    grad.view(torch.int16).fill_(0x7F7F)
    g = torch.randn(n0, 1024, 4, hidden, device="cuda").to(torch.bfloat16)
    assert mhc.expand_to_mhc_bwd(g, out=grad) is grad
    assert_bits(grad, expand_to_mhc_bwd_ref(g))


@pytest.mark.parametrize("shape", [(0,), (1,), (13,), (4001,), (1, 1024), (2, 4096)])
# 20: the benchmark's; 32 and 33: the most repeats whose steps a backward lane keeps, and the first recomputed.
@pytest.mark.parametrize(("repeat", "eps"), [(10, 1e-6), (1, 1e-6), (3, 1e-2), (20, 1e-6), (32, 1e-6), (33, 1e-6)])
def test_sinkhorn(shape: tuple[int, ...], repeat: int, eps: float) -> None:
    x = torch.randn(*shape, 4, 4, device="cuda")
    g = torch.randn(*shape, 4, 4, device="cuda")
    poison_allocator()
    y = mhc.sinkhorn_normalize(x, repeat, eps)
    torch.testing.assert_close(y, sinkhorn_normalize_ref(x, repeat, eps))
    poison_allocator()
    dx = mhc.sinkhorn_normalize_bwd(g, x, repeat, eps)
    torch.testing.assert_close(dx, sinkhorn_normalize_bwd_autograd(g, x, repeat, eps))


def test_sinkhorn_large_logits_and_out() -> None:
    """Logits up to +-30 (softmax near one-hot) and poisoned out= tensors."""
    x = torch.randn(4001, 4, 4, device="cuda") * 10
    g = torch.randn(4001, 4, 4, device="cuda")
    y = torch.full_like(x, float("nan"))
    assert mhc.sinkhorn_normalize(x, out=y) is y
    torch.testing.assert_close(y, sinkhorn_normalize_ref(x))
    dx = torch.full_like(x, float("nan"))
    assert mhc.sinkhorn_normalize_bwd(g, x, out=dx) is dx
    torch.testing.assert_close(dx, sinkhorn_normalize_bwd_autograd(g, x))


def test_bad_arguments_raise() -> None:
    with pytest.raises(errors.KernelArgumentError):
        mhc.expand_to_mhc(torch.zeros(4, 64, device="cuda"), 4)  # fp32, not bf16
    with pytest.raises(errors.KernelArgumentError):
        mhc.sinkhorn_normalize(torch.zeros(4, 4, 4, device="cuda", dtype=torch.float64))
    with pytest.raises(ValueError, match="x"):
        mhc.sinkhorn_normalize(torch.zeros(4, 4, 5, device="cuda"))
