"""The CUDA driver as the loader uses it: libcuda.so.1 through ctypes, the driver and arch checks,
torch's current device and stream, and the SM counts persistent grids are sized with.

Loaded on first use (``driver()``), so importing a package needs no GPU.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import torch

from . import _build_info as info  # type: ignore[attr-defined]  # generated into each package
from .errors import ArchMismatchError, CudaDriverError, NoGpuError

try:
    # Compiled by tkc next to this module where it could (source: _launch.c, shipped with it); it calls the
    # driver through the addresses driver() binds.
    from . import _launch as _native  # type: ignore[attr-defined]
except ImportError:  # a pure build: every launch goes through ctypes (_compiled.py)
    _native = None

CUDA_ERROR_INVALID_CONTEXT = 201
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16


class _Driver:
    """The few driver entry points the loader uses, resolved once from libcuda.so.1."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise NoGpuError("cannot load libcuda.so.1: no NVIDIA driver on this machine; the kernels of "
                             f"{info.PACKAGE} need a {info.GPUS} GPU") from exc
        self.check(self.lib.cuInit(0), "cuInit")
        check_driver_version(self.lib)

    def check(self, result: int, call: str) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(result, ctypes.byref(name))
            text = name.value.decode() if name.value else f"error {result}"
            raise CudaDriverError(f"{call} failed: {text}")


def check_driver_version(lib: Any) -> None:
    """Refuse a driver older than the CUDA the cubins were built with, naming both (the driver would refuse
    each cubin with CUDA_ERROR_UNSUPPORTED_PTX_VERSION or an invalid-image error, naming neither)."""
    needed = info.CUDA  # (0, 0): the build did not know nvcc's version
    if needed == (0, 0):
        return
    version = ctypes.c_int()
    if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return  # cuInit succeeded: let the first load report what is wrong
    have = (version.value // 1000, version.value % 1000 // 10)
    if have < tuple(needed):
        raise CudaDriverError(
            f"the NVIDIA driver supports CUDA {have[0]}.{have[1]}, but the cubins of {info.PACKAGE} {info.VERSION} "
            f"were built with nvcc {needed[0]}.{needed[1]} and need a driver for CUDA {needed[0]}.{needed[1]} or "
            "later (CUDA 13.0: driver 580 or newer); update the driver, or rebuild the wheel with an older nvcc "
            "(tkc build --nvcc PATH)")


_driver_lock = threading.Lock()
_driver_instance: _Driver | None = None


# libcuda's handle once the driver is loaded, for the launch fast path (empty until then).
_DRIVER_LIB: list[ctypes.CDLL] = []


def driver() -> _Driver:
    global _driver_instance
    if _driver_instance is None:
        with _driver_lock:
            if _driver_instance is None:
                _driver_instance = _Driver()
                _DRIVER_LIB.append(_driver_instance.lib)
                if _native is not None:  # the compiled launch calls the driver through these addresses
                    lib = _driver_instance.lib
                    _native.bind(ctypes.cast(lib.cuLaunchKernel, ctypes.c_void_p).value,
                                 ctypes.cast(lib.cuCtxGetDevice, ctypes.c_void_p).value,
                                 ctypes.cast(lib.cuLaunchKernelEx, ctypes.c_void_p).value)
    return _driver_instance


_device_archs: dict[int, str] = {}  # device index -> the built arch whose cubins run there


def device_arch(index: int) -> str:
    """The arch of the package (a key of ``_build_info.ARCHS``) whose cubins run on cuda:``index``, read from
    the device's compute capability once; ArchMismatchError naming the device and the built archs where
    none does."""
    arch = _device_archs.get(index)
    if arch is None:
        major, minor = torch.cuda.get_device_capability(index)
        arch = next((name for name, (a, b, *_) in info.ARCHS.items() if (a, b) == (major, minor)), None)
        if arch is None:
            wanted = f"sm{major}{minor}"
            fix = (f"build a multi-arch wheel that includes it (tkc build --arch {info.ARCH},{wanted} --multi-arch)"
                   if info.MULTI_ARCH else f"install the wheel built for {wanted} (tkc build --arch {wanted})")
            raise ArchMismatchError(
                f"{info.PACKAGE} {info.VERSION} holds {info.TARGET} cubins (for {info.GPUS}), but cuda:{index} "
                f"({torch.cuda.get_device_name(index)}) is sm_{major}{minor}; {fix}")
        _device_archs[index] = arch
    return arch


def check_device(index: int, arch: str = "") -> None:
    """Refuse a device that the cubins of ``arch`` (default: the package's one arch) do not run on, naming the
    device's arch and the built ones."""
    found = device_arch(index)
    if arch and found != arch:  # a multi-arch package's loader picked another arch's launcher: a tkc bug
        raise ArchMismatchError(f"{info.PACKAGE} {info.VERSION}: the {info.ARCHS[arch][2]} cubins were asked to run "
                                f"on cuda:{index}, which takes the {info.ARCHS[found][2]} ones; report this to tkc")


_process_arch: list[str | None] = []  # the answer, once asked: a process's devices do not change


def process_arch() -> str | None:
    """The one built arch that serves every device torch sees, or None where the devices need different archs
    (or one no built arch serves, or there is none): a multi-arch package then picks per device and call."""
    if _process_arch:
        return _process_arch[0]
    try:
        count = torch.cuda.device_count()
        archs = {device_arch(i) for i in range(count)}
    except ArchMismatchError:
        archs = set()
    _process_arch.append(archs.pop() if len(archs) == 1 else None)
    return _process_arch[0]


# torch.compile calls it for real and keeps the answer (torch.compiler.assume_constant_result, without importing
# torch._dynamo at import): a traced op's variant lookup must not break the graph on torch.cuda.device_count().
process_arch._dynamo_marked_constant = True  # type: ignore[attr-defined]


_sm_counts: dict[int, int] = {}
_num_sms = 0  # set_num_sms's cap; 0: every SM of the device


def set_num_sms(num_sms: int) -> None:
    """Run persistent and cooperative kernels on at most ``num_sms`` SMs of each device (to leave SMs to
    kernels running beside them, such as communication); TileKernels' ``set_num_sms``."""
    global _num_sms
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or not 0 < num_sms <= get_device_num_sms():
        raise ValueError(f"set_num_sms: num_sms must be an int in 1..{get_device_num_sms()} (the current "
                         f"device's SMs), got {num_sms!r}")
    _num_sms = num_sms


def get_device_num_sms() -> int:
    """The current CUDA device's multiprocessors."""
    return _device_sm_count(_current_device())


def get_num_sms() -> int:
    """The SMs persistent kernels use on the current device: ``set_num_sms``'s value, else all of them."""
    return sm_count(_current_device())


def sm_count(device: torch.device | int) -> int:
    """Multiprocessors persistent and cooperative grids are sized with on ``device``: the device's own
    count, read from the driver at run time (never the build machine's), capped by ``set_num_sms``."""
    index = device if isinstance(device, int) else (device.index if device.index is not None else _current_device())
    count = _device_sm_count(index)
    return min(count, _num_sms) if _num_sms else count


def _device_sm_count(index: int) -> int:
    count = _sm_counts.get(index)
    if count is None:
        drv = driver()
        cu_device, value = ctypes.c_int(), ctypes.c_int()
        drv.check(drv.lib.cuDeviceGet(ctypes.byref(cu_device), index), "cuDeviceGet")
        drv.check(drv.lib.cuDeviceGetAttribute(ctypes.byref(value), _CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                               cu_device), "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)")
        count = _sm_counts[index] = value.value
    return count


# A device's SM count is fixed: torch.compile calls this for real and keeps the int (as process_arch), where
# the driver calls through ctypes would be a graph break (an op's plan sizes its persistent grid while traced).
_device_sm_count._dynamo_marked_constant = True  # type: ignore[attr-defined]


# torch's raw getters: the public torch.cuda.current_stream(...).cuda_stream builds a Stream
# object per call (several microseconds); fall back to it where the private getter is missing.
_current_device: Callable[[], int] = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    _current_stream: Callable[[int], int] = torch._C._cuda_getCurrentRawStream
else:  # pragma: no cover - older torch
    def _current_stream(index: int) -> int:
        return int(torch.cuda.current_stream(index).cuda_stream)
current_stream = _current_stream  # for the generated launchers
