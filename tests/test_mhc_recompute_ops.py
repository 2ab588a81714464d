"""CPU tests of the mHC multi-layer recompute op (ops/mhc/multilayer_recompute.py) and its modeling re-export
(ops/modeling/mhc/ops/multilayer_recompute.py) on the stand-in runtime (tests/op_stub.py): TileKernels'
signature, the variant, the address table and the launch each call makes, and that a bad argument raises,
naming it, before anything is launched. No GPU needed."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import stub_package_with_layer

PACKAGE = "mhc_recompute_ops_pkg"


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType, Any]]:
    """(the op module, the modeling module, the stub runtime)."""
    with stub_package_with_layer(tmp_path_factory.mktemp("mhc_recompute_ops"), PACKAGE, "mhc", "multilayer_recompute", "modeling/mhc/ops/multilayer_recompute.py") as modules:
        yield modules


def _data(num_layers: int, num_post: int, lead: tuple[int, ...], h: int) -> tuple[Any, ...]:
    m = 4
    bf16 = torch.bfloat16
    return (torch.zeros(*lead, m, h, dtype=bf16),
            [torch.zeros(*lead, m, 1) for _ in range(num_layers)],
            [torch.zeros(*lead, h, dtype=bf16) for _ in range(num_post)],
            [torch.zeros(*lead, m, 1) for _ in range(num_post)],
            [torch.zeros(*lead, m, m) for _ in range(num_post)],
            [torch.zeros(*lead, h, dtype=bf16) for _ in range(num_layers)],
            [torch.zeros(*lead, m, h, dtype=bf16) for _ in range(num_post)])


def test_signature_is_tilekernels(ops: tuple[ModuleType, ModuleType, Any]) -> None:
    recompute, modeling, _ = ops
    assert modeling.mhc_multilayer_recompute is recompute.mhc_multilayer_recompute
    assert list(inspect.signature(recompute.mhc_multilayer_recompute).parameters) == [
        "initial_residual", "pre_mix_list", "layer_output_list", "post_mix_list", "comb_mix_list",
        "layer_input_list", "residual_list"]


@pytest.mark.parametrize(("num_layers", "num_post"), [(1, 1), (1, 0), (3, 2), (10, 10), (10, 9)])
@pytest.mark.parametrize(("lead", "hidden", "vec"), [((1, 13), 2560, 8), ((2, 3), 7168, 8), ((13,), 1283, 1)])
def test_one_launch_with_the_address_table(ops: tuple[ModuleType, ModuleType, Any], num_layers: int, num_post: int,
                                           lead: tuple[int, ...], hidden: int, vec: int) -> None:
    recompute, _, runtime = ops
    runtime.LAUNCHES.clear()
    initial, pre, outputs, posts, combs, inputs, residuals = data = _data(num_layers, num_post, lead, hidden)
    assert recompute.mhc_multilayer_recompute(*data) is None
    ((name, values, (flat, table, launched_post)),) = runtime.LAUNCHES
    assert (name, values, launched_post) == ("mhc_multilayer_recompute", {"mhc_mult": 4, "vec": vec}, num_post)
    tokens = initial.numel() // (4 * hidden)
    assert flat.shape == (tokens, 4, hidden) and flat.data_ptr() == initial.data_ptr()
    assert table.dtype == torch.int64 and table.shape == (6, num_layers)
    pad = [0] * (num_layers - num_post)
    rows = [pre, inputs, outputs, posts, combs, residuals]
    want = [[t.data_ptr() for t in row] + (pad if i >= 2 else []) for i, row in enumerate(rows)]
    assert table.tolist() == want


def test_no_tokens_launches_nothing(ops: tuple[ModuleType, ModuleType, Any]) -> None:
    recompute, _, runtime = ops
    runtime.LAUNCHES.clear()
    recompute.mhc_multilayer_recompute(*_data(3, 2, (1, 0), 2560))
    assert runtime.LAUNCHES == []


def test_a_misaligned_tensor_takes_the_scalar_variant(ops: tuple[ModuleType, ModuleType, Any]) -> None:
    recompute, _, runtime = ops
    runtime.LAUNCHES.clear()
    data = _data(2, 2, (1, 3), 2560)
    data[2][1] = torch.zeros(3 * 2560 + 1, dtype=torch.bfloat16)[1:].view(1, 3, 2560)  # starts 2 bytes in
    recompute.mhc_multilayer_recompute(*data)
    ((_, values, _),) = runtime.LAUNCHES
    assert values == {"mhc_mult": 4, "vec": 1}


def _with(index: int, value: object, layers: int = 2, post: int = 2) -> tuple[Any, ...]:
    data = list(_data(layers, post, (1, 3), 64))
    data[index] = value
    return tuple(data)


BAD = {
    "initial not a tensor": (_with(0, [[0.0]]), TypeError, "initial_residual"),
    "initial 1-D": (_with(0, torch.zeros(64, dtype=torch.bfloat16)), ValueError, "initial_residual"),
    "initial fp32": (_with(0, torch.zeros(1, 3, 4, 64)), ValueError, "initial_residual"),
    "pre not a list": (_with(1, torch.zeros(1, 3, 4, 1)), TypeError, "pre_mix_list"),
    "no layers": (_data(0, 0, (1, 3), 64), ValueError, "pre_mix_list"),
    "layer inputs short": (_with(5, [torch.zeros(1, 3, 64, dtype=torch.bfloat16)]), ValueError, "layer_input_list"),
    "comb count": (_with(4, [torch.zeros(1, 3, 4, 4)]), ValueError, "comb_mix_list"),
    "two layers fewer posts": (_data(3, 1, (1, 3), 64), ValueError, "layer_output_list"),
    "more posts than layers": (_data(1, 2, (1, 3), 64), ValueError, "layer_output_list"),
    "pre without its last 1": (_with(1, [torch.zeros(1, 3, 4)] * 2), ValueError, r"pre_mix_list\[0\]"),
    "comb tokens": (_with(4, [torch.zeros(1, 3, 4, 4), torch.zeros(1, 2, 4, 4)]), ValueError, r"comb_mix_list\[1\]"),
    "output fp32": (_with(2, [torch.zeros(1, 3, 64)] * 2), ValueError, r"layer_output_list\[0\]"),
    "residual not contiguous": (_with(6, [torch.zeros(1, 3, 64, 4, dtype=torch.bfloat16).transpose(2, 3)] * 2),
                                ValueError, r"residual_list\[0\]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_raise_before_any_launch(ops: tuple[ModuleType, ModuleType, Any], case: str) -> None:
    args, error, word = BAD[case]
    recompute, _, runtime = ops
    runtime.LAUNCHES.clear()
    with pytest.raises(error, match=word):
        recompute.mhc_multilayer_recompute(*args)
    assert runtime.LAUNCHES == []
