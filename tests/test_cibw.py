"""cibuildwheel's configuration of the generated projects (tkc/cibw.py), checked without a container engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tkc import package
from tkc.arch import ARCHS
from tkc.build import ArchSummary, BuildOptions
from tkc.cibw import BUILD_IDENTIFIERS, SOURCE_DATE_EPOCH, cibuildwheel_config

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

PACKAGE = "fake_kernels_aot"


def _write_project(root: Path, arch: str) -> Path:
    """A project shaped like tkc's generated ones (hatchling, a package with ARCH) plus the config."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling>=1.21"]\nbuild-backend = "hatchling.build"\n\n'
        f'[project]\nname = "{PACKAGE}"\nversion = "0.1.0+{arch}"\ndescription = "test"\n'
        'requires-python = ">=3.9"\ndependencies = ["torch>=2.4"]\n\n' + cibuildwheel_config(arch)
    )
    (root / PACKAGE).mkdir(exist_ok=True)
    (root / PACKAGE / "__init__.py").write_text(f'"""Fake kernels."""\n\nARCH = {arch!r}\n__version__ = "0.1.0"\n')
    return root


@pytest.mark.parametrize("arch", [*sorted(ARCHS), "sm90,sm100"])  # a per-arch project, and a multi-arch one
def test_config_parses_and_names_the_arch(arch: str) -> None:
    config = tomllib.loads(cibuildwheel_config(arch))["tool"]["cibuildwheel"]
    assert config["build"] == list(BUILD_IDENTIFIERS)
    assert config["linux"]["repair-wheel-command"] == ""
    assert config["test-command"].endswith(f"{{package}}/pyproject.toml {arch}")


def test_epoch_matches_the_packager() -> None:
    assert SOURCE_DATE_EPOCH == package.SOURCE_DATE_EPOCH


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_cibuildwheel_selects_exactly_one_build(small_build: tuple[BuildOptions, list[ArchSummary]],
                                                arch: str) -> None:
    # The generated project carries the config; --print-build-identifiers reads it and stops before
    # any container engine is needed.
    options, _ = small_build
    project = options.build_dir / "pkg" / options.specs.package.name / arch
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    proc = subprocess.run(
        [sys.executable, "-m", "cibuildwheel", "--print-build-identifiers", "--platform", "linux", "."],
        cwd=project, capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == list(BUILD_IDENTIFIERS)


def _wheel_of(project: Path, out: Path, platform: str) -> Path:
    env = dict(os.environ, TKC_WHEEL_PLATFORM=platform, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH)
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), "."],
                          cwd=project, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.mark.slow
def test_wheel_tags_follow_the_launch_module_and_cibuildwheel(small_build: tuple[BuildOptions, list[ArchSummary]],
                                                             tmp_path: Path) -> None:
    # tkc build compiles the stable-ABI launch module, so its wheel is cp310-abi3 for this host;
    # cibuildwheel's config sets TKC_WHEEL_PLATFORM, which the generated hatch_build.py turns into
    # the manylinux platform tag. Without the module the wheel is pure, or py3-none-<platform> for
    # cibuildwheel, which refuses pure wheels.
    options, summaries = small_build
    assert all(s.wheel.name.endswith("-cp310-abi3-linux_x86_64.whl") for s in summaries), summaries
    project = options.build_dir / "pkg" / options.specs.package.name / "sm90"
    wheel = _wheel_of(project, tmp_path / "native", "manylinux_2_17_x86_64")
    assert wheel.name == "tkc_small_kernels-0.0.1+sm90-cp310-abi3-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel) as z:
        assert "Root-Is-Purelib: false" in z.read("tkc_small_kernels-0.0.1+sm90.dist-info/WHEEL").decode()
        assert not [n for n in z.namelist() if n.endswith("hatch_build.py")]
        assert "tkc_small_kernels/_launch.abi3.so" in z.namelist()

    pure = tmp_path / "pure"
    shutil.copytree(project, pure)
    (pure / "tkc_small_kernels" / "_launch.abi3.so").unlink()
    wheel = _wheel_of(pure, tmp_path / "pure-wheel", "manylinux_2_17_x86_64")
    assert wheel.name == "tkc_small_kernels-0.0.1+sm90-py3-none-manylinux_2_17_x86_64.whl"


def test_test_command_imports_the_package_and_checks_its_arch(tmp_path: Path) -> None:
    # What cibuildwheel runs in its test venv, run here through sh with the package on PYTHONPATH.
    project = _write_project(tmp_path / "pkg", "sm90")
    command = tomllib.loads(cibuildwheel_config("sm90"))["tool"]["cibuildwheel"]["test-command"]
    command = command.replace("python ", f"{sys.executable} ", 1)
    env = dict(os.environ, PYTHONPATH=str(project))

    ok = subprocess.run(["sh", "-c", command.format(package=project)], cwd=tmp_path, capture_output=True,
                        text=True, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"{PACKAGE} 0.1.0 imports without a GPU" in ok.stdout

    wrong = command.replace(" sm90", " sm100").format(package=project)
    bad = subprocess.run(["sh", "-c", wrong], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "AssertionError" in bad.stderr


def test_test_command_checks_a_multi_arch_packages_archs(tmp_path: Path) -> None:
    # A multi-arch package's ARCH names all its archs (tkc.package); the config of its project checks them all.
    project = _write_project(tmp_path / "pkg", "sm90,sm100")
    command = tomllib.loads(cibuildwheel_config("sm90,sm100"))["tool"]["cibuildwheel"]["test-command"]
    command = command.replace("python ", f"{sys.executable} ", 1)
    ok = subprocess.run(["sh", "-c", command.format(package=project)], cwd=tmp_path, capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=str(project)))
    assert ok.returncode == 0, ok.stdout + ok.stderr
