"""What an op module's plan function is written in: its outputs (``out``, ``empty``, ``size``), the rules it
relies on beyond the launcher's contract (``multiple``, ``stride_multiple``, ``size_is``, ``same_size``), and the
plan itself (``launch``) or a value returned as is (``result``); ``pair`` declares an input that may be a
(data, scales) tuple. ``_op`` turns plans into ops."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _runtime as rt
from .errors import KernelArgumentError

__all__ = ["Alloc", "Empty", "Out", "Pair", "Plan", "Result", "Rule", "Size", "empty", "launch", "multiple", "out",
           "pair", "result", "same_size", "size", "size_is", "split_pair", "stride_multiple"]


class Out:
    """The i-th output of the op as a launcher argument, or ``view`` of it (the kernel's view of the output)."""

    __slots__ = ("index", "view")

    def __init__(self, index: int, view: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.index, self.view = index, view

    def of(self, outputs: Sequence[torch.Tensor]) -> torch.Tensor:
        t = outputs[self.index]
        return t if self.view is None else self.view(t)

    def __repr__(self) -> str:
        return f"out({self.index})"


_OUTS = tuple(Out(i) for i in range(16))


def out(index: int = 0, view: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Out:
    """The plan's ``index``-th output (what the op returns, or the caller's ``out`` tensor), or the
    kernel's ``view`` of it (a call with a view is not remembered by dispatch)."""
    return _OUTS[index] if view is None else Out(index, view)


class Size:
    """An output dimension from a tensor of the call: (t.shape[dim] * times + plus) // per."""

    __slots__ = ("dim", "per", "plus", "tensor", "times")

    def __init__(self, tensor: torch.Tensor, dim: int, times: int = 1, plus: int = 0, per: int = 1) -> None:
        self.tensor, self.dim, self.times, self.plus, self.per = tensor, dim, times, plus, per

    def of(self, tensor: torch.Tensor) -> Any:
        return (tensor.shape[self.dim] * self.times + self.plus) // self.per


def size(tensor: torch.Tensor, dim: int, times: int = 1, plus: int = 0, per: int = 1) -> Size:
    """A dimension read from ``tensor`` at every call: ``(tensor.shape[dim] * times + plus) // per``."""
    return Size(tensor, dim, times, plus, per)


class Empty:
    """An output the op allocates uninitialised: torch.empty(dims, dtype) on the inputs' device."""

    __slots__ = ("dims", "dtype")

    def __init__(self, dtype: torch.dtype, dims: tuple[int | Size, ...]) -> None:
        self.dtype, self.dims = dtype, dims


def empty(dtype: torch.dtype, *dims: int | Size) -> Empty:
    """An uninitialised output of ``dtype`` whose dimensions are constants or ``size(...)`` of a call tensor."""
    return Empty(dtype, dims)


class Rule:
    """A condition on a launcher's tensor the contract does not state; the error names the tensor."""

    __slots__ = ("dim", "kind", "message", "name", "other", "other_dim", "tensor", "value")

    def __init__(self, kind: int, name: str, tensor: Any, dim: int, value: int, other: Any = None,
                 other_dim: int = 0, message: str | None = None) -> None:
        self.kind, self.name, self.tensor, self.dim, self.value = kind, name, tensor, dim, value
        self.other, self.other_dim, self.message = other, other_dim, message

    def resolved(self, outputs: Sequence[torch.Tensor]) -> Rule:
        """The rule over real tensors: an ``out(i)`` it names is the call's i-th output."""
        tensor = self.tensor.of(outputs) if isinstance(self.tensor, Out) else self.tensor
        other = self.other.of(outputs) if isinstance(self.other, Out) else self.other
        return self if tensor is self.tensor and other is self.other else \
            Rule(self.kind, self.name, tensor, self.dim, self.value, other, self.other_dim, self.message)

    def holds(self) -> bool:
        t, dim = self.tensor, self.dim
        if self.kind == _MULTIPLE:
            return t.shape[dim] % self.value == 0  # type: ignore[no-any-return]
        if self.kind == _SIZE_IS:
            return t.shape[dim] == self.value  # type: ignore[no-any-return]
        if self.kind == _SAME_SIZE:
            assert self.other is not None
            return t.shape[dim] * self.value == self.other.shape[self.other_dim]  # type: ignore[no-any-return]
        return t.shape[dim] <= 1 or t.numel() == 0 or (t.stride(dim) * t.element_size()) % self.value == 0

    def error(self) -> KernelArgumentError:
        t, dim, name = self.tensor, self.dim, self.name
        if self.message is not None:  # the op's own words, given the tensor's shape
            return KernelArgumentError(f"{name}: {self.message}, got shape {tuple(t.shape)}")
        if self.kind == _MULTIPLE:
            return KernelArgumentError(
                f"{name}: dimension {dim} (size {t.shape[dim]}) must be a multiple of {self.value}, got shape "
                f"{tuple(t.shape)}; pad {name} to a multiple of {self.value}")
        if self.kind == _SIZE_IS:
            return KernelArgumentError(f"{name}: dimension {dim} must be {self.value}, got shape {tuple(t.shape)}")
        if self.kind == _SAME_SIZE:
            assert self.other is not None
            times = f" times {self.value}" if self.value != 1 else ""
            return KernelArgumentError(
                f"{name}: dimension {dim} (size {t.shape[dim]}){times} must equal dimension {self.other_dim} of "
                f"the tensor it goes with (size {self.other.shape[self.other_dim]}), got shape {tuple(t.shape)}")
        return KernelArgumentError(
            f"{name}: the stride of dimension {dim} ({t.stride(dim)} elements) must be a multiple of "
            f"{self.value} bytes for the kernel's vector accesses; pass {name}.contiguous()")

    def packed(self, arguments: Sequence[Any]) -> tuple[int, ...] | None:
        """The rule for dispatch, over launcher argument positions; None where a tensor is not an argument."""
        argument = _position(arguments, self.tensor)
        if argument is None:
            return None
        if self.kind == _MULTIPLE:
            return rt.size_multiple(argument, self.dim, self.value)
        if self.kind == _SIZE_IS:
            return rt.size_is(argument, self.dim, self.value)
        if self.kind == _SAME_SIZE:
            other = _position(arguments, self.other)
            return None if other is None else rt.same_size(argument, self.dim, other, self.other_dim, self.value)
        return rt.stride_bytes_multiple(argument, self.dim, self.value)


def _position(arguments: Sequence[Any], tensor: Any) -> int | None:
    return next((i for i, a in enumerate(arguments) if a is tensor), None)


_MULTIPLE, _STRIDE, _SIZE_IS, _SAME_SIZE = 1, 2, 3, 4


# Each rule names its tensor in errors; ``message`` words them as the op would ("expected shape
# (num_tokens, 8)"), followed by the tensor's shape.
def multiple(name: str, tensor: torch.Tensor | Out, dim: int, value: int, message: str | None = None) -> Rule:
    """``tensor.shape[dim] % value == 0`` (a tile multiple the kernel trusts)."""
    return Rule(_MULTIPLE, name, tensor, dim, value, message=message)


def stride_multiple(name: str, tensor: torch.Tensor | Out, dim: int, value: int, message: str | None = None) -> Rule:
    """The byte stride of ``dim`` a multiple of ``value`` wherever the tensor steps over it."""
    return Rule(_STRIDE, name, tensor, dim, value, message=message)


def size_is(name: str, tensor: torch.Tensor | Out, dim: int, value: int, message: str | None = None) -> Rule:
    """``tensor.shape[dim] == value`` (a size the contract leaves free that the kernel relies on)."""
    return Rule(_SIZE_IS, name, tensor, dim, value, message=message)


def same_size(name: str, tensor: torch.Tensor | Out, dim: int, other: torch.Tensor | Out, other_dim: int,
              times: int = 1, message: str | None = None) -> Rule:
    """``tensor.shape[dim] * times == other.shape[other_dim]`` (two sizes the contract does not tie)."""
    return Rule(_SAME_SIZE, name, tensor, dim, times, other, other_dim, message=message)


Alloc = Callable[..., Sequence[torch.Tensor]]


class Plan:
    """One launch of an op: launcher, its arguments in prim_func order, the outputs, the rules."""

    __slots__ = ("args", "constants", "launcher", "outputs", "rules", "then")

    def __init__(self, launcher: Callable[..., None], args: tuple[Any, ...],
                 outputs: Sequence[Empty] | Alloc | None, rules: Sequence[Rule],
                 then: Callable[..., Any] | None, constants: Sequence[torch.Tensor]) -> None:
        self.launcher, self.args, self.outputs, self.rules, self.then = launcher, args, outputs, rules, then
        self.constants = constants


def launch(launcher: Callable[..., None], *args: Any, outputs: Sequence[Empty] | Alloc | None = None,
           rules: Sequence[Rule] = (), then: Callable[..., Any] | None = None,
           constants: Sequence[torch.Tensor] = ()) -> Plan:
    """A plan: ``launcher(*args)`` with ``out(i)`` standing for the outputs.

    ``outputs``: an ``empty(...)`` per output, or a function of the plan's tensor arguments (in
    order) that returns them (a layout ``empty`` cannot say; such calls are not remembered by
    dispatch); None for an op that writes only its inputs. ``then``: a function of the outputs
    whose result the op returns instead (torch code, traced when compiling). ``constants``:
    tensors among ``args`` that the plan made and that the same call signature may reuse (a
    placeholder for an optional input the kernel does not read, cached per device); dispatch
    passes them as they are. Any other tensor the plan made keeps the call on the Python path.
    """
    return Plan(launcher, args, outputs, rules, then, constants)


class Result:
    """What an op returns without a launch of its own (a call routed to another op, an empty case)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def result(value: Any) -> Result:
    """Return ``value`` from the op as it is: the plan launched nothing itself (e.g. it called another op)."""
    return Result(value)


class Pair:
    """An input that is a tensor or a ``(data, scales)`` pair of them, a tuple or a list (a quantized tensor
    with its scales, as TileKernels passes one): dispatch keys it as two inputs, ``data`` and ``scales`` (None
    for a plain tensor), with the dimensions each selects the variant by. A pair whose scales are None is not
    split (the plan sees it and says what is wrong), so that it never replays a plain tensor's call."""

    __slots__ = ("data", "scales")

    def __init__(self, data: Sequence[int], scales: Sequence[int]) -> None:
        self.data, self.scales = tuple(data), tuple(scales)


def pair(data: Sequence[int] = (), scales: Sequence[int] = ()) -> Pair:
    """The ``inputs=`` entry of a parameter that takes a tensor or a ``(data, scales)`` tuple."""
    return Pair(data, scales)


def split_pair(value: Any) -> tuple[Any, Any]:
    """A pair input as dispatch takes it: ``(data, scales)`` for a 2-tuple or 2-list with scales, else ``(value, None)``
    (the generated public function spells the same test inline)."""
    if (value.__class__ is tuple or value.__class__ is list) and len(value) == 2 and value[1] is not None:
        return value[0], value[1]
    return value, None
