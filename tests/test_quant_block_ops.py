"""CPU tests of the per-block cast op module (templates/quant/per_block_cast.py) on a stub runtime.

The module is loaded into a throw-away package whose ``_runtime`` records variant selections and
launches instead of loading cubins (tests/op_stub.py), so what the op hands the kernel (the
variant, fresh outputs or the caller's ``out``) and the errors it raises itself show without a
GPU. The GPU tests (tests/gpu/test_per_block_cast.py, test_out.py) check the kernel's numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import WritingKernel, marked, poisoned, stub_package


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, Any]]:
    """(the per_block_cast op module, the stub _runtime)."""
    with stub_package(tmp_path_factory.mktemp("block"), "block_ops_stub", "quant", ("per_block_cast",)) as stubbed:
        modules, runtime = stubbed
        yield modules["per_block_cast"], runtime


@pytest.fixture()
def op(stub: tuple[ModuleType, Any]) -> ModuleType:
    stub[1].LAUNCHES.clear()
    return stub[0]


def _launches(stub: tuple[ModuleType, Any]) -> list[Any]:
    launches: list[Any] = stub[1].LAUNCHES
    return launches


def _x(rows: int = 33, hidden: int = 2048) -> torch.Tensor:
    return torch.randn(rows, hidden).bfloat16()


@pytest.mark.parametrize(("fmt", "block", "q_width", "sf_shape"), [
    ("e4m3", (128, 128), 2048, (1, 16)), ("e2m1", (32, 32), 1024, (2, 64))])
def test_cast_selects_and_allocates(op: ModuleType, stub: tuple[ModuleType, Any], fmt: str, block: tuple[int, int],
                                    q_width: int, sf_shape: tuple[int, int]) -> None:
    x = _x()
    q, sf = op.per_block_cast(x, fmt, block, round_sf=True)
    assert q.shape == (33, q_width) and sf.shape == sf_shape and sf.dtype == torch.float32
    ((name, values, args),) = _launches(stub)
    assert name == "per_block_cast" and values == dict(in_dtype="bfloat16", hidden=2048, fmt=fmt, block_m=block[0],
                                                       block_k=block[1], round_sf=True, precomputed_sf=False)
    assert args[0] is x and args[1] is q and args[2] is sf


@pytest.mark.parametrize("num_tokens", [0, 1, 33])
def test_out_is_launched_into_and_returned(op: ModuleType, stub: tuple[ModuleType, Any], num_tokens: int) -> None:
    x = _x(num_tokens)
    out = op.per_block_cast(x, "e2m1", (32, 128))  # what a caller keeps: an earlier call's pair
    result = op.per_block_cast(x, "e2m1", (32, 128), out=list(out))  # a list is taken as the tuple
    assert result[0] is out[0] and result[1] is out[1]
    assert _launches(stub)[-1][2][1:] == out
    q = torch.empty_like(out[0])
    assert op.per_block_cast_with_precomputed_sf(x, "e2m1", (32, 128), out[1], out=q) is q
    (_, values, args) = _launches(stub)[-1]
    assert values["precomputed_sf"] is True and args[1] is q and args[2] is out[1]


def test_out_of_the_wrong_kind_names_out_before_any_launch(op: ModuleType, stub: tuple[ModuleType, Any]) -> None:
    x = _x()
    q, sf = op.per_block_cast(x, "e4m3", (128, 128))
    _launches(stub).clear()
    with pytest.raises(TypeError, match=r"^out: expected \(q, sf\) as the op returns it"):
        op.per_block_cast(x, "e4m3", (128, 128), out=q)
    with pytest.raises(TypeError, match=r"^out: expected \(q, sf\)"):
        op.per_block_cast(x, "e4m3", (128, 128), out=(q, sf, sf))
    with pytest.raises(TypeError, match=r"^out: expected q as the op returns it \(a tensor\), got tuple"):
        op.per_block_cast_with_precomputed_sf(x, "e4m3", (128, 128), sf, out=(q,))
    assert _launches(stub) == []


def test_compiling_copies_the_result_into_out(op: ModuleType, stub: tuple[ModuleType, Any],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # While torch.compile traces, the custom op (the stub's is the function itself) computes into
    # fresh tensors and the op copies them into out: the graph holds no in-place launch.
    monkeypatch.setattr(op, "_kernel", WritingKernel(op._kernel, (1, 2)))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x = _x()
    out = tuple(poisoned(t) for t in op.per_block_cast(x, "e4m3", (32, 32)))
    result = op.per_block_cast(x, "e4m3", (32, 32), out=out)
    assert result[0] is out[0] and result[1] is out[1] and marked(out[0]) and marked(out[1])
    assert all(a is not t for a in _launches(stub)[-1][2] for t in out)
    q = poisoned(torch.empty_like(out[0]))
    assert op.per_block_cast_with_precomputed_sf(x, "e4m3", (32, 32), out[1], out=q) is q and marked(q)
    assert _launches(stub)[-1][2][1] is not q
