"""The loader's kernel objects, and the one module generated launchers and op modules import from.

Copied verbatim by tkc into every generated package with the rest of the loader; it needs only torch and
``libcuda.so.1``. Here:

- ``Cubin`` loads one cubin as a context-independent CUDA library (``cuLibraryLoadData``) on first use,
  after checking its bytes against the sha256 the build recorded, so importing the package needs no GPU
  and each cubin costs nothing until a variant of it runs;
- ``Function`` holds one kernel's launch configuration, its handle per device, and the rare paths
  (first launch, another device's context, launch attributes, errors);
- ``Kernel`` maps compile-time parameters to a variant's launcher, whose module it imports on the variant's
  first use; in a multi-arch package ``ArchKernels`` holds a ``Kernel`` per arch and picks the one of each
  device's arch (by its compute capability, on first use); ``get_kernel`` imports a kernel's index on first
  use; ``table`` reads its packed contracts and plans (data tkc wrote);
- ``launch_op`` defines the torch op an op traces into under ``torch.compile`` (see ``_op.py``).

What launchers call on every launch lives by responsibility and is re-exported here (``__all__``):
``_compiled`` (``run``, ``check``, ``launch``: the compiled module or its ctypes stand-ins), ``_checks``
(the Python tensor checks that name the argument), ``_tma`` (TMA descriptors), ``_dispatch`` (an op's
remembered call signatures) and ``_driver`` (libcuda, devices, streams, SM counts).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from . import _build_info as info  # type: ignore[attr-defined]  # generated into each package
from . import _protocol as protocol
from ._checks import check_disjoint, check_strides, check_tensor, dtype_name
from ._compiled import (
    _WRONG_DEVICE,
    NATIVE_CHECK,
    NATIVE_LAUNCH,
    NATIVE_RUN,
    _ctypes_launch_ex,
    check,
    launch,
    launch_cooperative,
    run,
    use_exchange,
)
from ._dispatch import (
    NATIVE_DISPATCH,
    dispatch,
    fast_path,
    from_input,
    from_out,
    output,
    remember,
    same_size,
    size_is,
    size_multiple,
    size_of,
    stride_bytes_multiple,
)
from ._driver import (
    CUDA_ERROR_INVALID_CONTEXT,
    _current_stream,
    check_device,
    current_stream,
    device_arch,
    driver,
    get_device_num_sms,
    get_num_sms,
    process_arch,
    set_num_sms,
    sm_count,
)
from ._tma import tensor_map
from .errors import CorruptPackageError, KernelArgumentError, VariantNotFoundError

__all__ = [  # what the generated launchers and the op modules import from here
    "NATIVE_CHECK", "NATIVE_DISPATCH", "NATIVE_LAUNCH", "NATIVE_RUN", "ArchKernels", "Cubin", "Function", "Kernel",
    "check", "check_disjoint", "check_strides", "check_tensor", "current_stream", "dispatch", "dtype_name", "fast_path",
    "from_input", "from_out", "get_device_num_sms", "get_kernel", "get_num_sms", "launch", "launch_cooperative",
    "launch_op", "output", "remember", "run", "same_size", "set_num_sms", "size_is", "size_multiple", "size_of",
    "sm_count", "stride_bytes_multiple", "table", "tensor_map", "use_exchange",
]

_CUBIN_DIR = Path(__file__).parent / "cubins"
_DYNAMIC_SMEM_DEFAULT_LIMIT = 48 * 1024  # above this a kernel must opt in per device
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720
_MAX_GRID = (2**31 - 1, 65535, 65535)  # blocks per grid dimension, every arch since sm_30


_TABLES = Path(__file__).parent / "_kernels"


_tables: dict[str, list[bytes | None]] = {}


def table(kernel: str) -> list[bytes | None]:
    """The packed contracts and plans of ``kernel``'s variants (``_kernels/<kernel>.bin``), in the order
    its launcher modules index them; read once per process, on the first use of one of its variants."""
    entries = _tables.get(kernel)
    if entries is None:
        path = _TABLES / f"{kernel}.bin"
        try:
            entries = _tables[kernel] = protocol.unpack_table(path.read_bytes())
        except ValueError:
            raise RuntimeError(f"{path} is not a tkc table: reinstall {info.PACKAGE}") from None
    return entries


@functools.lru_cache(maxsize=4)
def _pack(path: Path) -> bytes:
    """The decompressed bytes of a pack of cubins (``cubins/<kernel>.<n>.xz``, xz: the cubins of neighbouring
    variants concatenated), or a plain file's bytes. The last few stay: a kernel's variants share packs."""
    data = path.read_bytes()
    if path.suffix != ".xz":
        return data
    try:
        import lzma
    except ImportError:
        raise RuntimeError(f"{path}: this Python has no lzma module (xz), which {info.PACKAGE}'s cubins are "
                           "compressed with; use a Python built with liblzma (python.org's and most "
                           "distributions' are)") from None
    try:
        return lzma.decompress(data, format=lzma.FORMAT_XZ)
    except lzma.LZMAError as exc:
        raise CorruptPackageError(f"{path}: not a pack of cubins ({exc}); the installed package is damaged or was "
                                  f"modified: reinstall it (pip install --force-reinstall {info.PACKAGE})") from None


class Cubin:
    """One cubin of the package, loaded lazily as a context-independent library, after its bytes are checked
    against the sha256 the build recorded (``sha256``; once, before the driver sees them). Its bytes are
    ``size`` bytes at ``offset`` of the file ``filename`` (under ``cubins/``), decompressed where it is a
    pack; ``size`` -1: the rest of the file."""

    def __init__(self, filename: str, sha256: str = "", arch: str = "", *, offset: int = 0, size: int = -1) -> None:
        self.filename = filename
        self.sha256 = sha256
        self.arch = arch  # in a multi-arch package: the arch whose devices it runs on
        self.offset = offset
        self.size = size
        self._lock = threading.Lock()
        self._library: ctypes.c_void_p | None = None
        self._kernels: dict[str, ctypes.c_void_p] = {}

    def data(self) -> bytes:
        """The cubin's bytes; CorruptPackageError if they are not the ones the build wrote."""
        import hashlib

        path = _CUBIN_DIR / self.filename
        pack = _pack(path)
        data = pack[self.offset:] if self.size < 0 else pack[self.offset:self.offset + self.size]
        if self.sha256 and hashlib.sha256(data).hexdigest() != self.sha256:
            where = path if self.size < 0 else f"{path} (bytes {self.offset}..{self.offset + self.size})"
            raise CorruptPackageError(f"{where}: not the cubin {info.PACKAGE} {info.VERSION} was built with (its "
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
        check_device(device, self.arch)
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
        self._fast = launch_cooperative if cooperative else launch

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
        if result in (_WRONG_DEVICE, CUDA_ERROR_INVALID_CONTEXT):
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


class Kernel:
    """All prebuilt variants of one spec kernel, keyed by their compile-time parameters.

    ``modules`` names each variant's launcher module in the kernel's package (``_kernels/<name>/``); a
    launcher is imported on its variant's first use, so importing a kernel of hundreds of variants costs
    only its index. ``variants`` maps the same keys to the launchers.
    """

    def __init__(self, name: str, spec: str, keys: tuple[str, ...], variants: dict[tuple[Any, ...], str],
                 arch: str = "") -> None:
        self.name = name
        self.spec = spec
        self.keys = keys
        self.arch = arch  # in a multi-arch package: the arch whose variants these are (_kernels/<name>/<arch>/)
        self.modules = variants
        self.variants: Mapping[tuple[Any, ...], Callable[..., None]] = _Launchers(self)
        self._launchers: dict[tuple[Any, ...], Callable[..., None]] = {}
        folder = f"{name}.{arch}" if arch else name
        self._path = f"{__package__}._kernels.{folder}"
        self._index = sys.modules.get(self._path)  # the index module constructing this (None: built elsewhere)

    def variant(self, *values: Any) -> Callable[..., None]:
        """The launcher of the variant built for ``values``, given in grid order (``keys``).

        The ops' hot path: one dict lookup, no keyword handling. A miss (a variant's first use, or one
        not built) goes through ``select``, which loads it or names the keys and lists the built variants.
        """
        launcher = self._launchers.get(values)
        return launcher if launcher is not None else self.select(**dict(zip(self.keys, values)))

    def find(self, *values: Any) -> Callable[..., None] | None:
        """The launcher of the variant built for ``values`` (grid order), or None: for ops that prefer a
        specialized variant where the build has one and fall back to a generic one."""
        launcher = self._launchers.get(values)
        if launcher is None and values in self.modules:
            launcher = self._load(values)
        return launcher

    def has(self, *values: Any) -> bool:
        """Whether a variant is built for ``values`` (grid order), without loading its launcher: for ops that only
        ask which variants exist (find loads the one it returns)."""
        return values in self.modules

    def select(self, **values: Any) -> Callable[..., None]:
        """The launcher of the variant built for ``values`` (every grid key, by name)."""
        key = _grid_key(self.name, self.keys, values)
        launcher = self._launchers.get(key)
        if launcher is not None:
            return launcher
        if key not in self.modules:
            have = "\n  ".join(", ".join(f"{k}={v}" for k, v in zip(self.keys, variant))
                               for variant in self.modules)
            asked = ", ".join(f"{k}={values[k]!r}" for k in self.keys)
            where = f" for {info.ARCHS[self.arch][2]}" if self.arch else ""
            raise VariantNotFoundError(
                f"{self.name}: no prebuilt variant{where} for {asked} in {info.PACKAGE} {info.VERSION}; add the values "
                f"to the grid of kernel {self.name} in {self.spec} and rebuild (tkc build). Built variants:\n  {have}"
            )
        return self._load(key)

    def _load(self, key: tuple[Any, ...]) -> Callable[..., None]:
        """Import the launcher module of the variant built for ``key`` (once; importing is thread-safe)."""
        module_name = self.modules[key]
        launcher: Callable[..., None] = getattr(_submodule(self._index, self._path, module_name), module_name)
        # Remembered eagerly only: under torch.compile the store would be a side effect on the real dict that dynamo
        # replays after the graph, which it cannot for a launcher it got as a constant (the next eager use stores it).
        if not torch.compiler.is_compiling():
            self._launchers[key] = launcher
        return launcher


def _import(module: str) -> bool:
    """Import a launcher module (once: later calls find it in sys.modules)."""
    importlib.import_module(module)
    return True


def _submodule(index: ModuleType | None, path: str, name: str) -> ModuleType:
    """Submodule ``name`` of the kernel index module at ``path`` (``index``, or None where the Kernel was not built
    by its index module), imported on first use. Read as the index module's attribute, not from sys.modules:
    dynamo keeps one view of sys.modules a traced frame (the second launcher module a frame imports would be a
    miss), while a module's attributes it reads as they are."""
    _import(f"{path}.{name}")
    module: ModuleType = getattr(index if index is not None else sys.modules[path], name)
    return module


# A variant's first use may come while torch.compile traces an op, which cannot trace an import: dynamo calls
# _import for real and keeps its answer as a constant (torch.compiler.assume_constant_result, without importing
# torch._dynamo at import), as it does for process_arch and the op layer's template ids; the launcher is then read
# from sys.modules, which dynamo can trace and guard (a function returned as a constant it could not).
_import._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _grid_key(name: str, keys: tuple[str, ...], values: Mapping[str, Any]) -> tuple[Any, ...]:
    """``values`` (every grid key, by name) in grid order; a TypeError naming the keys where one is missing."""
    try:
        return tuple(values[k] for k in keys)
    except KeyError as exc:
        raise TypeError(f"{name}.select() needs every grid key: {', '.join(keys)}") from exc


class ArchKernels:
    """A kernel of a multi-arch package: a ``Kernel`` per built arch (``_kernels/<name>/<arch>/``, imported on
    first use), with the same surface as ``Kernel``.

    Which arch's launcher runs is decided per device: where every device torch sees takes one arch (a
    machine of one kind of GPU, the usual case), ``variant`` hands out that arch's launchers themselves, so
    the hot path is a per-arch package's; where the devices differ (an H100 and a B200 in one process), a
    ``_PerDevice`` launcher picks by the device of the call's first CUDA tensor (one dict lookup more).
    A device that no built arch serves gets the ArchMismatchError of a per-arch package, naming both.
    """

    def __init__(self, name: str, spec: str, keys: tuple[str, ...], archs: tuple[str, ...]) -> None:
        self.name = name
        self.spec = spec
        self.keys = keys
        self.archs = archs
        self._path = f"{__package__}._kernels.{name}"
        self._index = sys.modules.get(self._path)
        self.variants: Mapping[tuple[Any, ...], Callable[..., None]] = _Launchers(self)
        self._kernels: dict[str, Kernel] = {}
        self._launchers: dict[tuple[Any, ...], Callable[..., None]] = {}
        self._modules: dict[tuple[Any, ...], str] | None = None

    def of(self, arch: str) -> Kernel:
        """The ``Kernel`` of ``arch``'s variants; VariantNotFoundError where the build made none for it."""
        kernel = self._kernels.get(arch)
        if kernel is None:
            if arch not in self.archs:
                raise VariantNotFoundError(
                    f"{self.name}: {info.PACKAGE} {info.VERSION} has no variant for {info.ARCHS[arch][2]} (built "
                    f"for {', '.join(self.archs)}); add {arch} to the archs of kernel {self.name} in {self.spec} "
                    "and rebuild (tkc build)")
            kernel = self._kernels[arch] = _submodule(self._index, self._path, arch).KERNEL
        return kernel

    @property
    def modules(self) -> dict[tuple[Any, ...], str]:
        """Every key some arch has a variant for (the first arch's module name where several have)."""
        if self._modules is None:
            modules: dict[tuple[Any, ...], str] = {}
            for arch in self.archs:
                for key, module in self.of(arch).modules.items():
                    modules.setdefault(key, module)
            self._modules = modules
        return self._modules

    def variant(self, *values: Any) -> Callable[..., None]:
        """The launcher of the variant built for ``values`` (grid order); see ``Kernel.variant``."""
        launcher = self._launchers.get(values)
        return launcher if launcher is not None else self.select(**dict(zip(self.keys, values)))

    def find(self, *values: Any) -> Callable[..., None] | None:
        """The launcher of the variant built for ``values`` (grid order), or None: where one arch serves the
        process, that arch's (so an op's fallback to a generic variant works as in a per-arch package); where
        the devices differ, one that picks per device if any arch has the variant."""
        launcher = self._launchers.get(values)
        if launcher is not None:
            return launcher
        arch = process_arch()
        if arch is not None:
            launcher = self.of(arch).find(*values) if arch in self.archs else None
        elif values in self.modules:
            launcher = _PerDevice(self, values)
        if launcher is not None:
            self._launchers[values] = launcher
        return launcher

    def has(self, *values: Any) -> bool:
        """Whether a variant is built for ``values`` (grid order) where ``find`` would look: the process's one arch,
        else any arch; nothing is loaded."""
        arch = process_arch()
        if arch is not None:
            return arch in self.archs and self.of(arch).has(*values)
        return values in self.modules

    def select(self, **values: Any) -> Callable[..., None]:
        """The launcher of the variant built for ``values`` (every grid key, by name), as ``find``; where there is
        none, the VariantNotFoundError of the process's arch (or the first built one), naming the key and the
        built variants."""
        launcher = self.find(*_grid_key(self.name, self.keys, values))
        return launcher if launcher is not None else self.of(process_arch() or self.archs[0]).select(**values)


def _device_of(arguments: tuple[Any, ...]) -> int:
    """The device index of the first CUDA tensor among ``arguments``; -1 where there is none."""
    for argument in arguments:
        if isinstance(argument, torch.Tensor) and argument.is_cuda:
            return argument.get_device()
    return -1


class _PerDevice:
    """One variant of a multi-arch kernel in a process whose devices need different archs: each call runs the
    launcher of the arch of its first CUDA tensor's device (the launcher then checks every tensor is there)."""

    def __init__(self, kernel: ArchKernels, key: tuple[Any, ...]) -> None:
        self.kernel = kernel
        self.key = key
        self.__name__ = kernel.modules[key]
        self._by_device: dict[int, Callable[..., None]] = {}
        self._last: Callable[..., None] | None = None

    def template_description(self) -> str:
        """What a traced plan's key says of this launcher (the same in every process: _op._describe)."""
        return f"{__package__}._PerDevice({self.kernel.name!r}, {self.key!r})"

    def launcher(self, device: int) -> Callable[..., None]:
        """The launcher of the variant for cuda:``device``'s arch (-1: no CUDA tensor; the first arch's, whose
        checks then name the argument); ArchMismatchError or VariantNotFoundError naming what is missing."""
        launcher = self._by_device.get(device)
        if launcher is None:
            arch = device_arch(device) if device >= 0 else self.kernel.archs[0]
            kernel = self.kernel.of(arch)
            launcher = kernel.select(**dict(zip(kernel.keys, self.key)))
            self._by_device[device] = launcher
        return launcher

    def __call__(self, *arguments: Any) -> None:
        launcher = self._by_device.get(_device_of(arguments)) or self.launcher(_device_of(arguments))
        self._last = launcher
        launcher(*arguments)

    @property
    def planned(self) -> Any:
        """What dispatch() remembers (``_dispatch.remember``): the plan of the launcher that just ran. A plan of
        one arch's variant holds its kernel handles, which only ever hold devices of that arch, so a call on
        another device is declined by the compiled run and comes back here."""
        return getattr(self._last, "planned", None)


class _Launchers(Mapping[tuple[Any, ...], Callable[..., None]]):
    """A kernel's variants as a mapping of keys to launchers, each imported when it is first read."""

    def __init__(self, kernel: Kernel | ArchKernels) -> None:
        self._kernel = kernel

    def __getitem__(self, key: tuple[Any, ...]) -> Callable[..., None]:
        launcher = self._kernel.find(*key)
        if launcher is None:
            raise KeyError(key)
        return launcher

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._kernel.modules)

    def __len__(self) -> int:
        return len(self._kernel.modules)

    def __contains__(self, key: object) -> bool:
        return key in self._kernel.modules


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


def get_kernel(name: str) -> Kernel | ArchKernels:
    """The ``Kernel`` of spec kernel ``name`` (its generated module is imported on first use)."""
    try:
        module = importlib.import_module(f"{__package__}._kernels.{name}")
    except ModuleNotFoundError as exc:
        raise VariantNotFoundError(f"{info.PACKAGE} has no kernel {name!r}; kernels: "
                                   f"{', '.join(info.KERNELS)}") from exc
    return module.KERNEL
