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
              "GPUS = 'H100/H200'\nALIGNMENT = 16\nKERNELS: tuple[str, ...] = ()\nCUDA = (13, 0)\n"
              "MULTI_ARCH = False\nARCHS = {'sm90': (9, 0, 'sm_90a', 'H100/H200', 16)}\n")


def _tree(root: Path) -> Path:
    from tkc.package import RUNTIME_FILES, public_names, support_modules

    package = root / "lint_pkg"
    package.mkdir()
    for name in RUNTIME_FILES:
        shutil.copy(REPO / "tkc" / "runtime" / name, package / name)
    (package / "_build_info.py").write_text(BUILD_INFO)
    (package / "__init__.py").write_text("")
    exports: dict[Path, list[str]] = {}  # a module's __init__ lines: what the package's would export
    projects = [(REPO / "kernel_specs", REPO / "kernels"),
                (REPO / "examples" / "rmsnorm" / "kernel_specs", REPO / "examples" / "rmsnorm" / "kernels")]
    for specs, templates in projects:
        spec_set = load_specs([specs], templates)
        named = {(spec_set.ops / k.op).resolve() for k in spec_set.kernels}
        for kernel in spec_set.kernels:
            module = package / kernel.module
            module.mkdir(exist_ok=True)
            stem = f"_{Path(kernel.op).stem}"
            shutil.copy(spec_set.ops / kernel.op, module / f"{stem}.py")
            exports.setdefault(module, []).extend(f"from .{stem} import {n} as {n}"
                                                  for n in public_names(spec_set.ops / kernel.op))
            for helper in (spec_set.ops / kernel.op).parent.glob("_*.py"):
                shutil.copy(helper, module / helper.name)
        # The public modules of the op tree (ops/config.py, ops/moe/scoring.py, ops/modeling/engram.py ...), at
        # their install places: they import the op modules through the family's exports.
        def public(folder: Path) -> list[Path]:
            return sorted(d for d in folder.iterdir() if d.is_dir() and d.name.isidentifier()
                          and not d.name.startswith("_"))

        # The op tree and its sub-packages at any depth (modeling/mhc/ops/pre_apply_mix.py).
        folders = [(spec_set.ops, package)]
        for folder, target in folders:  # grows as it walks
            folders += [(d, target / d.name) for d in public(folder)]
        for folder, target in folders:
            for path in support_modules(folder, named):
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target / path.name)
                exports.setdefault(target, []).append(f"from . import {path.stem} as {path.stem}")
                chain = target
                while chain.parent != package and chain != package:  # every package above exports the one below
                    exports.setdefault(chain.parent, []).append(f"from . import {chain.name} as {chain.name}")
                    chain = chain.parent
    for module, lines in exports.items():
        if module != package:
            (module / "__init__.py").write_text("\n".join(sorted(set(lines))) + "\n")
    return package


def test_op_modules_type_check(tmp_path: Path) -> None:
    package = _tree(tmp_path)
    done = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "--no-incremental",
                           "--python-version", "3.10", "lint_pkg"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(list(package.rglob("_*.py"))) > 20  # every op module was checked, not an empty tree
    assert (package / "modeling" / "engram.py").is_file() and (package / "moe" / "routing.py").is_file()
    assert (package / "modeling" / "mhc" / "ops" / "pre_apply_mix.py").is_file()


def test_templates_use_jinja_only_to_instantiate_their_factory() -> None:
    """A kernel template is one TileLang factory with its variation as Python and its shared code imported from
    helper modules: no jinja control blocks ({% ... %}), and values ({{ ... }}) only in the last statement, the one
    that binds prim_func."""
    blocks, early = {}, {}
    templates = sorted((REPO / "kernels").rglob("*.j2"))
    for path in templates:
        name = path.relative_to(REPO / "kernels").as_posix()
        text = path.read_text()
        if "{%" in text:
            blocks[name] = text.count("{%")
        lines = text.splitlines()
        last = max((i for i, line in enumerate(lines) if line.startswith("prim_func")), default=len(lines))
        above = [i + 1 for i, line in enumerate(lines[:last]) if "{{" in line]
        if above:
            early[name] = above
    assert len(templates) >= 40  # the shipped templates were checked, not an empty folder
    assert not blocks, f"jinja control blocks (template: count): {blocks}; write the variation as Python"
    assert not early, (f"jinja values above the prim_func statement (template: lines): {early}; make them factory "
                       "arguments set on the last line")
