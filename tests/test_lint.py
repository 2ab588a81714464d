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
              "GPUS = 'H100/H200'\nALIGNMENT = 16\nKERNELS: tuple[str, ...] = ()\nCUDA = (13, 0)\n")


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


# Jinja control blocks ({% ... %}) per template: a kernel template is one TileLang factory with its variation as
# Python, jinja only on the line that instantiates it. These still hold blocks from before that rule; the count
# may only go down (lower it here when a template is converted). Every other template: none.
_JINJA_BLOCKS = {
    "moe/top2_sum_gate.py.j2": 20,
    "quant/_clamp.j2": 1, "quant/_layout.j2": 1, "quant/_scale.j2": 1, "quant/_store.j2": 3, "quant/_tiles.j2": 14,
    "quant/_words.j2": 1, "quant/per_block_cast_lossless.py.j2": 1,
    "quant/per_block_cast.py.j2": 1, "quant/per_channel_cast_and_transpose.py.j2": 1, "quant/per_channel_cast_fused.py.j2": 1,
    "quant/per_token_cast.py.j2": 2, "quant/per_token_cast_e5m6.py.j2": 1,
    "quant/swiglu_backward_and_per_token_cast.py.j2": 19,
    "quant/swiglu_forward_and_per_channel_cast_and_transpose.py.j2": 7,
    "quant/swiglu_forward_and_per_token_cast.py.j2": 3, "transpose/batched_transpose.py.j2": 2,
}


def test_templates_hold_no_more_jinja_control_blocks_than_their_budget() -> None:
    over = {}
    for path in sorted((REPO / "kernels").rglob("*.j2")):
        name = path.relative_to(REPO / "kernels").as_posix()
        count = path.read_text().count("{%")
        if count > _JINJA_BLOCKS.get(name, 0):
            over[name] = (count, _JINJA_BLOCKS.get(name, 0))
    assert not over, f"jinja control blocks over budget (count, budget): {over}; write the variation as Python"
