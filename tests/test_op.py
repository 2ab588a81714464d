"""The op layer (tkc/runtime/_op.py) on the CPU: a toy op declared as the shipped ops are.

The toy package holds the stub runtime of tests/op_stub.py with one change: ``launch_op``
defines a real torch op, so ``torch.compile(fullgraph=True)`` traces the op as the
installed wheel's ops are traced. The toy kernel is a Python function over CPU tensors that
writes its outputs, so every path's result can be compared with the plain-torch answer.
"""

from __future__ import annotations

import importlib
import inspect
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.conftest import REPO
from tests.op_stub import STUB_RUNTIME

PACKAGE = "toy_op_pkg"

# launch_op as the real runtime defines it (tkc/runtime/_runtime.py), under the toy package's name.
REAL_CUSTOM_OP = f'''
import torch

_LIBRARY = torch.library.Library("{PACKAGE}", "FRAGMENT")


def launch_op(name, run, fake, mutates=False):
    schema = ("(Tensor[] tensors, Tensor(a!)[] written, int template) -> ()" if mutates
              else "(Tensor[] tensors, int template) -> Tensor[]")
    _LIBRARY.define(name + schema)
    _LIBRARY.impl(name, run, "CompositeExplicitAutograd")
    _LIBRARY.impl(name, fake, "Meta")
    return getattr(torch.ops.{PACKAGE}, name).default
'''

TOY_OPS = '''
from __future__ import annotations

import torch

from .._args import matrix, positive_int
from .._op import Plan, empty, launch, multiple, op, out, pair, result, size, size_is
from .._runtime import LAUNCHES

__all__ = ["scale_rows", "row_sums", "negate_in_place", "accumulate_into", "scaled_or_nothing", "shifted",
           "scale_streams", "accumulate_each", "dequantized"]


class _Kernel:
    """Launchers over CPU tensors, recorded like the stub's: (name, grid values, arguments)."""

    def variant(self, width):
        def scale(x, y, factor):
            LAUNCHES.append(("scale", {"width": width}, (x, y, factor)))
            y.copy_(x * factor)

        return scale


def _sums(x, sums):
    LAUNCHES.append(("sums", {}, (x, sums)))
    sums.copy_(x.sum(dim=1))


def _negate(x):
    LAUNCHES.append(("negate", {}, (x,)))
    x.neg_()


def _accumulate(acc, x):
    LAUNCHES.append(("accumulate", {}, (acc, x)))
    acc.add_(x)


_kernel = _Kernel()


@op(outputs=("y",), inputs={"x": (1,)})
def scale_rows(x: torch.Tensor, factor: int = 2) -> Plan:
    """y = x * factor for a (rows, width) x whose width is a multiple of 4."""
    x = matrix("x", x, "(rows, width)")
    k = positive_int("factor", factor)
    return launch(_kernel.variant(int(x.shape[1])), x, out(0), float(k),
                  outputs=(empty(x.dtype, size(x, 0), x.shape[1]),), rules=(multiple("x", x, 1, 4),))


@op(outputs=("y",), positional_out=True)
def scale_rows_into(x: torch.Tensor, factor: int) -> Plan:
    """scale_rows whose out may come positionally too, as some TileKernels functions take it."""
    x = matrix("x", x, "(rows, width)")
    return launch(_kernel.variant(int(x.shape[1])), x, out(0), float(factor),
                  outputs=(empty(x.dtype, size(x, 0), x.shape[1]),))


@op(outputs=("sums", "y"), inputs={"x": (1,)})
def row_sums(x: torch.Tensor) -> list[Plan]:
    """(x.sum(1), x * 3): two launches into one set of outputs."""
    x = matrix("x", x, "(rows, width)")
    return [launch(_sums, x, out(0), outputs=(empty(x.dtype, size(x, 0)), empty(x.dtype, size(x, 0), x.shape[1])),
                   rules=(size_is("y", out(1), 1, int(x.shape[1])),)),
            launch(_kernel.variant(int(x.shape[1])), x, out(1), 3.0)]


_PLACEHOLDERS = {}


def _shift(x, bias, y):
    LAUNCHES.append(("shift", {}, (x, bias, y)))
    y.copy_(x + (bias if bias.numel() else 0))


@op(outputs=("y",), inputs={"x": (1,), "bias": (0,)})
def shifted(x: torch.Tensor, bias: torch.Tensor | None = None) -> Plan:
    """y = x + bias; without bias the kernel takes an empty placeholder, made once per device."""
    x = matrix("x", x, "(rows, width)")
    made = []
    if bias is None:
        bias = _PLACEHOLDERS.get(x.device)
        if bias is None:
            bias = _PLACEHOLDERS[x.device] = torch.empty(0, device=x.device)
        made.append(bias)
    return launch(_shift, x, bias, out(0), outputs=(empty(x.dtype, size(x, 0), x.shape[1]),), constants=made)


def _dequantize(x, scales, y):
    LAUNCHES.append(("dequantize", {}, (x, scales, y)))
    y.copy_(x * scales[:, None] if scales.numel() else x)


@op(outputs=("y",), inputs={"x": pair((1,), (0,))})
def dequantized(x: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> Plan:
    """y = data * scales[:, None] for a (data, scales) pair, y = x for a plain tensor (an empty placeholder
    for the scales)."""
    scales, made = None, []
    if isinstance(x, (tuple, list)):
        x, scales = x
    x = matrix("x", x, "(rows, width)")
    if scales is None:
        scales = _PLACEHOLDERS.get(x.device)
        if scales is None:
            scales = _PLACEHOLDERS[x.device] = torch.empty(0, device=x.device)
        made.append(scales)
    return launch(_dequantize, x, scales, out(0), outputs=(empty(x.dtype, size(x, 0), x.shape[1]),),
                  constants=made)


def _rows(t):
    return t.view(-1, t.shape[-1])


@op(outputs=("y",), inputs={"x": (2,)})
def scale_streams(x: torch.Tensor) -> Plan:
    """y = 2 x for a (tokens, streams, width) x, launched on its (tokens * streams, width) view: the output is
    sized from the caller's tensor, which the launcher never takes."""
    return launch(_kernel.variant(int(x.shape[2])), _rows(x), out(0, view=_rows), 2.0,
                  outputs=(empty(x.dtype, size(x, 0), size(x, 1), x.shape[2]),))


@op(out=False, mutates=True)
def negate_in_place(x: torch.Tensor) -> Plan:
    """x = -x, in place."""
    return launch(_negate, matrix("x", x))


@op(out=False, mutates=("acc",))
def accumulate_into(acc: torch.Tensor, x: torch.Tensor) -> Plan:
    """acc += x, in place; x is only read."""
    return launch(_accumulate, matrix("acc", acc), matrix("x", x))


def _accumulate_each(x, *accs):
    LAUNCHES.append(("accumulate_each", {}, (x, *accs)))
    for acc in accs:
        acc.add_(x)


@op(out=False, mutates=("accs",))
def accumulate_each(x: torch.Tensor, accs: list[torch.Tensor]) -> Plan:
    """acc += x for every acc in the list accs; x is only read."""
    return launch(_accumulate_each, matrix("x", x), *(matrix("accs", a) for a in accs))


@op(outputs=("y",), inputs={"x": (1,)})
def scaled_or_nothing(x: torch.Tensor, skip: bool = False, *, out: torch.Tensor | None = None) -> Plan:
    """A plan that takes out itself and, with skip, returns without a launch of its own."""
    if skip:
        return result(out)
    return scale_rows.plan(x, 5)
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType]]:
    root = tmp_path_factory.mktemp("toy_op")
    base = root / PACKAGE
    (base / "toy").mkdir(parents=True)
    (base / "__init__.py").write_text("")
    (base / "toy" / "__init__.py").write_text("")
    (base / "_runtime.py").write_text(STUB_RUNTIME + "\nKEYS = {}\n" + REAL_CUSTOM_OP)
    (base / "_build_info.py").write_text("ARCH = 'sm90'\nALIGNMENT = 16\n")
    for shared in ("_args.py", "_op.py", "_plan.py", "errors.py"):
        shutil.copy(REPO / "tkc" / "runtime" / shared, base / shared)
    (base / "toy" / "_ops.py").write_text(TOY_OPS)
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(f"{PACKAGE}.toy._ops"), importlib.import_module(f"{PACKAGE}._runtime")
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


@pytest.fixture(autouse=True)
def _clear(toy: tuple[ModuleType, ModuleType]) -> None:
    for record in (toy[1].LAUNCHES, toy[1].REMEMBERED, toy[1].DISPATCHED):
        record.clear()


def test_the_public_function_has_the_plan_signature_plus_out(toy: tuple[ModuleType, ModuleType]) -> None:
    ops, _ = toy
    assert str(inspect.signature(ops.scale_rows)) == "(x: 'torch.Tensor', factor: 'int' = 2, *, out=None)"
    assert str(inspect.signature(ops.scaled_or_nothing)) == \
        "(x: 'torch.Tensor', skip: 'bool' = False, *, out: 'torch.Tensor | None' = None)"
    assert str(inspect.signature(ops.negate_in_place)) == "(x: 'torch.Tensor')"
    assert ops.scale_rows.__doc__.startswith("y = x * factor")
    assert ops.scale_rows.__name__ == "scale_rows"


def test_an_allocating_call_launches_into_fresh_outputs_and_is_remembered(toy: tuple[ModuleType, ModuleType]) -> None:
    ops, rt = toy
    x = torch.randn(3, 8)
    y = ops.scale_rows(x, 3)
    assert torch.equal(y, x * 3)
    ((name, values, args),) = rt.LAUNCHES
    assert (name, values, args[0], args[1], args[2]) == ("scale", {"width": 8}, x, y, 3.0)
    # dispatch() was asked first with (inputs, out, options), then the recipe was remembered for it.
    ((fast, call),) = rt.DISPATCHED
    assert call[0] is x and call[1] is None and call[2] == 3
    ((remembered_fast, _, arguments, rules, remembered_call, outputs),) = rt.REMEMBERED
    assert remembered_fast is fast and remembered_call[0] is x and remembered_call[2] == 3
    assert [(a.kind, a.index) for a in arguments[:2]] == [("input", 0), ("out", 0)] and arguments[2] == 3.0
    assert rules == (("size_multiple", 0, 1, 4),)
    ((recipe,),) = [outputs]
    assert recipe.dtype == torch.float32 and recipe.dims == ((0, 0, 1, 0, 1), 8)


def test_positional_out_is_the_last_positional_parameter(toy: tuple[ModuleType, ModuleType]) -> None:
    ops, _ = toy
    assert str(inspect.signature(ops.scale_rows_into)) == "(x: 'torch.Tensor', factor: 'int', out=None)"
    x = torch.randn(2, 8)
    y, z = torch.full((2, 8), float("nan")), torch.full((2, 8), float("nan"))
    assert ops.scale_rows_into(x, 3, y) is y and ops.scale_rows_into(x, 3, out=z) is z
    assert torch.equal(y, x * 3) and torch.equal(z, x * 3)
    assert torch.equal(ops.scale_rows_into(x, 3), x * 3)

    def keyword_only(x: torch.Tensor, *, k: int = 1) -> None:
        """Not an op: out cannot follow a keyword-only parameter positionally."""

    with pytest.raises(TypeError, match="op keyword_only: positional_out needs out=True and a plan without keyword"):
        ops.op(outputs=("y",), positional_out=True)(keyword_only)


def test_out_is_written_in_place_and_returned(toy: tuple[ModuleType, ModuleType]) -> None:
    ops, rt = toy
    x = torch.randn(4, 8)
    y = torch.full((4, 8), float("nan"))
    assert ops.scale_rows(x, out=y) is y
    assert torch.equal(y, x * 2)
    (entry,) = rt.REMEMBERED
    assert entry[4][1] is y and entry[5] is None  # an out= call: no allocation recipe
    with pytest.raises(TypeError, match=r"^out: expected y as the op returns it \(a tensor\), got tuple"):
        ops.scale_rows(x, out=(y,))


def test_errors_name_the_argument_before_any_launch(toy: tuple[ModuleType, ModuleType]) -> None:
    ops, rt = toy
    with pytest.raises(ValueError, match=r"^x: dimension 1 \(size 6\) must be a multiple of 4"):
        ops.scale_rows(torch.randn(2, 6))
    with pytest.raises(ValueError, match=r"^factor: expected a positive int, got 0"):
        ops.scale_rows(torch.randn(2, 8), 0)
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor"):
        ops.scale_rows([1, 2])
    assert rt.LAUNCHES == [] and rt.REMEMBERED == []


def test_rules_on_outputs_name_the_output(toy: tuple[ModuleType, ModuleType]) -> None:
    ops, rt = toy
    x = torch.randn(2, 8)
    sums, y = ops.row_sums(x)
    assert torch.equal(sums, x.sum(1)) and torch.equal(y, x * 3)
    assert [launch[0] for launch in rt.LAUNCHES] == ["sums", "scale"]
    assert rt.REMEMBERED == []  # two launches: the Python path every time
    rt.LAUNCHES.clear()
    with pytest.raises(ValueError, match=r"^y: dimension 1 must be 8, got shape \(2, 4\)"):
        ops.row_sums(x, out=(torch.empty(2), torch.empty(2, 4)))
    assert rt.LAUNCHES == []


def test_a_plan_of_tensors_it_made_is_not_remembered(toy: tuple[ModuleType, ModuleType]) -> None:
    ops, rt = toy
    x = torch.randn(8, 4).t()  # matrix() passes it on; the toy plan launches it as given
    assert torch.equal(ops.scale_rows(x.contiguous()), x * 2)
    assert len(rt.REMEMBERED) == 1
    rt.REMEMBERED.clear()
    # scaled_or_nothing returns scale_rows' plan for its own x: the same caller tensor, remembered
    y = ops.scaled_or_nothing(x.contiguous())
    assert torch.equal(y, x * 5) and len(rt.REMEMBERED) == 1
    given = torch.zeros(1)
    assert ops.scaled_or_nothing(x, True, out=given) is given


def test_placeholders_the_plan_declares_are_remembered_as_constants(toy: tuple[ModuleType, ModuleType]) -> None:
    ops, rt = toy
    x = torch.randn(2, 4)
    assert torch.equal(ops.shifted(x), x)
    ((_, _, arguments, _, call, _),) = rt.REMEMBERED
    placeholder = arguments[1]
    assert isinstance(placeholder, torch.Tensor) and placeholder.numel() == 0 and call[1] is None
    rt.REMEMBERED.clear()
    bias = torch.randn(4)
    assert torch.equal(ops.shifted(x, bias), x + bias)
    ((_, _, arguments, _, _, _),) = rt.REMEMBERED
    assert (arguments[1].kind, arguments[1].index) == ("input", 1)  # the caller's bias, not a constant


def test_a_pair_input_is_two_inputs_of_dispatch(toy: tuple[ModuleType, ModuleType]) -> None:
    ops, rt = toy
    data, scales = torch.randn(3, 4), torch.rand(3) + 1
    assert torch.equal(ops.dequantized((data, scales)), data * scales[:, None])
    ((fast, call),) = rt.DISPATCHED
    assert fast[0] == (((1,), (0,)), 1)  # a mask per half of the pair
    assert call[0] is data and call[1] is scales and call[2] is None
    ((_, _, arguments, _, remembered, _),) = rt.REMEMBERED
    assert remembered[0] is data and remembered[1] is scales  # the replay's inputs are the pair's halves
    assert [(a.kind, a.index) for a in arguments] == [("input", 0), ("input", 1), ("out", 0)]
    rt.DISPATCHED.clear(), rt.REMEMBERED.clear()
    ops.dequantized([data, scales])  # a list as a tuple
    assert rt.DISPATCHED[0][1][:2] == (data, scales) and rt.REMEMBERED[0][4][:2] == (data, scales)
    rt.DISPATCHED.clear(), rt.REMEMBERED.clear()
    # A plain tensor: its scales None, which the key tells apart from a pair's; the placeholder is a constant.
    assert torch.equal(ops.dequantized(data), data)
    ((_, call),) = rt.DISPATCHED
    assert call[0] is data and call[1] is None
    ((_, _, arguments, _, remembered, _),) = rt.REMEMBERED
    assert remembered[:2] == (data, None) and isinstance(arguments[1], torch.Tensor)
    rt.DISPATCHED.clear(), rt.REMEMBERED.clear()
    # (data, None) is not split: dispatch sees the tuple (never a plain tensor's replay) and the plan decides.
    assert torch.equal(ops.dequantized((data, None)), data)
    ((_, call),) = rt.DISPATCHED
    assert isinstance(call[0], tuple) and call[1] is None and rt.REMEMBERED == []


def test_in_place_ops_write_their_input(toy: tuple[ModuleType, ModuleType]) -> None:
    ops, _ = toy
    x = torch.randn(2, 3)
    expected = -x
    assert ops.negate_in_place(x) is None
    assert torch.equal(x, expected)


def test_torch_compile_traces_one_custom_op_per_call_without_graph_breaks(
        toy: tuple[ModuleType, ModuleType]) -> None:
    ops, rt = toy
    torch._dynamo.reset()

    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = ops.scale_rows(x, 3) + ops.scale_rows(x - 1, 1) + 2  # an intermediate tensor as input
        sums, _ = ops.row_sums(x)
        ops.scale_rows(x, out=y)
        return scaled, sums

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    x = torch.randn(5, 8)
    y = torch.zeros(5, 8)
    scaled, sums = compiled(x, y)
    assert torch.equal(scaled, x * 3 + (x - 1) + 2) and torch.allclose(sums, x.sum(1)) and torch.equal(y, x * 2)
    assert rt.REMEMBERED == []  # nothing is remembered while tracing
    assert hasattr(torch.ops, PACKAGE) and hasattr(getattr(torch.ops, PACKAGE), "scale_rows")
    x2 = torch.randn(7, 8)  # another row count: the same graph, sizes read at run time
    scaled, sums = compiled(x2, torch.zeros(7, 8))
    assert torch.equal(scaled, x2 * 3 + (x2 - 1) + 2)


def test_torch_compile_sizes_outputs_from_a_tensor_the_launcher_does_not_take(
        toy: tuple[ModuleType, ModuleType]) -> None:
    """The launcher takes a view of the caller's tensor, the output's sizes read the tensor itself: the traced
    custom op takes that tensor too, for its fake kernel to size the output."""
    ops, _ = toy
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: ops.scale_streams(x) + 1, fullgraph=True, backend="aot_eager")
    for tokens in (3, 5):
        x = torch.randn(tokens, 4, 8)
        assert torch.equal(ops.scale_streams(x), x * 2)
        assert torch.equal(compiled(x), x * 2 + 1)


def test_an_in_place_op_may_name_a_list_it_writes(toy: tuple[ModuleType, ModuleType]) -> None:
    """``mutates=("accs",)`` with accs a list of tensors: each of them is declared written, x (a leaf that
    requires grad, read only) is not, so torch.compile's autograd accepts the op."""
    ops, _ = toy
    torch._dynamo.reset()

    def step(w: torch.Tensor) -> torch.Tensor:
        accs = [torch.zeros_like(w), torch.ones_like(w)]
        ops.accumulate_each(w, accs)
        return (accs[0] * accs[1] * w).sum()

    w = torch.randn(3, 4, requires_grad=True)
    loss = torch.compile(step, fullgraph=True, backend="aot_eager")(w)
    assert torch.allclose(loss, (w * (w + 1) * w).sum())


def test_torch_compile_of_an_in_place_op(toy: tuple[ModuleType, ModuleType]) -> None:
    ops, _ = toy
    torch._dynamo.reset()

    def step(x: torch.Tensor) -> torch.Tensor:
        ops.negate_in_place(x)
        return x * 2

    x = torch.randn(3, 4)
    expected = -x * 2
    assert torch.equal(torch.compile(step, fullgraph=True, backend="aot_eager")(x), expected)
    assert torch.equal(x, expected / 2)


def test_an_in_place_op_declares_only_what_it_writes(toy: tuple[ModuleType, ModuleType]) -> None:
    """An in-place op that names what it writes (``mutates=("acc",)``) traces under torch.compile with
    autograd, in a function and inside a custom backward that reads a weight (the Engram gate's)."""
    ops, _ = toy
    torch._dynamo.reset()

    def step(w: torch.Tensor) -> torch.Tensor:
        acc = torch.zeros_like(w)
        ops.accumulate_into(acc, w.detach())
        ops.accumulate_into(acc, w.detach())
        return (acc * w).sum()

    w = torch.randn(3, 4, requires_grad=True)
    loss = torch.compile(step, fullgraph=True, backend="aot_eager")(w)
    loss.backward()
    assert torch.allclose(loss, 2 * (w * w).sum()) and torch.allclose(w.grad, 2 * w.detach())

    class Scale(torch.autograd.Function):  # a backward that reads the weight and accumulates its gradient
        @staticmethod
        def forward(ctx, x, weight):  # type: ignore[no-untyped-def]
            ctx.save_for_backward(x, weight)
            return x * weight

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            x, weight = ctx.saved_tensors
            grad_weight = torch.zeros_like(weight)
            ops.accumulate_into(grad_weight, grad * x)
            ops.accumulate_into(grad_weight, weight)  # the weight itself only read
            return grad * weight, grad_weight

    layer = torch.nn.Linear(4, 4)
    x = torch.randn(4, 4, requires_grad=True)
    torch.compile(lambda x: Scale.apply(x, layer.weight).sum(), fullgraph=True, backend="aot_eager")(x).backward()
    assert torch.allclose(x.grad, layer.weight.detach())
    assert torch.allclose(layer.weight.grad, x.detach() + layer.weight.detach())


def test_errors_surface_while_tracing_too(toy: tuple[ModuleType, ModuleType]) -> None:
    ops, _ = toy
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"x: dimension 1 \(size 6\) must be a multiple of 4"):
        torch.compile(lambda x: ops.scale_rows(x), fullgraph=True, backend="aot_eager")(torch.randn(2, 6))


def test_declaring_ops_imports_no_compiler(toy: tuple[ModuleType, ModuleType]) -> None:
    # Importing an op module must stay cheap: torch._dynamo alone takes seconds to import.
    import subprocess

    ops, _ = toy
    root = Path(ops.__file__).parents[2]
    script = (f"import sys; sys.path.insert(0, {str(root)!r}); import {PACKAGE}.toy._ops; "
              "print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr


def test_template_ids_are_the_same_in_every_process(toy: tuple[ModuleType, ModuleType]) -> None:
    """A traced plan's template id is what the compiled graph keeps; inductor caches graphs on disk across
    processes, so two processes registering the same templates in different orders must give each the same id
    (launchers and views are module-level functions, recipes values)."""
    import subprocess

    ops, _ = toy
    root = Path(ops.__file__).parents[2]
    script = (f"import sys, math, operator, collections; sys.path.insert(0, {str(root)!r}); import torch\n"
              f"from {PACKAGE} import _op\n"
              "Recipe = collections.namedtuple('Recipe', 'fmt npc')\n"
              "keys = {'a': (((math.sqrt, (('t', 0, None), ('o', 1, operator.neg), ('c', 2.5, None))),), "
              "((torch.float32, (4, (0, 1, 1, 0, 1))),)),\n"
              "        'b': (((math.floor, (('t', 0, None),)),), Recipe('e4m3', 128))}\n"
              "print(sorted((name, _op._template_id(keys[name])) for name in sys.argv[1].split(',')))")
    seen = [subprocess.run([sys.executable, "-c", script, order], capture_output=True, text=True, check=True).stdout
            for order in ("a,b", "b,a")]
    assert seen[0] == seen[1] and seen[0].count("(") == 2, seen


def test_placeholders_are_one_set_per_device_and_key(toy: tuple[ModuleType, ModuleType]) -> None:
    args = importlib.import_module(f"{PACKAGE}._args")
    cache: dict[object, tuple[torch.Tensor, ...]] = {}
    x = torch.zeros(3)
    first = args.placeholders(cache, x, ((1,), torch.int32), ((0, 2), torch.float32), key=2)
    assert [(tuple(t.shape), t.dtype) for t in first] == [((1,), torch.int32), ((0, 2), torch.float32)]
    assert first[0] is not first[1]
    assert args.placeholders(cache, torch.ones(5), ((1,), torch.int32), ((0, 2), torch.float32), key=2) is first
    other = args.placeholders(cache, x, ((1,), torch.int32), key=3)
    assert other is not first and list(cache) == [(-1, 2), (-1, 3)]  # CPU tensors: device -1
