"""GPU test of the example user project (examples/rmsnorm, package my_kernels) against plain torch.

The kernel sums the squares in fp32 in its own order, so it is compared with a stated
tolerance (bf16 output: 1 % relative, 1e-2 absolute), not bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from tests.gpu.poison import poison_allocator

my_kernels = pytest.importorskip("my_kernels")

pytestmark = pytest.mark.gpu


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(torch.bfloat16)


@pytest.mark.parametrize("hidden", [1024, 4096])
@pytest.mark.parametrize("num_tokens", [0, 1, 13, 4001])
def test_rmsnorm_matches_torch(hidden: int, num_tokens: int) -> None:
    x = torch.randn(num_tokens, hidden, device="cuda", dtype=torch.bfloat16) * 3 + 0.5
    weight = torch.rand(hidden, device="cuda", dtype=torch.bfloat16) + 0.5
    poison_allocator()
    y = my_kernels.norm.rmsnorm(x, weight, 1e-5)
    torch.testing.assert_close(y.float(), rmsnorm_ref(x, weight, 1e-5).float(), rtol=1e-2, atol=1e-2)
    out = torch.full_like(y, float("nan"))
    assert my_kernels.norm.rmsnorm(x, weight, 1e-5, out=out) is out
    torch.testing.assert_close(out, y, rtol=0, atol=0)  # the same kernel: the same bits


def test_rmsnorm_compiles_and_refuses_bad_tensors() -> None:
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    weight = torch.rand(1024, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(lambda a, w: my_kernels.norm.rmsnorm(a, w) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(x, weight), my_kernels.norm.rmsnorm(x, weight) * 2, rtol=0, atol=0)
    errors = pytest.importorskip("my_kernels.errors")
    with pytest.raises(errors.KernelArgumentError, match="^weight: expected shape"):
        my_kernels.norm.rmsnorm(x, weight[:512])
    with pytest.raises(errors.VariantNotFoundError, match="hidden=2048"):
        my_kernels.norm.rmsnorm(torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16), weight)
