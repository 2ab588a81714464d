"""CPU tests of the mHC fused pre-step op module (ops/mhc/big_fuse.py) and its modeling function
(ops/modeling/mhc/ops/pre_big_fuse.py) on the stand-in runtime (tests/op_stub.py): TileKernels' signature,
the launches each call makes (the norm's GEMM stages, then the fused kernel) and with what, the outputs'
shapes, and that a bad argument raises, naming it, before anything is launched. No GPU needed."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import spelled, stub_package_with_layer

PACKAGE = "mhc_big_fuse_ops_pkg"
OPTIONS = (1e-6, 1e-2, 1e-4, 2.0, 10)  # rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, repeat


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType, Any]]:
    """(the op module, the modeling module, the stub runtime)."""
    with stub_package_with_layer(tmp_path_factory.mktemp("mhc_big_fuse_ops"), PACKAGE, "mhc", "big_fuse", "modeling/mhc/ops/pre_big_fuse.py") as modules:
        yield modules




def _data(lead: tuple[int, ...], h: int) -> tuple[torch.Tensor, ...]:
    return (torch.zeros(*lead, 4, h, dtype=torch.bfloat16), torch.zeros(24, 4 * h), torch.ones(3), torch.zeros(24))


def test_signatures(ops: tuple[ModuleType, ModuleType, Any]) -> None:
    big_fuse, modeling, _ = ops
    tilekernels = ("(residual, fn, mhc_scale, mhc_base, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, "
                   "sinkhorn_repeat, n_splits=16)")
    assert spelled(big_fuse.mhc_pre_big_fuse) == tilekernels
    assert spelled(modeling.mhc_pre_big_fuse) == tilekernels  # tile_kernels.modeling.mhc.ops.mhc_pre_big_fuse


@pytest.mark.parametrize(("hidden", "vec", "gemm"), [
    (1280, 8, ("mhc_norm_fn_mma", {"stage": "mma", "mhc_mult": 4})),
    (7168, 8, ("mhc_norm_fn_mma", {"stage": "mma", "mhc_mult": 4})),
    (1288, 8, ("mhc_norm_fn_dots", {"stage": "dots", "mhc_mult": 4, "vec": 8})),
    (1283, 1, ("mhc_norm_fn_dots", {"stage": "dots", "mhc_mult": 4, "vec": 4})),
])
@pytest.mark.parametrize("lead", [(1, 1), (1, 13), (2, 5), (7,), (1, 0)])
def test_launches(ops: tuple[ModuleType, ModuleType, Any], lead: tuple[int, ...], hidden: int, vec: int,
                  gemm: tuple[str, dict[str, Any]]) -> None:
    big_fuse, modeling, runtime = ops
    residual, fn, scale, base = _data(lead, hidden)
    t = int(torch.tensor(lead).prod())
    for call in (big_fuse.mhc_pre_big_fuse, modeling.mhc_pre_big_fuse):
        runtime.LAUNCHES.clear()
        post, comb, layer_input = call(residual, fn, scale, base, *OPTIONS)
        (n_w, v_w, l_w), (n_d, v_d, l_d), (n_f, v_f, l_f), (n_m, v_m, l_m) = runtime.LAUNCHES
        assert (n_w, v_w, l_w[0], l_w[3]) == ("mhc_norm_fn_weights", {"stage": "weights", "mhc_mult": 4}, fn, 0)
        assert (n_d, v_d) == gemm
        assert l_d[0].shape == (t, 4 * hidden) and l_d[0].data_ptr() == residual.data_ptr() and l_d[1] is l_w[2]
        # The stream mix: the split sums, scale and base, the streams -> layer_input (rms_eps, pre_eps).
        assert (n_f, v_f) == ("mhc_pre_big_fuse", {"stage": "stream", "mhc_mult": 4, "vec": vec})
        assert l_f[0] is l_d[2] and l_f[1] is l_d[3] and l_f[2] is scale and l_f[3] is base
        assert l_f[4].shape == (t, 4, hidden) and l_f[4].data_ptr() == residual.data_ptr()
        assert l_f[5].shape == (t, hidden) and l_f[6:] == OPTIONS[:2]
        # The mixes: the same split sums -> post and comb (K = 4 * hidden, rms_eps, sinkhorn_eps, post_mult, repeat).
        assert (n_m, v_m) == ("mhc_pre_big_fuse_mixes", {"stage": "mixes", "mhc_mult": 4})
        assert l_m[0] is l_d[2] and l_m[1] is l_d[3] and l_m[2] is scale and l_m[3] is base
        assert [a.shape for a in l_m[4:6]] == [(t, 4, 1), (t, 4, 4)]
        assert l_m[6:] == (4 * hidden, OPTIONS[0], *OPTIONS[2:])
        assert (post.shape, comb.shape, layer_input.shape) == ((*lead, 4, 1), (*lead, 4, 4), (*lead, hidden))
        assert (post.dtype, comb.dtype, layer_input.dtype) == (torch.float32, torch.float32, torch.bfloat16)
        assert [post.data_ptr(), comb.data_ptr(), layer_input.data_ptr()] == [a.data_ptr() for a in (*l_m[4:6], l_f[5])]


BAD = {
    "residual fp32": (lambda m: m.mhc_pre_big_fuse(torch.zeros(1, 2, 4, 64), *_data((1, 2), 64)[1:], *OPTIONS),
                      TypeError, "residual"),
    "fn columns": (lambda m: m.mhc_pre_big_fuse(_data((1, 2), 64)[0], torch.zeros(24, 128), *_data((1, 2), 64)[2:],
                                                *OPTIONS), ValueError, "fn"),
    "scale length": (lambda m: m.mhc_pre_big_fuse(*_data((1, 2), 64)[:2], torch.ones(24), _data((1, 2), 64)[3],
                                                  *OPTIONS), ValueError, "mhc_scale"),
    "base dtype": (lambda m: m.mhc_pre_big_fuse(*_data((1, 2), 64)[:3], torch.zeros(24, dtype=torch.float64),
                                                *OPTIONS), ValueError, "mhc_base"),
    "eps string": (lambda m: m.mhc_pre_big_fuse(*_data((1, 2), 64), 1e-6, "1e-2", 1e-4, 1.0, 10), TypeError,
                   "mhc_pre_eps"),
    "repeat 0": (lambda m: m.mhc_pre_big_fuse(*_data((1, 2), 64), 1e-6, 1e-2, 1e-4, 1.0, 0), ValueError,
                 "sinkhorn_repeat"),
    "n_splits 0": (lambda m: m.mhc_pre_big_fuse(*_data((1, 2), 64), *OPTIONS, 0), ValueError, "n_splits"),
    "mhc_mult 2": (lambda m: m.mhc_pre_big_fuse(torch.zeros(1, 2, 2, 64, dtype=torch.bfloat16), torch.zeros(8, 128),
                                                torch.ones(3), torch.zeros(8), *OPTIONS), NotImplementedError,
                   "residual"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_raise_before_any_launch(ops: tuple[ModuleType, ModuleType, Any], case: str) -> None:
    call, error, word = BAD[case]
    big_fuse, _, runtime = ops
    runtime.LAUNCHES.clear()
    with pytest.raises(error, match=word):
        call(big_fuse)
    assert runtime.LAUNCHES == []
