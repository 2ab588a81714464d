"""The launch paths: the compiled ``_launch`` module where the package has it, ctypes where it does not.

What the generated launchers call: ``run`` (check, grid, stream and launch in one C call, as the
variant's packed plan says), ``check`` (the tensors against the packed contract, in C) and
``launch`` / ``launch_cooperative`` (one kernel launch). Without the compiled module, ``run`` and
``check`` decline (the launchers' Python path runs) and the launches go through ctypes, about 2 µs
slower per call.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from . import _driver
from ._driver import _current_stream, _native

_CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4


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
    if _driver._current_device() != device:
        return _WRONG_DEVICE
    params = _Slots.of(kinds).pack(values)
    result: int = _driver._DRIVER_LIB[0].cuLaunchKernel(ctypes.c_void_p(kernel), *grid, *block, smem,
                                                ctypes.c_void_p(stream), params, None)
    return result


def _ctypes_launch_ex(kernel: int, device: int, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
                      stream: int, kinds: bytes, values: Sequence[Any], *, cooperative: bool,
                      cluster: tuple[int, int, int] | None) -> int:
    """cuLaunchKernelEx through ctypes with the cooperative and / or the cluster attribute."""
    if _driver._current_device() != device:
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
    result: int = _driver._DRIVER_LIB[0].cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(kernel),
                                                  _Slots.of(kinds).pack(values), None)
    return result


def _ctypes_launch_cooperative(kernel: int, device: int, grid: tuple[int, int, int], block: tuple[int, int, int],
                               smem: int, stream: int, kinds: bytes, *values: Any) -> int:
    """``_launch.launch_cooperative`` through ctypes, for a package built without its compiled module."""
    return _ctypes_launch_ex(kernel, device, grid, block, smem, stream, kinds, values, cooperative=True, cluster=None)


NATIVE_LAUNCH = _native is not None  # for benchmarks and bug reports: which launch path this package takes
# What the generated launchers call: launch(kernel, device, grid, block, smem, stream, kinds, *values)
# returns the CUresult (0: launched), or -1 when the current context is another device's;
# launch_cooperative the same for kernels with a grid-wide barrier.
launch: Callable[..., int] = _native.launch if _native is not None else _ctypes_launch
launch_cooperative: Callable[..., int] = (_native.launch_cooperative if _native is not None
                                          else _ctypes_launch_cooperative)


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


def _no_run(contract: bytes | None, plan: bytes | None, handles: dict[int, int], *arguments: Any) -> bool:
    return False  # no compiled run: the launcher's Python path launches


NATIVE_RUN = NATIVE_CHECK and hasattr(_native, "run")
if NATIVE_RUN:
    _native.set_stream(_current_stream)
# What the generated launchers call first: run(contract, plan, handles, *arguments) -> True when the
# compiled module checked the tensors and launched; False where the Python path must (see plan()).
run: Callable[..., bool] = _native.run if NATIVE_RUN else _no_run
