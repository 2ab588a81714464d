"""The op layer: an op module declares what an op is; this module derives everything else once.

Copied verbatim by tkc into every generated package, next to the loader. An op is a *plan*
function with the op's public signature (TileKernels' names and arguments) that checks its
non-tensor arguments, picks the variant and returns a ``Plan``: the launcher, its arguments
in prim_func order (the caller's tensors, ``out(i)`` for the i-th output, scalars), how to
allocate each output, and the rules it relies on beyond the launcher's contract. ``op(...)``
turns it into the public function, which

- takes a keyword-only ``out=`` (the tensors the call would return, written in place);
- goes first, for a call signature it has seen, to ``_dispatch.dispatch``: one C call that keys
  the call, checks the contract and the plan's rules, allocates the outputs and launches;
- otherwise runs the plan, checks the rules (naming the tensor), allocates or takes ``out``,
  launches, and remembers the call's recipe for ``dispatch``: which launcher argument is which
  input or output, which are constants, and each output's shape as sizes of the inputs;
- while ``torch.compile`` traces, calls one torch custom op per op (``torch.ops.<package>.<op>``)
  with the plan's tensors; its fake kernel allocates the outputs from the same recipe, so the
  graph has no break, and ``out=`` becomes a copy into ``out``.

A plan whose tensors are not the caller's (a ``.contiguous()`` copy, a dequantized pair) or
whose outputs are allocated by a function still runs: it only is not remembered. Ops whose
host logic is genuinely special return several plans (launched in order into one set of
outputs) or a ``then`` epilogue of torch code, which runs eagerly and is traced when compiling.
Launchers, ``out(i, view=...)`` views and output functions must be module-level functions:
torch.compile keys a traced plan by them (a closure cannot be a key of the compiled graph).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _runtime as rt
from ._args import out_tensors
from ._plan import (
    Empty,
    Out,
    Pair,
    Plan,
    Result,
    Rule,
    Size,
    empty,
    launch,
    multiple,
    out,
    pair,
    result,
    same_size,
    size,
    size_is,
    split_pair,
    stride_multiple,
)

# What op modules import from here: op() and the plan vocabulary of _plan.
__all__ = ["Empty", "Pair", "Plan", "Result", "Rule", "Size", "empty", "launch", "multiple", "op", "out", "pair",
           "result", "same_size", "size", "size_is", "stride_multiple"]



def _tensors(plans: Sequence[Plan]) -> list[torch.Tensor]:
    """The plans' tensor arguments in order, each once (by identity: ``is``, which torch.compile
    traces, where ``id()`` of a tensor made inside the compiled region is refused)."""
    seen: list[torch.Tensor] = []
    for plan in plans:
        for a in plan.args:
            if isinstance(a, torch.Tensor) and _index(seen, a) is None:
                seen.append(a)
    return seen


def _traced_tensors(plans: Sequence[Plan]) -> list[torch.Tensor]:
    """What the custom op takes while tracing: the plans' tensor arguments, then each tensor an output's
    ``size(...)`` reads that no launcher takes (the caller's tensor of a plan that launches on a view of it),
    so that the fake kernel can size the outputs from the op's own inputs."""
    tensors = _tensors(plans)
    outputs = plans[0].outputs
    if outputs is not None and not callable(outputs):
        for o in outputs:
            for d in o.dims:
                if isinstance(d, Size) and _index(tensors, d.tensor) is None:
                    tensors.append(d.tensor)
    return tensors


def _index(tensors: Sequence[Any], tensor: Any) -> int | None:
    """The position of ``tensor`` itself (not an equal one) in ``tensors``, or None."""
    for i, t in enumerate(tensors):
        if t is tensor:
            return i
    return None


def _allocate(plans: Sequence[Plan]) -> list[torch.Tensor]:
    """The outputs of an allocating call, as the first plan says."""
    outputs = plans[0].outputs
    if outputs is None:
        return []
    if callable(outputs):
        return list(outputs(*_tensors(plans)))
    device = next(a for plan in plans for a in plan.args if isinstance(a, torch.Tensor)).device
    return [torch.empty([d if isinstance(d, int) else d.of(d.tensor) for d in o.dims], dtype=o.dtype, device=device)
            for o in outputs]


# The compile route: a plan seen while tracing becomes a template (launchers, argument slots,
# output recipe over the custom op's tensor list) with an id; the graph calls the op's custom op
# with its tensors and that id, and the custom op and its fake kernel rebuild the call from it.
# The id is a hash of the template's description, not a count: inductor caches compiled graphs on
# disk across processes, and a graph that one process traced with id n must mean the same template
# in another that loads it (a count gave each process its own numbering, and a cached graph's
# output strides from the other process's template).
_templates: dict[int, tuple[Any, ...]] = {}
_template_ids: dict[tuple[Any, ...], int] = {}


def _describe(value: Any) -> str:
    """A description of a template key's part that is the same in every process: module-level functions by
    qualified name, value types (named tuples, dtypes, numbers, strings) by their repr, tuples part by part."""
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):  # a NamedTuple recipe: a value
        return repr(value)
    if isinstance(value, tuple):
        return "(" + ",".join(_describe(v) for v in value) + ")"
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return repr(value)
    name = getattr(value, "__qualname__", None)
    if name is not None and "<" not in name:  # a module-level function or class, never a closure or lambda
        return f"{value.__module__}.{name}"
    described = getattr(value, "template_description", None)  # a launcher object (_runtime._PerDevice)
    if described is not None:
        return str(described())
    # Anything else (a test's closure) by identity: its id then means something in this process only.
    return f"<{type(value).__qualname__} at {id(value):#x}>"


def _template_id(key: tuple[Any, ...]) -> int:
    """The id of a template: torch.compile calls this for real while tracing and keeps the int."""
    index = _template_ids.get(key)
    if index is None:
        digest = hashlib.sha256(_describe(key).encode()).digest()
        index = int.from_bytes(digest[:7], "little")
        if _templates.get(index, key) != key:
            raise RuntimeError(f"torch.compile route: two templates share id {index}: {_describe(key)}")
        _templates[index] = key
        _template_ids[key] = index
    return index


# What torch.compiler.assume_constant_result does, without importing torch._dynamo (seconds) at import.
_template_id._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _template(plans: Sequence[Plan], tensors: list[torch.Tensor]) -> int:
    """The template id of ``plans``, whose tensor arguments are ``tensors``; the key holds no tensors."""
    launches = []
    for plan in plans:
        slots = tuple(("t", _index(tensors, a), None) if isinstance(a, torch.Tensor) else ("o", a.index, a.view)
                      if isinstance(a, Out) else ("c", a, None) for a in plan.args)
        launches.append((plan.launcher, slots))
    outputs = plans[0].outputs
    recipe: Any
    if outputs is None or callable(outputs):
        recipe = outputs
    else:
        recipe = tuple((o.dtype, tuple(d if isinstance(d, int) else (_index(tensors, d.tensor), d.dim, d.times,
                                                                        d.plus, d.per) for d in o.dims))
                       for o in outputs)
        if any(d[0] is None for _, dims in recipe for d in dims if not isinstance(d, int)):
            raise TypeError("an output's size(...) must read a tensor the launcher takes")
    return _template_id((tuple(launches), recipe))


def _template_outputs(recipe: Any, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    if recipe is None:
        return []
    if callable(recipe):
        return list(recipe(*tensors))
    return [torch.empty(tuple(d if isinstance(d, int) else (tensors[d[0]].shape[d[1]] * d[2] + d[3]) // d[4]
                              for d in dims), dtype=dtype, device=tensors[0].device) for dtype, dims in recipe]


def _slot(slot: tuple[str, Any, Any], tensors: list[torch.Tensor], outputs: list[torch.Tensor]) -> Any:
    kind, value, view = slot
    if kind == "t":
        return tensors[value]
    if kind == "o":
        return outputs[value] if view is None else view(outputs[value])
    return value


def _run_template(tensors: list[torch.Tensor], template: int) -> list[torch.Tensor]:
    launches, recipe = _templates[template]
    outputs = _template_outputs(recipe, tensors)
    for launcher, slots in launches:
        launcher(*(_slot(slot, tensors, outputs) for slot in slots))
    return outputs


def _fake_template(tensors: list[torch.Tensor], template: int) -> list[torch.Tensor]:
    return _template_outputs(_templates[template][1], tensors)


def _run_in_place(tensors: list[torch.Tensor], written: list[torch.Tensor], template: int) -> None:
    _run_template([*tensors, *written], template)


def _fake_in_place(tensors: list[torch.Tensor], written: list[torch.Tensor], template: int) -> None:
    return None


def _check_output_rules(plans: Sequence[Plan], outputs: Sequence[torch.Tensor]) -> None:
    for plan in plans:
        for rule in plan.rules:
            if isinstance(rule.tensor, Out) or isinstance(rule.other, Out):
                real = rule.resolved(outputs)
                if not real.holds():
                    raise real.error()


class Op:
    """One declared op: its plan function, outputs, keyed dimensions, and what is derived from them."""

    def __init__(self, plan: Callable[..., Plan | Sequence[Plan]], name: str, outputs: tuple[str, ...],
                 keyed: dict[str, Sequence[int] | Pair], takes_out: bool, mutates: bool | Sequence[str]) -> None:
        self.plan, self.name, self.outputs = plan, name, outputs
        # The parameters an in-place op writes (True: every tensor it launches with); None: it writes none.
        self.mutated: tuple[str, ...] | bool | None = (
            None if mutates is False else True if mutates is True else tuple(mutates))
        self.signature = inspect.signature(plan)
        self.inputs = tuple(keyed)  # the tensor parameters, in dispatch order
        self.pairs = frozenset(name for name, dims in keyed.items() if isinstance(dims, Pair))
        masks: list[Sequence[int]] = []
        for dims in keyed.values():
            masks += (dims.data, dims.scales) if isinstance(dims, Pair) else (dims,)
        names = list(self.signature.parameters)
        self._keywords = tuple(n for n, p in self.signature.parameters.items() if p.kind is p.KEYWORD_ONLY)
        self._positional = len(names) - len(self._keywords)
        # The C fast path: for an op with out= (the key needs it), outputs and keyed inputs; None: no dispatch.
        self.fast = rt.fast_path(tuple(masks), len(outputs)) if takes_out and outputs and keyed else None
        # Registered now, not on first use: torch.compile cannot trace a registration. An in-place
        # op returns nothing (torch cannot functionalize outputs beside a mutated tensor list).
        if self.mutated is not None:
            self._custom = rt.launch_op(name, _run_in_place, _fake_in_place, mutates=True)
        else:
            self._custom = rt.launch_op(name, _run_template, _fake_template)

    def call(self, args: tuple[Any, ...], given: Any) -> Any:
        """The op's Python path: plan, rules, outputs, launch (or the custom op), remember."""
        if self._keywords:
            split = self._positional
            planned = self.plan(*args[:split], **dict(zip(self._keywords, args[split:])))
        else:
            planned = self.plan(*args)
        if isinstance(planned, Result):
            return planned.value
        plans: Sequence[Plan] = (planned,) if isinstance(planned, Plan) else planned
        for plan in plans:  # rules on the inputs before anything is allocated
            for rule in plan.rules:
                if not isinstance(rule.tensor, Out) and not isinstance(rule.other, Out) and not rule.holds():
                    raise rule.error()
        if not plans:  # nothing to launch (the plan checked the call and found no work)
            return None
        first, then = plans[0], plans[-1].then
        if torch.compiler.is_compiling():
            if given is not None:
                _check_output_rules(plans, out_tensors(given, self.outputs))
            outputs = self._compiled(plans, args)
            if given is not None:
                targets = out_tensors(given, self.outputs)
                outputs = [t.copy_(o) for t, o in zip(targets, outputs, strict=True)]
        else:
            outputs = list(out_tensors(given, self.outputs)) if given is not None else _allocate(plans)
            if any(plan.rules for plan in plans):
                _check_output_rules(plans, outputs)
            for plan in plans:
                plan.launcher(*[a.of(outputs) if isinstance(a, Out) else a for a in plan.args])
            if self.fast is not None and len(plans) == 1 and then is None and \
                    getattr(first.launcher, "planned", True) is not None:  # None: a launch dispatch cannot take
                self._remember(first, args, given, outputs)
        if then is not None:
            return then(*outputs)
        if not outputs:
            return None
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _compiled(self, plans: Sequence[Plan], args: tuple[Any, ...]) -> list[torch.Tensor]:
        tensors = _traced_tensors(plans)
        if self.mutated is None:
            return list(self._custom(tensors, _template(plans, tensors)) or ())
        # The custom op declares only what it writes as mutated: a read-only argument may be a leaf that
        # requires grad (a weight), which autograd refuses to see written in place.
        if isinstance(self.mutated, bool):
            read, written = [], tensors
        else:
            bound = dict(zip(self.signature.parameters, args))
            targets: list[Any] = []
            for name in self.mutated:  # a parameter that is a list of tensors: each of them is written
                value = bound[name]
                targets += value if isinstance(value, (list, tuple)) else [value]
            written = [t for t in tensors if any(t is w for w in targets)]
            read = [t for t in tensors if not any(t is w for w in targets)]
        self._custom(read, written, _template(plans, [*read, *written]))
        return []

    def _remember(self, plan: Plan, args: tuple[Any, ...], given: Any, outputs: list[torch.Tensor]) -> None:
        """Let dispatch() take later calls of this signature straight to the launch."""
        bound = dict(zip(self.signature.parameters, args))
        inputs: list[Any] = []
        for name in self.inputs:
            inputs += split_pair(bound[name]) if name in self.pairs else (bound[name],)
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        if any(_index(tensors, t) != i for i, t in enumerate(tensors)):
            return  # one tensor passed twice: a replay with two tensors would launch only one of them
        arguments: list[object] = []
        for a in plan.args:
            if isinstance(a, Out):
                if a.view is not None:
                    return  # dispatch passes tensors through, it takes no views
                arguments.append(rt.from_out(a.index))
            elif isinstance(a, torch.Tensor):
                position = _index(inputs, a)
                if position is not None:
                    arguments.append(rt.from_input(position))
                elif any(a is c for c in plan.constants):
                    arguments.append(a)
                else:
                    return  # a tensor the plan made: this call cannot be replayed from the caller's
            else:
                arguments.append(a)
        rules = []
        for rule in plan.rules:
            packed = rule.packed(plan.args)
            if packed is None:
                return
            rules.append(packed)
        recipe = None
        if given is None:
            if plan.outputs is None or callable(plan.outputs):
                return
            recipe = []
            for o, t in zip(plan.outputs, outputs):
                dims: list[int | tuple[int, int, int, int, int]] = []
                for d in o.dims:
                    if isinstance(d, int):
                        dims.append(d)
                    elif (position := _index(inputs, d.tensor)) is not None:
                        dims.append(rt.size_of(position, d.dim, d.times, d.plus, d.per))
                    else:
                        return
                recipe.append(rt.output(t.dtype, *dims))
        options = [value for name, value in bound.items() if name not in self.inputs and name != "out"]
        rt.remember(self.fast, plan.launcher, arguments, rules, *inputs, given, *options,  # type: ignore[arg-type]
                    outputs=recipe)


# The public function, spelled with the plan's own parameters so that a call costs one Python
# frame and, for a signature seen before, one C call (what dataclasses do for __init__: the
# source is built from the plan's parameter names only). Every op's function reads dispatch and
# is_compiling from _PUBLIC (tests count dispatch hits there); its own values are closed over.
_FAST_SOURCE = '''\
def make(FAST, call, _defaults):
    def public({parameters}):
        if not is_compiling():
{split}            done = dispatch(FAST, {inputs}out, {options})
            if done is not None:
                return done
        return call(({arguments}), out)
    return public
'''
_SOURCE = '''\
def make(FAST, call, _defaults):
    def public({parameters}):
        return call(({arguments}), {given})
    return public
'''
_PUBLIC: dict[str, Any] = {"dispatch": rt.dispatch, "is_compiling": torch.compiler.is_compiling}


def op(*, outputs: Sequence[str] = (), inputs: dict[str, Sequence[int] | Pair] | None = None,
       name: str | None = None, out: bool = True, positional_out: bool = False,
       mutates: bool | Sequence[str] = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make a plan function the public op.

    ``outputs``: the names of the tensors the op returns, in order (``out=`` takes them in that
    order and errors name them). ``inputs``: the plan's tensor parameters, each with the
    dimensions whose sizes choose the variant (the others vary at run time: the contract reads
    them); a call whose inputs match a remembered one in dtype, rank and those sizes, and
    whose other arguments have the same exact types and values, is replayed by dispatch. A
    parameter that takes a tensor or a ``(data, scales)`` tuple declares ``pair(data_dims, scales_dims)``.
    ``out``: whether the op takes ``out=``; ``positional_out``: also as the last positional parameter, where the
    op's TileKernels counterpart takes it so (``f(a, b, None)``; the plan then has no keyword-only parameters).
    ``mutates``: the op writes its input tensors (an
    in-place op; its custom op says so to torch.compile): True for all of them, or the names of the
    parameters it writes, each a tensor or a list of them (then the others may be tensors autograd must not
    see written, e.g. weights).
    """

    def declare(plan: Callable[..., Any]) -> Callable[..., Any]:
        if positional_out:
            kinds = {p.name: p.kind for p in inspect.signature(plan).parameters.values()}
            if not out or "out" in kinds or inspect.Parameter.KEYWORD_ONLY in kinds.values():
                raise TypeError(f"op {name or plan.__name__}: positional_out needs out=True and a plan without "
                                "keyword-only parameters or an out of its own")
        declared = Op(plan, name or plan.__name__, tuple(outputs), dict(inputs or {}), out, mutates)
        parameters = list(declared.signature.parameters.values())
        defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
        spelled, seen_keyword = [], False
        for p in parameters:
            if p.kind is inspect.Parameter.KEYWORD_ONLY and not seen_keyword:
                spelled.append("*")
                seen_keyword = True
            spelled.append(f"{p.name}=_defaults[{p.name!r}]" if p.name in defaults else p.name)
        # A plan that takes out itself (to route it to another op) declares it; else the op adds it.
        if out and "out" not in declared.signature.parameters:
            spelled.extend([] if seen_keyword or positional_out else ["*"])
            spelled.append("out=None")
        names = [p.name for p in parameters]
        # A pair input is two of dispatch's inputs, split as split_pair() does.
        test = "({n}.__class__ is tuple or {n}.__class__ is list) and len({n}) == 2 and {n}[1] is not None"
        split = "".join(f"            {n}__data, {n}__scales = {n} if {test.format(n=n)} else ({n}, None)\n"
                        for n in declared.inputs if n in declared.pairs)
        source = (_FAST_SOURCE if declared.fast is not None else _SOURCE).format(
            parameters=", ".join(spelled), split=split,
            inputs="".join(f"{n}__data, {n}__scales, " if n in declared.pairs else f"{n}, " for n in declared.inputs),
            options=", ".join(n for n in names if n not in declared.inputs and n != "out"),
            arguments="".join(f"{n}, " for n in names), given="out" if out else "None")
        exec(compile(source, f"<op {declared.name}>", "exec"), _PUBLIC)
        public = _PUBLIC.pop("make")(declared.fast, declared.call, defaults)
        public.__name__, public.__qualname__, public.__module__ = plan.__name__, plan.__qualname__, plan.__module__
        public.__doc__, public.plan, public.op = plan.__doc__, plan, declared
        shown = list(parameters)
        if out and "out" not in declared.signature.parameters:
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if positional_out else inspect.Parameter.KEYWORD_ONLY
            shown.append(inspect.Parameter("out", kind, default=None))
        public.__signature__ = inspect.Signature(shown)
        return public  # type: ignore[no-any-return]

    return declare

