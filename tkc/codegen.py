"""Python source of the generated launchers, one module per variant.

The launch contract recorded by ``lower`` becomes straight-line Python: a
reader of a failing launch sees exactly which checks ran, how each runtime size
was read, the grid formula, and the argument order the cubin expects. Each
variant's launcher is a module of its own (``_kernels/<kernel>/<variant>.py``),
so that importing a kernel costs its index, not the code of every variant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tkc import pack
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
# scalar type -> the loader's argument kind (a struct letter, see _runtime.Function)
_KINDS = {"int32": "i", "int64": "q", "uint32": "I", "uint64": "Q", "float32": "f", "float64": "d"}
_INT_LIMITS = {"int32": 2**31, "uint32": 2**32}
Requires = tuple[tuple[str, str], ...]  # a spec's requirements on the sizes: (lhs, rhs) that must be equal


@dataclass(frozen=True, kw_only=True)
class LauncherSource:
    func: str
    signature: str
    doc: str
    body: tuple[str, ...]
    cubin: str
    key: str
    functions: tuple[tuple[str, str], ...]  # (variable, Function(...) expression) per launch, host order
    # (variable, packed words) of the compiled check's contract and run()'s plan: entries of the
    # kernel module's table (_kernels/<kernel>.bin), not Python source
    contract: tuple[tuple[str, bytes | None], ...] = ()
    # what dispatch() launches with for the ops: (contract, plan, handles) variables; "" without a plan
    planned: str = ""
    # (variable, index) of each contract entry in the kernel module's table (set by tkc.package)
    table: tuple[tuple[str, int], ...] = ()
    # the cubin's sha256, which the loader checks before loading it, and where it is in its pack (``cubin``, under
    # cubins/): cubin_size bytes at cubin_offset of the decompressed pack (set by tkc.package)
    cubin_sha256: str = ""
    cubin_offset: int = 0
    cubin_size: int = -1


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
    tensors = [p.name for p in params if isinstance(p, TensorParam)]
    if tensors:
        lines.append(_pointer_reads(tensors))
    return lines


def _pointer_reads(tensors: list[str]) -> str:
    """Each data pointer is read once: for the alignment test, TMA descriptors and the launch."""
    return f"{', '.join(f'{t}_ptr' for t in tensors)} = {', '.join(f'{t}.data_ptr()' for t in tensors)}"


def _factors(value: int | str) -> tuple[int, list[str]]:
    """A size or stride as (numeric factor, sorted symbolic factors): ``"N * M"`` -> (1, ["M", "N"])."""
    if isinstance(value, int):
        return value, []
    number, names = 1, list[str]()
    for part in value.split("*"):
        part = part.strip().strip("()")
        if part.isdigit():
            number *= int(part)
        else:
            names.append(part)
    return number, sorted(names)


def _contiguous(shape: tuple[int | str, ...], strides: tuple[int | str, ...]) -> bool:
    """Whether ``strides`` are the row-major strides of ``shape``, so ``is_contiguous()`` tests them.

    torch's is_contiguous() skips dimensions of size 1 and accepts any empty tensor, exactly as
    the detailed stride check does; it is one call instead of building and comparing a tuple.
    Symbolic strides are compared as products of names (``N * M`` is the stride after (M, N)).
    """
    number, names = 1, list[str]()  # the row-major stride of the current dimension
    for size, stride in zip(reversed(shape), reversed(strides)):
        if _factors(stride) != (number, sorted(names)):
            return False
        size_number, size_names = _factors(size)
        if any(c in name for name in size_names for c in "+-/%() "):
            return False  # not a plain product: leave it to the explicit comparison
        number *= size_number
        names += size_names
    return True


def _size_ctypes(contract: LaunchContract) -> dict[str, str]:
    """Runtime size -> the C type of the kernel parameter it is passed as (its range is checked)."""
    return {a.name: a.ctype for launch in contract.launches for a in launch.args if a.kind == "size"}


def _fast_checks(contract: LaunchContract, alignment: int, requires: Requires = ()) -> list[str]:
    """One boolean expression that accepts well-formed arguments in a few attribute reads per tensor.

    It is conservative: anything it does not accept (a wrong type, dtype, shape, stride or
    device, but also a legal size-1 dimension with an unusual stride) goes through the
    detailed checks, which accept or raise an error naming the argument. The reads are the
    cheapest torch offers: ``get_device()`` (an int) rather than ``device`` objects,
    ``is_contiguous()`` rather than stride tuples where the layout is row-major.
    """
    tensors = [p for p in contract.params if isinstance(p, TensorParam)]
    if not tensors:
        return ["fast = True"]
    # A tensor that runtime sizes are read from has its shape (or strides) read once into a
    # local: each torch.Size or stride tuple torch builds costs about as much as a check.
    shape_of = {s.tensor: f"{s.tensor}_shape" for s in contract.sizes if s.kind == "shape"}
    strides_of = {s.tensor: f"{s.tensor}_strides" for s in contract.sizes if s.kind == "stride"}
    reads = [f"    {local} = {tensor}.shape" for tensor, local in shape_of.items()]
    reads += [f"    {local} = {tensor}.stride()" for tensor, local in strides_of.items()]
    for size in contract.sizes:
        local = (shape_of if size.kind == "shape" else strides_of)[size.tensor]
        reads.append(f"    {size.name} = {local}[{size.dim}]")
    first = tensors[0].name
    terms = [f"{p.name}.dtype is {torch_dtype(p.dtype)}" for p in tensors]
    terms += [f"{p.name}.is_cuda" for p in tensors]
    # a lazily negated view (torch._neg_view, x.conj().imag) holds un-negated memory
    terms += [f"not {p.name}.is_neg()" for p in tensors if not p.dtype.startswith(("int", "uint", "bool"))]
    terms += [f"{p.name}.get_device() == device" for p in tensors[1:]]
    terms += [f"{shape_of.get(p.name, p.name + '.shape')} == "
              f"{_shape_tuple([str(d) if isinstance(d, int) else d for d in p.shape])}" for p in tensors]
    for p in tensors:
        if p.strides and _contiguous(p.shape, p.strides):
            terms.append(f"{p.name}.is_contiguous()")
        elif p.strides:
            terms.append(f"{strides_of.get(p.name, p.name + '.stride()')} == "
                         f"{_shape_tuple([str(d) for d in p.strides])}")
    terms.append(f"not ({' | '.join(f'{p.name}_ptr' for p in tensors)}) & {alignment - 1}")
    ctypes_of = _size_ctypes(contract)
    terms += [f"{s.name} < {_INT_LIMITS[ctypes_of[s.name]]}" for s in contract.sizes
              if ctypes_of.get(s.name) in _INT_LIMITS]
    terms += [f"({lhs}) == ({rhs})" for lhs, rhs in requires]
    return [
        "try:",
        *reads,
        f"    device = {first}.get_device()",
        f"    {_pointer_reads([p.name for p in tensors])}",
        "    fast = (",
        *(f"        {'and ' if i else ''}{t}" for i, t in enumerate(terms)),
        "    )",
        "except (AttributeError, IndexError, TypeError, RuntimeError):",
        "    fast = False",
    ]


def _contract_words(contract: LaunchContract, alignment: int, requires: Requires = ()) -> bytes | None:
    """The variant's tensor checks packed for ``_launch.check`` (tkc/pack.py).

    The same facts as the fast Python check, as data: per tensor its dtype, shape and strides
    (integers or expressions of the sizes, or row-major where ``is_contiguous()`` tests them),
    and per runtime size where it is read and the range of its kernel parameter.
    """
    ctypes_of = _size_ctypes(contract)
    tensors = []
    for p in contract.params:
        if isinstance(p, TensorParam):
            strides = None if not p.strides else pack.ROW_MAJOR if _contiguous(p.shape, p.strides) else p.strides
            tensors.append((p.name, p.dtype, p.shape, strides))
    sizes = [(s.name, s.tensor, s.kind, s.dim, _INT_LIMITS.get(ctypes_of.get(s.name, ""), 0)) for s in contract.sizes]
    written = [p.name for p in contract.params if isinstance(p, TensorParam) and p.written]
    try:
        return pack.contract(tensors, sizes=sizes, written=written, alignment=alignment, requires=requires)
    except ValueError as exc:
        names = ", ".join(s.name for s in contract.sizes) or "none"
        raise LowerError(f"requires: {exc}; a requirement may name the kernel's runtime sizes ({names})") from None


def _checked_lines(contract: LaunchContract, contract_var: str, fast: list[str]) -> list[str]:
    """The compiled check first; the Python checks where it declines (see ``_compiled.check``)."""
    tensors = [p.name for p in contract.params if isinstance(p, TensorParam)]
    if not tensors:
        return fast
    names = ["device", *(f"{t}_ptr" for t in tensors), *(s.name for s in contract.sizes)]
    return [
        f"checked = check({contract_var}, {', '.join(tensors)})",
        "if checked is not None:  # the compiled check accepted every tensor",
        f"    {', '.join(names)}{',' if len(names) == 1 else ''} = checked",
        "else:  # a pure wheel, or arguments it does not accept: the Python checks decide",
        *(f"    {line}" for line in [*fast, *_disjoint_lines(contract)]),
    ]


def _disjoint_lines(contract: LaunchContract) -> list[str]:
    """The overlap check of the tensors the kernel writes against every other tensor argument."""
    tensors = [p for p in contract.params if isinstance(p, TensorParam)]
    written = [f'("{p.name}", {p.name})' for p in tensors if p.written]
    read = [f'("{p.name}", {p.name})' for p in tensors if not p.written]
    if not written or len(tensors) < 2:
        return []
    return [f"check_disjoint({_shape_tuple(written)}, {_shape_tuple(read) if read else '()'})"]


def _requirement_checks(contract: LaunchContract, requires: Requires) -> list[str]:
    """The spec's requirements on the sizes, each raising an error that names the tensor its first size is read
    from (the kernel trusts them: tile multiples its grid and indexing assume)."""
    source = {s.name: s.tensor for s in contract.sizes}
    lines = []
    for lhs, rhs in requires:
        named = [n for n in re.findall(r"[A-Za-z_]\w*", f"{lhs} {rhs}") if n in source]
        values = ", ".join(f"{n} = {{{n}}}" for n in dict.fromkeys(named))
        tensor = source[named[0]] if named else "arguments"
        lines += [f"if ({lhs}) != ({rhs}):",
                  f'    raise KernelArgumentError(f"{tensor}: the kernel requires {lhs} == {rhs}, got {values}; '
                  f'pad {tensor} to the multiple it needs")']
    return lines


def _size_limits(contract: LaunchContract) -> list[str]:
    """Sizes passed as 32-bit kernel arguments must fit, or the kernel would index wrongly."""
    ctypes_of = _size_ctypes(contract)
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
        f'    "{desc.tensor}", {desc.dtype_code}, {desc.tensor}_ptr, {dims}, {strides},',
        f"    {_shape_tuple([str(b) for b in desc.box_dims])}, "
        f"{_shape_tuple([str(e) for e in desc.element_strides])},",
        f"    interleave={desc.interleave}, swizzle={desc.swizzle}, l2_promotion={desc.l2_promotion}, "
        f"oob_fill={desc.oob_fill},",
        ")",
    ]


def _launch_values(launch: Launch) -> list[str]:
    values = []
    for a in launch.args:
        if a.kind == "tensor":
            values.append(f"{a.expr}_ptr")
        elif a.kind == "tma":
            values.append(a.expr)
        elif a.ctype not in _KINDS:
            raise LowerError(f"kernel {launch.symbol} takes argument {a.name or a.expr} of type {a.ctype}, "
                             "which the loader cannot pass")
        elif a.kind == "scalar":
            values.append(f"{'float' if a.ctype.startswith('float') else 'int'}({a.expr})")
        else:
            values.append(a.expr)
    return values


def _kinds(launch: Launch) -> str:
    """One struct letter per kernel argument, in the cubin's order (see _runtime.Function)."""
    return "".join("Q" if a.kind == "tensor" else "T" if a.kind == "tma" else _KINDS.get(a.ctype, "?")
                   for a in launch.args)


def _function(launch: Launch, cubin_var: str) -> str:
    """The ``Function(...)`` of one launch: symbol, block, shared memory and argument kinds."""
    kinds = _kinds(launch)
    extra = ""
    if launch.cooperative:
        extra += ", cooperative=True"  # a grid-wide barrier: all blocks must be resident at once
    if launch.cluster is not None:
        extra += f", cluster={launch.cluster}"
    return f'Function({cubin_var}, "{launch.symbol}", {launch.block}, {launch.dynamic_smem}, "{kinds}"{extra})'


def _launch_lines(launch: Launch, function_var: str) -> list[str]:
    lines = []
    if launch.cluster is not None:
        # The driver refuses a grid that is not a whole number of clusters with a bare error.
        lines += [
            f"if any(g % c for g, c in zip(grid, {launch.cluster})):",
            f'    raise KernelArgumentError(f"{launch.symbol}: the grid {{grid}} (from the tensors\' sizes) must be '
            f'a multiple of the thread-block cluster {launch.cluster}")',
        ]
    values = ", ".join(_launch_values(launch))
    if launch.cluster is not None:  # cuLaunchKernelEx with a cluster attribute: the ctypes path
        return [*lines, f"{function_var}.launch(device, grid, {values})"]
    # The launch call is spelled out (what the driver gets, in the cubin's order) rather than
    # hidden in Function.launch: that saves a Python call per launch. Anything but a kernel
    # ready on this device and a successful launch (first call, another device's context,
    # an error) goes to launch_slow, which loads, retries or raises.
    kinds = _kinds(launch)
    call = "launch_cooperative" if launch.cooperative else "launch"  # a grid-wide barrier: all blocks resident
    return [
        *lines,
        f"values = ({values}{',' if len(launch.args) == 1 else ''})",
        f"kernel = {function_var}.handles.get(device)",
        f"if kernel is None or {call}(kernel, device, grid, {launch.block}, {launch.dynamic_smem}, "
        f'current_stream(device), b"{kinds}", *values):',
        f"    {function_var}.launch_slow(device, grid, values)",
    ]


@dataclass(frozen=True, kw_only=True)
class _Configuration:
    """A launch's configuration as the loader's Function holds it (what pack.plan reads)."""

    kinds: bytes
    block: tuple[int, int, int]
    smem: int
    cooperative: bool
    cluster: tuple[int, int, int] | None


def _plan_words(contract: LaunchContract) -> bytes | None:
    """The launch packed for ``_launch.run`` (tkc/pack.py); None where the launcher has no single plain
    launch (several kernels, clusters and TMA descriptors take the Python path)."""
    tensors = [p.name for p in contract.params if isinstance(p, TensorParam)]
    if len(contract.launches) != 1 or contract.tma or not tensors or contract.launches[0].cluster is not None:
        return None
    launch = contract.launches[0]
    configuration = _Configuration(kinds=_kinds(launch).encode(), block=launch.block, smem=launch.dynamic_smem,
                                   cooperative=launch.cooperative, cluster=launch.cluster)
    return pack.plan(configuration, arguments=tuple(p.name for p in contract.params), tensors=tuple(tensors),
                     sizes=tuple(s.name for s in contract.sizes), grid=tuple(launch.grid),
                     values=tuple(_launch_values(launch)))


def launcher_source(func: str, doc: str, cubin: str, key: str, contract: LaunchContract,
                    alignment: int = 16, requires: Requires = ()) -> LauncherSource:
    """The launcher function of one variant; ``requires``: the spec's conditions on the runtime sizes."""
    # Module-level names of the variant's own module (one launcher per module: no prefixes needed).
    cubin_var = "_CUBIN"
    function_vars = [f"_{launch.symbol.upper()}" for launch in contract.launches]
    if len(contract.launches) == 1:
        function_vars = ["_KERNEL"]
    elif len(set(function_vars)) != len(function_vars) or {"_CUBIN", "_CONTRACT", "_PLAN"} & set(function_vars):
        function_vars = [f"_LAUNCH{i}" for i in range(len(contract.launches))]  # one kernel launched twice
    has_tensors = any(isinstance(p, TensorParam) for p in contract.params)
    slow = _tensor_checks(contract.params, contract) + _size_limits(contract) + _requirement_checks(contract, requires)
    python_checks = [*_fast_checks(contract, alignment, requires), "if not fast:", *(f"    {line}" for line in slow)]
    contract_var = "_CONTRACT"
    body = _checked_lines(contract, contract_var, python_checks)
    module_vars = [(contract_var, _contract_words(contract, alignment, requires))] if has_tensors else []
    plan = _plan_words(contract)
    planned = ""
    if plan is not None:
        plan_var = "_PLAN"
        module_vars.append((plan_var, plan))
        planned = f"({contract_var}, {plan_var}, {function_vars[0]}.handles)"
        tensors = ", ".join(p.name for p in contract.params)
        body = [
            f"if run({contract_var}, {plan_var}, {function_vars[0]}.handles, {tensors}):",
            "    return  # checked and launched by the compiled module in one call",
            *body,
        ]
    for i, launch in enumerate(contract.launches):
        grid = ", ".join(launch.grid)
        body.append(f"grid = ({grid})")
        if i == 0:
            body.append("if 0 in grid:")
            body.append("    return  # empty input: nothing to launch")
            for desc in contract.tma:
                body.extend(_tma_lines(desc))
        body.extend(_launch_lines(launch, function_vars[i]))
    return LauncherSource(
        func=func,
        signature=", ".join(p.name for p in contract.params),
        doc=doc,
        body=tuple(body),
        cubin=cubin,
        key=key,
        functions=tuple((var, _function(launch, cubin_var)) for var, launch in zip(function_vars, contract.launches)),
        contract=tuple(module_vars),
        planned=planned,
    )
