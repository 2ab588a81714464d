"""The loader of the prebuilt kernels: a thin ctypes layer over the CUDA driver.

Copied verbatim by tkc into every generated package; it needs only torch and
``libcuda.so.1``. The generated ``_kernels/<kernel>.py`` modules call it:

- ``Cubin`` loads one cubin as a context-independent CUDA library
  (``cuLibraryLoadData``) on first use, so importing the package needs no GPU
  and each cubin costs nothing until a variant of it runs;
- ``check_tensor`` validates an argument against the lowered contract and
  names the argument in every error;
- ``run`` is the hot path: one call of the compiled ``_launch`` module (see
  ``_launch.c``) that checks the tensors against the variant's ``contract`` and launches
  as its ``plan`` says, on torch's current stream of the tensors' device;
- ``check`` and ``launch`` are the same two steps apart, for the launchers' Python path
  (a first launch, errors, a package without the compiled module: then ``launch`` goes
  through ctypes);
- ``Function`` holds one kernel's launch configuration, its handle per device, and
  the rare paths (first launch, another device's context, launch attributes, errors);
- ``Kernel.select`` maps compile-time parameters to a variant's launcher;
- ``table`` reads a kernel module's packed contracts and plans (data tkc wrote at build time);
- ``dispatch`` / ``remember`` and ``launch_op`` are what the op layer (``_op.py``) builds every op's
  fast path and torch op from.
"""

from __future__ import annotations

import array
import ctypes
import importlib
import struct
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from . import _build_info as info  # type: ignore[attr-defined]  # generated into each package
from . import _protocol as protocol
from .errors import (
    ArchMismatchError,
    CorruptPackageError,
    CudaDriverError,
    KernelArgumentError,
    NoGpuError,
    VariantNotFoundError,
)

_CUBIN_DIR = Path(__file__).parent / "cubins"
_DYNAMIC_SMEM_DEFAULT_LIMIT = 48 * 1024  # above this a kernel must opt in per device
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CUDA_ERROR_INVALID_CONTEXT = 201
_CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720
_CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_MAX_GRID = (2**31 - 1, 65535, 65535)  # blocks per grid dimension, every arch since sm_30
_TORCH_TO_NAME = {
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
}


def dtype_name(dtype: torch.dtype) -> str:
    """The spec's name of a torch dtype ("bfloat16"); unknown dtypes keep torch's name."""
    return _TORCH_TO_NAME.get(dtype, str(dtype).removeprefix("torch."))


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


_checked_devices: set[int] = set()


def check_device(index: int) -> None:
    """Refuse a device whose arch the cubins were not built for, naming both archs."""
    if index in _checked_devices:
        return
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) != (info.MAJOR, info.MINOR):
        raise ArchMismatchError(
            f"{info.PACKAGE} {info.VERSION} holds {info.TARGET} cubins (for {info.GPUS}), but cuda:{index} "
            f"({torch.cuda.get_device_name(index)}) is sm_{major}{minor}; install the wheel built for "
            f"sm{major}{minor} (tkc build --arch sm{major}{minor})"
        )
    _checked_devices.add(index)


def _no_gpu(name: str, t: torch.Tensor) -> Exception:
    if not torch.cuda.is_available():
        return NoGpuError(f"{name}: no CUDA GPU is visible to torch; the kernels of {info.PACKAGE} run on "
                          f"{info.GPUS} GPUs ({info.TARGET})")
    return KernelArgumentError(f"{name}: expected a CUDA tensor, got one on {t.device}; move it with .cuda()")


def check_tensor(name: str, t: Any, dtype: torch.dtype, shape: Sequence[int | None], device: int | None) -> int:
    """Validate one tensor argument and return its CUDA device index.

    ``None`` in ``shape`` is a size read from this tensor; ``device`` is the index the other
    tensors are on (``None`` for the first).
    """
    if not isinstance(t, torch.Tensor):
        raise KernelArgumentError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise KernelArgumentError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if t.is_neg() or t.is_conj():
        # The kernel reads and writes memory: a lazy view's bit would be lost (the values un-negated).
        raise KernelArgumentError(f"{name}: a lazily {'negated' if t.is_neg() else 'conjugated'} view "
                                  f"(torch._neg_view, .conj()); pass {name}.resolve_neg() / .resolve_conj()")
    if t.device.type != "cuda":
        raise _no_gpu(name, t)
    index = t.get_device()
    if device is not None and index != device:
        raise KernelArgumentError(f"{name}: is on {t.device} but the other arguments are on cuda:{device}")
    if t.dim() != len(shape):
        raise KernelArgumentError(f"{name}: expected {len(shape)} dimensions, got shape {tuple(t.shape)}")
    for dim, (want, got) in enumerate(zip(shape, t.shape)):
        if want is not None and want != got:
            expected = tuple("*" if s is None else s for s in shape)
            raise KernelArgumentError(f"{name}: expected shape {expected}, got {tuple(t.shape)} "
                                      f"(dimension {dim} must be {want})")
    if t.data_ptr() % info.ALIGNMENT:
        raise KernelArgumentError(f"{name}: data pointer {t.data_ptr():#x} is not {info.ALIGNMENT}-byte aligned; "
                                  f"the {info.TARGET} kernels use vector accesses that need it (pass a fresh or "
                                  ".clone()d tensor)")
    return index


def check_strides(name: str, t: torch.Tensor, strides: Sequence[int]) -> None:
    """The element strides the kernel indexes with; dimensions of size 0 or 1 are never stepped over."""
    if t.numel() == 0:
        return  # an empty tensor is never indexed: any strides will do
    for dim, (want, got, size) in enumerate(zip(strides, t.stride(), t.shape)):
        if size > 1 and want != got:
            raise KernelArgumentError(f"{name}: expected strides {tuple(strides)}, got {t.stride()} "
                                      f"(dimension {dim}); pass a contiguous tensor (.contiguous())")


def _extent(t: torch.Tensor) -> int:
    """Bytes from t's first element to the end of its last (torch strides are never negative); 0 if empty."""
    if t.is_contiguous():
        return t.nbytes  # type: ignore[no-any-return]
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def check_disjoint(written: Sequence[tuple[str, torch.Tensor]], read: Sequence[tuple[str, torch.Tensor]]) -> None:
    """A KernelArgumentError naming the first written tensor whose memory overlaps another argument's.

    The kernel's threads read and write in no fixed order, so a written range that meets any
    other gives an undefined result (torch's out= refuses it too). Ranges are conservative: two
    interleaved strided views are refused although they never meet. What check() does in C.
    """
    spans = [(name, t.data_ptr(), _extent(t)) for name, t in written]
    spans += [(name, t.data_ptr(), _extent(t)) for name, t in read]
    for index in range(len(written)):
        name, first, size = spans[index]
        end = first + size
        for other_index, (other, other_first, other_size) in enumerate(spans):
            if size and other_size and other_index != index and first < other_first + other_size and other_first < end:
                raise KernelArgumentError(
                    f"{name}: its memory overlaps {other}'s, and the kernel writes {name}: the result would be "
                    f"undefined. Pass separate tensors (e.g. {name}.clone() or a fresh torch.empty)")


class TensorMap(ctypes.Structure):
    """A ``CUtensorMap``: 128 opaque bytes, 64-byte aligned when passed to the driver."""

    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


def _aligned_tensor_map() -> tuple[Any, TensorMap]:
    raw = ctypes.create_string_buffer(ctypes.sizeof(TensorMap) + 64)
    address = (ctypes.addressof(raw) + 63) & ~63
    return raw, TensorMap.from_address(address)


_tensor_maps: dict[tuple[Any, ...], tuple[Any, int]] = {}
_TENSOR_MAP_CACHE_SIZE = 256  # descriptors kept; the cache is emptied when full


def tensor_map(name: str, dtype_code: int, address: int, dims: Sequence[int], strides: Sequence[int],
               box: Sequence[int], element_strides: Sequence[int], interleave: int, swizzle: int,
               l2_promotion: int, oob_fill: int) -> tuple[Any, int]:
    """A tiled TMA descriptor for tensor ``name``: (its buffer, the aligned address to pass).

    ``strides`` are in bytes, without the element-size entry. A descriptor depends on nothing
    but these arguments, so encoded ones are kept by them: a tensor launched again with the
    same pointer and layout skips cuTensorMapEncodeTiled. The driver refuses strides that are
    not multiples of 16 bytes (or reach 2^40) and dimensions above 2^32 with a bare
    CUDA_ERROR_INVALID_VALUE; they are checked here first so the error names the tensor and
    the fix.
    """
    key = (dtype_code, address, *dims, -1, *strides, -1, *box, -1, *element_strides, interleave, swizzle,
           l2_promotion, oob_fill)
    cached = _tensor_maps.get(key)
    if cached is not None:
        return cached
    bad_stride = [s for s in strides if s % 16 or s >= 2**40]
    if bad_stride or any(not 0 < d <= 2**32 for d in dims):
        raise KernelArgumentError(
            f"{name}: the kernel moves {name} with the tensor memory accelerator (TMA), which needs every "
            f"stride to be a multiple of 16 bytes and each dimension in 1..2^32; got dimensions {tuple(dims)} "
            f"(innermost first) and byte strides {tuple(strides)}; pad the innermost dimension so that each "
            "row is a multiple of 16 bytes"
        )
    rank = len(dims)
    keep, desc = _aligned_tensor_map()
    arguments = (ctypes.byref(desc), dtype_code, rank, ctypes.c_void_p(address),
                 (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * max(rank - 1, 1))(*strides),
                 (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*element_strides),
                 interleave, swizzle, l2_promotion, oob_fill)
    result = driver().lib.cuTensorMapEncodeTiled(*arguments)
    if result == _CUDA_ERROR_INVALID_CONTEXT:
        # The driver wants a current context, which a thread that never made a CUDA call lacks;
        # any will do (the descriptor holds no context): let torch bind its current device's.
        torch.cuda.synchronize()
        result = driver().lib.cuTensorMapEncodeTiled(*arguments)
    driver().check(result, f"cuTensorMapEncodeTiled({name}: dims={tuple(dims)}, strides={tuple(strides)}, "
                           f"box={tuple(box)})")
    if len(_tensor_maps) >= _TENSOR_MAP_CACHE_SIZE:
        _tensor_maps.clear()
    entry = _tensor_maps[key] = (keep, ctypes.addressof(desc))
    return entry


class _LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: an id, padding to 8 bytes, and a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint32 * 16)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` of ``cuLaunchKernelEx``."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    ]


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


class _Slots:
    """The kernel-argument buffer and ``void**`` array of one argument-kind string, per thread.

    The ctypes launch paths (``cuLaunchKernelEx``, and plain launches where the package has
    no compiled ``_launch`` module) write a call's values into 8-byte slots with one
    ``struct.pack_into`` instead of building a ctypes object per argument. The driver copies
    the values during the launch call, so the slots can be reused as soon as it returns.
    """

    # struct letter -> the slot's format (every kernel parameter kind fits 8 bytes)
    _FORMATS: ClassVar[dict[str, str]] = {"Q": "Q", "q": "q", "i": "i4x", "I": "I4x", "f": "f4x", "d": "d",
                                          "T": "8x"}
    _by_kinds: ClassVar[dict[bytes, _Slots]] = {}

    def __init__(self, kinds: bytes) -> None:
        text = kinds.decode()
        self.tensormaps = tuple(i for i, k in enumerate(text) if k == "T")
        self.struct = struct.Struct("<" + "".join(self._FORMATS[k] for k in text))
        self.count = len(text)
        self.local = threading.local()

    @classmethod
    def of(cls, kinds: bytes) -> _Slots:
        slots = cls._by_kinds.get(kinds)
        if slots is None:
            slots = cls._by_kinds.setdefault(kinds, cls(kinds))
        return slots

    def pack(self, values: Sequence[Any]) -> Any:
        """The ``void**`` array holding ``values``; a value out of its slot's range raises struct.error."""
        state = getattr(self.local, "state", None)
        if state is None:
            slots = (ctypes.c_uint64 * max(1, self.count))()
            base = ctypes.addressof(slots)
            params = (ctypes.c_void_p * max(1, self.count))(*(base + 8 * i for i in range(self.count)))
            state = self.local.state = (slots, params)
        slots, params = state
        if not self.tensormaps:
            self.struct.pack_into(slots, 0, *values)
            return params
        for i in self.tensormaps:  # a tensor map is passed by the address of its descriptor
            params[i] = values[i]
        self.struct.pack_into(slots, 0, *(v for i, v in enumerate(values) if i not in self.tensormaps))
        return params


_WRONG_DEVICE = -1  # what launch() returns when the current context is another device's


def _ctypes_launch(kernel: int, device: int, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
                   stream: int, kinds: bytes, *values: Any) -> int:
    """``_launch.launch`` through ctypes, for a package built without its compiled module."""
    if _current_device() != device:
        return _WRONG_DEVICE
    params = _Slots.of(kinds).pack(values)
    result: int = _DRIVER_LIB[0].cuLaunchKernel(ctypes.c_void_p(kernel), *grid, *block, smem,
                                                ctypes.c_void_p(stream), params, None)
    return result


def _ctypes_launch_ex(kernel: int, device: int, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
                      stream: int, kinds: bytes, values: Sequence[Any], *, cooperative: bool,
                      cluster: tuple[int, int, int] | None) -> int:
    """cuLaunchKernelEx through ctypes with the cooperative and / or the cluster attribute."""
    if _current_device() != device:
        return _WRONG_DEVICE
    attrs = (_LaunchAttribute * 2)()
    count = 0
    if cooperative:
        attrs[count].id = _CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attrs[count].value[0] = 1
        count += 1
    if cluster is not None:
        attrs[count].id = _CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attrs[count].value[0], attrs[count].value[1], attrs[count].value[2] = cluster
        count += 1
    config = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), smem, ctypes.c_void_p(stream),
                           attrs, count)
    result: int = _DRIVER_LIB[0].cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(kernel),
                                                  _Slots.of(kinds).pack(values), None)
    return result


def _ctypes_launch_cooperative(kernel: int, device: int, grid: tuple[int, int, int], block: tuple[int, int, int],
                               smem: int, stream: int, kinds: bytes, *values: Any) -> int:
    """``_launch.launch_cooperative`` through ctypes, for a package built without its compiled module."""
    return _ctypes_launch_ex(kernel, device, grid, block, smem, stream, kinds, values, cooperative=True, cluster=None)


try:
    # Compiled by tkc next to this module where it could (source: _launch.c, shipped with it).
    from . import _launch as _native  # type: ignore[attr-defined]
except ImportError:  # a pure build: the same launch through ctypes, about 2 µs slower per call
    _native = None
_launch: Callable[..., int] = _native.launch if _native is not None else _ctypes_launch
_launch_cooperative: Callable[..., int] = (_native.launch_cooperative if _native is not None
                                           else _ctypes_launch_cooperative)
NATIVE_LAUNCH = _native is not None  # for benchmarks and bug reports: which launch path this package takes
# What the generated launchers call: launch(kernel, device, grid, block, smem, stream, kinds, *values)
# returns the CUresult (0: launched), or -1 when the current context is another device's;
# launch_cooperative the same for kernels with a grid-wide barrier.
launch = _launch
launch_cooperative = _launch_cooperative


# ---- the compiled tensor check ---------------------------------------------------------------
#
# A launcher first asks check(CONTRACT, *tensors) (``_launch.check``): one DLTensor read per
# tensor, compared in C with the variant's contract, which tkc packed at build time into 64-bit
# words (tkc/pack.py, the codes of _protocol.py) and table() reads from the kernel module's table.
# It returns (device, *data_pointers, *sizes) or None; None only means "not accepted here" (a pure
# wheel, a dtype this torch exports otherwise, a wrong argument), and the launcher's Python checks
# decide.

_to_dlpack = getattr(torch._C, "_to_dlpack", None)


def _no_check(contract: bytes | None, *tensors: Any) -> tuple[int, ...] | None:
    return None  # no compiled check: the launchers' Python checks run


NATIVE_CHECK = _native is not None and _to_dlpack is not None and hasattr(_native, "check")
NATIVE_EXCHANGE = False  # whether the compiled checks read tensors through torch's DLPack C exchange API


def use_exchange(enabled: bool = True) -> bool:
    """Read tensors in the compiled checks through torch's DLPack C exchange API (``enabled``) or
    ``torch._C._to_dlpack``; whether the exchange API is in use now.

    The exchange API (``Tensor.__dlpack_c_exchange_api__``, torch 2.10 and later) fills a DLTensor
    in one C call; ``_to_dlpack`` is a Python call that allocates a capsule, about 0.3 µs a tensor.
    Both read the same fields, so benchmarks and tests switch between them to compare.
    """
    global NATIVE_EXCHANGE
    if not NATIVE_CHECK or not hasattr(_native, "set_exchange"):
        return False
    api = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None) if enabled else None
    NATIVE_EXCHANGE = bool(_native.set_exchange(torch.Tensor if api is not None else None, api))
    return NATIVE_EXCHANGE


if NATIVE_CHECK:
    _native.set_dlpack(_to_dlpack)
    use_exchange()
# What the generated launchers call when run() declined: check(contract, *tensors) -> (device, *pointers,
# *sizes) or None.
check: Callable[..., tuple[int, ...] | None] = _native.check if NATIVE_CHECK else _no_check


_TABLES = Path(__file__).parent / "_kernels"


def table(kernel: str) -> list[bytes | None]:
    """The packed contracts and plans of ``kernel``'s variants (``_kernels/<kernel>.bin``), in the order
    its launcher module takes them."""
    path = _TABLES / f"{kernel}.bin"
    try:
        return protocol.unpack_table(path.read_bytes())
    except ValueError:
        raise RuntimeError(f"{path} is not a tkc table: reinstall {info.PACKAGE}") from None


def _no_run(contract: bytes | None, plan: bytes | None, handles: dict[int, int], *arguments: Any) -> bool:
    return False  # no compiled run: the launcher's Python path launches


class Cubin:
    """One cubin of the package, loaded lazily as a context-independent library, after its bytes are checked
    against the sha256 the build recorded (``sha256``; once, before the driver sees them)."""

    def __init__(self, filename: str, sha256: str = "") -> None:
        self.filename = filename
        self.sha256 = sha256
        self._lock = threading.Lock()
        self._library: ctypes.c_void_p | None = None
        self._kernels: dict[str, ctypes.c_void_p] = {}

    def data(self) -> bytes:
        """The cubin's bytes; CorruptPackageError if they are not the ones the build wrote."""
        import hashlib

        path = _CUBIN_DIR / self.filename
        data = path.read_bytes()
        if self.sha256 and hashlib.sha256(data).hexdigest() != self.sha256:
            raise CorruptPackageError(f"{path}: not the cubin {info.PACKAGE} {info.VERSION} was built with (its "
                                      "sha256 differs from the build's); the installed package is damaged or was "
                                      f"modified: reinstall it (pip install --force-reinstall {info.PACKAGE})")
        return data

    def _load(self) -> ctypes.c_void_p:
        with self._lock:
            if self._library is None:
                data = self.data()
                library = ctypes.c_void_p()
                drv = driver()
                drv.check(drv.lib.cuLibraryLoadData(ctypes.byref(library), data, None, None, 0, None, None, 0),
                          f"cuLibraryLoadData({self.filename})")
                self._library = library
            return self._library

    def kernel(self, symbol: str, device: int, smem: int) -> int:
        """The ``CUkernel`` handle of ``symbol``, ready to launch on ``device`` with ``smem`` bytes of dynamic
        shared memory (arch checked, the opt-in above 48 KiB set)."""
        check_device(device)
        drv = driver()
        if symbol not in self._kernels:
            handle = ctypes.c_void_p()
            drv.check(drv.lib.cuLibraryGetKernel(ctypes.byref(handle), self._load(), symbol.encode()),
                      f"cuLibraryGetKernel({self.filename}, {symbol})")
            self._kernels[symbol] = handle
        if smem > _DYNAMIC_SMEM_DEFAULT_LIMIT:
            cu_device = ctypes.c_int()
            drv.check(drv.lib.cuDeviceGet(ctypes.byref(cu_device), device), "cuDeviceGet")
            drv.check(drv.lib.cuKernelSetAttribute(_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem,
                                                   self._kernels[symbol], cu_device),
                      f"cuKernelSetAttribute({symbol}, max dynamic shared memory = {smem})")
        return int(self._kernels[symbol].value or 0)


class Function:
    """One kernel of a cubin with the launch configuration recorded at build time.

    ``kinds`` has one ``struct`` letter per kernel argument in the cubin's order: ``Q`` a
    device pointer (or uint64), ``i``/``I``/``q`` int32/uint32/int64, ``f``/``d`` float32/64,
    ``T`` the address of a TMA descriptor. ``launch`` is the hot path of every op: after the
    first call on a device it is a dict lookup, torch's raw stream getter and one call of the
    compiled ``_launch`` module; everything rare (loading the cubin, another device's
    context, a thread without one, errors) is in ``launch_slow``.
    """

    def __init__(self, cubin: Cubin, symbol: str, block: tuple[int, int, int], smem: int, kinds: str, *,
                 cooperative: bool = False, cluster: tuple[int, int, int] | None = None) -> None:
        self.cubin = cubin
        self.symbol = symbol
        self.block = block
        self.smem = smem
        self.kinds = kinds.encode()
        self.cooperative = cooperative  # a grid-wide barrier: every block must be resident at once
        self.cluster = cluster  # thread-block cluster shape
        self.handles: dict[int, int] = {}  # device index -> CUkernel, once launched there (fast-path launches)
        self._extended: dict[int, int] = {}  # the same for cluster launches, which never take the fast path
        # Plain and cooperative launches have a compiled fast path; clusters go through ctypes.
        self._fast = _launch_cooperative if cooperative else _launch

    def launch(self, device: int, grid: tuple[int, int, int], *values: Any) -> None:
        """Launch on torch's current stream of cuda:``device``; ``values`` in the cubin's argument order.

        The generated launchers spell this method's fast path out inline (one Python call less).
        """
        kernel = self.handles.get(device)
        if kernel is None or self._launch_fast(kernel, device, grid, values):
            self.launch_slow(device, grid, values)

    def launch_slow(self, device: int, grid: tuple[int, int, int], values: tuple[Any, ...]) -> None:
        """The first launch on a device, a launch from another device's context, and errors.

        Called after the fast path found no kernel handle for ``device`` or the driver refused
        the launch: a failed launch never ran, so launching again here is safe.
        """
        if not (grid[0] <= _MAX_GRID[0] and grid[1] <= _MAX_GRID[1] and grid[2] <= _MAX_GRID[2]):
            # The driver would say CUDA_ERROR_INVALID_VALUE; a grid follows from the tensors' sizes.
            raise KernelArgumentError(
                f"{self.symbol}: the tensors' sizes give a grid of {grid} blocks, beyond CUDA's limit of "
                f"{_MAX_GRID}; split the call into smaller ones (fewer tokens per call)")
        extended = self.cluster is not None
        kernel = (self._extended if extended else self.handles).get(device)
        if kernel is None:
            kernel = self.cubin.kernel(self.symbol, device, self.smem)
        launch = self._launch_ex if extended else self._launch_fast
        result = launch(kernel, device, grid, values)
        if result in (_WRONG_DEVICE, _CUDA_ERROR_INVALID_CONTEXT):
            # The launch goes to the thread's current context: make it the tensors' device
            # (torch binds its context to a thread that never made a CUDA call) and retry.
            with torch.cuda.device(device):
                torch.cuda.synchronize(device)  # a CUDA runtime call: binds the device's context to this thread
                result = launch(kernel, device, grid, values)
        if result == _CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE:
            raise KernelArgumentError(
                f"{self.symbol}: a grid of {grid} blocks cannot all be resident on cuda:{device} at once, which "
                f"its grid-wide barrier needs; size the grid from sm_count(device) ({sm_count(device)} SMs here)")
        if result:
            driver().check(result, f"cuLaunchKernel({self.symbol}, grid={grid}, block={self.block}, "
                                   f"smem={self.smem})")
        (self._extended if extended else self.handles)[device] = kernel  # the others now take the fast path

    def _launch_fast(self, kernel: int, device: int, grid: tuple[int, int, int], values: tuple[Any, ...]) -> int:
        return self._fast(kernel, device, grid, self.block, self.smem, _current_stream(device), self.kinds, *values)

    def _launch_ex(self, kernel: int, device: int, grid: tuple[int, int, int], values: tuple[Any, ...]) -> int:
        """cuLaunchKernelEx with the cluster (and, where set, the cooperative) attribute."""
        return _ctypes_launch_ex(kernel, device, grid, self.block, self.smem, _current_stream(device), self.kinds,
                                 values, cooperative=self.cooperative, cluster=self.cluster)


# torch's raw getters: the public torch.cuda.current_stream(...).cuda_stream builds a Stream
# object per call (several microseconds); fall back to it where the private getter is missing.
_current_device: Callable[[], int] = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    _current_stream: Callable[[int], int] = torch._C._cuda_getCurrentRawStream
else:  # pragma: no cover - older torch
    def _current_stream(index: int) -> int:
        return int(torch.cuda.current_stream(index).cuda_stream)
current_stream = _current_stream  # for the generated launchers

NATIVE_RUN = NATIVE_CHECK and hasattr(_native, "run")
if NATIVE_RUN:
    _native.set_stream(_current_stream)
# What the generated launchers call first: run(contract, plan, handles, *arguments) -> True when the
# compiled module checked the tensors and launched; False where the Python path must (see plan()).
run: Callable[..., bool] = _native.run if NATIVE_RUN else _no_run



# ---- dispatch(): an op's remembered call signatures, in one C call -----------------------------
#
# An op that takes out= and has seen a call signature before can skip its own Python (option
# checks, variant choice, out's tuple) as well as the launcher's: dispatch(fast, *inputs, out,
# *options) (``_launch.dispatch``) keys the call by the inputs' dtype, rank and compile-time
# dimensions and the options' exact types and values, looks up what remember() stored after the
# op's full checks passed, checks the rules the op states beyond the contract and launches as
# run() does. None means "not here" (a first call, another signature, a refused tensor, a pure
# wheel): the op's Python path runs and names what is wrong. Allocating calls (out None) are
# their own signatures: where the op remembered one with its outputs' shapes and dtypes
# (output(), size_of()), dispatch() allocates them with torch.empty and returns them.

_FAST_VERSION = protocol.FAST_VERSION
_FROM_INPUT, _FROM_OUT, _FROM_CONSTANT = protocol.FROM_INPUT, protocol.FROM_OUT, protocol.FROM_CONSTANT
_RULE_SAME_SIZE, _RULE_SIZE_MULTIPLE = protocol.RULE_SAME_SIZE, protocol.RULE_SIZE_MULTIPLE
_RULE_SIZE_IS, _RULE_STRIDE_BYTES = protocol.RULE_SIZE_IS, protocol.RULE_STRIDE_BYTES

FastPath = tuple[bytes, dict[bytes, tuple[Any, ...]]]  # (spec, table by call key) as dispatch() takes it


def fast_path(inputs: Sequence[Sequence[int]], outputs: int) -> FastPath:
    """A fast path for an op called as dispatch(fast, *inputs, out, *options).

    ``inputs``: per leading tensor argument (None allowed: an optional tensor), the dimensions
    whose sizes select the variant (compile-time in the grid, e.g. hidden); ``outputs``: how many
    tensors out holds (1: out is a tensor; more: a tuple or list of them).
    """
    masks = [sum(1 << d for d in dims) for dims in inputs]
    return array.array("q", [_FAST_VERSION, len(inputs), outputs, *masks]).tobytes(), {}


class Source:
    """A launcher argument that dispatch() takes from the call: the op's input or out's tensor ``index``."""

    __slots__ = ("index", "kind")

    def __init__(self, kind: int, index: int) -> None:
        self.kind, self.index = kind, index


def from_input(index: int) -> Source:
    return Source(_FROM_INPUT, index)


def from_out(index: int = 0) -> Source:
    return Source(_FROM_OUT, index)


# The checks an op makes beyond the contract, restated for dispatch(); arguments are positions in
# the launcher's argument list, dimensions of their shapes.
def same_size(argument: int, dim: int, other: int, other_dim: int, times: int = 1) -> tuple[int, ...]:
    """``dim`` of ``argument``, times ``times``, equal to ``other_dim`` of ``other``."""
    return (_RULE_SAME_SIZE, argument, dim, other, other_dim, times)


def size_multiple(argument: int, dim: int, multiple: int) -> tuple[int, ...]:
    return (_RULE_SIZE_MULTIPLE, argument, dim, multiple, 0, 0)


def size_is(argument: int, dim: int, size: int) -> tuple[int, ...]:
    return (_RULE_SIZE_IS, argument, dim, size, 0, 0)


def stride_bytes_multiple(argument: int, dim: int, multiple: int) -> tuple[int, ...]:
    """The stride of ``dim`` in bytes a multiple of ``multiple`` wherever the tensor has several indices there."""
    return (_RULE_STRIDE_BYTES, argument, dim, multiple, 0, 0)


class Output:
    """An output dispatch() allocates for an allocating call: torch.empty(*dims, dtype, device of the inputs)."""

    __slots__ = ("dims", "dtype")

    def __init__(self, dtype: torch.dtype, dims: Sequence[int | tuple[int, int, int, int, int]]) -> None:
        self.dtype, self.dims = dtype, tuple(dims)


def output(dtype: torch.dtype, *dims: int | tuple[int, int, int, int, int]) -> Output:
    """An output of ``dtype`` whose dimensions are constants or ``size_of(...)`` of the inputs."""
    return Output(dtype, dims)


def size_of(source: int, dim: int, times: int = 1, plus: int = 0, per: int = 1) -> tuple[int, int, int, int, int]:
    """An output dimension read from the call: (``dim`` of the op's input ``source`` * times + plus) // per."""
    return (source, dim, times, plus, per)


def remember(fast: FastPath, launch: Callable[..., None], arguments: Sequence[object],
             rules: Sequence[tuple[int, ...]], *call: Any, outputs: Sequence[Output] | None = None) -> None:
    """Let dispatch() take calls of ``call``'s signature straight to ``launch``.

    Call it after the op's full checks passed and ``launch`` ran for ``call`` (inputs, out,
    options, as the op passes them to dispatch). ``arguments``: the launcher's arguments, each a
    Source or a constant (a scalar the options fixed, a placeholder tensor); ``rules``: what the
    op checks beyond the contract and the key. For an allocating call (out None), ``outputs``
    says what the op allocated, as out's tensors in order: from_out(i) is then the i-th
    (ignored for an out= call, so that both forms can pass it; without it an allocating call
    is not remembered). A launcher without a plan (a pure wheel, a TMA or cluster launch), or a
    call dispatch() would never key, is not remembered.
    """
    planned = getattr(launch, "planned", None)
    allocating = call[int.from_bytes(fast[0][8:16], "little")] is None  # out follows the spec's inputs
    if not NATIVE_DISPATCH or planned is None or None in planned or (allocating and outputs is None):
        return
    key = _native.dispatch_key(fast[0], *call)  # type: ignore[union-attr]
    if key is None:
        return
    allocation: tuple[object, ...] = ()
    if allocating and outputs is not None:  # (an allocating call without outputs returned above)
        device = next(t.device for t in call if isinstance(t, torch.Tensor))
        shapes = []
        for result in outputs:
            shapes.append(len(result.dims))
            for dim in result.dims:
                shapes += (-1, 0, 0, dim, 1) if isinstance(dim, int) else dim
        allocation = (array.array("q", shapes).tobytes(),
                      tuple({"dtype": result.dtype, "device": device} for result in outputs))
    constants: list[object] = []
    words = [len(arguments)]
    for argument in arguments:
        if isinstance(argument, Source):
            words += (argument.kind, argument.index)
        else:
            words += (_FROM_CONSTANT, len(constants))
            constants.append(argument)
    words.append(len(rules))
    for rule in rules:
        words += rule
    fast[1][key] = (*planned, array.array("q", words).tobytes(), tuple(constants), *allocation)


def _no_dispatch(fast: FastPath, *call: Any) -> None:
    return None  # no compiled dispatch: the op's Python path runs


NATIVE_DISPATCH = NATIVE_RUN and hasattr(_native, "dispatch")
if NATIVE_DISPATCH:
    _native.set_allocator(torch.empty)
# What ops call first when eager: dispatch(fast, *inputs, out, *options) -> the op's result, or None.
dispatch: Callable[..., Any] = _native.dispatch if NATIVE_DISPATCH else _no_dispatch


class Kernel:
    """All prebuilt variants of one spec kernel, keyed by their compile-time parameters."""

    def __init__(self, name: str, spec: str, keys: tuple[str, ...],
                 variants: dict[tuple[Any, ...], Callable[..., None]]) -> None:
        self.name = name
        self.spec = spec
        self.keys = keys
        self.variants = variants

    def variant(self, *values: Any) -> Callable[..., None]:
        """The launcher of the variant built for ``values``, given in grid order (``keys``).

        The ops' hot path: one dict lookup, no keyword handling. A miss goes through
        ``select``, which names the keys and lists the built variants in its error.
        """
        launcher = self.variants.get(values)
        return launcher if launcher is not None else self.select(**dict(zip(self.keys, values)))

    def find(self, *values: Any) -> Callable[..., None] | None:
        """The launcher of the variant built for ``values`` (grid order), or None: for ops that prefer a
        specialized variant where the build has one and fall back to a generic one."""
        return self.variants.get(values)

    def select(self, **values: Any) -> Callable[..., None]:
        """The launcher of the variant built for ``values`` (every grid key, by name)."""
        # Ops pass the keys in grid order, so the values already form the key: one dict lookup.
        launcher = self.variants.get(tuple(values.values())) if tuple(values) == self.keys else None
        if launcher is not None:
            return launcher
        try:
            key = tuple(values[k] for k in self.keys)
        except KeyError as exc:
            raise TypeError(f"{self.name}.select() needs every grid key: {', '.join(self.keys)}") from exc
        launcher = self.variants.get(key)
        if launcher is None:
            have = "\n  ".join(", ".join(f"{k}={v}" for k, v in zip(self.keys, variant))
                               for variant in self.variants)
            asked = ", ".join(f"{k}={values[k]!r}" for k in self.keys)
            raise VariantNotFoundError(
                f"{self.name}: no prebuilt variant for {asked} in {info.PACKAGE} {info.VERSION}; add the values "
                f"to the grid of kernel {self.name} in {self.spec} and rebuild (tkc build). Built variants:\n  {have}"
            )
        return launcher


_library: list[Any] = []  # the package's torch.library fragment, made on the first op
_LAUNCH_SCHEMA = "(Tensor[] tensors, int template) -> Tensor[]"
_IN_PLACE_SCHEMA = "(Tensor[] tensors, Tensor(a!)[] written, int template) -> ()"


def launch_op(name: str, run: Callable[..., Any], fake: Callable[..., Any], mutates: bool = False) -> Any:
    """The torch op ``<package>::<name>`` an op traces into under ``torch.compile``: ``run`` launches the
    plan ``template`` names over ``tensors``, ``fake`` allocates its outputs (see ``_op``).

    Defined through torch.library's fragment API, with ``fake`` as the meta kernel: a fraction of what
    ``torch.library.custom_op`` costs per op at import. An in-place op (``mutates``) writes its tensors
    and returns nothing.
    """
    if not _library:
        _library.append(torch.library.Library(info.PACKAGE, "FRAGMENT"))
    lib = _library[0]
    try:
        lib.define(f"{name}{_IN_PLACE_SCHEMA if mutates else _LAUNCH_SCHEMA}")
    except RuntimeError:
        # Defined by an earlier import of the package in this process (tests re-import copies of
        # it): the schema is the same, and the kernels below replace the earlier ones.
        if not hasattr(getattr(torch.ops, info.PACKAGE), name):
            raise
    lib.impl(name, run, "CompositeExplicitAutograd")
    # As a meta kernel, which torch.compile's fake tensors run: a fraction of register_fake's import cost.
    lib.impl(name, fake, "Meta")
    return getattr(getattr(torch.ops, info.PACKAGE), name).default


def get_kernel(name: str) -> Kernel:
    """The ``Kernel`` of spec kernel ``name`` (its generated module is imported on first use)."""
    try:
        module = importlib.import_module(f"{__package__}._kernels.{name}")
    except ModuleNotFoundError as exc:
        raise VariantNotFoundError(f"{info.PACKAGE} has no kernel {name!r}; kernels: "
                                   f"{', '.join(info.KERNELS)}") from exc
    return module.KERNEL
