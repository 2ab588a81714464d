"""CPU tests of the mHC expand and Sinkhorn op modules (ops/mhc/{expand,sinkhorn}.py).

The op modules run inside a stand-in package (tests/op_stub.py) whose kernels record the variant
selected and the launch instead of running anything: the tests check TileKernels' signatures, the
variant and launch arguments each call makes (leading dimensions flattened into tokens), the outputs'
shapes, and that a bad argument raises, naming it, before anything is launched.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import stub_package

OPS = ("expand", "sinkhorn")


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], Any]]:
    with stub_package(tmp_path_factory.mktemp("mhc_ops"), "mhc_ops_pkg", "mhc", OPS) as stubbed:
        yield stubbed


def _spelled(fn: Callable[..., Any]) -> str:
    signature = inspect.signature(fn)
    return str(signature.replace(parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                                 return_annotation=signature.empty))


@pytest.mark.parametrize(("module", "name", "signature"), [
    ("expand", "expand_to_mhc", "(hidden, mhc_mult, *, out=None)"),
    ("expand", "expand_to_mhc_bwd", "(out_grad, *, out=None)"),
    ("sinkhorn", "sinkhorn_normalize", "(x, repeat=10, eps=1e-06, *, out=None)"),
    ("sinkhorn", "sinkhorn_normalize_bwd", "(grad_output, x, repeat=10, eps=1e-06, *, out=None)"),
])
def test_tilekernels_signatures(ops: tuple[dict[str, ModuleType], Any], module: str, name: str,
                                signature: str) -> None:
    """TileKernels 1.0.0's positional arguments (out= is keyword-only here; the _bwd ops are this catalog's)."""
    fn = getattr(ops[0][module], name)
    assert _spelled(fn) == signature
    assert name in ops[0][module].__all__


def _launch(runtime: Any, call: Callable[[], Any]) -> tuple[Any, tuple[str, dict[str, Any], tuple[Any, ...]]]:
    runtime.LAUNCHES.clear()
    result = call()
    (launched,) = runtime.LAUNCHES
    return result, launched


@pytest.mark.parametrize(("shape", "vec"), [((13, 7168), 8), ((2, 1024, 1280), 8), ((5, 100), 1), ((0, 2560), 8)])
@pytest.mark.parametrize("m", [2, 4])
def test_expand_launches(ops: tuple[dict[str, ModuleType], Any], shape: tuple[int, ...], vec: int, m: int) -> None:
    mods, runtime = ops
    x = torch.zeros(shape, dtype=torch.bfloat16)
    o, (name, values, args) = _launch(runtime, lambda: mods["expand"].expand_to_mhc(x, m))
    assert name == "mhc_expand" and values == {"direction": "fwd", "vec": vec}
    assert o.shape == (*shape[:-1], m, shape[-1]) and o.dtype == torch.bfloat16
    assert args[0].shape == (x.numel() // shape[-1], shape[-1]) and args[1].shape == (args[0].shape[0], m, shape[-1])
    assert args[1].data_ptr() == o.data_ptr()
    g, (name, values, args) = _launch(runtime, lambda: mods["expand"].expand_to_mhc_bwd(o))
    assert values == {"direction": "bwd", "vec": vec}
    assert g.shape == x.shape and g.dtype == torch.bfloat16
    assert args[0].shape == (x.numel() // shape[-1], m, shape[-1]) and args[1].data_ptr() == g.data_ptr()


@pytest.mark.parametrize("shape", [(1, 4, 4), (2, 13, 4, 4), (4, 4)])
def test_sinkhorn_launches(ops: tuple[dict[str, ModuleType], Any], shape: tuple[int, ...]) -> None:
    mods, runtime = ops
    x = torch.zeros(shape)
    y, (name, values, args) = _launch(runtime, lambda: mods["sinkhorn"].sinkhorn_normalize(x, 7, 1e-3))
    assert name == "mhc_sinkhorn" and values == {"direction": "fwd", "mhc": 4}
    assert y.shape == x.shape and y.dtype == torch.float32
    assert args[0].shape == (x.numel() // 16, 4, 4) and args[1].data_ptr() == y.data_ptr()
    assert args[2:] == (7, 1e-3)
    g, (name, values, args) = _launch(runtime, lambda: mods["sinkhorn"].sinkhorn_normalize_bwd(y, x))
    assert values == {"direction": "bwd", "mhc": 4} and g.shape == x.shape
    assert args[0].data_ptr() == y.data_ptr() and args[1].data_ptr() == x.data_ptr()
    assert args[2].data_ptr() == g.data_ptr() and args[3:] == (10, 1e-6)


BAD: dict[str, tuple[str, Callable[[Any], Any], type[Exception], str]] = {
    "expand list": ("expand", lambda m: m.expand_to_mhc([1.0], 4), TypeError, "hidden"),
    "expand 0-D": ("expand", lambda m: m.expand_to_mhc(torch.zeros((), dtype=torch.bfloat16), 4), ValueError,
                   "hidden"),
    "expand mult 0": ("expand", lambda m: m.expand_to_mhc(torch.zeros(2, 8, dtype=torch.bfloat16), 0), ValueError,
                      "mhc_mult"),
    "expand mult float": ("expand", lambda m: m.expand_to_mhc(torch.zeros(2, 8, dtype=torch.bfloat16), 4.0),
                          TypeError, "mhc_mult"),
    "expand bwd 1-D": ("expand", lambda m: m.expand_to_mhc_bwd(torch.zeros(8, dtype=torch.bfloat16)), ValueError,
                       "out_grad"),
    "sinkhorn not square": ("sinkhorn", lambda m: m.sinkhorn_normalize(torch.zeros(3, 4, 5)), ValueError, "x"),
    "sinkhorn 1-D": ("sinkhorn", lambda m: m.sinkhorn_normalize(torch.zeros(4)), ValueError, "x"),
    "sinkhorn mhc 8": ("sinkhorn", lambda m: m.sinkhorn_normalize(torch.zeros(3, 8, 8)), NotImplementedError, "x"),
    "sinkhorn repeat 0": ("sinkhorn", lambda m: m.sinkhorn_normalize(torch.zeros(3, 4, 4), 0), ValueError, "repeat"),
    "sinkhorn eps str": ("sinkhorn", lambda m: m.sinkhorn_normalize(torch.zeros(3, 4, 4), 10, "1e-6"), TypeError,
                         "eps"),
    "sinkhorn bwd shapes": ("sinkhorn", lambda m: m.sinkhorn_normalize_bwd(torch.zeros(3, 4, 4), torch.zeros(2, 4, 4)),
                            ValueError, "grad_output"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_arguments_raise_before_launch(ops: tuple[dict[str, ModuleType], Any], case: str) -> None:
    mods, runtime = ops
    module, call, error, name = BAD[case]
    runtime.LAUNCHES.clear()
    with pytest.raises(error, match=name):
        call(mods[module])
    assert runtime.LAUNCHES == []


def test_leading_dimensions_route_out_and_refuse_a_misfit(ops: tuple[dict[str, ModuleType], Any]) -> None:
    """(B, S, H) calls run the op on the flattened tokens and view back; out= is written and returned as given."""
    mods, runtime = ops
    x = torch.zeros(2, 3, 1280, dtype=torch.bfloat16)
    target = torch.empty(2, 3, 4, 1280, dtype=torch.bfloat16)
    o, (_, _, args) = _launch(runtime, lambda: mods["expand"].expand_to_mhc(x, 4, out=target))
    assert o is target and args[1].data_ptr() == target.data_ptr() and args[1].shape == (6, 4, 1280)
    with pytest.raises(ValueError, match=r"out: expected a contiguous tensor of shape \(2, 3, 4, 1280\)"):
        mods["expand"].expand_to_mhc(x, 4, out=torch.empty(2, 3, 4, 1024, dtype=torch.bfloat16))
    m = torch.zeros(2, 5, 4, 4)
    into = torch.empty_like(m)
    got, (_, _, args) = _launch(runtime, lambda: mods["sinkhorn"].sinkhorn_normalize(m, out=into))
    assert got is into and args[1].data_ptr() == into.data_ptr()
    with pytest.raises(ValueError, match="out: expected a contiguous tensor"):
        mods["sinkhorn"].sinkhorn_normalize(m, out=torch.empty(2, 4, 5, 4).transpose(1, 2))
