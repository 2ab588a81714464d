"""Stage 5, data: each variant's launch contract and launch plan, packed for the launch module.

``lower`` records the contract as a dataclass (expressions of runtime sizes as Python text);
here it becomes the int64 words ``_launch.c`` reads (the codes of ``runtime/_protocol.py``), at
build time: the package carries the words as data (``_kernels/<kernel>.bin``, see
``pack_table``), and the loader reads them without parsing anything.

``contract`` and ``plan`` take the same facts the generated launchers spell out, so tests can
pack contracts of their own (e.g. for DLPack's CPU device) with the same functions.
"""

from __future__ import annotations

import array
import ast
import functools
import re
import struct
from collections.abc import Sequence
from typing import Protocol

from tkc.runtime import _protocol as p

ROW_MAJOR = "row_major"  # a contract layout: the strides Tensor.is_contiguous() accepts
_LAYOUTS = {ROW_MAJOR: p.LAYOUT_ROW_MAJOR, None: p.LAYOUT_ANY}  # strides given per dimension: LAYOUT_STRIDES
_OPS = {ast.Add: p.OP_ADD, ast.Sub: p.OP_SUB, ast.Mult: p.OP_MUL, ast.FloorDiv: p.OP_FLOORDIV, ast.Mod: p.OP_MOD}
_CALLS = {"max": p.OP_MAX, "min": p.OP_MIN}  # of two arguments
_POINTER = re.compile(r"(\w+)_ptr")
_SCALAR = re.compile(r"(?:int|float)\((\w+)\)")


def dtype_name(dtype: object) -> str:
    """A dtype's name as the specs spell it: "bfloat16" for the name or for torch.bfloat16."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


@functools.cache
def expression(text: str, sizes: tuple[str, ...]) -> tuple[int, ...]:
    """A shape, stride or grid expression (``"((num_tokens + 127) - 127) // 128"``, ``max(a, b)``) in
    reverse Polish (op, operand) pairs over the size slots; raises ValueError for anything else."""
    out: list[int] = []

    def emit(node: ast.AST) -> None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            out.extend((p.OP_CONST, node.value))
        elif isinstance(node, ast.Name) and node.id in sizes:
            out.extend((p.OP_SIZE, sizes.index(node.id)))
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            emit(node.left)
            emit(node.right)
            out.extend((_OPS[type(node.op)], 0))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS
              and len(node.args) == 2 and not node.keywords):
            emit(node.args[0])
            emit(node.args[1])
            out.extend((_CALLS[node.func.id], 0))
        else:
            raise ValueError(f"{text!r}: not a sum, product, floor quotient, max or min of sizes and integers")

    emit(ast.parse(text, mode="eval").body)
    return (len(out) // 2, *out)


def contract(
    tensors: Sequence[tuple[str, object, Sequence[int | str], Sequence[int | str] | str | None]],
    sizes: Sequence[tuple[str, str, str, int, int]] = (),
    written: Sequence[str] = (),
    alignment: int = 16,
    device_type: int = p.KDL_CUDA,
    requires: Sequence[tuple[str, str]] = (),
) -> bytes | None:
    """The packed contract check() compares a launcher's tensors with; None where it cannot.

    tensors: (name, dtype, shape, strides) per tensor argument in prim_func order; dtype a spec
    name or a torch dtype; shape and strides entries are integers or expressions of sizes;
    strides may be ROW_MAJOR or None (not checked). sizes: (name, tensor, "shape" or "stride",
    dimension, limit) per runtime size, in the order check() returns them; limit is the bound of
    the kernel parameter (0: none). written: the tensors the kernel writes; check() declines when
    one's memory overlaps another tensor's. device_type: the DLPack device the tensors must be on
    (tests use 1, the CPU). requires: (lhs, rhs) expressions of the sizes that must be equal (the
    spec's ``requires``); ValueError for one that names no size. None for a dtype without a DLPack
    code (check() could never accept it).
    """
    names = tuple(s[0] for s in sizes)
    slots = [t[0] for t in tensors]
    mask = sum(1 << slots.index(name) for name in written)
    words = [p.CONTRACT_VERSION, len(tensors), len(sizes), alignment - 1, device_type, mask]
    for _, tensor, kind, dim, limit in sizes:
        words += [slots.index(tensor), 0 if kind == "shape" else 1, dim, limit]
    for _, dtype, shape, strides in tensors:
        code = p.DLPACK_DTYPES.get(dtype_name(dtype))
        if code is None:
            return None
        # per dimension, or a named layout: a KeyError for one this module does not know
        layout = _LAYOUTS[strides] if strides is None or isinstance(strides, str) else p.LAYOUT_STRIDES
        words += [code, len(shape), layout]
        for item in (*shape, *(strides if layout == p.LAYOUT_STRIDES else ())):  # type: ignore[misc]
            words += (1, p.OP_CONST, item) if isinstance(item, int) else expression(item, names)
    words.append(len(requires))
    for lhs, rhs in requires:
        words += (*expression(lhs, names), *expression(rhs, names))
    return array.array("q", words).tobytes()


def requirement(text: str) -> tuple[str, str]:
    """A spec's requirement ``"M % 64 == 0"`` as its two sides; ValueError for anything but one ``==``
    between expressions of sizes and integers (sums, products, floor quotients, remainders, max, min)."""
    node = ast.parse(text, mode="eval").body
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)):
        raise ValueError(f"{text!r}: not one comparison 'expression == expression'")
    lhs, rhs = ast.unparse(node.left), ast.unparse(node.comparators[0])
    names = tuple(sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - set(_CALLS)))
    expression(lhs, names), expression(rhs, names)  # the grammar, over whatever names it uses
    return lhs, rhs


def bind(requires: Sequence[tuple[str, str]], values: dict[str, object],
         sizes: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """A spec's requirements for one variant: names of grid keys that are no runtime size of the variant
    become its values (a grid key may be a compile-time value in some variants, ``hidden: [0, 2048]``, and a
    runtime size in others), and a requirement left over constants only is decided now: dropped when it
    holds, ValueError when it does not."""

    class Bind(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id not in values or node.id in sizes:
                return node
            if type(values[node.id]) is not int:
                raise ValueError(f"{lhs} == {rhs}: grid key {node.id} is {values[node.id]!r} here, not an integer")
            return ast.Constant(values[node.id])  # type: ignore[arg-type]  # grid values: str, int, float, bool

    out = []
    for lhs, rhs in requires:
        sides = [Bind().visit(ast.parse(text, mode="eval")).body for text in (lhs, rhs)]
        if any(isinstance(n, ast.Name) and n.id not in _CALLS for side in sides for n in ast.walk(side)):
            out.append((ast.unparse(sides[0]), ast.unparse(sides[1])))
        elif _constant(sides[0]) != _constant(sides[1]):
            raise ValueError(f"{lhs} == {rhs} does not hold for {', '.join(f'{k}={v}' for k, v in values.items())}")
    return tuple(out)


_FOLD = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.FloorDiv: int.__floordiv__,
         ast.Mod: int.__mod__}


def _constant(node: ast.AST) -> int:
    """The value of an expression of integers (the grammar of ``expression``, without sizes)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _FOLD:
        return _FOLD[type(node.op)](_constant(node.left), _constant(node.right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS:
        return (max if node.func.id == "max" else min)(*(_constant(arg) for arg in node.args))
    raise ValueError(f"{ast.unparse(node)}: not an expression of integers")


class Launchable(Protocol):
    """What plan() reads of a launch: its configuration as the loader's Function holds it."""

    @property
    def kinds(self) -> bytes: ...  # one struct letter per kernel argument (see _runtime.Function)
    @property
    def block(self) -> tuple[int, int, int]: ...
    @property
    def smem(self) -> int: ...
    @property
    def cooperative(self) -> bool: ...
    @property
    def cluster(self) -> tuple[int, int, int] | None: ...


def plan(function: Launchable, arguments: Sequence[str], tensors: Sequence[str], sizes: Sequence[str],
         grid: Sequence[str], values: Sequence[str]) -> bytes | None:
    """The launch after a passed check, packed for run() (``_launch.run``); None where run() cannot take it.

    The generated launcher's own fast path, as data: ``arguments`` its parameters, ``tensors``
    the contract's tensors and ``sizes`` its runtime sizes (both in the contract's order),
    ``grid`` three expressions of the sizes, ``values`` the kernel arguments in the cubin's
    order as the launcher spells them (``x_ptr``, a size, ``int(mode)``, ``float(eps)``). A
    cluster launch, a TMA descriptor or anything else these do not describe gets None, and the
    launcher's Python path launches it.
    """
    if function.cluster is not None or len(values) != len(function.kinds):
        return None
    words = [p.PLAN_VERSION, len(arguments), len(tensors), *(arguments.index(t) for t in tensors),
             int(function.cooperative), *function.block, function.smem]
    try:
        for text in grid:
            words += expression(text, tuple(sizes))
    except ValueError:
        return None
    words.append(len(values))
    for text, kind in zip(values, function.kinds.decode()):
        pointer, scalar = _POINTER.fullmatch(text), _SCALAR.fullmatch(text)
        if kind == "T":
            return None  # a tensor map is encoded in Python (tensor_map's cache)
        if pointer and pointer[1] in tensors:
            words += (p.FROM_POINTER, tensors.index(pointer[1]), ord(kind))
        elif text in sizes:
            words += (p.FROM_SIZE, sizes.index(text), ord(kind))
        elif scalar and scalar[1] in arguments and text.startswith("float") == (kind in "fd"):
            words += (p.FROM_ARGUMENT, arguments.index(scalar[1]), ord(kind))
        else:
            return None
    return array.array("q", words).tobytes()


def pack_table(entries: Sequence[bytes | None]) -> bytes:
    """The ``_kernels/<kernel>.bin`` of a kernel module: its variants' contracts and plans, in order (the
    format of ``_protocol.unpack_table``, which the loader reads it with)."""
    parts = [p.TABLE_MAGIC, struct.pack("<q", len(entries))]
    for entry in entries:
        parts.append(struct.pack("<q", -1 if entry is None else len(entry)))
        parts.append(entry or b"")
    return b"".join(parts)
