"""The generated package's runtime on a machine without a GPU: selection, lazy modules, argument
slots, checks that run before any driver call."""

from __future__ import annotations

import ctypes
import importlib
import sys
from types import ModuleType

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def package(small_package: ModuleType) -> ModuleType:
    return small_package


def test_op_modules_load_on_first_use(package: ModuleType) -> None:
    assert "tkc_small_kernels.quant._per_token_cast" not in sys.modules
    assert "per_token_cast" in dir(package.quant)
    assert callable(package.quant.per_token_cast)
    assert "tkc_small_kernels.quant._per_token_cast" in sys.modules
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        package.quant.nope  # noqa: B018


def test_select_names_the_grid_keys_and_the_built_variants(package: ModuleType) -> None:
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    errors = importlib.import_module("tkc_small_kernels.errors")
    kernel = runtime.get_kernel("per_token_cast")
    assert kernel.keys == ("in_dtype", "hidden", "fmt", "npc", "round_sf")
    with pytest.raises(TypeError, match="needs every grid key"):
        kernel.select(in_dtype="bfloat16")
    with pytest.raises(errors.VariantNotFoundError) as info:
        kernel.select(in_dtype="float16", hidden=2048, fmt="e4m3", npc=128, round_sf=True)
    message = str(info.value)
    assert "in_dtype='float16'" in message and "tests/data/specs/small.yaml" in message
    assert "in_dtype=bfloat16, hidden=2048, fmt=e4m3, npc=128, round_sf=True" in message
    with pytest.raises(errors.VariantNotFoundError, match="has no kernel 'nope'"):
        runtime.get_kernel("nope")


def test_select_takes_the_keys_in_any_order(package: ModuleType) -> None:
    kernel = importlib.import_module("tkc_small_kernels._runtime").get_kernel("per_token_cast")
    values = dict(zip(kernel.keys, next(iter(kernel.variants))))
    in_order = kernel.select(**values)  # the one-lookup path
    assert in_order is next(iter(kernel.variants.values()))
    assert kernel.select(**dict(reversed(values.items()))) is in_order


def test_launch_args_are_packed_into_slots_built_once(package: ModuleType) -> None:
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    args = runtime.LaunchArgs("pointer", "int32", "float32", "tensormap")
    keep, desc = runtime._aligned_tensor_map()
    params = args.pack(0x1000, -7, 1.5, desc)
    assert args.pack(0x2000, 3, 2.5, desc) is params  # the same array, new values
    assert ctypes.c_void_p.from_address(params[0]).value == 0x2000
    assert ctypes.c_int32.from_address(params[1]).value == 3
    assert ctypes.c_float.from_address(params[2]).value == 2.5
    assert params[3] == ctypes.addressof(desc) and ctypes.addressof(desc) % 64 == 0
    del keep


def test_tma_rules_are_checked_before_the_driver(package: ModuleType) -> None:
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    errors = importlib.import_module("tkc_small_kernels.errors")
    with pytest.raises(errors.KernelArgumentError, match="^y: the kernel moves y with the tensor memory"):
        runtime.tensor_map("y", 9, 0, (500, 130, 2), (1000, 130000), (64, 64, 1), (1, 1, 1), 0, 3, 2, 0)
    with pytest.raises(errors.KernelArgumentError, match="dimension in 1..2"):
        runtime.tensor_map("y", 9, 0, (64, 0, 2), (128, 0), (64, 64, 1), (1, 1, 1), 0, 3, 2, 0)


def test_tensor_checks_name_the_argument(package: ModuleType) -> None:
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    errors = importlib.import_module("tkc_small_kernels.errors")
    x = torch.empty(4, 2048, dtype=torch.bfloat16)
    with pytest.raises(errors.KernelArgumentError, match="^x: expected a torch.Tensor, got list"):
        runtime.check_tensor("x", [1], torch.bfloat16, (None, 2048), None)
    with pytest.raises(errors.KernelArgumentError, match=r"^x: expected dtype torch.float32, got torch.bfloat16"):
        runtime.check_tensor("x", x, torch.float32, (None, 2048), None)
    # Without a GPU, a CPU tensor is answered with NoGpuError (with one, KernelArgumentError).
    expected = errors.KernelArgumentError if torch.cuda.is_available() else errors.NoGpuError
    with pytest.raises(expected, match="^x: "):
        runtime.check_tensor("x", x, torch.bfloat16, (None, 2048), None)
    with pytest.raises(errors.KernelArgumentError, match=r"^x: expected strides \(2048, 1\)"):
        runtime.check_strides("x", x.t().contiguous().t(), (2048, 1))
    runtime.check_strides("x", torch.empty(0, 2048).t(), (2048, 1))  # empty: never indexed
    runtime.check_strides("x", x[:1, ::1], (2048, 1))
