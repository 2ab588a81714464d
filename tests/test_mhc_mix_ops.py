"""CPU tests of the mHC mix op modules (ops/mhc/mix_{split,head,apply}.py) on the stand-in runtime
(tests/op_stub.py): TileKernels' signatures, the variant and launch each call makes, the outputs'
shapes, and that a bad argument raises, naming it, before anything is launched. No GPU needed."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import stub_package

OPS = ("mix_split", "mix_head", "mix_apply")


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], Any]]:
    with stub_package(tmp_path_factory.mktemp("mhc_mix_ops"), "mhc_mix_ops_pkg", "mhc", OPS) as stubbed:
        yield stubbed


def _spelled(fn: Any) -> str:
    signature = inspect.signature(fn)
    return str(signature.replace(parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                                 return_annotation=signature.empty))


@pytest.mark.parametrize(("module", "name", "signature"), [
    ("mix_split", "mhc_pre_split_mixes",
     "(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)"),
    ("mix_head", "mhc_head_compute_mix", "(input_mix, mhc_scale, mhc_base, mhc_pre_eps)"),
    ("mix_apply", "mhc_pre_apply_mix", "(x, mix, *, out=None)"),
])
def test_tilekernels_signatures(ops: tuple[dict[str, ModuleType], Any], module: str, name: str,
                                signature: str) -> None:
    assert _spelled(getattr(ops[0][module], name)) == signature


@pytest.mark.parametrize(("n0", "n1"), [(1, 1), (2, 13), (1, 0)])
def test_split_launches_flat_rows(ops: tuple[dict[str, ModuleType], Any], n0: int, n1: int) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    x, scale, base = torch.zeros(n0, n1, 24), torch.ones(3), torch.zeros(24)
    pre, post, comb = modules["mix_split"].mhc_pre_split_mixes(x, scale, base, 4, 2.0, 1e-2)
    ((name, values, launched),) = runtime.LAUNCHES
    assert name == "mhc_pre_split_mixes_fwd" and values == {"mhc_mult": 4}
    assert launched[0].shape == (n0 * n1, 24) and launched[1] is scale and launched[2] is base
    assert [t.shape for t in launched[3:6]] == [(n0 * n1, 4), (n0 * n1, 4), (n0 * n1, 16)]
    assert launched[6:] == (2.0, 1e-2)
    assert (pre.shape, post.shape, comb.shape) == ((n0, n1, 4, 1), (n0, n1, 4, 1), (n0, n1, 4, 4))


def test_split_backward_sums_the_partials(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    x = torch.zeros(2, 13, 24)
    grads = torch.zeros(2, 13, 4, 1), torch.zeros(2, 13, 4, 1), torch.zeros(2, 13, 4, 4)
    xg, sg, bg = modules["mix_split"].mhc_pre_split_mixes_bwd(*grads, x, torch.ones(3), torch.zeros(24), 4, 2.0)
    ((name, values, launched),) = runtime.LAUNCHES
    assert name == "mhc_pre_split_mixes_bwd" and values == {"mhc_mult": 4}
    assert launched[7].shape == (1, 3) and launched[8].shape == (1, 24) and launched[9] == 2.0
    assert (xg.shape, sg.shape, bg.shape) == ((2, 13, 24), (3,), (24,))


def test_head_forward_and_backward(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    x = torch.zeros(2, 5, 4)
    y = modules["mix_head"].mhc_head_compute_mix(x, torch.ones(1), torch.zeros(4), 1e-2)
    xg, sg, bg = modules["mix_head"].mhc_head_compute_mix_bwd(torch.zeros(2, 5, 4), x, torch.ones(1), torch.zeros(4))
    (n1, v1, l1), (n2, v2, _) = runtime.LAUNCHES
    assert (n1, v1, n2, v2) == ("mhc_head_compute_mix_fwd", {"mhc_mult": 4}, "mhc_head_compute_mix_bwd",
                                {"mhc_mult": 4})
    assert l1[0].shape == (10, 4) and l1[-1] == 1e-2
    assert (y.shape, xg.shape, sg.shape, bg.shape) == ((2, 5, 4), (2, 5, 4), (1,), (4,))


@pytest.mark.parametrize(("hidden", "vec"), [(1280, 8), (7680, 8), (1283, 1)])
def test_apply_takes_16_byte_vectors_where_hidden_allows(ops: tuple[dict[str, ModuleType], Any], hidden: int,
                                                         vec: int) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    x, mix = torch.zeros(2, 3, 4, hidden, dtype=torch.bfloat16), torch.zeros(2, 3, 4, 1)
    o = modules["mix_apply"].mhc_pre_apply_mix(x, mix)
    xg, mg = modules["mix_apply"].mhc_pre_apply_mix_bwd(torch.zeros(2, 3, hidden, dtype=torch.bfloat16), x, mix)
    (n1, v1, l1), (n2, v2, l2) = runtime.LAUNCHES
    assert (n1, v1, n2, v2) == ("mhc_pre_apply_mix_fwd", {"mhc_mult": 4, "vec": vec}, "mhc_pre_apply_mix_bwd",
                                {"mhc_mult": 4, "vec": vec})
    assert l1[0].shape == (6, 4, hidden) and l1[1].shape == (6, 4) and l1[2].shape == (6, hidden)
    assert l2[-1] == 0  # no accumulated gradient given
    assert (o.shape, o.dtype, xg.shape, mg.shape) == ((2, 3, hidden), torch.bfloat16, x.shape, mix.shape)


def test_apply_backward_accumulates_a_given_gradient(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    x, mix = torch.zeros(3, 4, 256, dtype=torch.bfloat16), torch.zeros(3, 4, 1)
    acc = torch.zeros_like(x)
    modules["mix_apply"].mhc_pre_apply_mix_bwd(torch.zeros(3, 256, dtype=torch.bfloat16), x, mix, acc)
    ((_, _, launched),) = runtime.LAUNCHES
    assert launched[3].data_ptr() == acc.data_ptr() and launched[-1] == 1


BAD = {
    "split 2-D mixes": ("mix_split", lambda m: m.mhc_pre_split_mixes(torch.zeros(5, 24), torch.ones(3),
                                                                      torch.zeros(24), 4, 2.0, 0.0), ValueError,
                        "input_mixes"),
    "split wrong width": ("mix_split", lambda m: m.mhc_pre_split_mixes(torch.zeros(1, 5, 20), torch.ones(3),
                                                                        torch.zeros(24), 4, 2.0, 0.0), ValueError,
                          "input_mixes"),
    "split eps str": ("mix_split", lambda m: m.mhc_pre_split_mixes(torch.zeros(1, 5, 24), torch.ones(3),
                                                                    torch.zeros(24), 4, 2.0, "x"), TypeError,
                      "mhc_pre_eps"),
    "head list": ("mix_head", lambda m: m.mhc_head_compute_mix([[1.0]], torch.ones(1), torch.zeros(4), 0.0),
                  TypeError, "input_mix"),
    "apply mix shape": ("mix_apply", lambda m: m.mhc_pre_apply_mix(torch.zeros(3, 4, 64, dtype=torch.bfloat16),
                                                                    torch.zeros(3, 4)), ValueError, "mix"),
    "apply o_grad shape": ("mix_apply", lambda m: m.mhc_pre_apply_mix_bwd(
        torch.zeros(3, 32, dtype=torch.bfloat16), torch.zeros(3, 4, 64, dtype=torch.bfloat16), torch.zeros(3, 4, 1)),
        ValueError, "o_grad"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_raise_before_any_launch(ops: tuple[dict[str, ModuleType], Any], case: str) -> None:
    module, call, error, word = BAD[case]
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    with pytest.raises(error, match=word):
        call(modules[module])
    assert runtime.LAUNCHES == []
