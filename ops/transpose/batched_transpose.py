"""Transposes of the last two dimensions: ``batched_transpose`` (B, M, N) -> (B, N, M) and ``transpose``.

Both run the prebuilt ``batched_transpose`` kernel (kernels/transpose/batched_transpose.py.j2):
one variant per dtype (bfloat16, float32, float8_e4m3fn), with B, M and N read from the
tensors at run time. The kernel moves whole 64 x 64 tiles, so M and N must be multiples of
64; x's rows may be strided (x[:, :N] of a wider tensor, as TileKernels' tests pass it): unit column
stride, and row and batch strides that are multiples of 16 elements (rows start 16-byte aligned).
"""

from __future__ import annotations

from typing import Any

import torch

from .._op import Plan, empty, launch, multiple, op, out, size, stride_multiple
from .._runtime import dtype_name, get_kernel
from ..errors import KernelArgumentError

__all__ = ["batched_transpose", "transpose"]

TILE = 64  # the kernel's tile edge: M and N must be multiples of it
STRIDE_MULTIPLE = 16  # x's row and batch strides, in elements (the spec's requires)
MAX_GRID_YZ = 65535  # CUDA's limit on gridDim.y (M / 64 tiles) and gridDim.z (B)

_kernel = get_kernel("batched_transpose")


def _check(x: Any, ndim: int, op: str) -> None:
    """Raise ``KernelArgumentError`` (a ``ValueError``) naming x unless the kernel can take it."""
    if not isinstance(x, torch.Tensor):
        raise KernelArgumentError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        layout = "(B, M, N)" if ndim == 3 else "(M, N)"
        hint = "; use transpose() for a single matrix" if ndim == 3 and x.dim() == 2 else ""
        raise KernelArgumentError(f"{op}: x must be {ndim}-D {layout}, got shape {tuple(x.shape)}{hint}")
    m, n = x.shape[-2], x.shape[-1]
    if m % TILE or n % TILE:
        raise KernelArgumentError(f"{op}: the last two sizes of x must be multiples of {TILE}, got "
                                  f"M={m}, N={n} (shape {tuple(x.shape)}); pad x to multiples of {TILE}")
    batch = x.shape[0] if ndim == 3 else 1
    if batch > MAX_GRID_YZ or m // TILE > MAX_GRID_YZ:
        raise KernelArgumentError(f"{op}: x of shape {tuple(x.shape)} needs more than {MAX_GRID_YZ} thread "
                                  f"blocks along B or M / {TILE}; split x into chunks along that dimension")
    strides = x.stride()
    if x.numel() and (strides[-1] != 1 or any(s % STRIDE_MULTIPLE for s in strides[:-1])):
        raise KernelArgumentError(f"{op}: x must have unit column stride and row (and batch) strides that are "
                                  f"multiples of {STRIDE_MULTIPLE} elements, got shape {tuple(x.shape)} with strides "
                                  f"{strides}; pass x.contiguous()")


@op(outputs=("out",), inputs={"x": ()})
def batched_transpose(x: torch.Tensor) -> Plan:
    """Return x.transpose(-1, -2) as a new contiguous tensor: (B, M, N) -> (B, N, M).

    x: a CUDA tensor of bfloat16, float32 or float8_e4m3fn, with M and N multiples of 64
    (B may be 0), unit column stride and row and batch strides multiples of 16 elements.
    Raises ``KernelArgumentError`` (a ``ValueError``) naming x for a bad shape, layout or device,
    and ``VariantNotFoundError`` for another dtype.
    out: a contiguous (B, N, M) tensor of x's dtype to write into instead (not overlapping
    x), returned as given; the launcher checks it under the kernel's name for it, y.
    """
    _check(x, 3, "batched_transpose")
    return launch(_kernel.variant(dtype_name(x.dtype)), x, out(0),
                  outputs=(empty(x.dtype, size(x, 0), size(x, 2), size(x, 1)),),
                  rules=(multiple("x", x, 1, TILE), multiple("x", x, 2, TILE),
                         stride_multiple("x", x, 0, STRIDE_MULTIPLE), stride_multiple("x", x, 1, STRIDE_MULTIPLE)))


def _batch_of_one(y: torch.Tensor) -> torch.Tensor:
    return y.unsqueeze(0)


@op(outputs=("out",))
def transpose(x: torch.Tensor) -> Plan:
    """Return x.T as a new contiguous tensor: (M, N) -> (N, M); the batched kernel with B = 1.

    Same conditions on x as ``batched_transpose``; out: a contiguous (N, M) tensor to write into.
    """
    _check(x, 2, "transpose")
    batch = x.unsqueeze(0)
    return launch(_kernel.variant(dtype_name(x.dtype)), batch, out(0, view=_batch_of_one),
                  outputs=(empty(x.dtype, size(batch, 2), size(batch, 1)),))
