"""The op modules are type-checked by mypy like tkc/ (ruff lints them in place: pyproject.toml).

They use relative imports of the package they are installed into (``.._op``, ``.._runtime``), so
they are checked where tkc puts them: a package tree assembled as tkc.package lays it out (the
runtime files beside ``<module>/_<op stem>.py`` for every kernel of the shipped specs and the
example project), with a ``_build_info`` of the names the runtime reads.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tkc.spec import load_specs

BUILD_INFO = ("PACKAGE = 'lint_pkg'\nVERSION = '0'\nARCH = 'sm90'\nTARGET = 'sm_90a'\nMAJOR = 9\nMINOR = 0\n"
              "GPUS = 'H100/H200'\nALIGNMENT = 16\nKERNELS: tuple[str, ...] = ()\n")


def _tree(root: Path) -> Path:
    package = root / "lint_pkg"
    package.mkdir()
    for name in ("_runtime.py", "_op.py", "_protocol.py", "_args.py", "errors.py"):
        shutil.copy(REPO / "tkc" / "runtime" / name, package / name)
    (package / "_build_info.py").write_text(BUILD_INFO)
    (package / "__init__.py").write_text("")
    projects = [(REPO / "kernel_specs", REPO / "kernels"),
                (REPO / "examples" / "rmsnorm" / "kernel_specs", REPO / "examples" / "rmsnorm" / "kernels")]
    for specs, templates in projects:
        spec_set = load_specs([specs], templates)
        for kernel in spec_set.kernels:
            module = package / kernel.module
            module.mkdir(exist_ok=True)
            (module / "__init__.py").write_text("")
            shutil.copy(spec_set.ops / kernel.op, module / f"_{Path(kernel.op).stem}.py")
            for helper in (spec_set.ops / kernel.op).parent.glob("_*.py"):
                shutil.copy(helper, module / helper.name)
    return package


def test_op_modules_type_check(tmp_path: Path) -> None:
    package = _tree(tmp_path)
    done = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "--no-incremental",
                           "--python-version", "3.10", "lint_pkg"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(list(package.rglob("_*.py"))) > 20  # every op module was checked, not an empty tree
