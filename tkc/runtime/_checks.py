"""The launchers' Python tensor checks: what the compiled check (``_launch.check``) decides in C, spelled
out for the path that names what is wrong (a first call, a refused tensor, a package without the
compiled module)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import _build_info as info  # type: ignore[attr-defined]  # generated into each package
from ._driver import device_arch
from .errors import KernelArgumentError, NoGpuError

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
    # A multi-arch package's launchers each run on their own arch's devices: its alignment is the device's.
    alignment = info.ARCHS[device_arch(index)][4] if info.MULTI_ARCH else info.ALIGNMENT
    if t.data_ptr() % alignment:
        target = info.ARCHS[device_arch(index)][2] if info.MULTI_ARCH else info.TARGET
        raise KernelArgumentError(f"{name}: data pointer {t.data_ptr():#x} is not {alignment}-byte aligned; "
                                  f"the {target} kernels use vector accesses that need it (pass a fresh or "
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
