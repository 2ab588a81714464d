"""A stub package for CPU tests of op modules: no build, no GPU, no cubins.

The op files are copied as tkc installs them (``ops/<family>/<op>.py`` ->
``<package>/<family>/_<op>.py``, next to the real ``_args.py`` and ``errors.py``) over a
``_runtime`` whose kernels (with the shipped specs' grid keys) record each launch as
``(kernel name, selected grid values, launch arguments)`` in ``LAUNCHES`` instead of
launching. Tests call the ops and read what they would have launched, or check that a bad
argument raised before anything was. For ``out=``, ``WritingKernel`` wraps a stub kernel so
that its launches also write MARK bytes into the outputs: what reaches the caller's tensors
shows then, the copy of the compile path included.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from tests.conftest import REPO

STUB_RUNTIME = '''
LAUNCHES = []


class _Kernel:
    def __init__(self, name):
        self.name = name
        self.keys = KEYS.get(name, ())
        # As the real Kernel.variants: every built key (its launcher once asked for); the stub launches any key.
        self.variants = dict.fromkeys(BUILT.get(name, ()))

    def variant(self, *values):
        # As the real Kernel.variant: one dict lookup once the variant has been asked for.
        launcher = self.variants.get(values)
        if launcher is None:
            launcher = self.variants[values] = self.select(**dict(zip(self.keys, values)))
        return launcher

    def find(self, *values):
        # As the real Kernel.find: None for a variant the shipped specs do not build.
        return self.variant(*values) if values in BUILT.get(self.name, ()) else None

    def has(self, *values):
        return values in BUILT.get(self.name, ())

    def select(self, **values):
        def launch(*args):
            LAUNCHES.append((self.name, values, args))
        return launch


def get_kernel(name):
    return _Kernel(name)


def launch_op(name, run, fake, mutates=False):
    return run  # the compile route launches the stub kernels directly


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def sm_count(device):
    return 132  # an H200's; ops size cooperative grids with it


# dispatch(): a stub launcher has no plan, so every call takes the op's Python path; what the ops
# remember is recorded, for tests that resolve it against the launch it stands for.
REMEMBERED = []
DISPATCHED = []


class Source:
    def __init__(self, kind, index):
        self.kind, self.index = kind, index


def fast_path(inputs, outputs):
    return (inputs, outputs), {}


def dispatch(fast, *call):
    DISPATCHED.append((fast, call))
    return None


def remember(fast, launch, arguments, rules, *call, outputs=None):
    REMEMBERED.append((fast, launch, tuple(arguments), tuple(rules), call, outputs))


class Output:
    def __init__(self, dtype, dims):
        self.dtype, self.dims = dtype, tuple(dims)


def output(dtype, *dims):
    return Output(dtype, dims)


def size_of(source, dim, times=1, plus=0, per=1):
    return (source, dim, times, plus, per)


def from_input(index):
    return Source("input", index)


def from_out(index=0):
    return Source("out", index)


def same_size(argument, dim, other, other_dim, times=1):
    return ("same_size", argument, dim, other, other_dim, times)


def size_multiple(argument, dim, multiple):
    return ("size_multiple", argument, dim, multiple)


def size_is(argument, dim, size):
    return ("size_is", argument, dim, size)


def stride_bytes_multiple(argument, dim, multiple):
    return ("stride_bytes_multiple", argument, dim, multiple)
'''

# The build constants op modules read (an sm90 package's values; KERNELS, the shipped specs' kernels, is added).
STUB_BUILD_INFO = "ARCH = 'sm90'\nALIGNMENT = 16\n"


def grid_keys() -> dict[str, tuple[str, ...]]:
    """Each shipped kernel's grid keys, in grid order: what ``Kernel.variant`` takes its values in."""
    from tkc.spec import load_specs

    return {k.name: k.grid_keys for k in load_specs([REPO / "kernel_specs"], REPO / "kernels").kernels}


def built_variants() -> dict[str, set[tuple[Any, ...]]]:
    """Each shipped kernel's variants, as their grid values in grid order: what ``Kernel.find`` finds."""
    from tkc.spec import expand, load_specs

    kernels = load_specs([REPO / "kernel_specs"], REPO / "kernels").kernels
    return {k.name: {tuple(v.param_dict[key] for key in k.grid_keys) for v in expand(k)} for k in kernels}


@contextmanager
def stub_package(root: Path, package: str, family: str,
                 ops: Sequence[str]) -> Iterator[tuple[dict[str, ModuleType], ModuleType]]:
    """(op modules by file stem, the stub ``_runtime``) of ``package`` written under ``root``.

    The package is importable inside the ``with`` block only; its modules are dropped after it.
    """
    base = root / package
    (base / family).mkdir(parents=True)
    (base / "__init__.py").write_text("")
    (base / family / "__init__.py").write_text("")
    (base / "_runtime.py").write_text(STUB_RUNTIME + f"\n\n# kernel -> grid keys, from the shipped specs\nKEYS = {grid_keys()!r}\n"
                                      f"# kernel -> its variants' grid values\nBUILT = {built_variants()!r}\n")
    (base / "_build_info.py").write_text(f"{STUB_BUILD_INFO}KERNELS = {tuple(grid_keys())!r}\n")
    for shared in ("_args.py", "_op.py", "_plan.py", "errors.py"):
        shutil.copy(REPO / "tkc" / "runtime" / shared, base / shared)
    for op in ops:
        shutil.copy(REPO / "ops" / family / f"{op}.py", base / family / f"_{op}.py")
    for helper in (REPO / "ops" / family).glob("_*.py"):  # the family's helpers, as tkc installs them
        shutil.copy(helper, base / family / helper.name)
    sys.path.insert(0, str(root))
    try:
        runtime = importlib.import_module(f"{package}._runtime")
        yield {op: importlib.import_module(f"{package}.{family}._{op}") for op in ops}, runtime
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == package or n.startswith(f"{package}.")]:
            del sys.modules[name]


# --- out= ------------------------------------------------------------------------------------

POISON = 0x7F  # what a test's out holds before the call
MARK = 0x3C  # what a WritingKernel's launches write into the outputs


def bits(t: torch.Tensor) -> torch.Tensor:
    """t's elements as the signed integers of their size (any dtype, any strides)."""
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def poisoned(t: torch.Tensor) -> torch.Tensor:
    """t with every byte of its storage set to POISON."""
    torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).fill_(POISON)
    return t


def marked(t: torch.Tensor) -> bool:
    """Whether every element of t holds MARK bytes only."""
    return bool((bits(t) == int.from_bytes(bytes([MARK]) * t.element_size(), "little", signed=True)).all())


class WritingKernel:
    """A stub kernel whose launches fill the tensors at positions ``written`` of the launch with MARK
    bytes (what a kernel writes), after recording the launch as the stub does."""

    def __init__(self, kernel: Any, written: Sequence[int]) -> None:
        self.kernel, self.keys, self.written = kernel, kernel.keys, tuple(written)

    def variant(self, *values: Any) -> Any:
        return self.select(**dict(zip(self.keys, values)))

    def find(self, *values: Any) -> Any:
        return self.variant(*values)

    def has(self, *values: Any) -> bool:
        return True

    def select(self, **values: Any) -> Any:
        launch = self.kernel.select(**values)

        def run(*args: Any) -> None:
            launch(*args)
            for i in self.written:
                bits(args[i]).fill_(int.from_bytes(bytes([MARK]) * args[i].element_size(), "little", signed=True))
        return run


class CheckingKernel:
    """A stub kernel whose launchers refuse a tensor argument that is not contiguous, naming it as the
    real launcher's stride check does (``names``: the kernel's parameters in order), and count
    their refusals in ``refused``; accepted launches are recorded as the stub records them."""

    def __init__(self, kernel: Any, names: Sequence[str]) -> None:
        self.kernel, self.keys, self.names, self.refused = kernel, kernel.keys, tuple(names), 0

    def variant(self, *values: Any) -> Any:
        return self.select(**dict(zip(self.keys, values)))

    def find(self, *values: Any) -> Any:
        return self.variant(*values)

    def has(self, *values: Any) -> bool:
        return True

    def select(self, **values: Any) -> Any:
        launch = self.kernel.select(**values)
        errors = importlib.import_module(f"{self.kernel.__module__.split('.')[0]}.errors")

        def run(*args: Any) -> None:
            for name, t in zip(self.names, args):
                if isinstance(t, torch.Tensor) and not t.is_contiguous():
                    self.refused += 1
                    raise errors.KernelArgumentError(f"{name}: expected a contiguous tensor")
            launch(*args)
        return run


@contextmanager
def stub_package_with_layer(root: Path, package: str, family: str, op: str,
                            layer: str) -> Iterator[tuple[ModuleType, ModuleType, ModuleType]]:
    """(the op module, its autograd layer module, the stub ``_runtime``): ``stub_package`` of one op, whose
    family module exports the op's ``__all__`` as the installed package does, with the layer module ``layer``
    (a path under ops/, e.g. ``modeling/mhc/ops/post.py``) installed at the same place in the package."""
    with stub_package(root, package, family, (op,)) as (modules, runtime):
        module = modules[op]
        family_module = importlib.import_module(f"{package}.{family}")
        for name in module.__all__:
            setattr(family_module, name, getattr(module, name))
        target = root / package / layer
        target.parent.mkdir(parents=True, exist_ok=True)
        for folder in target.relative_to(root / package).parents:
            if folder != Path("."):
                (root / package / folder / "__init__.py").touch()
        shutil.copy(REPO / "ops" / layer, target)
        yield module, importlib.import_module(f"{package}.{layer.removesuffix('.py').replace('/', '.')}"), runtime


def spelled(fn: Any) -> str:
    """``fn``'s signature without annotations: what a caller sees of its names and defaults."""
    import inspect

    signature = inspect.signature(fn)
    return str(signature.replace(parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                                 return_annotation=signature.empty))
