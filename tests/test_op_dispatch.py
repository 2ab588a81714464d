"""What the op modules hand dispatch() (the compiled fast path of out= calls), on the CPU.

The op modules run over the stub runtime of tests/op_stub.py, whose launchers record their
arguments and whose dispatch() and remember() record what the ops pass them. For every op call
with out= of benchmarks/op_overhead_cpu.py (the shapes of the GPU overhead benchmark), the
recipe an op remembers must resolve, against the call it remembers, to exactly the arguments
the launcher was just given; and the op must call dispatch() with that same call, so that a
later call finds the entry. The GPU tests (tests/gpu/test_out.py) check the launches themselves.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from benchmarks.op_overhead_cpu import calls, stubbed_ops

# out= calls that are not remembered, and why.
NOT_REMEMBERED = {
    "quant.swiglu_backward_and_per_token_cast out=": "x is a (data, sf) pair and out nests (q, sf), and with no "
                                                     "rows the op zeroes weight_grad itself: it keeps its Python path",
    "quant.swiglu_backward_and_per_token_cast": "as its out= form",
}


@pytest.fixture(scope="module")
def ops() -> Iterator[tuple[dict[str, Any], list[ModuleType]]]:
    with tempfile.TemporaryDirectory() as root, stubbed_ops(Path(root)) as (modules, runtimes):
        yield calls(modules), runtimes


def _out_calls() -> list[str]:
    """The out= calls, and the allocating calls of the same ops (dispatch() takes both)."""
    with tempfile.TemporaryDirectory() as root, stubbed_ops(Path(root)) as (modules, _):
        names = list(calls(modules))
    out_calls = [name for name in names if name.endswith(" out=")]
    return out_calls + [name.removesuffix(" out=") for name in out_calls if name.removesuffix(" out=") in names]


def _same(a: object, b: object) -> bool:
    """Tensors by identity (the launcher must get the caller's objects, not views); scalars by type and value."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("name", _out_calls())
def test_a_remembered_recipe_is_the_launch_it_stands_for(ops: tuple[dict[str, Any], list[ModuleType]],
                                                         name: str) -> None:
    op_calls, runtimes = ops
    for runtime in runtimes:
        runtime.LAUNCHES.clear()
        runtime.REMEMBERED.clear()
        runtime.DISPATCHED.clear()
    result = op_calls[name]()
    launches = [launch for runtime in runtimes for launch in runtime.LAUNCHES]
    remembered = [entry for runtime in runtimes for entry in runtime.REMEMBERED]
    dispatched = [entry for runtime in runtimes for entry in runtime.DISPATCHED]
    if name in NOT_REMEMBERED:
        assert not remembered, NOT_REMEMBERED[name]
        return
    assert len(launches) == 1 and len(remembered) == 1, (launches, remembered)
    fast, _, arguments, _, call, allocated = remembered[0]
    inputs, outputs = fast[0]
    out = call[len(inputs)]
    if out is None:  # an allocating call: what dispatch() would allocate, and the op returned
        assert allocated is not None and len(allocated) == outputs, "an allocating call remembers its outputs"
        out = result
        for i, (recipe, tensor) in enumerate(zip(allocated, (out,) if outputs == 1 else out, strict=True)):
            dims = tuple(d if isinstance(d, int) else (call[d[0]].shape[d[1]] * d[2] + d[3]) // d[4]
                         for d in recipe.dims)
            assert (recipe.dtype, dims) == (tensor.dtype, tuple(tensor.shape)), f"output {i}"
            assert tensor.is_contiguous(), f"output {i}: dispatch() allocates contiguous tensors"
    resolved = []
    for argument in arguments:
        if type(argument).__name__ == "Source":
            if argument.kind == "input":
                resolved.append(call[argument.index])
            else:
                resolved.append(out if outputs == 1 else out[argument.index])
        else:
            resolved.append(argument)
    launched = launches[0][2]
    assert len(resolved) == len(launched)
    for i, (a, b) in enumerate(zip(resolved, launched, strict=True)):
        assert _same(a, b), f"launcher argument {i}: remembered {a!r}, launched {b!r}"
    # dispatch() was asked first, with the very call that is remembered: a later call finds it.
    assert len(dispatched) == 1 and dispatched[0][0] is fast
    assert len(dispatched[0][1]) == len(call)
    assert all(a is b for a, b in zip(dispatched[0][1], call, strict=True))
