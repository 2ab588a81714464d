"""Transposes of the last two dimensions: ``batched_transpose`` (B, M, N) -> (B, N, M) and ``transpose``.

Both run the prebuilt ``batched_transpose`` kernel (templates/transpose/batched_transpose.py.j2):
one variant per dtype (bfloat16, float32, float8_e4m3fn), with B, M and N read from the
tensors at run time. The kernel moves whole 64 x 64 tiles, so M and N must be multiples of
64, and it indexes x as a contiguous tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from .._args import out_tensors
from .._runtime import (
    custom_op,
    dispatch,
    dtype_name,
    fast_path,
    from_input,
    from_out,
    get_kernel,
    output,
    remember,
    size_multiple,
    size_of,
)
from ..errors import KernelArgumentError

__all__ = ["batched_transpose", "transpose"]

TILE = 64  # the kernel's tile edge: M and N must be multiples of it
MAX_GRID_YZ = 65535  # CUDA's limit on gridDim.y (M / 64 tiles) and gridDim.z (B)

_kernel = get_kernel("batched_transpose")
# batched_transpose(x, out=y) in one C call (_runtime.dispatch): keyed by x's dtype; the launcher's
# contract checks both tensors (contiguous, y of shape (B, N, M), no overlap) and its grid limits,
# and the rules are _check's tile multiples, which the contract only reads. An allocating call
# (out None) allocates y as _launch does: (B, N, M) of x's dtype, read from x.
_FAST = fast_path(inputs=((),), outputs=1)
_TILE_RULES = (size_multiple(0, 1, TILE), size_multiple(0, 2, TILE))


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
    if not x.is_contiguous():
        raise KernelArgumentError(f"{op}: x must be contiguous, got shape {tuple(x.shape)} with strides "
                                  f"{x.stride()}; pass x.contiguous()")


def _launch(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """y[b] = x[b].T for a checked (B, M, N) tensor x, into out (B, N, M) if given (the launcher checks
    it as y, overlaps with x included)."""
    launch = _kernel.variant(dtype_name(x.dtype))
    if out is None:
        b, m, n = x.shape
        out = x.new_empty((b, n, m))  # x's dtype and device; one attribute read less than torch.empty
    launch(x, out)
    return out


def _fake_transpose(x: torch.Tensor) -> torch.Tensor:
    b, m, n = x.shape
    return x.new_empty((b, n, m))


@custom_op("batched_transpose", fake=_fake_transpose)
def _batched_transpose_op(x: torch.Tensor) -> torch.Tensor:
    """The torch custom op torch.compile sees (``torch.ops.<package>.batched_transpose``)."""
    _check(x, 3, "batched_transpose")
    return _launch(x)


def batched_transpose(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Return x.transpose(-1, -2) as a new contiguous tensor: (B, M, N) -> (B, N, M).

    x: a contiguous CUDA tensor of bfloat16, float32 or float8_e4m3fn, with M and N
    multiples of 64; B may be 0. Raises ``KernelArgumentError`` (a ``ValueError``) naming
    x for a bad shape, layout or device, and ``VariantNotFoundError`` for another dtype.
    out: a contiguous (B, N, M) tensor of x's dtype to write into instead (not overlapping
    x), returned as given; the launcher checks it under the kernel's name for it, y.
    """
    if torch.compiler.is_compiling():
        y = _batched_transpose_op(x)
        return y if out is None else out_tensors(out, ("out",))[0].copy_(y)
    done = dispatch(_FAST, x, out)  # a dtype seen before: checked and launched in one C call
    if done is not None:
        return done  # type: ignore[no-any-return]
    _check(x, 3, "batched_transpose")
    launch = _kernel.variant(dtype_name(x.dtype))
    if out is None:
        b, m, n = x.shape
        y = x.new_empty((b, n, m))
    else:
        (y,) = out_tensors(out, ("out",))
    launch(x, y)
    remember(_FAST, launch, (from_input(0), from_out()), _TILE_RULES, x, out,
             outputs=(output(y.dtype, size_of(0, 0), size_of(0, 2), size_of(0, 1)),))
    return y


def transpose(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Return x.T as a new contiguous tensor: (M, N) -> (N, M); the batched kernel with B = 1.

    Same conditions on x as ``batched_transpose``; out: a contiguous (N, M) tensor to write into.
    """
    if torch.compiler.is_compiling():
        y = _batched_transpose_op(x.unsqueeze(0)).squeeze(0)
        return y if out is None else out_tensors(out, ("out",))[0].copy_(y)
    _check(x, 2, "transpose")
    if out is None:
        return _launch(x.unsqueeze(0)).squeeze(0)
    (y,) = out_tensors(out, ("out",))
    _launch(x.unsqueeze(0), y.unsqueeze(0))
    return y
