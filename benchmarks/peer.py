"""TileKernels beside the wheel: each benchmark call, made once through tile_kernels_aot and once through TileKernels.

tile_kernels_aot is a drop-in for TileKernels (same module names, functions and arguments), so a benchmark case
needs no second spelling of its call. ``mirror(ours, theirs)`` wraps the wheel's module tree: a function read from
it is a ``Twin`` that calls the wheel's function, or TileKernels' of the same name while ``as_theirs`` runs a call.
A case's call written once (``lambda x: tk.quant.per_token_cast(x, "e4m3", 128)``) is then timed on both, on the
same inputs, by the same timer; a call that reaches no TileKernels function is refused rather than timed twice as
ours.

TileKernels JIT-compiles through TileLang, which the GPU machines here do not have and cannot download. To bring
it (unpacked wheels, about 46 MB as tar.xz, within what one device call carries):

    pip download --no-deps --python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64 \\
        --platform manylinux_2_17_x86_64 tilelang==0.1.15 "apache-tvm-ffi>=0.1.11,<0.1.13" \\
        "z3-solver>=4.13.0,<4.15.5" torch-c-dlpack-ext cloudpickle ml-dtypes psutil tqdm tile-kernels==1.0.0
    mkdir tree && for w in *.whl; do unzip -q -o $w -d tree; done && rm -rf tree/z3_solver-*.data
    # TileKernels 1.0.0 imports determine_target from tilelang.utils.target, which TileLang 0.1.12 moved:
    echo "from tilelang.backend.target import determine_target" > tree/tilelang/utils/target.py
    tar cf - -C tree . | xz -T2 -6 > build/tkjit.tar.xz

and on the GPU machine (its nvcc compiles TileLang's kernels) ``TK_JIT=build/tkjit.tar.xz
benchmarks/gpu_session.sh``, which unpacks it onto PYTHONPATH and runs ``bench.py --tilekernels``.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_side = threading.local()  # .theirs: whether Twins call TileKernels; .calls: how many did


def _theirs() -> bool:
    return getattr(_side, "theirs", False)


class Twin:
    """A function of the wheel and TileKernels' function of the same name (None: TileKernels has none)."""

    def __init__(self, name: str, ours: Callable[..., Any], theirs: Callable[..., Any] | None) -> None:
        self.name, self.ours, self.theirs = name, ours, theirs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not _theirs():
            return self.ours(*args, **kwargs)
        if self.theirs is None:
            raise NotImplementedError(f"TileKernels has no {self.name}")
        _side.calls += 1
        return self.theirs(*args, **kwargs)


class Mirror:
    """A module of the wheel with TileKernels' module of the same name beside it (None: TileKernels has none).

    Submodules are Mirrors, functions Twins; anything else (classes, constants) is the wheel's own. A name the
    wheel lacks raises AttributeError as the module would, so ``getattr(tk.mhc, name, None)`` still works.
    """

    def __init__(self, name: str, ours: types.ModuleType, theirs: types.ModuleType | None) -> None:
        self._name, self._ours, self._theirs = name, ours, theirs

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._ours, attr)
        other = getattr(self._theirs, attr, None) if self._theirs is not None else None
        name = f"{self._name}.{attr}"
        if isinstance(value, types.ModuleType):
            return Mirror(name, value, other if isinstance(other, types.ModuleType) else None)
        if callable(value) and not isinstance(value, type):
            return Twin(name, value, other if callable(other) else None)
        return value


def mirror(ours: types.ModuleType, theirs: types.ModuleType | None) -> Any:
    """The wheel's package as the cases see it: the package itself without TileKernels, else its Mirror."""
    return ours if theirs is None else Mirror(theirs.__name__, ours, theirs)


@contextmanager
def _as_theirs() -> Iterator[None]:
    before = _theirs(), getattr(_side, "calls", 0)
    _side.theirs, _side.calls = True, 0
    try:
        yield
    finally:
        calls = _side.calls
        _side.theirs, _side.calls = before[0], before[1] + calls


def as_theirs(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with every Twin it calls calling TileKernels; a call that reached none raises (it would time ours)."""

    def call(*args: Any) -> Any:
        with _as_theirs():
            result = fn(*args)
            if _side.calls == 0:
                raise LookupError("the call reaches no TileKernels function (it does not go through the mirror)")
        return result

    return call
