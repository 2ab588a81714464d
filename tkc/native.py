"""Stage 5, host side: the loader's compiled launch module (``tkc/runtime/_launch.c``).

The generated loader launches through one C call of ``_launch.launch`` instead of a
ctypes foreign call plus argument packing, about 2 µs less per launch on the H200's
host. The module uses CPython's stable ABI (``Py_LIMITED_API`` 3.10), so one build serves
every CPython from 3.10 on, and it links against nothing else (the loader hands it the
driver's entry points), so building it needs only a C compiler and ``Python.h``: no CUDA.

It is optional. Where ``Python.h`` or a C compiler is missing, ``build_launch_module``
says why and the package is built without it: a pure wheel whose loader launches
through ctypes, correct but slower per call.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tkc.fsutil import write_atomic

SOURCE = Path(__file__).parent / "runtime" / "_launch.c"
FILENAME = "_launch.abi3.so"
# The stable-ABI floor the source declares (Py_LIMITED_API 0x030A0000) as a wheel tag.
ABI_TAG = "cp310-abi3"
# -O2 -fPIC -shared: a position-independent shared object. No -g: no build paths in the binary,
# so the same source and compiler give the same bytes (the wheel stays reproducible).
CFLAGS = ("-O2", "-fPIC", "-shared", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror")


@dataclass(frozen=True, kw_only=True)
class LaunchModule:
    """The compiled module, or why there is none."""

    data: bytes | None
    compiler: str  # the compiler's first --version line, or "" when none was found
    reason: str = ""  # why data is None


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name:
            found = shutil.which(name)
            if found:
                return found
    return None


def build_launch_module(cache: Path) -> LaunchModule:
    """Compile ``_launch.c`` for this host (cached under ``cache/launch/``), or say why it cannot be."""
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        return LaunchModule(data=None, compiler="", reason=(
            f"no Python.h under {include}: install this Python's development headers (Debian/Ubuntu: "
            "apt install python3-dev) for the faster compiled launch path"))
    cc = _compiler()
    if cc is None:
        return LaunchModule(data=None, compiler="", reason=(
            "no C compiler (cc, gcc or clang; or $CC) on PATH: install one for the faster compiled launch path"))
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    compiler = version[0].strip() if version else Path(cc).name
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, compiler.encode(), str(include).encode(), " ".join(CFLAGS).encode()]))
    cached = cache / "launch" / f"{key.hexdigest()[:32]}.so"
    if cached.is_file():
        return LaunchModule(data=cached.read_bytes(), compiler=compiler)
    with tempfile.TemporaryDirectory(prefix="tkc-launch-") as tmp:
        # Compiled in a scratch folder under fixed names, so nothing path-dependent ends up in the binary.
        shutil.copyfile(SOURCE, Path(tmp) / "_launch.c")
        proc = subprocess.run([cc, *CFLAGS, f"-I{include}", "_launch.c", "-o", FILENAME], cwd=tmp,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            return LaunchModule(data=None, compiler=compiler, reason=(
                f"{cc} could not compile {SOURCE.name}:\n{(proc.stdout + proc.stderr)[-2000:]}"))
        data = (Path(tmp) / FILENAME).read_bytes()
    write_atomic(cached, data)
    return LaunchModule(data=data, compiler=compiler)
