"""Run DeepSeek's TileKernels test suite against the installed tile_kernels_aot wheel.

TileKernels' tests import ``tile_kernels``. This script lays out a ``tile_kernels`` package whose
kernel modules (``quant``, ``moe``, ``transpose``, ``engram``, ``mhc``, ``modeling``, ``config``) are
tile_kernels_aot's own, with TileKernels' torch references (``torch``), test helpers (``testing``)
and ``utils`` beside them. Nothing adapts an argument: a test that fails through the alias is a gap
in tile_kernels_aot's API or input domain.

    # here (network): TileKernels' wheel, its tests (a checkout), pytest-xdist
    python benchmarks/tilekernels_suite.py prepare --tests /path/to/TileKernels/tests --root build/tilekernels
    # on the GPU machine, with tile_kernels_aot installed on PYTHONPATH
    python benchmarks/tilekernels_suite.py run --root build/tilekernels --out $OUT [--workers 4] [files...]

``run`` runs each test file in its own pytest process (one file's crash or timeout costs only that
file), writes a JUnit XML per file and ``tilekernels-suite.md``: passed/failed/errors per file and
the commonest failure messages.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

TILE_KERNELS = "tile-kernels==1.0.0"
HELPERS = ("pytest-xdist", "execnet")
# tile_kernels_aot modules that stand in for TileKernels' own (the ones the wheel has are aliased).
KERNEL_MODULES = ("config", "quant", "moe", "transpose", "engram", "mhc", "modeling")

ALIAS = '''\
"""TileKernels' import path, served by tile_kernels_aot (written by benchmarks/tilekernels_suite.py).

Kernel modules are tile_kernels_aot's; ``torch``, ``testing`` and ``utils`` are TileKernels' own
references and helpers, copied from its wheel."""
import importlib
import pkgutil
import sys

import tile_kernels_aot



def _alias(name, module):
    """``module`` and its public submodules at every depth (quant.common, modeling.mhc.ops.post, ...) under
    TileKernels' name: a submodule left out would be loaded a second time from the same file under the alias,
    where its relative imports miss tile_kernels_aot's private modules."""
    sys.modules[name] = module
    for sub in pkgutil.iter_modules(getattr(module, "__path__", [])):
        if not sub.name.startswith("_"):
            _alias(f"{{name}}.{{sub.name}}", importlib.import_module(f"{{module.__name__}}.{{sub.name}}"))


for _name in {modules!r}:
    try:
        _module = importlib.import_module(f"tile_kernels_aot.{{_name}}")
    except ModuleNotFoundError:
        continue
    _alias(f"{{__name__}}.{{_name}}", _module)
    globals()[_name] = _module
for _name in ("get_num_sms", "set_num_sms", "get_device_num_sms"):
    if hasattr(tile_kernels_aot, _name):
        globals()[_name] = getattr(tile_kernels_aot, _name)

from . import utils, torch, testing  # noqa: E402  TileKernels' own
'''


def prepare(tests: Path, root: Path) -> None:
    if not (tests / "conftest.py").is_file():
        sys.exit(f"{tests}: not TileKernels' tests folder (no conftest.py); pass --tests <checkout>/tests")
    if root.exists():
        shutil.rmtree(root)
    (root / "site").mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, TILE_KERNELS],
                       check=True)
        wheel = next(Path(tmp).glob("tile_kernels-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                top = member.split("/")[1] if member.startswith("tile_kernels/") else ""
                if top in ("torch", "testing", "utils.py"):
                    zf.extract(member, root / "site")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(root / "site"), *HELPERS], check=True)
    (root / "site" / "tile_kernels" / "__init__.py").write_text(ALIAS.format(modules=KERNEL_MODULES))
    shutil.copytree(tests, root / "tests")
    print(f"prepared {root}: {sum(1 for _ in (root / 'tests').rglob('test_*.py'))} test files")


def _summarize(xml: Path) -> tuple[collections.Counter, collections.Counter]:
    counts: collections.Counter = collections.Counter()
    messages: collections.Counter = collections.Counter()
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
                text = (child.get("message") or child.text or "").strip().splitlines()
                first = re.sub(r"0x[0-9a-f]+|\d+", "N", text[0] if text else child.tag)[:160]
                if outcome != "skipped":
                    messages[first] += 1
        counts[outcome] += 1
    return counts, messages


def run(root: Path, out: Path, workers: int, files: list[str], timeout: int, deadline: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str((root / "site").resolve()),
                                                        os.environ.get("PYTHONPATH", "")])))
    selected = files or sorted((str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")),
                               key=lambda rel: (not rel.startswith("tests/quant"), rel))
    rows, all_messages = [], collections.Counter()
    total: collections.Counter = collections.Counter()
    stop = time.monotonic() + deadline
    for rel in selected:
        if time.monotonic() > stop - 10:
            rows.append((rel, collections.Counter(), "not run (deadline)", 0.0))
            print(f"{rel}: not run (deadline)", flush=True)
            continue
        name = rel.replace("/", "_").removesuffix(".py")
        xml, log = out / f"{name}.xml", out / f"{name}.log"
        args = [sys.executable, "-m", "pytest", rel, "-q", "-p", "no:cacheprovider",
                f"--junitxml={xml.resolve()}"]
        if workers > 1:
            args[3:3] = ["-p", "xdist.plugin", "-n", str(workers)]
        start = time.monotonic()
        try:
            proc = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True,
                                  timeout=min(timeout, stop - time.monotonic()))
            log.write_text(proc.stdout + proc.stderr)
            status = f"exit {proc.returncode}"
        except subprocess.TimeoutExpired as exc:
            log.write_text(f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {timeout} s\n")
            status = "timeout"
        seconds = time.monotonic() - start
        counts, messages = _summarize(xml) if xml.is_file() else (collections.Counter(), collections.Counter())
        if not xml.is_file():
            tail = log.read_text().strip().splitlines()[-1:] or [status]
            messages[f"no report ({status}): {tail[0][:140]}"] += 1
        total.update(counts)
        all_messages.update(messages)
        rows.append((rel, counts, status, seconds))
        print(f"{rel}: {dict(counts)} {status} {seconds:.0f} s", flush=True)
    cases = sum(total[k] for k in ("passed", "failed", "errors"))
    lines = ["# TileKernels' test suite against tile_kernels_aot", "",
             f"{total['passed']} of {cases} cases passed ({100 * total['passed'] / max(cases, 1):.1f}%), "
             f"{total['failed']} failed, {total['errors']} errors, {total['skipped']} skipped.", "",
             "| test file | passed | failed | errors | skipped | run | s |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {rel} | {c['passed']} | {c['failed']} | {c['errors']} | {c['skipped']} | {status} | {s:.0f} |"
              for rel, c, status, s in rows]
    lines += ["", "## Commonest failure messages (digits as N)", ""]
    lines += [f"- {n} x `{m}`" for m, n in all_messages.most_common(40)]
    (out / "tilekernels-suite.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:3]))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--tests", type=Path, required=True)
    p.add_argument("--root", type=Path, default=Path("build/tilekernels"))
    r = sub.add_parser("run")
    r.add_argument("--root", type=Path, default=Path("build/tilekernels"))
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    r.add_argument("--workers", type=int, default=4)
    r.add_argument("--timeout", type=int, default=300, help="seconds per test file")
    r.add_argument("--deadline", type=float, default=3600, help="seconds for the whole run: files not "
                   "started by then are listed as not run")
    r.add_argument("files", nargs="*", help="test files relative to the root (tests/quant/test_x.py)")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.tests, args.root)
        return 0
    return run(args.root, args.out, args.workers, args.files, args.timeout, args.deadline)


if __name__ == "__main__":
    sys.exit(main())
