"""Shared fixtures: one real build of the small spec for both archs, reused by the tests.

GPU tests (marker ``gpu``) skip cleanly where torch sees no CUDA device, so the
same ``pytest`` command runs on CI machines without a GPU.
"""

from __future__ import annotations

import importlib
import lzma
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tkc.build import ArchSummary, BuildOptions

REPO = Path(__file__).resolve().parent.parent
SMALL_SPEC = REPO / "tests" / "data" / "specs" / "small.yaml"
TEMPLATES = REPO / "kernels"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def small_options(root: Path, jobs: int = 2) -> BuildOptions:
    # Imported here so that GPU-only runs (no TileLang on the GPU machine) never import the build stages.
    from tkc.arch import ARCHS
    from tkc.build import BuildOptions
    from tkc.spec import load_specs

    return BuildOptions(
        specs=load_specs([SMALL_SPEC], TEMPLATES), templates=TEMPLATES, build_dir=root / "build",
        dist_dir=root / "dist", archs=tuple(ARCHS.values()), jobs=jobs,
    )


@pytest.fixture(scope="session")
def small_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[BuildOptions, list[ArchSummary]]:
    """The small spec built once through TileLang and nvcc (about a minute on 2 cores)."""
    from tkc.build import build

    options = small_options(tmp_path_factory.mktemp("small"))
    return options, build(options)


@pytest.fixture(scope="session")
def small_multi_build(small_build: tuple[BuildOptions, list[ArchSummary]]
                      ) -> tuple[BuildOptions, list[ArchSummary]]:
    """The small build's variants packaged as one multi-arch wheel (every arch; all cache hits), in a dist
    folder of its own."""
    import dataclasses

    from tkc.build import build

    options, _ = small_build
    multi = dataclasses.replace(options, multi_arch=True, dist_dir=options.dist_dir.parent / "dist-multi")
    return multi, build(multi)


def multi_arch_root(options: BuildOptions) -> Path:
    """The generated project of a multi-arch build (build/pkg/<package>/<arch>-<arch>...)."""
    return options.build_dir / "pkg" / options.specs.package.name / "-".join(a.name for a in options.archs)


@pytest.fixture(scope="module")
def small_package(small_build: tuple[BuildOptions, list[ArchSummary]]) -> Iterator[ModuleType]:
    """The small build's sm90 package (tkc_small_kernels) imported from build/pkg, dropped afterwards."""
    options, _ = small_build
    root = options.build_dir / "pkg" / "tkc_small_kernels" / "sm90"
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("tkc_small_kernels")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith("tkc_small_kernels")]:
            del sys.modules[name]


@pytest.fixture(scope="module", params=["exchange", "to_dlpack"])
def tensor_reader(request: pytest.FixtureRequest, small_package: ModuleType) -> Iterator[str]:
    """How the small package's compiled checks read tensors: torch's DLPack C exchange API or
    ``torch._C._to_dlpack``. Both must read the same fields, so the tests that take this run twice."""
    runtime = importlib.import_module("tkc_small_kernels._runtime")
    if not runtime.NATIVE_CHECK:  # no compiled module (no C compiler or Python.h): Python checks only
        if request.param == "exchange":
            pytest.skip("the small package was built without its compiled module")
        yield request.param
        return
    if runtime.use_exchange(request.param == "exchange") != (request.param == "exchange"):
        pytest.skip("this torch has no DLPack C exchange API (Tensor.__dlpack_c_exchange_api__)")
    try:
        yield request.param
    finally:
        runtime.use_exchange(True)


def packed_cubin(wheel: zipfile.ZipFile, package: str, variant: dict) -> bytes:
    """A variant's cubin read out of its wheel as the loader reads it: ``variant["bytes"]`` bytes at
    ``variant["offset"]`` of its xz pack (the manifest's ``cubin``), decompressed."""
    pack = lzma.decompress(wheel.read(f"{package}/{variant['cubin']}"), format=lzma.FORMAT_XZ)
    return pack[variant["offset"]:variant["offset"] + variant["bytes"]]
