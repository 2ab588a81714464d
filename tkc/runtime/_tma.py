"""TMA descriptors (``CUtensorMap``) for the launchers of kernels that move tensors with the tensor memory
accelerator, encoded through the driver and kept by their arguments."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import torch

from ._driver import CUDA_ERROR_INVALID_CONTEXT, driver
from .errors import KernelArgumentError


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
    if result == CUDA_ERROR_INVALID_CONTEXT:
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
