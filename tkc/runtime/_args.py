"""Checks of the non-tensor arguments the op modules share (the launchers check the tensors).

Copied verbatim by tkc into every generated package, next to the loader. Each error names the
argument, as the launchers' errors do.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch


def not_built(argument: str, what: str, kernel: str) -> NotImplementedError:
    """The error for an option this package's specs did not build."""
    return NotImplementedError(
        f"{argument}: {what} is not built into this package; the kernel spec (kernel {kernel}) "
        "must add it before it can be used"
    )


def matrix(name: str, x: object, shape: str = "(num_tokens, hidden)") -> torch.Tensor:
    """``x`` as a 2-D tensor, or a TypeError / ValueError naming it."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {shape}, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D tensor {shape}, got shape {tuple(x.shape)}")
    return x


def one_of(name: str, value: object, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return str(value)


def no_host_sync_under_compile(name: str, fix: str) -> None:
    """A ValueError naming ``name`` when torch.compile traces the call: what it asked for needs the device's result
    on the host, which a traced graph (and a CUDA graph) cannot wait for. ``fix``: what to pass instead."""
    if torch.compiler.is_compiling():
        raise ValueError(f"{name}: under torch.compile {fix}; this call would need a host synchronization")


def storage_gradients(enabled: bool) -> bool:
    """Whether two ops' backwards may pass a gradient through an attribute of a tensor's storage (TileKernels'
    ``fuse_grad_acc``: one adds into the other's gradient in place): ``enabled``, and only eagerly. torch.compile
    cannot trace attributes of storages; without them each backward returns its own gradient and autograd adds
    the two, the same sum."""
    return enabled and not torch.compiler.is_compiling()


def positive_int(name: str, value: object) -> int:
    """``value`` as a positive int (bools refused), or a TypeError / ValueError naming it."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}") from None
    if number <= 0 or isinstance(value, bool):
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return number


def real(name: str, value: object) -> float:
    """``value`` (an int or a float; bools refused) as a float, or a TypeError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    return float(value)


# The output formats of the cast-back ops; TileKernels spells them 'bf16' / 'fp32'.
OUT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def output_dtype(fmt: str | torch.dtype) -> torch.dtype:
    """The output dtype a cast-back ``fmt`` names ('bf16', 'fp32' or the dtype), or a ValueError naming fmt."""
    if isinstance(fmt, torch.dtype):
        if fmt in OUT_DTYPES.values():
            return fmt
    elif isinstance(fmt, str) and fmt in OUT_DTYPES:
        return OUT_DTYPES[fmt]
    raise ValueError(f"fmt: expected 'bf16', 'fp32', torch.bfloat16 or torch.float32, got {fmt!r}")


def column_storage(sf: torch.Tensor) -> torch.Tensor | None:
    """The contiguous (columns, P) storage behind a column-major (T, columns) view, or None.

    A view with strides (1, P), P >= T > 0, whose storage holds all columns * P elements: what
    per_token_cast returns for column-major scales (P = align(T, 4)), so a kernel can read or
    write it in place. Anything else is None (the op copies, or refuses, by name).
    """
    num_tokens, cols = sf.shape
    padded = sf.stride(1)
    if num_tokens > 0 and cols > 0 and sf.stride(0) == 1 and padded >= num_tokens and \
            sf.untyped_storage().nbytes() >= (sf.storage_offset() + cols * padded) * sf.element_size():
        return sf.as_strided((cols, padded), (padded, 1))
    return None


def out_tensors(out: object, names: Sequence[str]) -> tuple[torch.Tensor, ...]:
    """``out`` as the tuple of tensors the op would have returned (``names``, in order), or a TypeError naming out.

    One name takes a tensor; several take a tuple or list of that many. The launcher then checks
    each against the kernel's contract (dtype, device, shape, strides, alignment) under its name.
    """
    if len(names) == 1:
        if isinstance(out, torch.Tensor):
            return (out,)
    elif isinstance(out, (tuple, list)) and len(out) == len(names):
        for t in out:
            if not isinstance(t, torch.Tensor):
                break
        else:
            return tuple(out)
    spelled = names[0] if len(names) == 1 else f"({', '.join(names)})"
    raise TypeError(f"out: expected {spelled} as the op returns it ({'a tensor' if len(names) == 1 else 'tensors'}), "
                    f"got {type(out).__name__}")


def copied_into(out: object, names: Sequence[str], result: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The op's result copied into the caller's ``out`` (checked as ``out_tensors`` does), returned as out.

    What an op with ``out=`` returns while compiling: there the custom op allocates its result,
    and the copy keeps the traced graph functional.
    """
    targets = out_tensors(out, names)
    for target, value in zip(targets, result, strict=True):
        target.copy_(value)
    return targets


def placeholders(cache: dict[Any, tuple[torch.Tensor, ...]], x: torch.Tensor,
                 *tensors: tuple[tuple[int, ...], torch.dtype], key: object = None) -> tuple[torch.Tensor, ...]:
    """Stand-ins for a call's absent optional tensors: one set per device of x (and ``key``), of these (shape,
    dtype), allocated on first use, so that a call allocates none and dispatch replays it with them as constants
    (distinct tensors: dispatch replays inputs by position). The variant built without a tensor never reads its
    stand-in. A CPU x gets a set too (device -1), which the launcher then refuses by name."""
    index = (x.get_device(), key)
    found = cache.get(index)
    if found is None:
        found = cache[index] = tuple(x.new_empty(shape, dtype=dtype) for shape, dtype in tensors)
    return found

