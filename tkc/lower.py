"""Stage 3: a rendered TileLang module -> CUDA source + the launch contract.

TileLang lowers for an explicit target object (``sm_90a`` / ``sm_100a``) inside
that target's context, so nothing depends on the build machine's GPU. The
launch contract is read back from the lowered IR instead of being re-derived:

- the device functions' ``thread_extent`` attributes give grid and block as
  expressions of runtime sizes, ``dyn_shared_memory_buf`` the dynamic shared
  memory, ``use_cooperative_groups`` / ``cluster_dims`` the launch kind;
- the host function's ``call_packed`` of each kernel gives the argument order
  the kernel really takes (it differs from the prim_func signature: buffers
  are reordered, TMA descriptors replace tensors, sizes are appended);
- the host function's ``tma_descriptor_args`` give every ``cuTensorMapEncodeTiled``
  argument as expressions;
- the device functions' stores (buffer stores, store / atomic intrinsics on a
  tensor's address, TMA stores through its descriptor) name the tensors a kernel
  writes: the loader refuses a written tensor whose memory overlaps another one.

Expressions are printed as Python over the runtime-size names, so the generated
loader evaluates them directly.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.machinery
import importlib.util
import re
import sys
from dataclasses import dataclass
from typing import Any

from tkc.arch import Arch
from tkc.errors import LowerError
from tkc.render import HELPER_PACKAGE, RenderedKernel

# What this module writes into a cache entry (the CUDA source, the launch contract): bump when that changes
# for the same rendered source, pass configs and TileLang version (those are keyed already), so that older
# entries are rebuilt.
FORMAT = 1


@dataclass(frozen=True, kw_only=True)
class TensorParam:
    """A tensor parameter of the prim_func, as the op passes it."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]  # ints are compile-time, strings name runtime sizes
    strides: tuple[int | str, ...]  # element strides; ints fixed, strings runtime sizes
    written: bool = False  # a device function stores to it (outputs, in-place tensors)


@dataclass(frozen=True, kw_only=True)
class ScalarParam:
    name: str
    dtype: str


@dataclass(frozen=True, kw_only=True)
class SizeSource:
    """Where the loader reads a runtime size: ``tensor.shape[dim]`` or ``tensor.stride(dim)``."""

    name: str
    tensor: str
    dim: int
    kind: str  # "shape" | "stride"


@dataclass(frozen=True, kw_only=True)
class TmaDescriptor:
    """Arguments of one ``cuTensorMapEncodeTiled`` call, as Python expressions."""

    name: str
    tensor: str  # the tensor parameter whose data pointer is the global address
    dtype_code: int  # CUtensorMapDataType
    rank: int
    global_dims: tuple[str, ...]  # innermost first
    global_strides: tuple[str, ...]  # bytes, rank entries; entry 0 (element size) is not passed
    box_dims: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int


@dataclass(frozen=True, kw_only=True)
class KernelArg:
    """One argument of the ``__global__`` function, in the order it takes them."""

    name: str
    kind: str  # "tensor" (data pointer) | "tma" (CUtensorMap by value) | "scalar" | "size" | "expr"
    ctype: str  # "pointer" | "tensormap" | "int32" | "int64" | "uint32" | "float32" | "float64"
    expr: str  # Python expression: a parameter or size name, or a formula


@dataclass(frozen=True, kw_only=True)
class Launch:
    symbol: str
    args: tuple[KernelArg, ...]
    grid: tuple[str, str, str]  # Python expressions of runtime sizes
    block: tuple[int, int, int]
    dynamic_smem: int
    cooperative: bool
    cluster: tuple[int, int, int] | None


@dataclass(frozen=True, kw_only=True)
class LaunchContract:
    params: tuple[TensorParam | ScalarParam, ...]  # prim_func order
    sizes: tuple[SizeSource, ...]
    tma: tuple[TmaDescriptor, ...]
    launches: tuple[Launch, ...]  # host order


@dataclass(frozen=True, kw_only=True)
class LoweredKernel:
    contract: LaunchContract
    cuda_source: str


def _tvm() -> Any:
    from tilelang import tvm

    return tvm


def py_expr(expr: Any) -> str:
    """A TIR integer expression as Python source over variable names.

    Integer division in lowered TIR is floor division on non-negative sizes, so
    ``//`` and ``%`` are exact here. Casts between integer widths are dropped
    (Python ints do not overflow; the loader packs the result into the C type).
    """
    tirx = _tvm().tirx
    if isinstance(expr, int | float):
        return repr(expr)
    if isinstance(expr, tirx.IntImm):
        return str(int(expr.value))
    if isinstance(expr, tirx.FloatImm):
        return repr(float(expr.value))
    if isinstance(expr, tirx.Var):
        return str(expr.name)
    if isinstance(expr, tirx.Cast):
        return py_expr(expr.value)
    binary = {
        tirx.Add: "+", tirx.Sub: "-", tirx.Mul: "*", tirx.FloorDiv: "//", tirx.FloorMod: "%",
        tirx.Div: "//", tirx.Mod: "%", tirx.EQ: "==", tirx.NE: "!=", tirx.LT: "<", tirx.LE: "<=",
        tirx.GT: ">", tirx.GE: ">=", tirx.And: "and", tirx.Or: "or",
    }  # fmt: skip
    for node_type, op in binary.items():
        if isinstance(expr, node_type):
            return f"({py_expr(expr.a)} {op} {py_expr(expr.b)})"
    if isinstance(expr, tirx.Min | tirx.Max):
        fn = "min" if isinstance(expr, tirx.Min) else "max"
        return f"{fn}({py_expr(expr.a)}, {py_expr(expr.b)})"
    if isinstance(expr, tirx.Select):
        return f"({py_expr(expr.true_value)} if {py_expr(expr.condition)} else {py_expr(expr.false_value)})"
    if isinstance(expr, tirx.Not):
        return f"(not {py_expr(expr.a)})"
    raise LowerError(f"cannot express {type(expr).__name__} {expr} as a Python formula for the loader")


def _strip_parens(text: str) -> str:
    """Drop one pair of redundant outer parentheses for readability."""
    if text.startswith("(") and text.endswith(")"):
        depth = 0
        for i, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(text) - 1:
                return text
        return text[1:-1]
    return text


def _int(expr: Any, what: str) -> int:
    try:
        return int(_strip_parens(py_expr(expr)))
    except ValueError as exc:
        raise LowerError(f"{what} must be a compile-time integer, got {expr}") from exc


_loaded_helpers: dict[str, str] = {}  # helper module -> the source it was imported from, in this process


def _map_helper_package(rendered: RenderedKernel) -> None:
    """Make ``tkc_templates`` name ``rendered.templates``, with each helper imported from the source the cache key
    was computed from: a package mapped onto another folder, or a helper whose file changed since this process
    imported it, is dropped and imported again."""
    package = sys.modules.get(HELPER_PACKAGE)
    stale = package is None or list(getattr(package, "__path__", [])) != [str(rendered.templates)] or any(
        _loaded_helpers.get(h.module, h.source) != h.source for h in rendered.helpers)
    if stale:
        for name in [n for n in sys.modules if n == HELPER_PACKAGE or n.startswith(HELPER_PACKAGE + ".")]:
            del sys.modules[name]
        _loaded_helpers.clear()
        spec = importlib.machinery.ModuleSpec(HELPER_PACKAGE, None, is_package=True)
        spec.submodule_search_locations = [str(rendered.templates)]
        sys.modules[HELPER_PACKAGE] = importlib.util.module_from_spec(spec)
    for helper in rendered.helpers:
        _loaded_helpers.setdefault(helper.module, helper.source)


def import_rendered(rendered: RenderedKernel) -> Any:
    """Import the rendered module from its file (TileLang needs the source on disk)."""
    _map_helper_package(rendered)
    name = f"tkc_rendered_{rendered.arch.name}_{rendered.variant.id}"
    spec = importlib.util.spec_from_file_location(name, rendered.path)
    if spec is None or spec.loader is None:
        raise LowerError(f"{rendered.path}: cannot import the rendered module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise LowerError(f"{rendered.path}: the rendered TileLang module fails to build its prim_func "
                         f"({type(exc).__name__}: {exc}); fix {rendered.variant.kernel.template}") from exc
    finally:
        sys.modules.pop(name, None)
    if not hasattr(module, "prim_func"):
        raise LowerError(f"{rendered.path}: no module-level 'prim_func'; end the template with "
                         "`prim_func = <factory>(...)`")
    return module.prim_func


def _signature(func: Any) -> tuple[tuple[TensorParam | ScalarParam, ...], tuple[SizeSource, ...], dict[str, str]]:
    """Parameters in prim_func order, where each runtime size is read, and data-var -> tensor name."""
    tirx = _tvm().tirx
    params: list[TensorParam | ScalarParam] = []
    sizes: dict[str, SizeSource] = {}
    data_names: dict[str, str] = {}
    for var in func.params:
        if var not in func.buffer_map:
            params.append(ScalarParam(name=str(var.name), dtype=str(var.dtype)))
            continue
        buf = func.buffer_map[var]
        name = str(buf.name)
        data_names[str(buf.data.name)] = name
        dims: list[int | str] = []
        for kind, exprs in (("shape", buf.shape), ("stride", buf.strides)):
            out: list[int | str] = []
            for dim, e in enumerate(exprs):
                if isinstance(e, tirx.IntImm):
                    out.append(int(e.value))
                elif isinstance(e, tirx.Var):
                    out.append(str(e.name))
                    sizes.setdefault(str(e.name), SizeSource(name=str(e.name), tensor=name, dim=dim, kind=kind))
                else:
                    out.append(_strip_parens(py_expr(e)))
            if kind == "shape":
                dims = out
            else:
                strides = out
        params.append(TensorParam(name=name, dtype=str(buf.dtype), shape=tuple(dims), strides=tuple(strides)))
    return tuple(params), tuple(sizes.values()), data_names


def _call_args(host_func: Any, symbol: str, count: int) -> list[Any]:
    """The expressions the host function passes to kernel ``symbol`` (its ``call_packed``)."""
    tvm = _tvm()
    found: list[Any] = []
    call_packed = tvm.ir.Op.get("tirx.tvm_call_packed")

    def visit(node: Any) -> None:
        if isinstance(node, tvm.tirx.Call) and node.op == call_packed and node.args:
            head = node.args[0]
            if isinstance(head, tvm.tirx.StringImm) and head.value == symbol:
                found.append(list(node.args[1 : 1 + count]))

    tvm.tirx.stmt_functor.post_order_visit(host_func.body, visit)
    if len(found) != 1:
        raise LowerError(f"expected one host call of kernel {symbol}, found {len(found)}")
    return found[0]


def _tma(host_func: Any, data_names: dict[str, str]) -> dict[str, TmaDescriptor]:
    attrs = host_func.attrs
    if "tma_descriptor_args" not in attrs:
        return {}
    out = {}
    for var, args in attrs["tma_descriptor_args"].items():
        kind = str(args[0].value)
        if kind != "__tvm_tensormap_create_tiled":
            raise LowerError(f"TMA descriptor {var.name} uses {kind}; only tiled descriptors are supported")
        rank = _int(args[3], "TMA rank")
        address = str(args[4].name)
        rest = list(args[5:])
        out[str(var.name)] = TmaDescriptor(
            name=str(var.name),
            tensor=data_names.get(address, address),
            dtype_code=_int(args[2], "TMA dtype"),
            rank=rank,
            global_dims=tuple(_strip_parens(py_expr(e)) for e in rest[:rank]),
            global_strides=tuple(_strip_parens(py_expr(e)) for e in rest[rank : 2 * rank]),
            box_dims=tuple(_int(e, "TMA box") for e in rest[2 * rank : 3 * rank]),
            element_strides=tuple(_int(e, "TMA element stride") for e in rest[3 * rank : 4 * rank]),
            interleave=_int(rest[4 * rank], "TMA interleave"),
            swizzle=_int(rest[4 * rank + 1], "TMA swizzle"),
            l2_promotion=_int(rest[4 * rank + 2], "TMA L2 promotion"),
            oob_fill=_int(rest[4 * rank + 3], "TMA OOB fill"),
        )
    return out


def _kernel_arg(expr: Any, data_names: dict[str, str], tma: dict[str, TmaDescriptor],
                scalars: dict[str, str], sizes: set[str]) -> KernelArg:
    tirx = _tvm().tirx
    if isinstance(expr, tirx.Var):
        name = str(expr.name)
        if name in tma:
            return KernelArg(name=name, kind="tma", ctype="tensormap", expr=name)
        if name in data_names:
            return KernelArg(name=data_names[name], kind="tensor", ctype="pointer", expr=data_names[name])
        if name in scalars:
            return KernelArg(name=name, kind="scalar", ctype=scalars[name], expr=name)
        if name in sizes:
            return KernelArg(name=name, kind="size", ctype=str(expr.dtype), expr=name)
        raise LowerError(f"kernel argument {name} is neither a tensor, a TMA descriptor, a scalar nor a size")
    return KernelArg(name="", kind="expr", ctype=str(expr.dtype), expr=_strip_parens(py_expr(expr)))


# Intrinsics and extern functions that write through an address argument: TileLang's vector
# stores (tl::store_global_*), atomics and reductions. A name that matches but only reads
# makes the overlap check stricter, never wrong; loads (__ldg, __ldcg, cp.async) do not match.
_WRITING_CALL = re.compile(r"store|atomic|\bred\b|red_", re.IGNORECASE)


def written_tensors(device_mod: Any, data_names: dict[str, str], tma: dict[str, TmaDescriptor]) -> frozenset[str]:
    """The tensor parameters the device functions write.

    A buffer store to a parameter's buffer (what ``T.copy`` and element assignments lower
    to), a store or atomic call that takes an address inside it (``address_of`` or
    ``tvm_access_ptr``, the latter only with its write bit), or a TMA store through a
    descriptor of it.
    """
    tvm = _tvm()
    tirx = tvm.tirx
    written: set[str] = set()

    def tensors_in(node: Any) -> set[str]:
        found: set[str] = set()

        def visit(sub: Any) -> None:
            if isinstance(sub, tirx.BufferLoad | tirx.BufferStore) and str(sub.buffer.data.name) in data_names:
                found.add(data_names[str(sub.buffer.data.name)])
            elif isinstance(sub, tirx.Var) and str(sub.name) in data_names:
                found.add(data_names[str(sub.name)])

        tirx.stmt_functor.post_order_visit(node, visit)
        return found

    def visit(node: Any) -> None:
        if isinstance(node, tirx.BufferStore):
            name = data_names.get(str(node.buffer.data.name))
            if name is not None:
                written.add(name)
        elif isinstance(node, tirx.Call) and node.args:
            op = str(getattr(node.op, "name", ""))
            head = node.args[0]
            if op == "tl.tma_store" and isinstance(head, tirx.Var) and str(head.name) in tma:
                written.add(tma[str(head.name)].tensor)
            elif op == "tirx.tvm_access_ptr" and len(node.args) == 5:
                mask = node.args[4]
                if isinstance(mask, tirx.IntImm) and int(mask.value) & 2:
                    written.update(tensors_in(node.args[1]))
            elif op.startswith("tirx.call_") and isinstance(head, tirx.StringImm):
                if _WRITING_CALL.search(head.value):
                    for arg in node.args[1:]:
                        written.update(tensors_in(arg))
            elif _WRITING_CALL.search(op) and not op.startswith("tirx."):
                for arg in node.args:
                    written.update(tensors_in(arg))

    for dev in device_mod.functions.values():
        tirx.stmt_functor.post_order_visit(dev.body, visit)
    return frozenset(written)


def contract_of(func: Any, host_mod: Any, device_mod: Any) -> LaunchContract:
    """Read the launch contract from the lowered host and device modules."""
    params, sizes, data_names = _signature(func)
    host_funcs = list(host_mod.functions.values())
    if len(host_funcs) != 1:
        raise LowerError(f"expected one host function, found {len(host_funcs)}")
    host = host_funcs[0]
    tma = _tma(host, data_names)
    scalars = {p.name: p.dtype for p in params if isinstance(p, ScalarParam)}
    size_names = {s.name for s in sizes}
    launches = []
    order = str(host)
    for gvar, dev in device_mod.functions.items():
        symbol = str(gvar.name_hint)
        attrs = dev.attrs
        grid: list[Any] = [1, 1, 1]
        block: list[Any] = [1, 1, 1]
        for tag, extent in attrs["thread_extent"].items():
            axis = "xyz".index(str(tag)[-1])
            (block if "threadIdx" in str(tag) else grid)[axis] = extent
        smem = _int(attrs["dyn_shared_memory_buf"], "dynamic shared memory") if "dyn_shared_memory_buf" in attrs else 0
        cluster = tuple(int(c) for c in attrs["cluster_dims"]) if "cluster_dims" in attrs else None
        raw_args = _call_args(host, symbol, len(dev.params))
        launches.append((order.find(f'"{symbol}"'), Launch(
            symbol=symbol,
            args=tuple(_kernel_arg(a, data_names, tma, scalars, size_names) for a in raw_args),
            grid=tuple(_strip_parens(py_expr(g)) for g in grid),  # type: ignore[arg-type]
            block=tuple(_int(b, f"block size of {symbol}") for b in block),  # type: ignore[arg-type]
            dynamic_smem=smem,
            cooperative=bool(attrs["use_cooperative_groups"]) if "use_cooperative_groups" in attrs else False,
            cluster=cluster,  # type: ignore[arg-type]
        )))
    launches.sort(key=lambda item: item[0])
    written = written_tensors(device_mod, data_names, tma)
    params = tuple(dataclasses.replace(p, written=True) if isinstance(p, TensorParam) and p.name in written else p
                   for p in params)
    return LaunchContract(params=params, sizes=sizes, tma=tuple(tma.values()),
                          launches=tuple(launch for _, launch in launches))


def lower(rendered: RenderedKernel, arch: Arch) -> LoweredKernel:
    """Lower ``rendered`` for ``arch`` with TileLang; no GPU is touched."""
    import tilelang

    tvm = _tvm()
    func = import_rendered(rendered)
    spec = rendered.variant.kernel
    known = set(tvm.transform.PassContext.list_configs())
    for key, _ in spec.pass_configs:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise LowerError(f"{spec.source}:{spec.line}: kernels.{spec.name}.pass_configs.{key}: TileLang "
                             f"{tilelang.__version__} has no such pass config{hint}")
    target = tvm.target.Target({"kind": "cuda", "arch": arch.target})
    try:
        with tvm.transform.PassContext(opt_level=3, config=dict(spec.pass_configs)), target:
            artifact = tilelang.lower(func, target=target)
    except Exception as exc:
        raise LowerError(f"{rendered.path}: TileLang cannot lower variant {rendered.variant.describe()} of "
                         f"{spec.name} for {arch.target}: {type(exc).__name__}: {exc}") from exc
    contract = contract_of(func, artifact.host_mod, artifact.device_mod)
    return LoweredKernel(contract=contract, cuda_source=str(artifact.kernel_source))

