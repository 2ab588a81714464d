"""Stage 4: CUDA source -> cubin with nvcc, plus the compiler's resource report.

nvcc and the CUDA headers come from PyPI (``nvidia-cuda-nvcc``, ``nvidia-cuda-cccl``)
so a fresh machine needs no system CUDA; a system toolkit is used only when the
options name it. Cubins carry SASS for exactly one arch and no PTX: nothing is
JIT-compiled at run time.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tkc.arch import Arch
from tkc.errors import ToolchainError

# Fixed flags. No --use_fast_math: the quantization contract needs IEEE division
# (results must match torch bit for bit). C++20 is what TileLang's templates need.
FIXED_MTIME = 315532800  # 1980-01-01, the epoch the wheels use too
# No -lineinfo by default: the line table records nvcc's working folder and the include folders' absolute
# paths (the venv's), so cubins with it differ between machines. ``line_info`` (tkc build --lineinfo) adds it
# for profiling builds, whose cubins are then specific to the machine and folder they were built in.
NVCC_FLAGS = ("-cubin", "-std=c++20", "-O3", "-w", "-Xcudafe", "--diag_suppress=177", "-Xptxas", "-v")
LINE_INFO_FLAGS = ("-lineinfo",)
# What this module writes into a cache entry (the cubin, its resources): bump when that changes for the
# same source and flags, so that older entries are rebuilt (the flags and nvcc's version are keyed already).
FORMAT = 2


@dataclass(frozen=True, kw_only=True)
class Toolchain:
    """An nvcc and the include folders the kernels need."""

    nvcc: Path
    cuda_include: Path
    version: str  # nvcc's version, part of every cache key
    line_info: bool = False  # -lineinfo: source lines for profilers, machine-specific paths in the cubins

    @property
    def flags(self) -> tuple[str, ...]:
        """nvcc's flags for every kernel (part of every cache key)."""
        return NVCC_FLAGS + (LINE_INFO_FLAGS if self.line_info else ())

    @property
    def fingerprint(self) -> str:
        return f"nvcc {self.version}"


@dataclass(frozen=True, kw_only=True)
class Resources:
    """ptxas's report for one kernel symbol."""

    registers: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    static_smem: int


@dataclass(frozen=True, kw_only=True)
class CompiledKernel:
    cubin: bytes
    resources: dict[str, Resources]
    log: str


def _pypi_cuda_root() -> Path | None:
    try:
        import nvidia.cu13  # the namespace package of nvidia-cuda-nvcc >= 13
    except ImportError:
        return None
    for root in map(Path, nvidia.cu13.__path__):
        if (root / "bin" / "nvcc").is_file():
            return root
    return None


@functools.cache
def _nvcc_version(nvcc: Path) -> str:
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ToolchainError(f"{nvcc} --version failed: {exc}; reinstall with pip install -e '.[dev]'") from exc
    match = re.search(r"release [\d.]+, V([\d.]+)", out)
    return match.group(1) if match else out.strip().splitlines()[-1]


def find_toolchain(nvcc: str | None = None, *, line_info: bool = False) -> Toolchain:
    """The PyPI nvcc by default; ``nvcc="system"`` takes CUDA_HOME or PATH; else a path to nvcc."""
    if nvcc is None:
        root = _pypi_cuda_root()
        if root is None:
            raise ToolchainError("nvcc from PyPI is not installed; run pip install -e '.[dev]' (it brings "
                                 "nvidia-cuda-nvcc), or pass --nvcc system to use a system CUDA toolkit")
        path = root / "bin" / "nvcc"
    elif nvcc == "system":
        cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        found = Path(cuda_home) / "bin" / "nvcc" if cuda_home else None
        which = shutil.which("nvcc")
        path = found if found is not None and found.is_file() else Path(which) if which else Path()
        if not path.is_file():
            raise ToolchainError("--nvcc system: no nvcc under $CUDA_HOME/bin or on PATH; drop the option to use "
                                 "the nvcc from PyPI")
        root = path.resolve().parent.parent
    else:
        path = Path(nvcc)
        if not path.is_file():
            raise ToolchainError(f"--nvcc {nvcc}: no such file; give the path of an nvcc binary")
        root = path.resolve().parent.parent
    return Toolchain(nvcc=path, cuda_include=root / "include", version=_nvcc_version(path), line_info=line_info)


def include_dirs(toolchain: Toolchain) -> tuple[Path, ...]:
    """TileLang's device templates, CUTLASS (both shipped in the tilelang wheel) and the CUDA headers."""
    import tilelang.env as tl_env  # imported here: a fully cached build never pays TileLang's import

    includes = (Path(tl_env.TILELANG_TEMPLATE_PATH), Path(tl_env.CUTLASS_INCLUDE_DIR), toolchain.cuda_include)
    missing = [p for p in includes if not p.is_dir()]
    if missing:
        raise ToolchainError(f"include folder {missing[0]} is missing; reinstall tilelang and nvidia-cuda-cccl "
                             "(pip install -e '.[dev]')")
    return tuple(p.resolve() for p in includes)


def nvcc_command(toolchain: Toolchain, arch: Arch, source: Path, output: Path) -> list[str]:
    # cicc names internal-linkage symbols (libcu++'s customization-point objects, anything in an anonymous
    # namespace) after a hash of the source's absolute path, which nvcc passes it; the folder is a fresh
    # mkdtemp, so without the source's bare name in its place such cubins would differ from build to build.
    return [
        str(toolchain.nvcc), *toolchain.flags, "-Xcicc", "--orig_src_path_name", "-Xcicc", source.name,
        "-gencode", arch.gencode, *(f"-I{p}" for p in include_dirs(toolchain)), "-o", str(output), str(source),
    ]


_RES_RE = re.compile(
    r"Function properties for (?P<sym>\S+)\s*\n\s*(?P<stack>\d+) bytes stack frame, (?P<ss>\d+) bytes spill stores, "
    r"(?P<sl>\d+) bytes spill loads\s*\n.*?Used (?P<reg>\d+) registers(?P<rest>[^\n]*)",
    re.S,
)


def parse_ptxas(log: str) -> dict[str, Resources]:
    """Registers, stack, spills and static shared memory per kernel from ``ptxas -v``."""
    out = {}
    for m in _RES_RE.finditer(log):
        smem = re.search(r"(\d+) bytes smem", m.group("rest"))
        out[m.group("sym")] = Resources(
            registers=int(m.group("reg")), stack_bytes=int(m.group("stack")), spill_stores=int(m.group("ss")),
            spill_loads=int(m.group("sl")), static_smem=int(smem.group(1)) if smem else 0,
        )
    return out


def compile_cubin(cuda_source: str, arch: Arch, toolchain: Toolchain, *, name: str) -> CompiledKernel:
    """Compile one kernel's CUDA source for ``arch``.

    nvcc runs in a folder of its own (``mkdtemp``: made for this compile, private to the user, so no
    other user's symlink can redirect its files), with a relative source path. Without line info the
    cubin records neither that folder nor any include path, so the same inputs give the same cubin bytes
    on every machine, whatever its TMPDIR and wherever its venv.
    """
    workdir = Path(tempfile.mkdtemp(prefix="tkc-nvcc-"))
    try:
        (workdir / "kernel.cu").write_text(cuda_source)
        # A line table records the source's mtime too: pin it to the wheels' fixed epoch.
        os.utime(workdir / "kernel.cu", (FIXED_MTIME, FIXED_MTIME))
        cmd = nvcc_command(toolchain, arch, Path("kernel.cu"), Path("kernel.cubin"))
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise ToolchainError(f"nvcc failed for {name} ({arch.target}):\n{log.strip()[-4000:]}\n"
                                 f"command (in {workdir}): {' '.join(cmd)}")
        cubin = (workdir / "kernel.cubin").read_bytes()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return CompiledKernel(cubin=cubin, resources=parse_ptxas(log), log=log)


def cubin_target(cubin: bytes) -> str:
    """The arch a cubin was built for, read from the cubin itself ("sm_90a").

    The ELF header's e_flags hold the SM number (bits 8..15); the arch-specific
    suffix ("a") is only in the ptxas command line recorded in the
    ``.note.nv.tkinfo`` note, so both are read and must agree.
    """
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ToolchainError("not a 64-bit ELF cubin")
    (flags,) = struct.unpack_from("<I", cubin, 0x30)
    sm = (flags >> 8) & 0xFF
    note = re.search(rb"-arch (sm_(\d+)[af]?)", cubin)
    if note is None:
        return f"sm_{sm}"
    if int(note.group(2)) != sm:
        raise ToolchainError(f"cubin ELF header says sm_{sm} but its note says {note.group(1).decode()}")
    return note.group(1).decode()


# Several variants' sources in one translation unit: nvcc parses the headers every kernel includes (85-88% of a
# lone variant's compile) once for the unit, then each kernel's PTX goes through ptxas alone, so every variant
# keeps a cubin of its own, the same bytes as its own nvcc run wherever cicc treats the kernel the same beside
# its unit-mates. The unit's members are a function of the build plan, never of what happened to miss the cache.
UNIT_SIZE = 16
# TileLang's prologue: the headers of a lowered kernel. Members with the same prologue share a unit's nvcc run.
_PROLOGUE = re.compile(r"^#if defined\(_MSC_VER\).*?^#ifdef ENABLE_BF16\n.*?^#endif\n", re.S | re.M)
_KERNEL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(')
_EXTERN_SHARED = re.compile(r"extern __shared__ [^;]*?(\w+)\[\];")
_MARK = "tkcunit"  # member i's namespace is tkcunit<i>, its kernels and extern shared arrays <name>__tkcunit<i>
_OWNER = re.compile(_MARK + r"(\d+)")
_NUMBERED = re.compile(r"(\$L__BB|__local_depot)(\d+)")  # per-function label and depot numbers in a module


@dataclass(frozen=True, kw_only=True)
class UnitMember:
    name: str  # the variant id, for messages
    cuda_source: str


def compile_unit(members: list[UnitMember], arch: Arch, toolchain: Toolchain) -> list[CompiledKernel]:
    """Compile lowered kernels of one arch, a cubin each, with one nvcc front end per group of equal prologues.

    A group nvcc cannot take together (a body that needs the global namespace, a PTX symbol two members claim)
    is compiled member by member instead, each member then its lone compile's cubin.
    """
    out: dict[int, CompiledKernel] = {}
    groups: dict[str, list[int]] = {}
    for i, member in enumerate(members):
        found = _PROLOGUE.search(member.cuda_source)
        if found is None or toolchain.line_info:  # a line table would name the unit's source lines
            out[i] = compile_cubin(member.cuda_source, arch, toolchain, name=member.name)
        else:
            groups.setdefault(found.group(0), []).append(i)
    for prologue, indices in groups.items():
        compiled = _compile_group(prologue, [members[i] for i in indices], arch, toolchain) \
            if len(indices) > 1 else None
        for n, i in enumerate(indices):
            out[i] = compiled[n] if compiled is not None else \
                compile_cubin(members[i].cuda_source, arch, toolchain, name=members[i].name)
    return [out[i] for i in range(len(members))]


def _compile_group(prologue: str, members: list[UnitMember], arch: Arch,
                   toolchain: Toolchain) -> list[CompiledKernel] | None:
    """One ``nvcc -ptx`` over the members (each in a namespace, its unmangled symbols renamed), then ptxas on each
    member's part of the PTX with its names put back; None where the group cannot be compiled as one."""
    bodies, renamed = [], []
    for i, member in enumerate(members):
        prologue_at = member.cuda_source.index(prologue)
        body = member.cuda_source[:prologue_at] + member.cuda_source[prologue_at + len(prologue):]
        if _MARK in body:
            return None
        names = sorted(set(_KERNEL.findall(body)) | set(_EXTERN_SHARED.findall(body)))
        for name in names:
            body = re.sub(rf"\b{name}\b", f"{name}__{_MARK}{i}", body)
        bodies.append(f"namespace {_MARK}{i} {{\n{body}\n}}\n")
        renamed.append(names)
    workdir = Path(tempfile.mkdtemp(prefix="tkc-nvcc-"))
    try:
        # The unit is named kernel.cu like a lone variant's source: cicc names internal symbols after it.
        (workdir / "kernel.cu").write_text(prologue + "".join(bodies))
        cmd = nvcc_command(toolchain, arch, Path("kernel.cu"), Path("kernel.ptx"))
        cmd[cmd.index("-cubin")] = "-ptx"
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir)
        if proc.returncode != 0:
            return None
        parts = _split_ptx((workdir / "kernel.ptx").read_text(), len(members))
        if parts is None:
            return None
        compiled = []
        for i, part in enumerate(parts):
            for name in renamed[i]:
                part = re.sub(rf"\b{name}__{_MARK}{i}(?!\d)", name, part)
            kernel = _ptxas(_renumber(part), arch, toolchain, workdir=workdir)
            if kernel is None:
                return None
            compiled.append(kernel)
        return compiled
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _renumber(ptx: str) -> str:
    """Labels and local depots carry their function's index in the module: counted again from 0 in a part."""
    order: dict[str, int] = {}
    return _NUMBERED.sub(lambda m: f"{m.group(1)}{order.setdefault(m.group(2), len(order))}", ptx)


def _split_ptx(ptx: str, count: int) -> list[str] | None:
    """Each member's module: the header, the items it owns, and the items no member owns that it uses (or that
    none uses: the headers' own globals, which a lone compile keeps too). Comments dropped: ptxas ignores them."""
    lines = [line for line in ptx.split("\n") if not line.lstrip().startswith("//")]
    start = next((n + 1 for n, line in enumerate(lines) if line.startswith(".address_size")), None)
    if start is None:
        return None
    header = "\n".join(lines[:start]) + "\n"
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for line in lines[start:]:
        current.append(line)
        depth += line.count("{") - line.count("}")
        if depth == 0 and (line.strip() in ("", "}") or line.rstrip().endswith(";")):
            items.append("\n".join(current))
            current = []
    if depth != 0:
        return None
    items.append("\n".join(current))
    owners = [{int(n) for n in _OWNER.findall(item)} for item in items]
    if any(len(o) > 1 for o in owners):
        return None
    declared = [re.search(r"(\w+)(?:\[\d*\])?\s*(?:=[^;]*)?;\s*$", item) if not o and item.strip() else None
                for item, o in zip(items, owners)]
    used_by: list[set[int]] = []
    for match in declared:
        users = set()
        if match is not None:
            word = re.compile(rf"\b{re.escape(match.group(1))}\b")
            users = {next(iter(o)) for item, o in zip(items, owners) if o and word.search(item)}
        used_by.append(users)
    parts = []
    for i in range(count):
        kept = [item for item, o, users in zip(items, owners, used_by)
                if o == {i} or (not o and (not users or i in users))]
        parts.append(header + "\n".join(kept) + "\n")
    return parts


def _ptxas(ptx: str, arch: Arch, toolchain: Toolchain, *, workdir: Path) -> CompiledKernel | None:
    """ptxas as nvcc calls it for the flags tkc uses (-w, -Xptxas -v); None where it fails (the member's lone
    compile then reports the error, naming it)."""
    (workdir / "part.ptx").write_text(ptx)
    cmd = [str(toolchain.nvcc.parent / "ptxas"), "-w", f"-arch={arch.target}", "-m64", "-v", "part.ptx",
           "-o", "part.cubin"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        return None
    return CompiledKernel(cubin=(workdir / "part.cubin").read_bytes(), resources=parse_ptxas(log), log=log)
