"""Python source of the generated launchers, one function per variant.

The launch contract recorded by ``lower`` becomes straight-line Python: a
reader of a failing launch sees exactly which checks ran, how each runtime size
was read, the grid formula, and the argument order the cubin expects.
"""

from __future__ import annotations

from dataclasses import dataclass

from tkc.errors import LowerError
from tkc.lower import Launch, LaunchContract, ScalarParam, TensorParam, TmaDescriptor

_TORCH_DTYPES = {
    "bfloat16": "torch.bfloat16",
    "float16": "torch.float16",
    "float32": "torch.float32",
    "float64": "torch.float64",
    "float8_e4m3fn": "torch.float8_e4m3fn",
    "float8_e4m3": "torch.float8_e4m3fn",
    "float8_e5m2": "torch.float8_e5m2",
    "int8": "torch.int8",
    "uint8": "torch.uint8",
    "int16": "torch.int16",
    "int32": "torch.int32",
    "int64": "torch.int64",
    "bool": "torch.bool",
}
_CTYPES = ("int32", "int64", "uint32", "uint64", "float32", "float64")  # scalar types the loader passes
_INT_LIMITS = {"int32": 2**31, "uint32": 2**32}


@dataclass(frozen=True, kw_only=True)
class LauncherSource:
    func: str
    signature: str
    doc: str
    body: tuple[str, ...]
    cubin: str
    smem: dict[str, int]
    key: str
    arg_slots: tuple[tuple[str, tuple[str, ...]], ...]  # (LaunchArgs variable, slot kinds) per launch


def torch_dtype(name: str) -> str:
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise LowerError(f"tensor dtype {name} has no torch equivalent the loader can check") from None


def _shape_tuple(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _tensor_checks(params: tuple[TensorParam | ScalarParam, ...], contract: LaunchContract) -> list[str]:
    """Checks in parameter order; a size is bound right after the tensor it is read from passed its check."""
    lines: list[str] = []
    bound: set[str] = set()
    device = "None"
    for p in params:
        if isinstance(p, ScalarParam):
            continue
        shape = [str(d) if isinstance(d, int) or d in bound else ("None" if d in {s.name for s in contract.sizes}
                 else f"({d})") for d in p.shape]
        call = f'check_tensor("{p.name}", {p.name}, {torch_dtype(p.dtype)}, {_shape_tuple(shape)}, {device})'
        lines.append(f"device = {call}" if device == "None" else call)
        device = "device"
        for size in contract.sizes:
            if size.tensor == p.name and size.name not in bound:
                read = f"{p.name}.shape[{size.dim}]" if size.kind == "shape" else f"{p.name}.stride({size.dim})"
                lines.append(f"{size.name} = {read}")
                bound.add(size.name)
    for p in params:
        if isinstance(p, TensorParam) and p.strides:
            lines.append(f'check_strides("{p.name}", {p.name}, {_shape_tuple([str(s) for s in p.strides])})')
    return lines


def _fast_checks(contract: LaunchContract, alignment: int) -> list[str]:
    """One boolean expression that accepts well-formed arguments in about a microsecond.

    It is conservative: anything it does not accept (a wrong type, dtype, shape, stride or
    device, but also a legal size-1 dimension with an unusual stride) goes through the
    detailed checks, which accept or raise an error naming the argument.
    """
    tensors = [p for p in contract.params if isinstance(p, TensorParam)]
    if not tensors:
        return ["fast = True"]
    reads = []
    for size in contract.sizes:
        read = f"{size.tensor}.shape[{size.dim}]" if size.kind == "shape" else f"{size.tensor}.stride({size.dim})"
        reads.append(f"    {size.name} = {read}")
    first = tensors[0].name
    terms = [f"{p.name}.dtype is {torch_dtype(p.dtype)}" for p in tensors]
    terms.append(f"{first}.is_cuda")
    terms += [f"{p.name}.shape == {_shape_tuple([str(d) if isinstance(d, int) else d for d in p.shape])}"
              for p in tensors]
    terms += [f"{p.name}.stride() == {_shape_tuple([str(d) for d in p.strides])}" for p in tensors if p.strides]
    terms += [f"{p.name}.device == device" for p in tensors[1:]]
    terms.append(f"not ({' | '.join(f'{p.name}.data_ptr()' for p in tensors)}) & {alignment - 1}")
    ctypes_of = {a.name: a.ctype for launch in contract.launches for a in launch.args if a.kind == "size"}
    terms += [f"{s.name} < {_INT_LIMITS[ctypes_of[s.name]]}" for s in contract.sizes
              if ctypes_of.get(s.name) in _INT_LIMITS]
    return [
        "try:",
        *reads,
        f"    device = {first}.device",
        "    fast = (",
        *(f"        {'and ' if i else ''}{t}" for i, t in enumerate(terms)),
        "    )",
        "except (AttributeError, IndexError, TypeError):",
        "    fast = False",
    ]


def _size_limits(contract: LaunchContract) -> list[str]:
    """Sizes passed as 32-bit kernel arguments must fit, or the kernel would index wrongly."""
    ctypes_of = {a.name: a.ctype for launch in contract.launches for a in launch.args if a.kind == "size"}
    lines = []
    for size in contract.sizes:
        limit = _INT_LIMITS.get(ctypes_of.get(size.name, ""))
        if limit:
            lines.append(f"if {size.name} >= {limit}:")
            lines.append(f'    raise ValueError(f"{size.name} = {{{size.name}}} does not fit the kernel\'s '
                         f'{ctypes_of[size.name]} argument")')
    return lines


def _tma_lines(desc: TmaDescriptor) -> list[str]:
    dims = _shape_tuple(list(desc.global_dims))
    strides = _shape_tuple(list(desc.global_strides[1:])) if desc.rank > 1 else "()"
    return [
        f"_{desc.name}_buffer, {desc.name} = tensor_map(",
        f'    "{desc.tensor}", {desc.dtype_code}, {desc.tensor}.data_ptr(), {dims}, {strides},',
        f"    {_shape_tuple([str(b) for b in desc.box_dims])}, "
        f"{_shape_tuple([str(e) for e in desc.element_strides])},",
        f"    interleave={desc.interleave}, swizzle={desc.swizzle}, l2_promotion={desc.l2_promotion}, "
        f"oob_fill={desc.oob_fill},",
        ")",
    ]


def _launch_lines(launch: Launch, cubin_var: str, args_var: str) -> list[str]:
    values = []
    for a in launch.args:
        if a.kind == "tensor":
            values.append(f"{a.expr}.data_ptr()")
        elif a.kind == "tma":
            values.append(a.expr)
        elif a.ctype not in _CTYPES:
            raise LowerError(f"kernel {launch.symbol} takes argument {a.name or a.expr} of type {a.ctype}, "
                             "which the loader cannot pass")
        elif a.kind == "scalar":
            values.append(f"{'float' if a.ctype.startswith('float') else 'int'}({a.expr})")
        else:
            values.append(a.expr)
    kind = []
    if launch.cooperative:
        kind.append("cooperative=True")  # a grid-wide barrier: all blocks must be resident at once
    if launch.cluster is not None:
        kind.append(f"cluster={launch.cluster}")
    lines = []
    if launch.cluster is not None:
        # The driver refuses a grid that is not a whole number of clusters with a bare error.
        lines += [
            f"if any(g % c for g, c in zip(grid, {launch.cluster})):",
            f'    raise KernelArgumentError(f"{launch.symbol}: the grid {{grid}} (from the tensors\' sizes) must be '
            f'a multiple of the thread-block cluster {launch.cluster}")',
        ]
    return [
        *lines,
        f"{cubin_var}.launch(",
        f'    "{launch.symbol}", device, grid, {launch.block}, {launch.dynamic_smem},',
        f"    {args_var}.pack({', '.join(values)}),",
        *([f"    {', '.join(kind)},"] if kind else []),
        ")",
    ]


def _slot_kinds(launch: Launch) -> tuple[str, ...]:
    return tuple("pointer" if a.kind == "tensor" else "tensormap" if a.kind == "tma" else a.ctype
                 for a in launch.args)


def launcher_source(func: str, doc: str, cubin: str, key: str, contract: LaunchContract,
                    alignment: int = 16) -> LauncherSource:
    """The launcher function of one variant."""
    cubin_var = f"_{func.upper()}"
    args_vars = [f"{cubin_var}_ARGS{i if i else ''}" for i in range(len(contract.launches))]
    slow = _tensor_checks(contract.params, contract) + _size_limits(contract)
    body = [*_fast_checks(contract, alignment), "if not fast:", *(f"    {line}" for line in slow)]
    for i, launch in enumerate(contract.launches):
        grid = ", ".join(launch.grid)
        body.append(f"grid = ({grid})")
        if i == 0:
            body.append("if 0 in grid:")
            body.append("    return  # empty input: nothing to launch")
            for desc in contract.tma:
                body.extend(_tma_lines(desc))
        body.extend(_launch_lines(launch, cubin_var, args_vars[i]))
    return LauncherSource(
        func=func,
        signature=", ".join(p.name for p in contract.params),
        doc=doc,
        body=tuple(body),
        cubin=cubin,
        smem={launch.symbol: launch.dynamic_smem for launch in contract.launches},
        key=key,
        arg_slots=tuple((var, _slot_kinds(launch)) for var, launch in zip(args_vars, contract.launches)),
    )
