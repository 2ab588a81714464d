"""The example user project (examples/rmsnorm): a kernel and op of one's own, built into a wheel.

tkc is a compiler, not a fixed catalog: the example's spec names its own package (my_kernels)
and module (norm), and its op module uses the same declaration as the shipped ops. Built here
for every arch through TileLang and nvcc; its GPU test is tests/gpu/test_example_rmsnorm.py.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO
from tkc.arch import ARCHS

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "rmsnorm"


@pytest.fixture(scope="module")
def example_wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tkc.build import BuildOptions, build
    from tkc.spec import load_specs

    root = tmp_path_factory.mktemp("example")
    options = BuildOptions(specs=load_specs([EXAMPLE / "kernel_specs"], EXAMPLE / "kernels"),
                           templates=EXAMPLE / "kernels", build_dir=root / "build", dist_dir=root / "dist",
                           archs=tuple(ARCHS.values()), jobs=2)
    return {summary.arch.name: summary.wheel for summary in build(options)}


def test_the_example_builds_a_wheel_per_arch_with_its_own_module(example_wheels: dict[str, Path]) -> None:
    assert set(example_wheels) == set(ARCHS)
    for arch, wheel in example_wheels.items():
        assert wheel.name.startswith(f"my_kernels-0.1.0+{arch}-")
        names = zipfile.ZipFile(wheel).namelist()
        assert "my_kernels/norm/_rmsnorm.py" in names and "my_kernels/_op.py" in names
        assert sum(n.startswith("my_kernels/_kernels/rmsnorm/rmsnorm_") for n in names) == 2  # hidden 1024 and 4096
        assert [n for n in names if n.startswith("my_kernels/cubins/")] == ["my_kernels/cubins/rmsnorm.0.xz"]


def test_the_example_imports_without_gpu_and_names_bad_arguments(example_wheels: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    str(example_wheels["sm90"])], check=True)
    script = """
import inspect, sys, torch
import my_kernels
from my_kernels.errors import NoGpuError
assert str(inspect.signature(my_kernels.norm.rmsnorm)) == \\
    "(x: 'torch.Tensor', weight: 'torch.Tensor', eps: 'float' = 1e-06, *, out=None)"
x, w = torch.randn(3, 1024, dtype=torch.bfloat16), torch.ones(1024, dtype=torch.bfloat16)
try:
    my_kernels.norm.rmsnorm(x, w, eps=-1.0)
except ValueError as exc:
    assert str(exc).startswith("eps:"), exc
try:
    my_kernels.norm.rmsnorm(x, w)
except NoGpuError as exc:
    assert "GPU" in str(exc), exc
else:
    raise AssertionError("CPU tensors without a GPU must raise NoGpuError")
assert "tilelang" not in sys.modules and "tkc" not in sys.modules
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr
