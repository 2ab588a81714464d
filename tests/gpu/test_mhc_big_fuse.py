"""GPU tests of ``tile_kernels_aot.mhc.mhc_pre_big_fuse`` and ``tile_kernels_aot.modeling.mhc.ops.mhc_pre_big_fuse``.

TileKernels 1.0.0's tests/mhc/test_pre_big_fuse.py holds the fused kernel to the ops it fuses bit for bit
(torch.equal with mhc_pre_norm_fn without a weight, mhc_pre_split_mixes, sinkhorn_normalize and
mhc_pre_apply_mix run one after the other): so here, against this package's ops, for every output. Against
the plain-torch references (TileKernels' mhc_pre_norm_fn_ref with TF32 matmuls, then the split, Sinkhorn and
mix references): atol = rtol = 1e-3 for post and comb (the mixes' own tolerance; sigmoid and Sinkhorn do not
amplify it here), and for the bf16 layer input atol 1e-2 / rtol 1e-2: pre differs from the reference's in
the fourth digit (its TF32 matmul rounds otherwise), which moves a few sums across a bf16 rounding step
(one bf16 ulp, 2^-8 relative: 12 of 59 million values at 8192 x 7168 on the H200).
Inputs from TileKernels' data generator (randn streams, fn * 1e-4, scale and base * 0.1, eps 1e-6, repeat
10); token counts 0, 1, 13 and TileKernels' 512 .. 8192; hidden as its test (1280, 2560, 4096) plus 7168 and
1283 (the vec-1 variant, K % 8 == 4). Outputs come from a poisoned caching allocator (tests/gpu/poison.py).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.gpu.poison import poison_allocator
from tests.reference.mhc import sinkhorn_normalize_ref
from tests.reference.mhc_mix import pre_apply_mix_ref, pre_split_mixes_ref
from tests.reference.mhc_norm import norm_fn_ref

tile_kernels_aot, _, errors, runtime = installed_package()
mhc = importlib.import_module("tile_kernels_aot.mhc")
modeling_ops = importlib.import_module("tile_kernels_aot.modeling.mhc.ops")

pytestmark = pytest.mark.gpu

OPTIONS = {"rms_eps": 1e-6, "mhc_pre_eps": 1e-6, "mhc_sinkhorn_eps": 1e-6, "mhc_post_mult_value": 1.0,
           "sinkhorn_repeat": 10}
MIXES = {"atol": 1e-3, "rtol": 1e-3}
LAYER_INPUT = {"atol": 1e-2, "rtol": 1e-2}


def _data(n1: int, hidden: int) -> tuple[torch.Tensor, ...]:
    """TileKernels' generate_big_fuse_test_data."""
    m = 4
    per_stream = 1 + torch.arange(m, device="cuda").mul(0.01)
    residual = (torch.randn(1, n1, m, hidden, device="cuda") * per_stream.view(1, 1, -1, 1)).bfloat16()
    fn = (torch.randn(m * (m + 2), m, hidden, device="cuda") * 1e-4 * per_stream.view(1, -1, 1)).flatten(1, 2)
    scale = torch.randn(3, device="cuda") * 0.1
    base = torch.randn(m * (m + 2), device="cuda") * 0.1
    return residual, fn, scale, base


def _composed(ops: object, residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
              rms_eps: float, mhc_pre_eps: float, mhc_sinkhorn_eps: float, mhc_post_mult_value: float,
              sinkhorn_repeat: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TileKernels' big_fuse_reference over ``ops`` (this package's mhc module or its modeling ops)."""
    m = residual.shape[-2]
    if ops is modeling_ops:
        mixes = ops.mhc_pre_norm_fn(residual, fn, None, rms_eps, fuse_grad_acc=False, n_splits=16)
    else:
        mixes = ops.mhc_pre_norm_fn(residual, fn, None, rms_eps)  # type: ignore[attr-defined]
    pre, post, comb = ops.mhc_pre_split_mixes(mixes, scale, base, m, mhc_post_mult_value,  # type: ignore[attr-defined]
                                              mhc_pre_eps)
    comb = ops.sinkhorn_normalize(comb, repeat=sinkhorn_repeat, eps=mhc_sinkhorn_eps)  # type: ignore[attr-defined]
    return post, comb, ops.mhc_pre_apply_mix(residual, pre)  # type: ignore[attr-defined]


def _reference(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
               rms_eps: float, mhc_pre_eps: float, mhc_sinkhorn_eps: float, mhc_post_mult_value: float,
               sinkhorn_repeat: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        mixes = norm_fn_ref(residual, fn, None, rms_eps)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    pre, post, comb = pre_split_mixes_ref(mixes, scale, base, residual.shape[-2], mhc_post_mult_value, mhc_pre_eps)
    comb = sinkhorn_normalize_ref(comb, sinkhorn_repeat, mhc_sinkhorn_eps)
    return post, comb, pre_apply_mix_ref(residual, pre)


def _assert_bits(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, got.dtype, want.shape, want.dtype)
    ints = torch.int16 if got.element_size() == 2 else torch.int32
    wrong = (got.view(ints) != want.view(ints)).nonzero()
    assert wrong.numel() == 0, f"{name}: {wrong.shape[0]} of {got.numel()} differ; first at {wrong[0].tolist()}"


@pytest.mark.parametrize("hidden", [1280, 2560, 4096, 7168, 1283])
@pytest.mark.parametrize("n1", [0, 1, 13, 512, 1024, 2048, 8192])
def test_big_fuse_is_the_ops_it_fuses(n1: int, hidden: int) -> None:
    residual, fn, scale, base = _data(n1, hidden)
    poison_allocator()
    fused = mhc.mhc_pre_big_fuse(residual, fn, scale, base, **OPTIONS)
    assert [t.shape for t in fused] == [(1, n1, 4, 1), (1, n1, 4, 4), (1, n1, hidden)]
    for name, got, want in zip(("post_mix", "comb_mix", "layer_input"), fused,
                               _composed(mhc, residual, fn, scale, base, **OPTIONS), strict=True):
        _assert_bits(got, want, name)
    post, comb, layer_input = _reference(residual, fn, scale, base, **OPTIONS)
    torch.testing.assert_close(fused[0], post, **MIXES)
    torch.testing.assert_close(fused[1], comb, **MIXES)
    torch.testing.assert_close(fused[2], layer_input, **LAYER_INPUT)


@pytest.mark.parametrize("hidden", [1280, 2560, 4096])
@pytest.mark.parametrize("n1", [512, 1024, 2048, 8192])
def test_correctness_as_tilekernels_tests_it(n1: int, hidden: int) -> None:
    """TileKernels' test_correctness: the modeling op against its modeling ops, torch.equal."""
    residual, fn, scale, base = _data(n1, hidden)
    poison_allocator()
    fused = modeling_ops.mhc_pre_big_fuse(residual, fn, scale, base, n_splits=16, **OPTIONS)
    for got, want in zip(fused, _composed(modeling_ops, residual, fn, scale, base, **OPTIONS), strict=True):
        assert torch.equal(got, want)


def test_other_options_and_a_flat_residual() -> None:
    """Options the pipeline passes (post_mult_value 2, other eps, repeat 20) and a 3-D residual."""
    residual, fn, scale, base = _data(13, 1280)
    options = {"rms_eps": 1e-5, "mhc_pre_eps": 1e-2, "mhc_sinkhorn_eps": 1e-4, "mhc_post_mult_value": 2.0,
               "sinkhorn_repeat": 20}
    want = _composed(mhc, residual, fn, scale, base, **options)
    flat = mhc.mhc_pre_big_fuse(residual[0], fn, scale, base, **options)
    assert [t.shape for t in flat] == [(13, 4, 1), (13, 4, 4), (13, 1280)]
    for name, got, expected in zip(("post_mix", "comb_mix", "layer_input"), flat, want, strict=True):
        _assert_bits(got, expected[0], name)
