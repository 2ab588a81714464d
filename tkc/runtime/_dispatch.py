"""dispatch(): an op's remembered call signatures, checked and launched in one C call."""

from __future__ import annotations

import array
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _protocol as protocol
from ._compiled import NATIVE_RUN, _native

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
