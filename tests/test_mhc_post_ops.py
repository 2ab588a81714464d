"""CPU tests of the mHC post op module (ops/mhc/post.py) and its autograd layer
(ops/modeling/mhc/ops/post.py) on the stand-in runtime (tests/op_stub.py): TileKernels' signatures, the
variant and launch each call makes, the outputs' shapes, the backward's ``fuse_grad_acc``, and that a bad
argument raises, naming it, before anything is launched. No GPU needed."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import spelled, stub_package_with_layer

PACKAGE = "mhc_post_ops_pkg"


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType, Any]]:
    """(the op module, the modeling module, the stub runtime)."""
    with stub_package_with_layer(tmp_path_factory.mktemp("mhc_post_ops"), PACKAGE, "mhc", "post", "modeling/mhc/ops/post.py") as modules:
        yield modules




def _data(n0: int, n1: int, h: int) -> tuple[torch.Tensor, ...]:
    return (torch.zeros(n0, n1, h, dtype=torch.bfloat16), torch.zeros(n0, n1, 4, h, dtype=torch.bfloat16),
            torch.zeros(n0, n1, 4, 1), torch.zeros(n0, n1, 4, 4))


def test_signatures(ops: tuple[ModuleType, ModuleType, Any]) -> None:
    post, modeling, _ = ops
    assert spelled(post.mhc_post_fwd) == "(x, residual, post_layer_mix, comb_res_mix, out=None)"  # TileKernels' too
    assert spelled(post.mhc_post_bwd) == "(x, residual, post_layer_mix, comb_res_mix, d_o)"
    # TileKernels' tile_kernels.modeling.mhc.ops exports, spelled as there.
    assert spelled(modeling.mhc_post) == "(x, residual, post_layer_mix, comb_res_mix, out=None)"
    assert spelled(modeling.mhc_post_fwd) == "(x, residual, post_layer_mix, comb_res_mix, out=None)"
    assert spelled(modeling.mhc_post_bwd) == "(x, residual, post_layer_mix, comb_res_mix, d_o, fuse_grad_acc=True)"


@pytest.mark.parametrize(("hidden", "vec"), [(1280, 8), (7168, 8), (1283, 1)])
@pytest.mark.parametrize(("n0", "n1"), [(1, 1), (2, 13), (1, 0)])
def test_launches_flat_tokens(ops: tuple[ModuleType, ModuleType, Any], n0: int, n1: int, hidden: int,
                              vec: int) -> None:
    post, _, runtime = ops
    runtime.LAUNCHES.clear()
    x, residual, p, comb = _data(n0, n1, hidden)
    out = post.mhc_post_fwd(x, residual, p, comb)
    grads = post.mhc_post_bwd(x, residual, p, comb, torch.zeros_like(residual))
    (n_f, v_f, l_f), (n_b, v_b, l_b) = runtime.LAUNCHES
    t = n0 * n1
    assert (n_f, v_f, n_b, v_b) == ("mhc_post_fwd", {"mhc_mult": 4, "vec": vec}, "mhc_post_bwd",
                                    {"mhc_mult": 4, "vec": vec})
    assert [a.shape for a in l_f] == [(t, hidden), (t, 4, hidden), (t, 4), (t, 4, 4), (t, 4, hidden)]
    assert [a.shape for a in l_b] == [(t, 4, hidden), (t, hidden), (t, 4, hidden), (t, 4), (t, 4, 4),
                                      (t, hidden), (t, 4, hidden), (t, 4), (t, 4, 4)]
    assert (out.shape, out.dtype) == (residual.shape, torch.bfloat16)
    assert [(g.shape, g.dtype) for g in grads] == [(x.shape, torch.bfloat16), (residual.shape, torch.bfloat16),
                                                   (p.shape, torch.float32), (comb.shape, torch.float32)]


def test_out_is_written_through_a_view(ops: tuple[ModuleType, ModuleType, Any]) -> None:
    post, _, runtime = ops
    runtime.LAUNCHES.clear()
    x, residual, p, comb = _data(2, 3, 256)
    given = torch.empty_like(residual)
    assert post.mhc_post_fwd(x, residual, p, comb, out=given) is given
    ((_, _, launched),) = runtime.LAUNCHES
    assert launched[-1].data_ptr() == given.data_ptr() and launched[-1].shape == (6, 4, 256)


def test_autograd_runs_the_backward_and_leaves_the_residual_gradient(ops: tuple[ModuleType, ModuleType, Any]) -> None:
    _, modeling, runtime = ops
    runtime.LAUNCHES.clear()
    leaves = [t.requires_grad_() for t in _data(1, 5, 64)]
    out = modeling.mhc_post(*leaves)
    out.backward(torch.zeros_like(out))
    assert [name for name, _, _ in runtime.LAUNCHES] == ["mhc_post_fwd", "mhc_post_bwd"]
    assert [t.grad.shape for t in leaves] == [t.shape for t in leaves]  # type: ignore[union-attr]
    stored = leaves[1].untyped_storage().grad_from_mhc_post  # type: ignore[attr-defined]
    assert stored.shape == leaves[1].shape and stored.dtype == torch.bfloat16
    runtime.LAUNCHES.clear()
    x, residual, p, comb = _data(1, 2, 64)
    modeling.mhc_post_bwd(x, residual, p, comb, torch.zeros_like(residual), fuse_grad_acc=False)
    assert not hasattr(residual.untyped_storage(), "grad_from_mhc_post")


BAD = {
    "x list": (lambda m: m.mhc_post_fwd([[0.0]], *_data(1, 2, 64)[1:]), TypeError, "x"),
    "x width": (lambda m: m.mhc_post_fwd(torch.zeros(1, 2, 32, dtype=torch.bfloat16), *_data(1, 2, 64)[1:]),
                ValueError, "x"),
    "residual 1-D": (lambda m: m.mhc_post_fwd(torch.zeros(64, dtype=torch.bfloat16),
                                              torch.zeros(64, dtype=torch.bfloat16), *_data(1, 2, 64)[2:]),
                     ValueError, "residual"),
    "post without its last 1": (lambda m: m.mhc_post_fwd(*_data(1, 2, 64)[:2], torch.zeros(1, 2, 4),
                                                         _data(1, 2, 64)[3]), ValueError, "post_layer_mix"),
    "comb tokens": (lambda m: m.mhc_post_fwd(*_data(1, 2, 64)[:3], torch.zeros(1, 3, 4, 4)), ValueError,
                    "comb_res_mix"),
    "d_o shape": (lambda m: m.mhc_post_bwd(*_data(1, 2, 64), torch.zeros(1, 2, 64, dtype=torch.bfloat16)),
                  ValueError, "d_o"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_raise_before_any_launch(ops: tuple[ModuleType, ModuleType, Any], case: str) -> None:
    call, error, word = BAD[case]
    post, _, runtime = ops
    runtime.LAUNCHES.clear()
    with pytest.raises(error, match=word):
        call(post)
    assert runtime.LAUNCHES == []
