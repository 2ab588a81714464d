"""Stage 1: kernel specs (YAML) -> frozen dataclasses, validated once.

A spec file declares the package and, per kernel, the template that renders it,
the op module that exposes it, the compile-time grid, constraints between grid
keys, TileLang pass configs and the archs. ``expand`` turns a kernel into its
variants: one per grid point that satisfies every constraint.

Errors name the file, line, key, bad value and the fix, are collected for the
whole spec set, and raise one ``SpecError`` (exit code 2).
"""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import itertools
import keyword
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType

import yaml

from tkc.arch import ARCHS
from tkc.errors import SpecError
from tkc.pack import requirement

Value = str | int | bool | float

# Names the package root holds itself: a module may be any other Python identifier.
RESERVED_MODULES = ("cubins", "errors")
DTYPES = (
    "bfloat16",
    "float16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
)
FORMATS = ("e4m3", "e2m1", "e5m6")
TOP_KEYS = ("package", "kernels")
PACKAGE_KEYS = ("name", "version")
KERNEL_KEYS = ("module", "template", "op", "archs", "grid", "constraints", "requires", "pass_configs", "description")
REQUIRED_KERNEL_KEYS = ("module", "template", "op", "grid")
# Grid keys whose values come from a closed set; any other key takes free scalars.
CLOSED_GRID_KEYS: dict[str, tuple[str, ...]] = {"fmt": FORMATS}
# What a grid key means, read from its name where the catalog's templates agree on it: sizes and counts are
# ints (a '2048' or 2048.0 would build a variant no call selects: calls pass ints), flags are bools. Keys not
# named here may take any scalar of one type.
SIZE_GRID_KEYS = ("hidden", "npc", "npt", "block_m", "block_k", "mhc", "mhc_mult", "vec", "tile", "tables",
                  "cluster", "experts_per_group", "max_ngram_size", "threads")
FLAG_GRID_KEYS = ("round_sf", "precomputed_sf", "save", "expand", "aux", "physical_map")
_SIZE_LIMIT = 2**31  # sizes and counts reach the kernels as int32
_VERSION_RE = re.compile(r"^\d+(\.\d+)*([ab]|rc)?\d*(\.post\d+)?(\.dev\d+)?$")
# Constraint expressions may use these syntax nodes only: comparisons, boolean and
# arithmetic operators over grid keys and literals. No calls, attributes or subscripts.
_SAFE_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.BinOp,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.Compare, ast.Eq,
    ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Name, ast.Load,
    ast.Constant, ast.Tuple, ast.List, ast.IfExp,
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Package:
    name: str
    version: str


@dataclass(frozen=True, kw_only=True)
class KernelSpec:
    """One kernel of a spec file, with its compile-time grid."""

    name: str
    module: str
    template: str  # path relative to the kernel templates folder (kernels/)
    op: str  # path relative to the op modules folder (ops/)
    archs: tuple[str, ...]
    grid: tuple[tuple[str, tuple[Value, ...]], ...]
    constraints: tuple[str, ...]
    pass_configs: tuple[tuple[str, Value], ...]
    description: str
    source: str  # the spec file, for messages
    # Conditions on the kernel's runtime sizes ("M % 64 == 0") that its launchers check before every launch:
    # what the kernel trusts beyond the tensors' shapes (tile multiples); (lhs, rhs) pairs that must be equal.
    requires: tuple[tuple[str, str], ...] = ()
    line: int

    @property
    def grid_keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.grid)


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One grid point of a kernel: the unit that is rendered, lowered and compiled."""

    kernel: KernelSpec
    params: tuple[tuple[str, Value], ...]  # in grid-key order

    @property
    def id(self) -> str:
        """Deterministic name: kernel name plus a short hash of the sorted parameters."""
        text = repr(sorted(self.params))
        return f"{self.kernel.name}_{hashlib.sha256(text.encode()).hexdigest()[:10]}"

    @property
    def param_dict(self) -> dict[str, Value]:
        return dict(self.params)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params)


@dataclass(frozen=True, kw_only=True)
class SpecSet:
    package: Package
    kernels: tuple[KernelSpec, ...]
    files: tuple[str, ...]
    ops: Path = Path("ops")  # the folder the kernels' op paths are relative to

    def kernel(self, name: str) -> KernelSpec:
        for k in self.kernels:
            if k.name == name:
                return k
        raise SpecError(f"no kernel {name!r} in the specs; kernels: {', '.join(k.name for k in self.kernels)}"
                        f"{_did_you_mean(name, [k.name for k in self.kernels])}")


@dataclass
class _Problems:
    """Collects every problem of a spec set so one run reports them all."""

    items: list[str] = field(default_factory=list)

    def add(self, file: str, node: yaml.Node | None, where: str, message: str) -> None:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        self.items.append(f"{file}{line}: {where}: {message}")


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _scalar(node: yaml.Node) -> Value | None:
    """The Python value of a YAML scalar node, or None if the node is not a scalar."""
    if not isinstance(node, yaml.ScalarNode) or not node.tag.startswith("tag:yaml.org,2002:"):
        return None  # a YAML tag of its own (!foo, !!python/...) makes no plain value
    try:
        value = yaml.safe_load(yaml.serialize(node))
    except yaml.YAMLError:
        return None
    return value if isinstance(value, str | int | bool | float) else None


def _mapping(node: yaml.Node, file: str, where: str, allowed: tuple[str, ...],
             problems: _Problems) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """A mapping node's entries by key, reporting unknown and duplicate keys."""
    if not isinstance(node, yaml.MappingNode):
        problems.add(file, node, where, f"expected a mapping with keys {', '.join(allowed) or '...'}")
        return {}
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key_node, value_node in node.value:
        key = _scalar(key_node)
        if not isinstance(key, str):
            problems.add(file, key_node, where, f"keys must be strings, got {key_node.value!r}")
            continue
        if key in out:
            problems.add(file, key_node, f"{where}.{key}", "duplicate key; keep one")
            continue
        if allowed and key not in allowed:
            problems.add(file, key_node, f"{where}.{key}",
                         f"unknown key; valid keys: {', '.join(allowed)}{_did_you_mean(key, allowed)}")
            continue
        out[key] = (key_node, value_node)
    return out


def _string(entries: Mapping[str, tuple[yaml.Node, yaml.Node]], key: str, file: str, where: str,
            problems: _Problems) -> str | None:
    if key not in entries:
        return None
    node = entries[key][1]
    value = _scalar(node)
    if not isinstance(value, str) or not value:
        problems.add(file, node, f"{where}.{key}", f"expected a non-empty string, got {node.value!r}")
        return None
    return value


RESERVED_GRID_KEYS = ("arch", "variant_id", "self")
MAX_GRID_POINTS = 65536  # per kernel, before the constraints: beyond it a spec is a mistake, not a catalog
MAX_CONSTRAINT_CHARS = 2000
# What evaluating a kernel's constraints may cost: their characters in all (each is evaluated at every grid
# point), how deeply one nests (Python's compiler recurses on it), and the size of any value one computes
# (``9 ** 9 ** 9`` or ``(1,) * 10**10`` would run for minutes or exhaust memory). The catalog's kernels need
# at most a few hundred characters, 7 levels and small integers.
MAX_CONSTRAINTS_CHARS = 10 * MAX_CONSTRAINT_CHARS
MAX_CONSTRAINT_DEPTH = 100
MAX_CONSTRAINT_BITS = 4096  # of an integer a constraint computes
MAX_CONSTRAINT_ITEMS = 10000  # of a string, tuple or list a constraint computes
# Path parts and string grid values reach generated code and file names: words only.
SAFE_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")
SAFE_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _inside(root: Path, relative: str) -> bool:
    """Whether ``relative`` is a plain relative path (words, no '..') that resolves inside ``root``."""
    if not SAFE_PATH.fullmatch(relative) or ".." in relative.split("/"):
        return False
    return (root / relative).resolve().is_relative_to(root.resolve())


def _identifier(value: str) -> bool:
    """A Python name that is no keyword, of ASCII letters, digits and '_' (it names files, modules and
    keyword arguments), at most 100 characters."""
    return value.isidentifier() and value.isascii() and len(value) <= 100 and not keyword.iskeyword(value)


def _meaning(key: str, value: Value) -> str:
    """Why ``value`` does not fit what grid key ``key`` means (see SIZE_GRID_KEYS), or ""."""
    if key in SIZE_GRID_KEYS or key.startswith("num_"):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{key} is a size or count: give an int, e.g. {key}: [2048]"
        if value >= _SIZE_LIMIT:
            return f"{key} is a size or count, passed to the kernels as int32: give a value below 2^31"
    if (key in FLAG_GRID_KEYS or key.startswith(("with_", "without_"))) and not isinstance(value, bool):
        return f"{key} is a flag: give true or false"
    return ""


def _check_grid(node: yaml.Node, file: str, where: str,
                problems: _Problems) -> tuple[tuple[str, tuple[Value, ...]], ...]:
    grid: list[tuple[str, tuple[Value, ...]]] = []
    for key, (key_node, values_node) in _mapping(node, file, where, (), problems).items():
        here = f"{where}.{key}"
        if not _identifier(key):
            problems.add(file, key_node, here, "grid keys must be Python identifiers (they become template "
                         "variables and keyword arguments of select())")
            continue
        if key in RESERVED_GRID_KEYS or key.startswith("_"):
            problems.add(file, key_node, here, f"{key!r} is taken ({', '.join(RESERVED_GRID_KEYS)}: the templates' "
                         "own variables and select()'s self; names starting with '_' are Python's); rename the key")
            continue
        items = values_node.value if isinstance(values_node, yaml.SequenceNode) else [values_node]
        values: list[Value] = []
        for item in items:
            value = _scalar(item)
            if value is None:
                tagged = isinstance(item, yaml.ScalarNode) and not item.tag.startswith("tag:yaml.org,2002:")
                problems.add(file, item, here, f"YAML tag {item.tag!r} not allowed; give plain values" if tagged else
                             f"expected scalars (str, int, bool, float), got {item.value!r}")
                continue
            if isinstance(value, str) and (not SAFE_WORD.fullmatch(value) or keyword.iskeyword(value)):
                problems.add(file, item, here, f"bad value {value!r}; a string value is pasted into the template, "
                             "so it must be a word (letters, digits, '_', not a Python keyword), e.g. bfloat16")
                continue
            if isinstance(value, float) and not math.isfinite(value):
                problems.add(file, item, here, f"bad value {value!r}; give a finite number")
                continue
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                problems.add(file, item, here, f"bad value {value!r}; grid numbers are sizes, counts and factors: "
                             "give a value >= 0")
                continue
            if values and type(value) is not type(values[0]):
                problems.add(file, item, here, f"bad value {value!r}: a {type(value).__name__} among "
                             f"{type(values[0]).__name__} values; give every value of a key one type")
                continue
            meaning = _meaning(key, value)
            if meaning:
                problems.add(file, item, here, f"bad value {value!r}; {meaning}")
                continue
            choices = DTYPES if key.endswith("dtype") else CLOSED_GRID_KEYS.get(key)
            if choices is not None and value not in choices:
                problems.add(file, item, here, f"bad value {value!r}; valid choices: {', '.join(choices)}"
                             f"{_did_you_mean(str(value), choices)}")
                continue
            if value in values:
                problems.add(file, item, here, f"value {value!r} is listed twice; list it once")
                continue
            values.append(value)
        if not items:
            problems.add(file, values_node, here, "empty list; give at least one value")
        grid.append((key, tuple(values)))
    if not grid and isinstance(node, yaml.MappingNode):
        problems.add(file, node, where, "empty grid; give at least one key (e.g. dtype: [bfloat16])")
    return tuple(grid)


def _check_requires(node: yaml.Node, file: str, where: str, problems: _Problems) -> tuple[tuple[str, str], ...]:
    """The kernel's requirements on its runtime sizes, as (lhs, rhs) pairs; which sizes exist is known once the
    template is lowered (tkc.codegen names the sizes there)."""
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    out: list[tuple[str, str]] = []
    for item in items:
        text = _scalar(item)
        try:
            if not isinstance(text, str):
                raise ValueError(f"expected a string, got {item.value!r}")
            out.append(requirement(text))
        except (SyntaxError, ValueError) as exc:
            problems.add(file, item, where, f"{exc}; a requirement compares expressions of the kernel's runtime "
                         "sizes and integers with ==, e.g. \"M % 64 == 0\"")
    return tuple(out)


def _check_constraints(node: yaml.Node, file: str, where: str, keys: tuple[str, ...],
                       problems: _Problems) -> tuple[str, ...]:
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    out: list[str] = []
    for item in items:
        text = _scalar(item)
        if not isinstance(text, str):
            problems.add(file, item, where, f"expected a Python expression string, got {item.value!r}")
            continue
        if len(text) > MAX_CONSTRAINT_CHARS:
            problems.add(file, item, where, f"a constraint of {len(text)} characters; at most {MAX_CONSTRAINT_CHARS}: "
                         "split it into several")
            continue
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as exc:
            problems.add(file, item, where, f"{text!r} is not a Python expression: {exc.msg}")
            continue
        except (RecursionError, MemoryError):
            problems.add(file, item, where, f"{text[:60]!r}... nests too deeply; at most {MAX_CONSTRAINT_DEPTH} "
                         "levels: split it into several constraints")
            continue
        bad = [type(n).__name__ for n in ast.walk(tree) if not isinstance(n, _SAFE_NODES)]
        if bad:
            problems.add(file, item, where, f"{text!r} uses {bad[0]}; constraints may only compare grid keys "
                         "and literals (and, or, not, in, arithmetic)")
            continue
        depth = _depth(tree)
        if depth > MAX_CONSTRAINT_DEPTH:
            problems.add(file, item, where, f"{text[:60]!r}... nests {depth} levels deep; at most "
                         f"{MAX_CONSTRAINT_DEPTH}: split it into several constraints")
            continue
        unknown = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in keys]
        if unknown:
            problems.add(file, item, where, f"{text!r} names {unknown[0]!r}, which is not a grid key; grid keys: "
                         f"{', '.join(keys)}{_did_you_mean(unknown[0], keys)}")
            continue
        out.append(text)
    total = sum(map(len, out))
    if total > MAX_CONSTRAINTS_CHARS:
        problems.add(file, node, where, f"constraints of {total} characters in all; at most {MAX_CONSTRAINTS_CHARS} "
                     "per kernel (each is evaluated at every grid point): simplify them or narrow the grid")
        return ()
    return tuple(out)


def _depth(tree: ast.AST) -> int:
    """How deeply ``tree`` nests (iteratively: a deep tree is what this guards against)."""
    deepest, pending = 0, [(tree, 1)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        pending += [(child, depth + 1) for child in ast.iter_child_nodes(node)]
    return deepest


def _check_kernel(name: str, key_node: yaml.Node, node: yaml.Node, file: str, roots: dict[str, Path],
                  problems: _Problems) -> KernelSpec | None:
    where = f"kernels.{name}"
    before = len(problems.items)
    if not _identifier(name):
        problems.add(file, key_node, where, "kernel names must be Python identifiers")
    entries = _mapping(node, file, where, KERNEL_KEYS, problems)
    for key in REQUIRED_KERNEL_KEYS:
        if key not in entries and isinstance(node, yaml.MappingNode):
            problems.add(file, node, f"{where}.{key}", "missing required key")
    module = _string(entries, "module", file, where, problems)
    if module is not None and (not _identifier(module) or module.startswith("_") or module in RESERVED_MODULES):
        problems.add(file, entries["module"][1], f"{where}.module",
                     f"bad value {module!r}; a module is the package's submodule users import ({module!r} would be "
                     f"<package>.{module}): a Python identifier that does not start with '_' and is not "
                     f"{' or '.join(repr(m) for m in RESERVED_MODULES)}, e.g. quant, moe or linalg")
    paths: dict[str, str | None] = {}
    for key, suffix in (("template", ".py.j2"), ("op", ".py")):
        value = _string(entries, key, file, where, problems)
        paths[key] = value
        if value is None:
            continue
        if not value.endswith(suffix):
            problems.add(file, entries[key][1], f"{where}.{key}", f"{value!r} should end in {suffix}")
        elif not _inside(roots[key], value):
            problems.add(file, entries[key][1], f"{where}.{key}",
                         f"{value!r} leaves {roots[key]}; give a relative path of words ({SAFE_PATH.pattern}) "
                         "under it, without '..' (nor a symlink out of it)")
        elif not (roots[key] / value).is_file():
            problems.add(file, entries[key][1], f"{where}.{key}",
                         f"{value!r} does not exist under {roots[key]}; create it or fix the path")
    archs: tuple[str, ...] = tuple(ARCHS)
    if "archs" in entries:
        arch_node = entries["archs"][1]
        items = arch_node.value if isinstance(arch_node, yaml.SequenceNode) else [arch_node]
        picked = []
        for item in items:
            arch = _scalar(item)
            if arch not in ARCHS:
                problems.add(file, item, f"{where}.archs", f"bad value {item.value!r}; valid choices: "
                             f"{', '.join(ARCHS)}{_did_you_mean(str(arch), ARCHS)}")
            elif arch not in picked:
                picked.append(str(arch))
        if not items:
            problems.add(file, arch_node, f"{where}.archs", f"empty list; name the archs to build ({', '.join(ARCHS)}) "
                         "or leave the key out for all of them")
        archs = tuple(picked)
    grid = _check_grid(entries["grid"][1], file, f"{where}.grid", problems) if "grid" in entries else ()
    keys = tuple(k for k, _ in grid)
    constraints = (_check_constraints(entries["constraints"][1], file, f"{where}.constraints", keys, problems)
                   if "constraints" in entries else ())
    requires = _check_requires(entries["requires"][1], file, f"{where}.requires", problems) \
        if "requires" in entries else ()
    pass_configs: list[tuple[str, Value]] = []
    if "pass_configs" in entries:
        for key, (_, value_node) in _mapping(entries["pass_configs"][1], file, f"{where}.pass_configs", (),
                                             problems).items():
            config = _scalar(value_node)
            if config is None:
                problems.add(file, value_node, f"{where}.pass_configs.{key}", "expected a scalar value")
            else:
                pass_configs.append((key, config))
    description = _string(entries, "description", file, where, problems) or ""
    if len(problems.items) > before:
        return None
    spec = KernelSpec(
        name=name, module=str(module), template=str(paths["template"]), op=str(paths["op"]), archs=archs,
        grid=grid, constraints=constraints, pass_configs=tuple(sorted(pass_configs)), description=description,
        source=file, line=key_node.start_mark.line + 1, requires=requires,
    )
    points = math.prod(len(values) for _, values in grid)
    if points > MAX_GRID_POINTS:
        problems.add(file, entries["grid"][1], f"{where}.grid", f"{points} grid points "
                     f"({' x '.join(f'{k} {len(v)}' for k, v in grid)}); at most {MAX_GRID_POINTS} per kernel: "
                     "narrow the grid or split the kernel")
        return None
    if not expand(spec):
        problems.add(file, entries["constraints"][1] if "constraints" in entries else node, where,
                     "the constraints exclude every grid point; relax them or widen the grid")
        return None
    return spec


def _load_file(path: Path, roots: dict[str, Path], problems: _Problems) -> tuple[Package | None, list[KernelSpec]]:
    file = str(path)
    try:
        root = yaml.compose(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        problems.items.append(f"{file}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                              "save the spec as UTF-8")
        return None, []
    except RecursionError:
        problems.items.append(f"{file}: nested too deeply for a spec; a grid is a mapping of flat lists")
        return None, []
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problems.items.append(f"{file}{line}: not valid YAML: {getattr(exc, 'problem', exc)}")
        return None, []
    if root is None:
        problems.items.append(f"{file}: empty spec file; declare 'package' and 'kernels'")
        return None, []
    top = _mapping(root, file, "(top level)", TOP_KEYS, problems)
    package = None
    if "package" in top:
        entries = _mapping(top["package"][1], file, "package", PACKAGE_KEYS, problems)
        name = _string(entries, "name", file, "package", problems)
        version = _string(entries, "version", file, "package", problems)
        if name is not None and not _identifier(name):
            problems.add(file, entries["name"][1], "package.name", f"{name!r} is not a Python package name")
        if version is not None and not _VERSION_RE.match(version):
            problems.add(file, entries["version"][1], "package.version",
                         f"{version!r} is not a PEP 440 version such as 0.1.0")
        if name and version:
            package = Package(name=name, version=version)
    kernels: list[KernelSpec] = []
    if "kernels" not in top:
        problems.add(file, root, "kernels", "missing required key; declare at least one kernel")
    else:
        for name, (key_node, node) in _mapping(top["kernels"][1], file, "kernels", (), problems).items():
            spec = _check_kernel(name, key_node, node, file, roots, problems)
            if spec is not None:
                kernels.append(spec)
    return package, kernels


def load_specs(paths: Iterable[Path], templates: Path, ops: Path | None = None) -> SpecSet:
    """Parse and validate spec files (or folders of ``*.yaml``) into one ``SpecSet``.

    ``templates``: the kernel templates folder (``template:`` paths are relative to it); ``ops``: the
    op modules folder (``op:`` paths), by default ``ops/`` beside the templates folder: a project
    keeps its build-time kernels and its run-time ops side by side (``kernels/`` and ``ops/``).
    """
    ops = templates.parent / "ops" if ops is None else ops
    roots = {"template": templates, "op": ops}
    files: list[Path] = []
    for p in paths:
        files.extend(sorted(p.glob("*.yaml")) + sorted(p.glob("*.yml")) if p.is_dir() else [p])
    problems = _Problems()
    if not files:
        raise SpecError(f"no spec files found in {', '.join(map(str, paths))}; add kernel_specs/*.yaml")
    package: Package | None = None
    kernels: list[KernelSpec] = []
    for path in files:
        if not path.is_file():
            problems.items.append(f"{path}: no such spec file")
            continue
        if not str(path).isprintable() or any(c in str(path) for c in "\"'\\"):
            # The path is written into generated comments and strings.
            problems.items.append(f"{str(path)!r}: a spec file's path may not hold quotes, backslashes or control "
                                  "characters; rename the file or its folder")
            continue
        pkg, found = _load_file(path, roots, problems)
        if pkg is not None and package is not None and pkg != package:
            problems.items.append(f"{path}: package {pkg.name} {pkg.version} differs from {package.name} "
                                  f"{package.version} declared earlier; all specs of a build share one package")
        package = package or pkg
        for spec in found:
            clash = next((k for k in kernels if k.name == spec.name), None)
            if clash is not None:
                problems.items.append(f"{spec.source}:{spec.line}: kernels.{spec.name}: already declared at "
                                      f"{clash.source}:{clash.line}; rename one")
            else:
                kernels.append(spec)
    if package is None and not problems.items:
        problems.items.append(f"{files[0]}: no spec declares 'package' (name, version); add it to one file")
    if problems.items:
        raise SpecError("invalid kernel spec:\n  " + "\n  ".join(problems.items))
    assert package is not None
    return SpecSet(package=package, kernels=tuple(kernels), files=tuple(map(str, files)), ops=ops)


def _sized(value: object) -> object:
    """``value``, unless it is larger than a constraint may compute (MAX_CONSTRAINT_BITS / _ITEMS)."""
    if isinstance(value, int) and value.bit_length() > MAX_CONSTRAINT_BITS:
        raise ValueError(f"it computes an integer of more than {MAX_CONSTRAINT_BITS} bits")
    if isinstance(value, str | tuple | list) and len(value) > MAX_CONSTRAINT_ITEMS:
        raise ValueError(f"it computes a {type(value).__name__} of more than {MAX_CONSTRAINT_ITEMS} items")
    return value


def _guarded_pow(a: object, b: object) -> object:
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1 \
            and b * math.log2(abs(a)) >= MAX_CONSTRAINT_BITS:
        raise ValueError(f"{a} ** {b} is an integer of more than {MAX_CONSTRAINT_BITS} bits")
    return _sized(a ** b)  # type: ignore[operator]


def _guarded_mul(a: object, b: object) -> object:
    if isinstance(a, int) and isinstance(b, int):
        if a.bit_length() + b.bit_length() > MAX_CONSTRAINT_BITS + 1:
            raise ValueError(f"it computes an integer of more than {MAX_CONSTRAINT_BITS} bits")
    else:
        sequence, count = (a, b) if isinstance(a, str | tuple | list) else (b, a)
        if isinstance(sequence, str | tuple | list) and isinstance(count, int) \
                and len(sequence) * count > MAX_CONSTRAINT_ITEMS:
            raise ValueError(f"it repeats a {type(sequence).__name__} to more than {MAX_CONSTRAINT_ITEMS} items")
    return _sized(a * b)  # type: ignore[operator]


def _guarded_mod(a: object, b: object) -> object:
    if isinstance(a, str):
        raise ValueError("'%' formats a string; constraints compare values, they do not format them")
    return a % b  # type: ignore[operator]


# The operators that can make a value of any size from small ones; eval'd constraints call these instead.
_GUARDS = {ast.Pow: "_guarded_pow", ast.Mult: "_guarded_mul", ast.Mod: "_guarded_mod"}
_GUARD_GLOBALS = {"__builtins__": {}, "_guarded_pow": _guarded_pow, "_guarded_mul": _guarded_mul,
                  "_guarded_mod": _guarded_mod}  # no grid key starts with '_': none can shadow them


class _Guard(ast.NodeTransformer):
    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        guard = _GUARDS.get(type(node.op))
        if guard is None:
            return node
        return ast.copy_location(ast.Call(func=ast.Name(id=guard, ctx=ast.Load()), args=[node.left, node.right],
                                          keywords=[]), node)


@functools.lru_cache(maxsize=1024)
def _compiled(text: str, source: str) -> CodeType:
    """A constraint's code object, compiled once (a rebuild evaluates each for every grid point), with its
    ``**``, ``*`` and ``%`` through the guards that bound what it may compute."""
    tree = ast.fix_missing_locations(_Guard().visit(ast.parse(text, mode="eval")))
    return compile(tree, f"<{source} constraint>", "eval")


def _satisfies(spec: KernelSpec, params: dict[str, Value]) -> bool:
    for text in spec.constraints:
        code = _compiled(text, spec.source)
        try:
            # Only whitelisted syntax over grid values reaches eval (checked in _check_constraints), and
            # what it computes is bounded (the guards).
            ok = eval(code, _GUARD_GLOBALS, dict(params))
        except Exception as exc:
            raise SpecError(f"{spec.source}:{spec.line}: kernels.{spec.name}.constraints: {text!r} fails for "
                            f"{params}: {exc}; fix the expression") from exc
        if not ok:
            return False
    return True


def expand(spec: KernelSpec) -> tuple[Variant, ...]:
    """Every grid point of ``spec`` that satisfies all its constraints, in grid order."""
    keys = spec.grid_keys
    out = []
    for values in itertools.product(*(v for _, v in spec.grid)):
        params = dict(zip(keys, values, strict=True))
        if _satisfies(spec, params):
            out.append(Variant(kernel=spec, params=tuple(params.items())))
    return tuple(out)
