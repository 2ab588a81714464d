"""CPU tests of the mHC pre-norm op module (ops/mhc/norm_fn.py, its helper ops/mhc/_norm.py) and its autograd
layer (ops/modeling/mhc/ops/norm_fn.py) on the stand-in runtime (tests/op_stub.py): TileKernels'
signatures, the stages and variants each call launches and with what, the split counts, the outputs'
shapes, the backward's ``fuse_grad_acc`` and weight merge, and that a bad argument raises, naming it,
before anything is launched. No GPU needed."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import spelled, stub_package_with_layer

PACKAGE = "mhc_norm_ops_pkg"
FWD = ["mhc_norm_fn_weights", "mhc_norm_fn_mma", "mhc_norm_fn_norm"]  # hidden % 16 == 0: the tensor cores
BWD = ["mhc_norm_fn_bwd_norm", "mhc_norm_fn_bwd_x", "mhc_norm_fn_bwd_fn"]


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType, ModuleType, Any]]:
    """(the op module, its _norm helper, the modeling module, the stub runtime)."""
    root = tmp_path_factory.mktemp("mhc_norm_ops")
    with stub_package_with_layer(root, PACKAGE, "mhc", "norm_fn", "modeling/mhc/ops/norm_fn.py") as (op, layer, runtime):
        yield op, importlib.import_module(f"{PACKAGE}.mhc._norm"), layer, runtime




def _data(n0: int, n1: int, h: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.zeros(n0, n1, 4, h, dtype=torch.bfloat16), torch.zeros(24, 4 * h), torch.ones(4 * h)


def test_signatures(ops: tuple[ModuleType, ModuleType, ModuleType, Any]) -> None:
    norm_fn, _, modeling, _ = ops
    tilekernels = "(residual, mhc_fn, mhc_norm_weight, mhc_norm_eps, fuse_grad_acc=True, n_splits=16)"
    assert spelled(norm_fn.mhc_pre_norm_fn) == tilekernels
    assert spelled(modeling.mhc_pre_norm_fn) == tilekernels  # tile_kernels.modeling.mhc.ops.mhc_pre_norm_fn
    assert spelled(modeling.MHCPreNormFn.forward) == "(ctx, x, fn, norm_eps, fuse_grad_acc, n_splits)"
    assert modeling.__all__ == ["MHCPreNormFn", "mhc_pre_norm_fn"]


MMA = ("mhc_norm_fn_mma", {"stage": "mma", "mhc_mult": 4})


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(("hidden", "gemm"), [
    (1280, MMA), (7168, MMA), (1296, MMA),  # K % 64 == 0: the tensor-core GEMM
    (1288, ("mhc_norm_fn_dots", {"stage": "dots", "mhc_mult": 4, "vec": 8})),  # K % 64 == 32
    (1283, ("mhc_norm_fn_dots", {"stage": "dots", "mhc_mult": 4, "vec": 4})),
])
@pytest.mark.parametrize(("n0", "n1"), [(1, 1), (2, 13), (1, 0)])
def test_forward_launches_three_stages(ops: tuple[ModuleType, ModuleType, ModuleType, Any], n0: int, n1: int,
                                       hidden: int, gemm: tuple[str, dict[str, Any]], weighted: bool) -> None:
    norm_fn, _, _, runtime = ops
    runtime.LAUNCHES.clear()
    residual, fn, weight = _data(n0, n1, hidden)
    mixes = norm_fn.mhc_pre_norm_fn(residual, fn, weight if weighted else None, 1e-6)
    (n_w, v_w, l_w), (n_d, v_d, l_d), (n_n, v_n, l_n) = runtime.LAUNCHES
    t, k = n0 * n1, 4 * hidden
    assert [n_w, (n_d, v_d), n_n] == [FWD[0], gemm, FWD[2]]
    assert (v_w, v_n) == ({"stage": "weights", "mhc_mult": 4}, {"stage": "norm", "mhc_mult": 4})
    # weights: fn, the weight (fn's elements as a stand-in without one), fn_eff, has_weight
    assert l_w[0] is fn and l_w[3] == int(weighted)
    assert l_w[1] is weight if weighted else (l_w[1].shape == (24 * k,) and l_w[1].data_ptr() == fn.data_ptr())
    fn_eff = l_w[2]
    assert fn_eff.shape == (24, k) and fn_eff.dtype == torch.float32
    # dots: x as (tokens, K) rows of residual's storage, fn_eff, the partials (one split off the GPU)
    assert l_d[0].shape == (t, k) and l_d[0].data_ptr() == residual.data_ptr() and l_d[1] is fn_eff
    assert [a.shape for a in l_d[2:]] == [(1, t, 24), (1, t)]
    # norm: the partials, mixes, dots_sum, sqrsum, K and eps
    assert l_n[0] is l_d[2] and l_n[1] is l_d[3]
    assert [a.shape for a in l_n[2:5]] == [(t, 24), (t, 24), (t,)] and l_n[5:] == (k, 1e-6)
    assert mixes.shape == (n0, n1, 24) and mixes.dtype == torch.float32
    assert mixes.data_ptr() == l_n[2].data_ptr()


def test_forward_with_saved_tensors(ops: tuple[ModuleType, ModuleType, ModuleType, Any]) -> None:
    norm_fn, _, _, runtime = ops
    runtime.LAUNCHES.clear()
    residual, fn, _ = _data(2, 3, 256)
    mixes, fn_eff, dots_sum, sqrsum = norm_fn.mhc_pre_norm_fn_fwd(residual, fn, None, 1e-5)
    *_, (_, _, launched) = runtime.LAUNCHES
    assert [mixes, dots_sum, sqrsum] == list(launched[2:5]) and fn_eff is runtime.LAUNCHES[0][2][2]


@pytest.mark.parametrize(("num_tokens", "hidden", "splits"), [
    (13, 7168, 112),  # one token tile: as many splits as 4 lanes x 8 steps of 16-byte vectors allow
    (1, 1280, 20),
    (4096, 7168, 5),  # 64 token tiles: 264 blocks wanted (132 SMs x 2)
    (8192, 7168, 3),
    (16384, 1280, 2),
    (16384, 7168, 2),
    (13, 64, 1),  # a short row: one split
    (0, 7168, 112),  # no tokens: the grid is empty whatever the count
])
def test_cuda_core_split_counts(ops: tuple[ModuleType, ModuleType, ModuleType, Any], num_tokens: int, hidden: int,
                           splits: int) -> None:
    helper = ops[1]
    assert helper.dots_splits(num_tokens, 4 * hidden, 0) == splits
    assert helper.dots_splits(num_tokens, 4 * hidden, -1) == 1


@pytest.mark.parametrize(("num_tokens", "hidden", "splits"), [
    (8192, 7168, 2),  # 64 token tiles of 128: 128 blocks on 132 SMs
    (16384, 7168, 1),  # 128 tiles fill the GPU alone: one split, TileKernels' sums
    (1024, 7168, 16),  # 8 tiles: 16 of the 448 steps' divisors keeps 128 blocks
    (1, 7168, 112),  # one tile: 112 (divides 448) of at most 132
    (13, 1280, 80),  # 80 steps: 80 itself
    (1, 16, 1),  # K = 64: one step
    (4096, 1296, 3),  # 81 steps, 32 tiles: at most 4 splits, of which 81 divides 3
    (0, 7168, 112),  # no tokens: the grid is empty whatever the count
])
def test_tensor_core_split_counts(ops: tuple[ModuleType, ModuleType, ModuleType, Any], num_tokens: int, hidden: int,
                                  splits: int) -> None:
    helper = ops[1]
    got = helper.mma_splits(num_tokens, 4 * hidden, 0)
    assert got == splits and (4 * hidden // 64) % got == 0
    assert helper.mma_splits(num_tokens, 4 * hidden, -1) == 1


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize(("n0", "n1", "hidden"), [(1, 1, 1280), (2, 13, 7168), (1, 0, 1280), (1, 5, 1283)])
def test_backward_launches_three_stages(ops: tuple[ModuleType, ModuleType, ModuleType, Any], n0: int, n1: int,
                                        hidden: int, accumulate: bool) -> None:
    norm_fn, _, _, runtime = ops
    residual, fn, _ = _data(n0, n1, hidden)
    t, k = n0 * n1, 4 * hidden
    g, dots_sum, sqrsum = torch.zeros(n0, n1, 24), torch.zeros(t, 24), torch.zeros(t)
    given = torch.zeros_like(residual) if accumulate else None
    runtime.LAUNCHES.clear()
    x_grad, fn_grad = norm_fn.mhc_pre_norm_fn_bwd(g, residual, fn, dots_sum, sqrsum, 1e-6, given)
    (n_n, v_n, l_n), (n_x, v_x, l_x), (n_f, v_f, l_f) = runtime.LAUNCHES
    assert [n_n, n_x, n_f] == BWD
    assert (v_n, v_x, v_f) == ({"stage": "norm", "mhc_mult": 4}, {"stage": "x", "mhc_mult": 4},
                               {"stage": "fn", "mhc_mult": 4})
    assert [a.shape for a in l_n[:3]] == [(t, 24), (t, 24), (t,)] and l_n[5:] == (k, 1e-6)
    assert [a.data_ptr() for a in l_n[:3]] == [g.data_ptr(), dots_sum.data_ptr(), sqrsum.data_ptr()]
    og, qg = l_n[3], l_n[4]
    assert (og.shape, qg.shape) == ((t, 24), (t,))
    assert l_x[0] is og and l_x[1] is qg and l_x[2].shape == (t, k) and l_x[3] is fn
    assert l_x[4].shape == (t, k) and l_x[4].data_ptr() == (given if accumulate else residual).data_ptr()
    assert l_x[5].shape == (t, k) and l_x[5].dtype == torch.bfloat16 and l_x[6] == int(accumulate)
    assert l_f[0] is og and l_f[1] is l_x[2] and l_f[2].shape == (1, 24, k)  # one token range off the GPU
    assert x_grad is l_x[5] and (fn_grad.shape, fn_grad.dtype) == ((24, k), torch.float32)


def test_autograd_merges_the_weight_and_accumulates_into_mhc_posts_gradient(
        ops: tuple[ModuleType, ModuleType, ModuleType, Any]) -> None:
    _, _, modeling, runtime = ops
    residual, fn, weight = (t.clone().requires_grad_() for t in _data(1, 5, 64))
    runtime.LAUNCHES.clear()
    mixes = modeling.mhc_pre_norm_fn(residual, fn, weight, 1e-6)
    assert mixes.shape == (1, 5, 24)
    assert [name for name, _, _ in runtime.LAUNCHES] == FWD
    assert runtime.LAUNCHES[0][2][3] == 0  # the merge ran in torch: the op's own weight is unused
    storage = residual.untyped_storage()
    storage.grad_from_mhc_post = torch.zeros_like(residual)  # type: ignore[attr-defined]
    mixes.backward(torch.zeros_like(mixes))
    assert [name for name, _, _ in runtime.LAUNCHES] == FWD + BWD
    assert runtime.LAUNCHES[-2][2][6] == 1  # the x stage added to mhc_post's gradient
    assert not hasattr(storage, "grad_from_mhc_post") and residual.grad is None
    assert fn.grad is not None and fn.grad.shape == fn.shape
    assert weight.grad is not None and weight.grad.shape == weight.shape


def test_autograd_without_fused_accumulation_returns_the_residual_gradient(
        ops: tuple[ModuleType, ModuleType, ModuleType, Any]) -> None:
    _, _, modeling, runtime = ops
    residual, fn, _ = (t.clone().requires_grad_() for t in _data(1, 3, 64))
    storage = residual.untyped_storage()
    storage.grad_from_mhc_post = torch.zeros_like(residual)  # type: ignore[attr-defined]
    runtime.LAUNCHES.clear()
    mixes = modeling.mhc_pre_norm_fn(residual, fn, None, 1e-6, fuse_grad_acc=False)
    mixes.backward(torch.zeros_like(mixes))
    assert runtime.LAUNCHES[-2][2][6] == 0
    assert hasattr(storage, "grad_from_mhc_post")  # left for whoever owns it
    assert residual.grad is not None and residual.grad.shape == residual.shape


def test_weight_merge_accumulates_into_main_grad(ops: tuple[ModuleType, ModuleType, ModuleType, Any]) -> None:
    _, _, modeling, _ = ops
    fn = torch.full((24, 256), 2.0, requires_grad=True)
    weight = torch.full((256,), 3.0, requires_grad=True)
    fn.main_grad = torch.ones(24, 256)  # type: ignore[attr-defined]
    weight.main_grad = torch.ones(256)  # type: ignore[attr-defined]
    merged = modeling._MHCFnNormwMerge.apply(fn, weight)
    assert torch.equal(merged, torch.full((24, 256), 6.0))
    merged.backward(torch.ones(24, 256))
    assert fn.grad is None and weight.grad is None
    assert torch.equal(fn.main_grad, torch.full((24, 256), 4.0))  # type: ignore[attr-defined]
    assert torch.equal(weight.main_grad, torch.full((256,), 49.0))  # type: ignore[attr-defined]


BAD = {
    "residual list": (lambda m: m.mhc_pre_norm_fn([[0.0]], *_data(1, 2, 64)[1:], 1e-6), TypeError, "residual"),
    "residual fp32": (lambda m: m.mhc_pre_norm_fn(torch.zeros(1, 2, 4, 64), *_data(1, 2, 64)[1:], 1e-6),
                      TypeError, "residual"),
    "residual 1-D": (lambda m: m.mhc_pre_norm_fn(torch.zeros(64, dtype=torch.bfloat16), *_data(1, 2, 64)[1:], 1e-6),
                     ValueError, "residual"),
    "mhc_mult 2": (lambda m: m.mhc_pre_norm_fn(torch.zeros(1, 2, 2, 64, dtype=torch.bfloat16), torch.zeros(8, 128),
                                               None, 1e-6), NotImplementedError, "residual"),
    "fn rows": (lambda m: m.mhc_pre_norm_fn(_data(1, 2, 64)[0], torch.zeros(16, 256), None, 1e-6), ValueError,
                "mhc_fn"),
    "fn bf16": (lambda m: m.mhc_pre_norm_fn(_data(1, 2, 64)[0], torch.zeros(24, 256, dtype=torch.bfloat16), None,
                                            1e-6), TypeError, "mhc_fn"),
    "weight length": (lambda m: m.mhc_pre_norm_fn(*_data(1, 2, 64)[:2], torch.ones(64), 1e-6), ValueError,
                      "mhc_norm_weight"),
    "eps string": (lambda m: m.mhc_pre_norm_fn(*_data(1, 2, 64)[:2], None, "1e-6"), TypeError, "mhc_norm_eps"),
    "n_splits 0": (lambda m: m.mhc_pre_norm_fn(*_data(1, 2, 64)[:2], None, 1e-6, True, 0), ValueError, "n_splits"),
    "mixes_grad width": (lambda m: m.mhc_pre_norm_fn_bwd(torch.zeros(2, 16), *_data(1, 2, 64)[:2],
                                                         torch.zeros(2, 24), torch.zeros(2), 1e-6),
                         ValueError, "mixes_grad"),
    "sqrsum tokens": (lambda m: m.mhc_pre_norm_fn_bwd(torch.zeros(2, 24), *_data(1, 2, 64)[:2],
                                                      torch.zeros(2, 24), torch.zeros(3), 1e-6),
                      ValueError, "sqrsum"),
    "x_grad shape": (lambda m: m.mhc_pre_norm_fn_bwd(torch.zeros(2, 24), *_data(1, 2, 64)[:2], torch.zeros(2, 24),
                                                     torch.zeros(2), 1e-6, torch.zeros(2, 256)), ValueError, "x_grad"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_raise_before_any_launch(ops: tuple[ModuleType, ModuleType, ModuleType, Any],
                                               case: str) -> None:
    call, error, word = BAD[case]
    norm_fn, _, _, runtime = ops
    runtime.LAUNCHES.clear()
    with pytest.raises(error, match=word):
        call(norm_fn)
    assert runtime.LAUNCHES == []
