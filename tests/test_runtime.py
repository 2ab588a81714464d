"""The generated package's runtime on a machine without a GPU: selection, lazy modules, argument
slots, checks that run before any driver call."""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import lzma
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tkc import pack

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


def test_a_kernel_imports_a_variants_launcher_on_its_first_use(package: ModuleType) -> None:
    """Importing a kernel costs its index: each variant's launcher module is imported when the variant is first
    asked for (variant, select, find or the variants mapping), once."""
    import sys

    runtime = importlib.import_module("tkc_small_kernels._runtime")
    kernel = runtime.get_kernel("per_token_cast")
    first = next(iter(kernel.modules.items()))
    modules = [f"tkc_small_kernels._kernels.per_token_cast.{name}" for _, name in kernel.modules.items()]
    saved = {name: sys.modules.pop(name) for name in modules if name in sys.modules}  # as if freshly imported
    try:
        kernel = runtime.Kernel(kernel.name, kernel.spec, kernel.keys, dict(kernel.modules))
        assert len(kernel.variants) == len(modules) and first[0] in kernel.variants
        # has() answers from the index alone: what traced code (torch.compile) may ask.
        assert kernel.has(*first[0]) and not kernel.has("float16", 1, "e4m3", 128, True, "row_major")
        assert not any(name in sys.modules for name in modules)
        launcher = kernel.variant(*first[0])
        assert launcher.__name__ == first[1] and launcher.__module__ == modules[0] and modules[0] in sys.modules
        assert not any(name in sys.modules for name in modules[1:])
        assert kernel.variant(*first[0]) is launcher is kernel.find(*first[0]) is kernel.variants[first[0]]
        assert kernel.find("float16", 1, "e4m3", 128, True, "row_major") is None
        with pytest.raises(KeyError):
            kernel.variants[("float16",)]
    finally:
        sys.modules.update(saved)


def test_a_variants_first_use_may_come_under_torch_compile(package: ModuleType) -> None:
    """A process whose first call of an op is traced by torch.compile(fullgraph=True) loads the variant's launcher
    then: the import runs for real (dynamo cannot trace one) and the launcher is a constant of the graph. (On this
    machine the traced graph then runs the launcher on CPU tensors, which it refuses naming x: past the trace.)"""
    import sys

    import torch

    runtime = importlib.import_module("tkc_small_kernels._runtime")
    errors = importlib.import_module("tkc_small_kernels.errors")
    kernel = runtime.get_kernel("per_token_cast")
    saved_launchers = dict(kernel._launchers)
    modules = {name: sys.modules.pop(name) for name in list(sys.modules)
               if name.startswith("tkc_small_kernels._kernels.per_token_cast.")}
    kernel._launchers.clear()
    try:
        torch._dynamo.reset()
        cast = torch.compile(lambda x: package.quant.per_token_cast(x, "e4m3", 128, round_sf=True), fullgraph=True,
                             backend="eager")
        with pytest.raises(errors.KernelError, match=r"\bx\b"):
            cast(torch.zeros(4, 2048, dtype=torch.bfloat16))
        assert any(name.startswith("tkc_small_kernels._kernels.per_token_cast.") for name in sys.modules)
    finally:
        kernel._launchers.clear()
        kernel._launchers.update(saved_launchers)
        sys.modules.update(modules)
        torch._dynamo.reset()


def test_one_traced_frame_may_load_several_new_launchers(package: ModuleType) -> None:
    """A traced op that picks two variants neither used before (mhc_pre's norm weights and GEMM, moe_routing's
    expand and reduce) loads both in one frame: dynamo's view of sys.modules is fixed for the frame, so the
    launchers are read from the index module's attributes."""
    import sys

    import torch

    runtime = importlib.import_module("tkc_small_kernels._runtime")
    kernel = runtime.get_kernel("per_token_cast")
    keys = list(kernel.modules)
    assert len(keys) == 2
    prefix = "tkc_small_kernels._kernels.per_token_cast."
    saved_launchers = dict(kernel._launchers)
    modules = {name: sys.modules.pop(name) for name in list(sys.modules) if name.startswith(prefix)}
    kernel._launchers.clear()
    try:
        torch._dynamo.reset()
        names = torch.compile(lambda x: (x + 1, [kernel.variant(*key).__name__ for key in keys]), fullgraph=True,
                              backend="eager")(torch.zeros(2))[1]
        assert names == [kernel.modules[key] for key in keys]
        assert all(prefix + kernel.modules[key] in sys.modules for key in keys)
    finally:
        kernel._launchers.clear()
        kernel._launchers.update(saved_launchers)
        sys.modules.update(modules)
        torch._dynamo.reset()


def test_a_traced_plan_may_read_the_sm_count_first(package: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """A persistent kernel's plan sizes its grid from the device's SM count; where a traced call is the first to
    ask, dynamo calls the driver for real (ctypes is not traceable) and keeps the count as a constant."""
    import torch

    drv = importlib.import_module("tkc_small_kernels._driver")

    class Lib:
        def cuDeviceGet(self, device: Any, index: int) -> int:
            device._obj.value = index
            return 0

        def cuDeviceGetAttribute(self, value: Any, attribute: int, device: int) -> int:
            value._obj.value = 132
            return 0

    class Driver:
        lib = Lib()

        def check(self, result: int, what: str) -> None:
            assert result == 0, what

    monkeypatch.setattr(drv, "driver", lambda: Driver())
    monkeypatch.setattr(drv, "_sm_counts", {})
    torch._dynamo.reset()
    try:
        out = torch.compile(lambda x: x + drv.sm_count(3), fullgraph=True, backend="eager")(torch.zeros(2))
        assert out.tolist() == [132.0, 132.0] and drv._sm_counts == {3: 132}
    finally:
        torch._dynamo.reset()


def test_variant_takes_the_grid_values_in_order(package: ModuleType) -> None:
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    errors = importlib.import_module("tkc_small_kernels.errors")
    kernel = runtime.get_kernel("per_token_cast")
    for values, launcher in kernel.variants.items():
        assert kernel.variant(*values) is launcher is kernel.select(**dict(zip(kernel.keys, values)))
    with pytest.raises(errors.VariantNotFoundError, match="in_dtype='float16'"):  # a miss: select's error
        kernel.variant("float16", 2048, "e4m3", 128, True)
    with pytest.raises(TypeError, match="needs every grid key"):
        kernel.variant("bfloat16")


# A stand-in for libcuda's two launch entry points that records what it was given.
_STUB_DRIVER = r"""
#include <stdint.h>
#include <string.h>
unsigned long long seen_kernel, seen_stream, seen_slots[8], seen_params[8];
unsigned seen_dims[7];
int current_device, next_result, param_count;  /* param_count: how many params to record */
/* static: the export below calls it directly, not through the PLT, where a libcuda stub that
 * TileLang loaded earlier in the process would interpose its own cuLaunchKernel. */
static int record(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  unsigned smem, void *stream, void **params) {
    unsigned dims[7] = {gx, gy, gz, bx, by, bz, smem};
    memcpy(seen_dims, dims, sizeof dims);
    seen_kernel = (unsigned long long)f;
    seen_stream = (unsigned long long)stream;
    for (int i = 0; i < param_count; i++) {
        seen_params[i] = (unsigned long long)params[i];
        memcpy(&seen_slots[i], params[i], 8);
    }
    return next_result;
}
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, void *stream, void **params, void **extra) {
    return record(f, gx, gy, gz, bx, by, bz, smem, stream, params);
}
int cuCtxGetDevice(int *device) { *device = current_device; return 0; }
/* cuLaunchKernelEx: the same record, plus the first attribute's id and first value word. */
typedef struct { int id; char pad[4]; unsigned value[16]; } attribute;
typedef struct { unsigned grid[3], block[3], smem; void *stream; attribute *attrs; unsigned num_attrs; } config;
int seen_attr_id, seen_attr_value, seen_num_attrs;
int cuLaunchKernelEx(const config *c, void *f, void **params, void **extra) {
    seen_num_attrs = c->num_attrs;
    seen_attr_id = c->num_attrs ? c->attrs[0].id : -1;
    seen_attr_value = c->num_attrs ? (int)c->attrs[0].value[0] : -1;
    return record(f, c->grid[0], c->grid[1], c->grid[2], c->block[0], c->block[1], c->block[2], c->smem,
                  c->stream, params);
}
"""
# One value of every argument kind, as the generated launchers pass them.
_KINDS = b"QqiIfdTQ"


@pytest.fixture(scope="module")
def stub_driver(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    folder = tmp_path_factory.mktemp("stub_driver")
    (folder / "stub.c").write_text(_STUB_DRIVER)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "stub.c", "-o", "libstub.so"], cwd=folder, check=True)
    return ctypes.CDLL(str(folder / "libstub.so"))


def _bind(native: ModuleType, lib: ctypes.CDLL) -> None:
    native.bind(*(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                  for name in ("cuLaunchKernel", "cuCtxGetDevice", "cuLaunchKernelEx")))


def _seen(lib: ctypes.CDLL) -> tuple[object, ...]:
    slots = (ctypes.c_uint64 * 8).in_dll(lib, "seen_slots")
    params = (ctypes.c_uint64 * 8).in_dll(lib, "seen_params")
    values = (slots[0], ctypes.c_int64.from_buffer_copy(bytes(slots)[8:16]).value,
              ctypes.c_int32.from_buffer_copy(bytes(slots)[16:20]).value, slots[3] & 0xFFFFFFFF,
              ctypes.c_float.from_buffer_copy(bytes(slots)[32:36]).value,
              ctypes.c_double.from_buffer_copy(bytes(slots)[40:48]).value, params[6], slots[7])
    return (ctypes.c_uint64.in_dll(lib, "seen_kernel").value, ctypes.c_uint64.in_dll(lib, "seen_stream").value,
            tuple((ctypes.c_uint * 7).in_dll(lib, "seen_dims")), values)


def test_both_launch_paths_hand_the_driver_the_same_arguments(package: ModuleType, stub_driver: ctypes.CDLL,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    native = importlib.import_module("tkc_small_kernels._launch")  # compiled by tkc build on this host
    compiled = importlib.import_module("tkc_small_kernels._compiled")
    driver = importlib.import_module("tkc_small_kernels._driver")
    assert runtime.NATIVE_LAUNCH and runtime.launch is native.launch
    _bind(native, stub_driver)
    monkeypatch.setattr(driver, "_DRIVER_LIB", [stub_driver])
    monkeypatch.setattr(driver, "_current_device", lambda: 0)
    keep, tensormap = importlib.import_module("tkc_small_kernels._tma")._aligned_tensor_map()
    address = ctypes.addressof(tensormap)
    values = (0xDEAD_BEEF_0000, -(2**40), -7, 2**32 - 1, 1.5, -2.25, address, 2**64 - 1)
    expected = (0x1234, 0x5678, (70000, 2, 3, 128, 1, 1, 512), (*values[:6], address, values[7]))
    # Plain launches go to cuLaunchKernel, cooperative ones to cuLaunchKernelEx with the cooperative
    # attribute (id 2, value 1): the compiled and the ctypes path alike; cluster launches (ctypes
    # only) with the cluster attribute (id 4, its x dimension first).
    def cluster(*args: object) -> int:
        return compiled._ctypes_launch_ex(*args[:7], args[7:], cooperative=False, cluster=(2, 1, 1))

    paths = ((native.launch, (0, 0, 0)), (compiled._ctypes_launch, (0, 0, 0)), (native.launch_cooperative, (1, 2, 1)),
             (compiled._ctypes_launch_cooperative, (1, 2, 1)), (cluster, (1, 4, 2)))
    for launch, attributes_seen in paths:
        ctypes.c_int.in_dll(stub_driver, "param_count").value = len(values)
        ctypes.c_int.in_dll(stub_driver, "next_result").value = 0
        ctypes.c_uint64.in_dll(stub_driver, "seen_kernel").value = 0
        ctypes.c_int.in_dll(stub_driver, "seen_num_attrs").value = 0
        assert launch(0x1234, 0, (70000, 2, 3), (128, 1, 1), 512, 0x5678, _KINDS, *values) == 0
        assert _seen(stub_driver) == expected, launch
        attributes = tuple(ctypes.c_int.in_dll(stub_driver, n).value
                           for n in ("seen_num_attrs", "seen_attr_id", "seen_attr_value"))
        assert attributes == attributes_seen, launch  # the plain paths run first: nothing recorded yet
        ctypes.c_int.in_dll(stub_driver, "param_count").value = 1
        ctypes.c_int.in_dll(stub_driver, "next_result").value = 719  # a driver error comes back as is
        assert launch(0x1234, 0, (1, 1, 1), (32, 1, 1), 0, 0, b"Q", 16) == 719
    del keep
    # Another device's context is current: no launch, the caller switches devices and retries.
    ctypes.c_int.in_dll(stub_driver, "param_count").value = 0
    ctypes.c_int.in_dll(stub_driver, "current_device").value = 1
    ctypes.c_uint64.in_dll(stub_driver, "seen_kernel").value = 0
    assert native.launch(0x1234, 0, (1, 1, 1), (32, 1, 1), 0, 0, b"Q", 16) == runtime._WRONG_DEVICE
    assert ctypes.c_uint64.in_dll(stub_driver, "seen_kernel").value == 0
    ctypes.c_int.in_dll(stub_driver, "current_device").value = 0


@pytest.mark.parametrize(("kinds", "values", "error"), [
    (b"i", (2**31,), OverflowError), (b"I", (-1,), OverflowError), (b"Q", (-1,), OverflowError),
    (b"i", ("7",), TypeError), (b"ii", (1,), TypeError), (b"x", (1,), ValueError),
])
def test_native_launch_refuses_values_that_do_not_fit(package: ModuleType, stub_driver: ctypes.CDLL,
                                                      kinds: bytes, values: tuple[object, ...],
                                                      error: type[Exception]) -> None:
    native = importlib.import_module("tkc_small_kernels._launch")
    _bind(native, stub_driver)
    ctypes.c_int.in_dll(stub_driver, "param_count").value = 0
    ctypes.c_uint64.in_dll(stub_driver, "seen_kernel").value = 0
    with pytest.raises(error):
        native.launch(0x1234, 0, (1, 1, 1), (32, 1, 1), 0, 0, kinds, *values)
    assert ctypes.c_uint64.in_dll(stub_driver, "seen_kernel").value == 0  # nothing was launched
    with pytest.raises(OverflowError, match="grid dimension 0"):
        native.launch(0x1234, 0, (2**32, 1, 1), (32, 1, 1), 0, 0, b"")


def test_slots_are_built_once_per_thread(package: ModuleType) -> None:
    compiled = importlib.import_module("tkc_small_kernels._compiled")
    slots = compiled._Slots.of(b"QifT")
    assert compiled._Slots.of(b"QifT") is slots
    keep, desc = importlib.import_module("tkc_small_kernels._tma")._aligned_tensor_map()
    params = slots.pack((0x1000, -7, 1.5, ctypes.addressof(desc)))
    assert slots.pack((0x2000, 3, 2.5, ctypes.addressof(desc))) is params  # the same array, new values
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


# ---- run(): the compiled check and launch in one call, on CPU tensors through the stub driver ----

def _run_setup(package: ModuleType, stub_driver: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch,
               cooperative: bool = False) -> tuple[ModuleType, ModuleType, bytes, object, bytes]:
    """(runtime, native, contract, Function, plan) of a per_token_cast-like launch on DLPack's CPU device:
    strided x rows, a row-major q, scales by an expression of the tokens, a grid of max(...), and one
    kernel argument of every source (pointers, sizes as int32 and int64, an int and a float scalar)."""
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    native = importlib.import_module("tkc_small_kernels._launch")
    if not runtime.NATIVE_RUN:
        pytest.skip("the small package was built without its compiled module")
    _bind(native, stub_driver)
    native.set_stream(lambda device: 0x5678 + device)
    monkeypatch.setattr(importlib.import_module("tkc_small_kernels._driver"), "_DRIVER_LIB", [stub_driver])
    contract = pack.contract(
        (
            ("x", torch.bfloat16, ("num_tokens", 256), ("x_row_stride", 1)),
            ("q", torch.float8_e4m3fn, ("num_tokens", 256), pack.ROW_MAJOR),
            ("sf", torch.float32, ("(num_tokens + 127) // 128", 2), pack.ROW_MAJOR),
        ),
        sizes=(("num_tokens", "x", "shape", 0, 2**31), ("x_row_stride", "x", "stride", 0, 0)),
        written=("q", "sf"), alignment=16, device_type=1,
    )
    function = runtime.Function(runtime.Cubin("none.cubin"), "k", (128, 2, 1), 512, "QQQiqfd",
                                cooperative=cooperative)
    plan = pack.plan(function, arguments=("x", "q", "sf", "mode", "eps"), tensors=("x", "q", "sf"),
                        sizes=("num_tokens", "x_row_stride"), grid=("max((num_tokens + 3) // 4, 1)", "3", "1"),
                        values=("q_ptr", "sf_ptr", "x_ptr", "int(mode)", "x_row_stride", "float(eps)",
                                "float(eps)"))
    assert plan is not None
    return runtime, native, contract, function, plan


def _reset(stub_driver: ctypes.CDLL, params: int = 7) -> None:
    ctypes.c_int.in_dll(stub_driver, "param_count").value = params
    ctypes.c_int.in_dll(stub_driver, "next_result").value = 0
    ctypes.c_int.in_dll(stub_driver, "current_device").value = 0
    ctypes.c_uint64.in_dll(stub_driver, "seen_kernel").value = 0
    ctypes.c_int.in_dll(stub_driver, "seen_num_attrs").value = 0


def _launch_seen(lib: ctypes.CDLL, params: int = 7) -> tuple[object, ...]:
    """(kernel, stream, dims, the first params' 8-byte slots): what a launch handed the stub, without the
    slots' addresses (stack addresses of each path; only a 'T' kind passes an address of meaning)."""
    return (*_seen(lib)[:3], tuple((ctypes.c_uint64 * 8).in_dll(lib, "seen_slots"))[:params])


def _launched(stub_driver: ctypes.CDLL) -> bool:
    return ctypes.c_uint64.in_dll(stub_driver, "seen_kernel").value != 0


def _token_tensors(tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(tokens, 320).to(torch.bfloat16)[:, :256]
    return x, torch.empty(tokens, 256, dtype=torch.float8_e4m3fn), torch.empty((tokens + 127) // 128, 2)


@pytest.mark.parametrize("cooperative", [False, True])
@pytest.mark.usefixtures("tensor_reader")
def test_run_launches_what_the_python_path_launches(package: ModuleType, stub_driver: ctypes.CDLL,
                                                    monkeypatch: pytest.MonkeyPatch, cooperative: bool) -> None:
    runtime, native, contract, function, plan = _run_setup(package, stub_driver, monkeypatch, cooperative)
    function.handles[0] = 0x1234
    x, q, sf = _token_tensors(300)
    _reset(stub_driver)
    assert native.run(contract, plan, function.handles, x, q, sf, 2, 0.1) is True
    by_run = _launch_seen(stub_driver)
    attributes = ctypes.c_int.in_dll(stub_driver, "seen_num_attrs").value
    # The Python path of a generated launcher: check(), the grid, the values, launch().
    device, x_ptr, q_ptr, sf_ptr, num_tokens, x_row_stride = runtime.check(contract, x, q, sf)
    grid = (max((num_tokens + 3) // 4, 1), 3, 1)
    launch = native.launch_cooperative if cooperative else native.launch
    _reset(stub_driver)
    assert launch(0x1234, device, grid, (128, 2, 1), 512, 0x5678 + device, b"QQQiqfd", q_ptr, sf_ptr, x_ptr, 2,
                  x_row_stride, 0.1, 0.1) == 0
    assert by_run == _launch_seen(stub_driver)
    assert by_run[1:3] == (0x5678, (75, 3, 1, 128, 2, 1, 512))
    assert attributes == ctypes.c_int.in_dll(stub_driver, "seen_num_attrs").value == int(cooperative)


@pytest.mark.usefixtures("tensor_reader")
def test_run_launches_nothing_for_an_empty_grid(package: ModuleType, stub_driver: ctypes.CDLL,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _, native, contract, function, _ = _run_setup(package, stub_driver, monkeypatch)
    function.handles[0] = 0x1234
    plan = pack.plan(function, arguments=("x", "q", "sf", "mode", "eps"), tensors=("x", "q", "sf"),
                        sizes=("num_tokens", "x_row_stride"), grid=("(num_tokens + 3) // 4", "3", "1"),
                        values=("q_ptr", "sf_ptr", "x_ptr", "int(mode)", "x_row_stride", "float(eps)",
                                "float(eps)"))
    _reset(stub_driver)
    assert native.run(contract, plan, function.handles, *_token_tensors(0), 2, 0.1) is True  # `if 0 in grid`
    assert not _launched(stub_driver)


@pytest.mark.parametrize("case", [
    "no handle yet", "another device's context", "driver error", "x dtype", "q rows", "not a tensor",
    "mode not an int", "eps not a number", "argument missing", "no plan", "no contract", "truncated plan",
    "plan version",
])
@pytest.mark.usefixtures("tensor_reader")
def test_run_declines_what_the_python_path_must_decide(package: ModuleType, stub_driver: ctypes.CDLL,
                                                       monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """False means the launcher's Python path runs: it names a bad argument, loads the kernel on a new
    device, switches contexts or reports the driver's error. Nothing is launched, except a launch the
    driver refused (which never ran, so launching again is safe)."""
    _, native, contract, _, plan = _run_setup(package, stub_driver, monkeypatch)
    handles = {0: 0x1234}
    x, q, sf = _token_tensors(300)
    args: list[object] = [contract, plan, handles, x, q, sf, 2, 0.1]
    _reset(stub_driver)
    if case == "no handle yet":
        handles.clear()
    elif case == "another device's context":
        ctypes.c_int.in_dll(stub_driver, "current_device").value = 1
    elif case == "driver error":
        ctypes.c_int.in_dll(stub_driver, "next_result").value = 719
    elif case == "x dtype":
        args[3] = x.float()
    elif case == "q rows":
        args[4] = q[:299]
    elif case == "not a tensor":
        args[5] = sf.tolist()
    elif case == "mode not an int":
        args[6] = "2"
    elif case == "eps not a number":
        args[7] = None
    elif case == "argument missing":
        del args[7]
    elif case == "no plan":
        args[1] = None
    elif case == "no contract":
        args[0] = None
    elif case == "truncated plan":
        args[1] = plan[:-8]
    elif case == "plan version":
        args[1] = (9).to_bytes(8, "little") + plan[8:]
    assert native.run(*args) is False
    assert _launched(stub_driver) is (case == "driver error")


def test_plan_leaves_what_run_cannot_take_to_python(package: ModuleType) -> None:
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    if not runtime.NATIVE_RUN:
        pytest.skip("the small package was built without its compiled module")
    cubin = runtime.Cubin("none.cubin")

    def plan(kinds: str, values: tuple[str, ...], grid: tuple[str, ...] = ("n", "1", "1"), **extra: object) -> object:
        return pack.plan(runtime.Function(cubin, "k", (32, 1, 1), 0, kinds, **extra), arguments=("x", "n_arg"),
                            tensors=("x",), sizes=("n",), grid=grid, values=values)

    assert plan("Qi", ("x_ptr", "n")) is not None
    assert plan("Qi", ("x_ptr", "n"), cluster=(2, 1, 1)) is None  # cuLaunchKernelEx with a cluster: ctypes
    assert plan("Ti", ("x_ptr", "n")) is None  # a TMA descriptor: encoded in Python
    assert plan("Qi", ("x_ptr", "n + 1")) is None  # not a pointer, size or scalar argument
    assert plan("Qi", ("y_ptr", "n")) is None  # not a tensor of the contract
    assert plan("Qf", ("x_ptr", "int(n_arg)")) is None  # an int where the kernel takes a float
    assert plan("Qi", ("x_ptr",)) is None  # fewer values than kinds
    assert plan("Qi", ("x_ptr", "n"), grid=("n ** 2", "1", "1")) is None  # outside the expression grammar


@pytest.mark.usefixtures("tensor_reader")
def test_grids_beyond_cudas_limits_are_refused_by_name(package: ModuleType, stub_driver: ctypes.CDLL,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A grid follows from the tensors' sizes: 65536 row tiles in y is the caller's to split, named as such,
    where the driver would only say CUDA_ERROR_INVALID_VALUE. run() leaves it to that error."""
    runtime, native, _, _, _ = _run_setup(package, stub_driver, monkeypatch)
    errors = importlib.import_module("tkc_small_kernels.errors")
    contract = pack.contract((("x", torch.int8, ("n",), pack.ROW_MAJOR),), sizes=(("n", "x", "shape", 0, 0),),
                                alignment=1, device_type=1)
    function = runtime.Function(runtime.Cubin("none.cubin"), "k", (32, 1, 1), 0, "Q")
    function.handles[0] = 0x1234
    plan = pack.plan(function, arguments=("x",), tensors=("x",), sizes=("n",), grid=("1", "n", "1"),
                        values=("x_ptr",))
    _reset(stub_driver, params=1)
    assert native.run(contract, plan, function.handles, torch.empty(65535, dtype=torch.int8)) is True
    _reset(stub_driver, params=1)
    assert native.run(contract, plan, function.handles, torch.empty(65536, dtype=torch.int8)) is False
    assert not _launched(stub_driver)
    for grid in ((1, 65536, 1), (1, 1, 65536), (2**31, 1, 1)):
        with pytest.raises(errors.KernelArgumentError, match=r"^k: the tensors' sizes give a grid of .* beyond CUDA's "
                                                             r"limit of \(2147483647, 65535, 65535\); split the call"):
            function.launch_slow(0, grid, (0x1000,))


# ---- dispatch(): an op's remembered call signature, on CPU tensors through the stub driver ----

def _dispatch_setup(package: ModuleType, stub_driver: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
                    ) -> tuple[ModuleType, ModuleType, object, tuple[object, ...], tuple[object, ...]]:
    """(runtime, native, fast path, launcher arguments, call) of a per_token_cast-like op called as
    op(x, fmt, npc, flag, out=(q, sf)), whose call was remembered: x keyed by its width, q and sf from out,
    mode and eps constants, x's row stride a multiple of 16 bytes."""
    runtime, native, contract, function, plan = _run_setup(package, stub_driver, monkeypatch)
    if not runtime.NATIVE_DISPATCH:
        pytest.skip("the small package was built without dispatch()")
    function.handles[0] = 0x1234

    def launcher(*args: object) -> None:
        raise AssertionError("dispatch() launches through the plan, never through the launcher")

    launcher.planned = (contract, plan, function.handles)  # type: ignore[attr-defined]
    fast = runtime.fast_path(inputs=((1,),), outputs=2)
    x, q, sf = _token_tensors(300)
    call = (x, (q, sf), "e4m3", 128, None, False)
    assert runtime.dispatch(fast, *call) is None  # nothing remembered yet
    arguments = (runtime.from_input(0), runtime.from_out(0), runtime.from_out(1), 2, 0.1)
    runtime.remember(fast, launcher, arguments, (runtime.stride_bytes_multiple(0, 0, 16),), *call)
    return runtime, native, fast, (contract, plan, function.handles), call


@pytest.mark.usefixtures("tensor_reader")
def test_dispatch_launches_what_run_launches(package: ModuleType, stub_driver: ctypes.CDLL,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, native, fast, planned, call = _dispatch_setup(package, stub_driver, monkeypatch)
    x, (q, sf) = call[:2]
    _reset(stub_driver)
    assert native.run(*planned, x, q, sf, 2, 0.1) is True
    by_run = _launch_seen(stub_driver)
    _reset(stub_driver)
    assert runtime.dispatch(fast, *call) is call[1]  # out, returned as given
    assert _launch_seen(stub_driver) == by_run
    _reset(stub_driver)
    as_list = runtime.dispatch(fast, x, [q, sf], *call[2:])  # a list out comes back as the op's tuple
    assert type(as_list) is tuple and as_list[0] is q and as_list[1] is sf
    assert _launch_seen(stub_driver) == by_run
    # Equal options are the same signature whatever object holds them (a str built at run time is not
    # the interned literal the call was remembered with).
    fmt = "".join(["e4", "m3"])
    assert fmt is not call[2]
    _reset(stub_driver)
    assert runtime.dispatch(fast, x, call[1], fmt, *call[3:]) is call[1]
    assert _launch_seen(stub_driver) == by_run
    # Another token count is the same signature: the sizes are read per call.
    x2, q2, sf2 = _token_tensors(5)
    _reset(stub_driver)
    assert runtime.dispatch(fast, x2, (q2, sf2), *call[2:]) is not None
    assert _launch_seen(stub_driver)[2][:3] == (2, 3, 1)


@pytest.mark.usefixtures("tensor_reader")
def test_dispatch_allocates_what_an_allocating_call_remembered(package: ModuleType, stub_driver: ctypes.CDLL,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """out None is a signature of its own: remembered with its outputs, dispatch() allocates them (shapes from
    the call's sizes) and launches into them as the out= call does."""
    runtime, _, fast, planned, call = _dispatch_setup(package, stub_driver, monkeypatch)
    x = call[0]
    allocating = (x, None, *call[2:])
    assert runtime.dispatch(fast, *allocating) is None  # only the out= signature is remembered
    outputs = (runtime.output(torch.float8_e4m3fn, runtime.size_of(0, 0), 256),
               runtime.output(torch.float32, runtime.size_of(0, 0, plus=127, per=128), 2))
    arguments = (runtime.from_input(0), runtime.from_out(0), runtime.from_out(1), 2, 0.1)

    def launcher(*args: object) -> None:
        raise AssertionError("dispatch() launches through the plan, never through the launcher")

    launcher.planned = planned  # type: ignore[attr-defined]
    runtime.remember(fast, launcher, arguments, (runtime.stride_bytes_multiple(0, 0, 16),), *allocating,
                     outputs=outputs)
    for tokens in (300, 5, 0):
        xt = _token_tensors(tokens)[0]
        _reset(stub_driver)
        result = runtime.dispatch(fast, xt, None, *call[2:])
        assert type(result) is tuple and len(result) == 2
        q, sf = result
        assert (q.dtype, tuple(q.shape), q.device) == (torch.float8_e4m3fn, (tokens, 256), xt.device)
        assert (sf.dtype, tuple(sf.shape)) == (torch.float32, ((tokens + 127) // 128, 2))
        assert q.is_contiguous() and sf.is_contiguous()
        # The launch got the new tensors, as the out= call with them does.
        seen = _launch_seen(stub_driver)
        _reset(stub_driver)
        assert runtime.dispatch(fast, xt, (q, sf), *call[2:]) is not None
        assert _launch_seen(stub_driver) == seen
    # A refused input declines before anything is returned; the op's Python path then names it.
    assert runtime.dispatch(fast, torch.randn(300, 260).to(torch.bfloat16)[:, :256], None, *call[2:]) is None


@pytest.mark.parametrize("case", [
    "another npc", "npc a float", "flag an int", "npc a bool", "an option of another type", "fmt a longer string",
    "fmt a prefix", "a tuple option", "an int beyond 64 bits", "x dtype", "x width",
    "x not a tensor", "no out", "out of one tensor", "out a dict", "q rows", "row stride", "no handle yet",
    "driver error", "spec version",
])
@pytest.mark.usefixtures("tensor_reader")
def test_dispatch_declines_what_the_op_must_decide(package: ModuleType, stub_driver: ctypes.CDLL,
                                                   monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """None: the op's Python path runs its checks (naming the argument) or launches; nothing was launched,
    except a launch the driver refused (which never ran)."""
    runtime, _, fast, planned, call = _dispatch_setup(package, stub_driver, monkeypatch)
    x, (q, sf) = call[:2]
    args = list(call)
    if case == "another npc":
        args[3] = 64
    elif case == "npc a float":
        args[3] = 128.0  # == 128, same hash: the key holds the type too
    elif case == "flag an int":
        args[5] = 0  # == False
    elif case == "npc a bool":
        args[3] = True
    elif case == "an option of another type":
        args[4] = [1, 128]
        assert importlib.import_module("tkc_small_kernels._launch").dispatch_key(fast[0], *args) is None  # never remembered either
    elif case == "fmt a longer string":
        args[2] = "e4m3fn"
    elif case == "fmt a prefix":
        args[2] = "e4m"
    elif case == "a tuple option":
        args[4] = (1, 128)  # remembered as None
    elif case == "an int beyond 64 bits":
        args[3] = 2**64 + 128
        assert importlib.import_module("tkc_small_kernels._launch").dispatch_key(fast[0], *args) is None
    elif case == "x dtype":
        args[0] = x.float()
    elif case == "x width":
        args[0] = torch.randn(300, 512).to(torch.bfloat16)
    elif case == "x not a tensor":
        args[0] = x.tolist()
    elif case == "no out":
        args[1] = None
    elif case == "out of one tensor":
        args[1] = (q,)
    elif case == "out a dict":
        args[1] = {0: q, 1: sf}
    elif case == "q rows":
        args[1] = (q[:299], sf)
    elif case == "row stride":  # 260 bf16 per row: 520 bytes, not a multiple of 16 (the contract accepts it)
        args[0] = torch.randn(300, 260).to(torch.bfloat16)[:, :256]
        assert runtime.check(planned[0], args[0], q, sf) is not None
    elif case == "no handle yet":
        planned[2].clear()
    elif case == "driver error":
        ctypes.c_int.in_dll(stub_driver, "next_result").value = 719
    elif case == "spec version":
        fast = ((9).to_bytes(8, "little") + fast[0][8:], fast[1])
    if case != "driver error":
        _reset(stub_driver)
    assert runtime.dispatch(fast, *args) is None
    assert _launched(stub_driver) is (case == "driver error")


@pytest.mark.usefixtures("tensor_reader")
def test_dispatch_rules_restate_the_ops_checks(package: ModuleType, stub_driver: ctypes.CDLL,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizes the contract leaves free: each rule launches where it holds and declines where it does not."""
    runtime, _, _, _, _ = _run_setup(package, stub_driver, monkeypatch)
    contract = pack.contract((("x", torch.float32, ("n", 4), pack.ROW_MAJOR), ("y", torch.int32, ("m",), None)),
                                sizes=(("n", "x", "shape", 0, 0), ("m", "y", "shape", 0, 0)), alignment=4,
                                device_type=1)
    function = runtime.Function(runtime.Cubin("none.cubin"), "k", (32, 1, 1), 0, "QQ")
    function.handles[0] = 0x1234
    plan = pack.plan(function, arguments=("x", "y"), tensors=("x", "y"), sizes=("n", "m"),
                        grid=("n", "1", "1"), values=("x_ptr", "y_ptr"))

    def launcher(*args: object) -> None:
        raise AssertionError

    launcher.planned = (contract, plan, function.handles)  # type: ignore[attr-defined]
    rules = {
        "same": (runtime.same_size(0, 0, 1, 0), 8, 8, 7),
        "times": (runtime.same_size(0, 0, 1, 0, times=2), 8, 16, 8),
        "multiple": (runtime.size_multiple(1, 0, 4), 8, 12, 10),
        "is": (runtime.size_is(1, 0, 3), 8, 3, 4),
    }
    for name, (rule, n, m_good, m_bad) in rules.items():
        x, out = torch.zeros(n, 4), torch.zeros(m_good, dtype=torch.int32)
        fast = runtime.fast_path(inputs=((),), outputs=1)
        runtime.remember(fast, launcher, (runtime.from_input(0), runtime.from_out()), (rule,), x, out)
        assert len(fast[1]) == 1, name
        _reset(stub_driver, params=2)
        assert runtime.dispatch(fast, x, out) is out, name
        assert _launched(stub_driver), name
        _reset(stub_driver, params=2)
        assert runtime.dispatch(fast, x, torch.zeros(m_bad, dtype=torch.int32)) is None, name
        assert not _launched(stub_driver), name


def test_generated_launchers_carry_what_dispatch_launches_with(package: ModuleType) -> None:
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    if not runtime.NATIVE_RUN:
        pytest.skip("the small package was built without its compiled module")
    kernel = runtime.get_kernel("per_token_cast")
    for launch in kernel.variants.values():
        module = sys.modules[launch.__module__]
        contract, plan, handles = launch.planned
        assert contract is module._CONTRACT and plan is module._PLAN and handles is module._KERNEL.handles


def test_a_tampered_cubin_is_refused_before_the_driver_sees_it(package: ModuleType, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Each launcher module's cubins carry the sha256 the manifest records; a flipped byte in an installed cubin
    is a CorruptPackageError naming the file, raised on reading it (no GPU needed: the driver comes after)."""
    import hashlib
    import json
    import shutil

    runtime = importlib.import_module("tkc_small_kernels._runtime")
    errors = importlib.import_module("tkc_small_kernels.errors")
    kernel = runtime.get_kernel("per_token_cast")
    cubins = [sys.modules[launch.__module__]._CUBIN for launch in kernel.variants.values()]
    manifest = json.loads((runtime._CUBIN_DIR.parent / "manifest.json").read_text())
    recorded = {(v["cubin"].removeprefix("cubins/"), v["offset"], v["bytes"]): v["sha256"]
                for v in manifest["kernels"]["per_token_cast"]["variants"]}
    assert cubins and {(c.filename, c.offset, c.size): c.sha256 for c in cubins} == recorded
    for cubin in cubins:
        assert hashlib.sha256(cubin.data()).hexdigest() == cubin.sha256
    first, second = sorted(cubins, key=lambda c: c.offset)[:2]  # two cubins of one pack
    assert first.filename == second.filename
    tampered = tmp_path / "cubins"
    shutil.copytree(runtime._CUBIN_DIR, tampered)
    data = bytearray(lzma.decompress((tampered / first.filename).read_bytes()))
    data[first.offset + first.size // 2] ^= 0x40
    (tampered / first.filename).write_bytes(lzma.compress(bytes(data), format=lzma.FORMAT_XZ))
    monkeypatch.setattr(runtime, "_CUBIN_DIR", tampered)
    monkeypatch.setattr(runtime, "driver", lambda: pytest.fail("the driver was asked to load a tampered cubin"))
    again = runtime.Cubin(first.filename, first.sha256, offset=first.offset, size=first.size)
    with pytest.raises(errors.CorruptPackageError, match=rf"{first.filename} \(bytes {first.offset}\.\.\d+\): not the "
                       r"cubin .* reinstall it"):
        again._load()
    intact = runtime.Cubin(second.filename, second.sha256, offset=second.offset, size=second.size)
    assert intact.data() == data[second.offset:second.offset + second.size]
    # A pack that is no xz stream at all (truncated, say) is refused the same way, naming it.
    (tampered / first.filename).write_bytes(b"not xz")
    runtime._pack.cache_clear()  # packs are read once per process
    with pytest.raises(errors.CorruptPackageError, match=rf"{first.filename}: not a pack of cubins .* reinstall it"):
        runtime.Cubin(first.filename, first.sha256, offset=first.offset, size=first.size).data()


class _FakeDriver:
    """cuDriverGetVersion of a driver that supports CUDA ``version`` (1000 * major + 10 * minor)."""

    def __init__(self, version: int, result: int = 0) -> None:
        self.version, self.result = version, result

    def cuDriverGetVersion(self, out: object) -> int:
        out._obj.value = self.version  # type: ignore[attr-defined]  # a ctypes byref
        return self.result


def test_an_older_driver_is_refused_naming_both_versions(package: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    driver = importlib.import_module("tkc_small_kernels._driver")
    errors = importlib.import_module("tkc_small_kernels.errors")
    info = importlib.import_module("tkc_small_kernels._build_info")
    assert info.CUDA == (13, 0)  # the build's nvcc (13.0 from PyPI)
    with pytest.raises(errors.CudaDriverError, match=r"supports CUDA 12\.8, but the cubins .* need a driver for "
                                                     r"CUDA 13\.0 or later .*update the driver"):
        driver.check_driver_version(_FakeDriver(12080))
    for newer in (13000, 13020, 14000):
        driver.check_driver_version(_FakeDriver(newer))
    driver.check_driver_version(_FakeDriver(0, result=1))  # the query failing is left to the first load
    monkeypatch.setattr(info, "CUDA", (0, 0))  # a build whose nvcc version was unknown checks nothing
    driver.check_driver_version(_FakeDriver(11000))


@pytest.fixture
def multi_package(small_multi_build: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The small multi-arch package (sm90, sm100, sm103) imported fresh from its build folder, in place of the
    sm90 package of the other tests (restored afterwards)."""
    from tests.conftest import multi_arch_root

    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if name.startswith("tkc_small_kernels")}
    monkeypatch.syspath_prepend(str(multi_arch_root(small_multi_build[0])))
    try:
        yield importlib.import_module("tkc_small_kernels")
    finally:
        for name in [m for m in sys.modules if m.startswith("tkc_small_kernels")]:
            del sys.modules[name]
        sys.modules.update(saved)


def _fake_devices(monkeypatch: pytest.MonkeyPatch, capabilities: list[tuple[int, int]]) -> None:
    """torch sees one device of each compute capability (no GPU needed: only the arch choice reads them)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(capabilities))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capabilities[index])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"fake GPU {index}")


def test_a_multi_arch_package_imports_no_arch_until_a_variant_is_used(multi_package: ModuleType) -> None:
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    kernel = runtime.get_kernel("per_token_cast")
    assert type(kernel).__name__ == "ArchKernels" and kernel.archs == ("sm90", "sm100", "sm103")
    assert not [m for m in sys.modules if m.startswith("tkc_small_kernels._kernels.per_token_cast.")]
    assert len(kernel.variants) == 2  # the keys, from the arch indexes: no launcher module yet
    assert not [m for m in sys.modules if m.count(".") == 4 and ".per_token_cast.sm" in m]


def test_one_arch_of_devices_takes_that_archs_launchers_themselves(multi_package: ModuleType,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every device an sm_100 (a B200 machine): the launchers are the sm100 ones, as in the per-arch wheel."""
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    _fake_devices(monkeypatch, [(10, 0), (10, 0)])
    kernel = runtime.get_kernel("per_token_cast")
    key = next(iter(kernel.modules))
    launcher = kernel.variant(*key)
    assert launcher.__module__ == f"tkc_small_kernels._kernels.per_token_cast.sm100.{kernel.modules[key]}"
    cubin = sys.modules[launcher.__module__]._CUBIN
    assert cubin.filename.startswith("sm100/") and cubin.arch == "sm100"
    assert hashlib.sha256(cubin.data()).hexdigest() == cubin.sha256  # read from cubins/sm100/, checked
    assert kernel.variant(*key) is launcher is kernel.find(*key) is kernel.variants[key]
    assert not [m for m in sys.modules if ".per_token_cast.sm90." in m]  # the other archs stay unimported



def test_find_in_a_multi_arch_package_is_none_for_an_unbuilt_key(multi_package: ModuleType,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Ops fall back from a specialized variant to a generic one through find(): a key the device's arch has
    no variant for gives None there (not an error), and select() names the key and the built variants."""
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    errors = importlib.import_module("tkc_small_kernels.errors")
    kernel = runtime.get_kernel("per_token_cast")
    missing = tuple(-1 for _ in kernel.keys)
    for capabilities in ([(9, 0)], [(9, 0), (10, 0)]):
        _fake_devices(monkeypatch, capabilities)
        assert kernel.find(*missing) is None and not kernel.has(*missing)
        assert kernel.has(*next(iter(kernel.modules)))
        with pytest.raises(errors.VariantNotFoundError, match="no prebuilt variant"):
            kernel.select(**dict(zip(kernel.keys, missing)))

def test_devices_of_two_archs_in_one_process_select_their_own_cubins(multi_package: ModuleType,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An H100 (cuda:0) beside a B200 (cuda:1): each call runs the launcher of its tensors' device's arch."""
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    driver = importlib.import_module("tkc_small_kernels._driver")
    errors = importlib.import_module("tkc_small_kernels.errors")
    _fake_devices(monkeypatch, [(9, 0), (10, 0)])
    kernel = runtime.get_kernel("per_token_cast")
    key = next(iter(kernel.modules))
    per_device = kernel.variant(*key)
    assert type(per_device).__name__ == "_PerDevice" and kernel.variant(*key) is per_device
    for device, arch in ((0, "sm90"), (1, "sm100")):
        launcher = per_device.launcher(device)
        assert launcher.__module__ == f"tkc_small_kernels._kernels.per_token_cast.{arch}.{kernel.modules[key]}"
        cubin = sys.modules[launcher.__module__]._CUBIN
        assert cubin.filename == f"{arch}/per_token_cast.0.xz" and cubin.arch == arch
        assert hashlib.sha256(cubin.data()).hexdigest() == cubin.sha256
    # A launcher never launches on another arch's device (its cubins check the device before the driver).
    with pytest.raises(errors.ArchMismatchError, match="the sm_100a cubins were asked to run on cuda:0"):
        driver.check_device(0, "sm100")
    driver.check_device(1, "sm100")
    # Each call goes by the device of its first CUDA tensor (faked here: the launchers record their calls).
    calls: list[tuple[str, tuple[object, ...]]] = []
    fresh = runtime.ArchKernels(kernel.name, kernel.spec, kernel.keys, kernel.archs)
    for arch in ("sm90", "sm100"):
        def record(*arguments: object, arch: str = arch) -> None:
            calls.append((arch, arguments))
        record.planned = (arch,)  # type: ignore[attr-defined]
        fresh.of(arch)._launchers[key] = record
    assert runtime._device_of((3, torch.zeros(1))) == -1  # no CUDA tensor: the first arch's checks name it
    monkeypatch.setattr(runtime, "_device_of", lambda arguments: arguments[0])
    launcher = fresh.variant(*key)
    launcher(1, "x")
    assert launcher.planned == ("sm100",)  # what dispatch() remembers: the plan of the launcher that ran
    launcher(0, "y")
    launcher(1, "z")
    assert calls == [("sm100", (1, "x")), ("sm90", (0, "y")), ("sm100", (1, "z"))]
    assert launcher.planned == ("sm100",)


@pytest.mark.parametrize("capabilities", [[(8, 0)], [(9, 0), (8, 0)]])
def test_a_device_no_built_arch_serves_is_refused_naming_both(multi_package: ModuleType,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capabilities: list[tuple[int, int]]) -> None:
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    errors = importlib.import_module("tkc_small_kernels.errors")
    _fake_devices(monkeypatch, capabilities)
    kernel = runtime.get_kernel("batched_transpose")
    launcher = kernel.variant(*next(iter(kernel.modules)))
    device = len(capabilities) - 1
    with pytest.raises(errors.ArchMismatchError) as info:
        launcher.launcher(device)
    assert str(info.value) == (
        f"tkc_small_kernels 0.0.1 holds sm_90a, sm_100a, sm_103a cubins (for H100/H200, B200/GB200, B300/GB300), "
        f"but cuda:{device} (fake GPU {device}) is sm_80; build a multi-arch wheel that includes it (tkc build "
        "--arch sm90,sm100,sm103,sm80 --multi-arch)")
    if device:
        assert launcher.launcher(0).__module__.startswith("tkc_small_kernels._kernels.batched_transpose.sm90.")
