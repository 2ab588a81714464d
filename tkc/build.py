"""The build: specs -> (render, lower, compile) per variant and arch, cached -> one wheel per arch.

Each (variant, arch) has a key, a content hash of everything that decides its
lowering: the rendered TileLang source, pass configs, arch, nvcc flags, the
TileLang and nvcc versions, and the formats of tkc's lower and compile stages.
Variants compile in units (``units_of``: up to ``UNIT_SIZE`` of one spec kernel
and arch, one nvcc front end for all of them, a cubin each), so a cache entry
(cubin, contract, resources) is keyed over its whole unit, and the lowered
sources are kept apart under their own keys (``cache/lowered``): a unit whose
entries are gone is compiled again without TileLang. A hit reads the entry and
calls neither TileLang nor nvcc. Misses run in a process pool (``jobs``); every
entry is written to a temp folder and renamed into place, so an interrupted
build leaves no half-written entry.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import tkc.compile
import tkc.lower
from tkc.arch import Arch
from tkc.compile import UNIT_SIZE, Resources, Toolchain, compile_unit, cubin_target, find_toolchain
from tkc.errors import PackageError, ToolchainError, UsageError
from tkc.fsutil import sha256_bytes, write_atomic
from tkc.lower import (
    KernelArg,
    Launch,
    LaunchContract,
    ScalarParam,
    SizeSource,
    TensorParam,
    TmaDescriptor,
    lower,
)
from tkc.native import build_launch_module
from tkc.package import BuiltVariant, PackageResult, write_multi_arch_package, write_package
from tkc.render import RenderedKernel, render
from tkc.spec import SpecSet, Variant, expand

CACHE_FORMAT = 1  # bump when the layout of a cache entry changes


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """Everything a build reads; made once by the CLI (nothing else reads the environment)."""

    specs: SpecSet
    templates: Path
    build_dir: Path
    dist_dir: Path
    archs: tuple[Arch, ...]
    jobs: int = 1
    nvcc: str | None = None  # None: nvcc from PyPI; "system": CUDA_HOME / PATH; else a path
    line_info: bool = False  # nvcc -lineinfo (profiling builds; their cubins name this machine's folders)
    kernels: tuple[str, ...] = ()  # only these spec kernels (tkc build --kernel); empty: all of them
    multi_arch: bool = False  # one wheel holding every arch's cubins (tkc build --multi-arch), not one per arch


@dataclass(frozen=True, kw_only=True)
class ArchSummary:
    arch: Arch
    variants: int
    compiled: int
    cached: int
    seconds: float  # TileLang + nvcc time spent on this arch's variants (summed over workers)
    wheel: Path
    wheel_bytes: int
    native_launch_missing: str = ""  # why the package has no compiled launch module (it launches through ctypes)


@dataclass(frozen=True, kw_only=True)
class LowerJob:
    """One (variant, arch) to lower into the lowered store; picklable for the process pool."""

    rendered: RenderedKernel
    lowered: Path  # cache/lowered/<key[:2]>/<key>: its CUDA source and launch contract


@dataclass(frozen=True, kw_only=True)
class UnitEntry:
    """A variant of a compile unit: where its lowered source and its cache entry go."""

    rendered: RenderedKernel
    key: str  # cache_key: what its lowering depends on
    lowered: Path
    entry: Path  # its cache entry, keyed over the whole unit (its cubin depends on its unit-mates)


@dataclass(frozen=True, kw_only=True)
class UnitJob:
    """The lowered members of one compile unit to compile into their cache entries."""

    members: tuple[UnitEntry, ...]  # all of them, in unit order: each cubin depends on the others
    misses: int  # how many of their entries are missing (the others are kept as they are)
    toolchain: Toolchain

    @property
    def arch(self) -> Arch:
        return self.members[0].rendered.arch


@functools.cache
def tilelang_version() -> str:
    return importlib.metadata.version("tilelang")


def cache_key(rendered: RenderedKernel, toolchain: Toolchain) -> str:
    """The cache entry of a variant: a digest of everything that makes its cubin (its rendered module's text)."""
    return _key(rendered, toolchain, lambda text: text)


def _code(text: str) -> str:
    """A Python module as its syntax tree: what TileLang builds the kernel from, without comments or layout (the
    docstrings stay: they are part of the tree)."""
    return hashlib.sha256(ast.dump(ast.parse(text), include_attributes=False).encode()).hexdigest()


def code_key(rendered: RenderedKernel, toolchain: Toolchain) -> str:
    """``cache_key`` with the rendered module and its helpers as their syntax trees: two variants with one code key
    lower to the same kernel, so an edit of a template's comments or layout reuses the entries built before it
    (``cache/code/``) instead of lowering and compiling its variants again."""
    return _key(rendered, toolchain, _code)


def _key(rendered: RenderedKernel, toolchain: Toolchain, text: Callable[[str], str]) -> str:
    spec = rendered.variant.kernel
    # The shared helper modules the rendered source imports are part of its source; a variant without helpers
    # keys as it did before helpers existed.
    helpers = {"helpers": {h.module: text(h.source) for h in rendered.helpers}} if rendered.helpers else {}
    material = json.dumps({
        **helpers,
        "format": CACHE_FORMAT,
        "source": text(rendered.source),
        "pass_configs": [list(p) for p in spec.pass_configs],
        "arch": rendered.arch.target,
        "gencode": rendered.arch.gencode,
        "nvcc_flags": list(toolchain.flags),
        "nvcc": toolchain.version,
        "tilelang": tilelang_version(),
        # What the two stages write into an entry, by version (not their source: a comment or a refactor of
        # tkc/lower.py or tkc/compile.py must not rebuild the catalog).
        "lower": tkc.lower.FORMAT,
        "compile": tkc.compile.FORMAT,
    }, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def _contract_from_json(data: dict) -> LaunchContract:
    params = tuple(ScalarParam(**p) if "shape" not in p else
                   TensorParam(**{**p, "shape": tuple(p["shape"]), "strides": tuple(p["strides"])})
                   for p in data["params"])
    return LaunchContract(
        params=params,
        sizes=tuple(SizeSource(**s) for s in data["sizes"]),
        tma=tuple(TmaDescriptor(**{k: tuple(v) if isinstance(v, list) else v for k, v in t.items()})  # type: ignore[arg-type]
                  for t in data["tma"]),
        launches=tuple(Launch(**{
            **launch, "args": tuple(KernelArg(**a) for a in launch["args"]), "grid": tuple(launch["grid"]),
            "block": tuple(launch["block"]), "cluster": tuple(launch["cluster"]) if launch["cluster"] else None,
        }) for launch in data["launches"]),
    )


def check_cubin(cubin: bytes, arch: Arch, contract: LaunchContract) -> str | None:
    """What is wrong with a cubin for ``arch`` that should hold the contract's kernels, or None: an ELF of the
    arch's target (header and ptxas note agree) with every launched kernel's symbol in its string table."""
    try:
        target = cubin_target(cubin)
    except (ToolchainError, struct.error) as exc:
        return f"not a cubin: {exc}"
    if target != arch.target:
        return f"a cubin for {target}, not {arch.target}"
    missing = [launch.symbol for launch in contract.launches if launch.symbol.encode() + b"\0" not in cubin]
    return f"no kernel {missing[0]} in it" if missing else None


def meta_sha256(data: dict) -> str:
    """The sha256 a cache entry's meta.json records of its own other fields (contract, resources, the cubin's
    sha256), over their canonical JSON: an edit of any of them shows."""
    return sha256_bytes(json.dumps({k: v for k, v in data.items() if k != "meta_sha256"}, sort_keys=True).encode())


def read_entry(entry: Path, arch: Arch | None = None) -> tuple[bytes, LaunchContract, dict[str, Resources]] | None:
    """A complete, intact cache entry, or None (no entry); ToolchainError for a damaged one.

    Intact: meta.json parses and has the sha256 it records of its fields (contract, resources), the cubin
    has the sha256 meta.json records for it, and (given ``arch``) the cubin passes ``check_cubin``: an ELF of
    the arch with the contract's kernels. Entries written before the hashes were recorded get them here,
    once their cubin passes ``check_cubin`` for ``arch``. A folder without meta.json is a damaged entry too
    (entries are renamed into place whole, so none is ever seen half-written).
    """
    meta = entry / "meta.json"
    if not meta.is_file():
        if entry.exists():
            raise ToolchainError(f"cache entry {entry}: no meta.json")
        return None
    try:
        data = json.loads(meta.read_text())
        contract = _contract_from_json(data["contract"])
        resources = {k: Resources(**v) for k, v in data["resources"].items()}
        cubin = (entry / "kernel.cubin").read_bytes()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ToolchainError(f"cache entry {entry}: unreadable ({type(exc).__name__}: {exc})") from None
    recorded, recorded_meta = data.get("cubin_sha256"), data.get("meta_sha256")
    if recorded is not None and sha256_bytes(cubin) != recorded:
        raise ToolchainError(f"cache entry {entry}: kernel.cubin does not have the sha256 its meta.json records")
    if recorded_meta is not None and meta_sha256(data) != recorded_meta:
        raise ToolchainError(f"cache entry {entry}: meta.json (its contract or resources) does not have the sha256 "
                             "it records; it was edited")
    problem = check_cubin(cubin, arch, contract) if arch is not None else \
        None if recorded is not None and recorded_meta is not None else "no recorded sha256"
    if problem is not None:
        raise ToolchainError(f"cache entry {entry}: {problem}")
    if recorded is None or recorded_meta is None:
        data = {**data, "cubin_sha256": sha256_bytes(cubin)}
        write_atomic(meta, json.dumps({**data, "meta_sha256": meta_sha256(data)}, indent=1, sort_keys=True))
    return cubin, contract, resources


def _intact(entry: Path, arch: Arch) -> bool:
    """Whether ``entry`` is a usable cache hit; a damaged one is removed, with a warning naming it."""
    try:
        return read_entry(entry, arch) is not None
    except ToolchainError as exc:
        print(f"tkc: {exc}; rebuilding it", file=sys.stderr)
        shutil.rmtree(entry, ignore_errors=True)
        return False


def unit_keys(keys: list[str]) -> list[str]:
    """The entry keys of a unit's members from their own keys (``cache_key``, or ``code_key`` for the code index):
    each over the whole unit in order, as nvcc sees it. A unit of one keys its entry by its own key."""
    if len(keys) == 1:
        return keys
    return [hashlib.sha256(json.dumps({"unit": keys, "member": i}).encode()).hexdigest() for i in range(len(keys))]


def units_of(work: list[tuple[Variant, Arch]], size: int = UNIT_SIZE) -> list[list[tuple[Variant, Arch]]]:
    """The compile units of the work: each spec kernel's variants of an arch, in id order, dealt into
    ceil(n / size) units. A function of the plan only, so that an incremental build compiles every variant beside
    the unit-mates a clean build gives it (its cubin can depend on them) and a shard takes whole units."""
    by_kernel: dict[tuple[str, str], list[tuple[Variant, Arch]]] = {}
    for variant, arch in work:
        by_kernel.setdefault((arch.name, variant.kernel.name), []).append((variant, arch))
    units = []
    for group in by_kernel.values():
        group.sort(key=lambda w: w[0].id)
        count = -(-len(group) // size)
        units += [group[i::count] for i in range(count)]
    return units


def read_lowered(lowered: Path) -> tuple[str, LaunchContract] | None:
    """A variant's lowered CUDA source and contract from the lowered store, or None (absent or damaged)."""
    try:
        data = json.loads((lowered / "contract.json").read_text())
        source = (lowered / "kernel.cu").read_text()
        if sha256_bytes(source.encode()) != data["cuda_sha256"]:
            return None
        return source, _contract_from_json(data["contract"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_lowered(lowered: Path, source: str, contract: LaunchContract) -> None:
    def fill(tmp: Path) -> None:
        (tmp / "kernel.cu").write_text(source)
        data = {"contract": dataclasses.asdict(contract), "cuda_sha256": sha256_bytes(source.encode())}
        (tmp / "contract.json").write_text(json.dumps(data, indent=1, sort_keys=True))

    _install(lowered, fill, marker="contract.json")


def run_lower(job: LowerJob) -> float:
    """Lower one variant into the lowered store; returns the seconds spent. Runs in a worker."""
    start = time.perf_counter()
    lowered = lower(job.rendered, job.rendered.arch)
    _write_lowered(job.lowered, lowered.cuda_source, lowered.contract)
    return time.perf_counter() - start


def run_unit(job: UnitJob) -> float:
    """Compile a unit's lowered members into their cache entries; returns the seconds spent. Runs in a worker."""
    start = time.perf_counter()
    lowered = []
    for m in job.members:
        found = read_lowered(m.lowered)
        if found is None:
            raise ToolchainError(f"the lowered source of {m.rendered.variant.id} ({job.arch.name}) at {m.lowered} "
                                 "vanished or was damaged during the build; run the build again")
        lowered.append(found)
    try:
        compiled = compile_unit([tkc.compile.UnitMember(name=m.rendered.variant.id, cuda_source=source)
                                 for m, (source, _) in zip(job.members, lowered)], job.arch, job.toolchain)
    except FileNotFoundError as exc:
        names = ", ".join(m.rendered.variant.id for m in job.members)
        raise ToolchainError(f"nvcc exited 0 for {names} ({job.arch.target}) without writing "
                             f"{Path(exc.filename or 'kernel.cubin').name}; check the nvcc at "
                             f"{job.toolchain.nvcc}") from None
    unit = [m.rendered.variant.id for m in job.members]
    for m, (source, contract), result in zip(job.members, lowered, compiled):
        problem = check_cubin(result.cubin, job.arch, contract)
        if problem is not None:
            raise ToolchainError(f"nvcc gave no usable cubin for {m.rendered.variant.id} ({job.arch.target}): "
                                 f"{problem}; check the nvcc at {job.toolchain.nvcc}")
        _install(m.entry, functools.partial(_fill_entry, m, job.arch, source, contract, result, unit))
    return time.perf_counter() - start


def _fill_entry(member: UnitEntry, arch: Arch, source: str, contract: LaunchContract,
                compiled: tkc.compile.CompiledKernel, unit: list[str], tmp: Path) -> None:
    (tmp / "kernel.cu").write_text(source)
    (tmp / "kernel.cubin").write_bytes(compiled.cubin)
    (tmp / "ptxas.log").write_text(compiled.log)
    meta = {
        "variant": member.rendered.variant.id, "arch": arch.name, "unit": unit,
        "contract": dataclasses.asdict(contract), "cubin_sha256": sha256_bytes(compiled.cubin),
        "resources": {k: dataclasses.asdict(v) for k, v in compiled.resources.items()},
    }
    # Through JSON first: the hash is of what a reader parses (tuples become lists).
    meta = json.loads(json.dumps(meta))
    (tmp / "meta.json").write_text(json.dumps({**meta, "meta_sha256": meta_sha256(meta)}, indent=1, sort_keys=True))


def _install(entry: Path, fill: Callable[[Path], object], marker: str = "meta.json") -> None:
    """Make ``entry`` the folder ``fill`` writes, atomically: filled beside it, then renamed into place (a folder
    another build renamed there first is kept)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}."))
    try:
        fill(tmp)
        try:
            os.replace(tmp, entry)
        except OSError:
            if not (entry / marker).is_file():  # another build put it there first: keep theirs
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _pool(jobs: int) -> Iterator[ProcessPoolExecutor | None]:
    if jobs <= 1:
        yield None
        return
    # spawn, not fork: TileLang and torch hold threads and CUDA state that fork does not copy safely.
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        yield pool


def plan(options: BuildOptions) -> list[tuple[Variant, Arch]]:
    """Every (variant, arch) the build makes, in spec order (of the kernels ``options.kernels`` names, if any)."""
    wanted = {options.specs.kernel(name).name for name in options.kernels}  # SpecError naming an unknown one
    kernels = [k for k in options.specs.kernels if not wanted or k.name in wanted]
    for arch in options.archs:
        if not any(arch.name in k.archs for k in kernels):
            declared = sorted({a for k in kernels for a in k.archs})
            raise UsageError(f"--arch {arch.name}: no kernel to build declares {arch.name} (their archs: name "
                             f"{', '.join(declared)}); add {arch.name} to the archs: of the kernels to build for it, "
                             "or leave it out of --arch")
    return [(v, arch) for arch in options.archs for k in kernels if arch.name in k.archs for v in expand(k)]


def shard_of(work: list[tuple[Variant, Arch]], index: int, count: int) -> list[tuple[Variant, Arch]]:
    """Shard ``index`` (1-based) of ``count``: whole compile units (no two shards lower and compile the same one),
    the largest first, each to the shard with the fewest variants so far (the lowest index on a tie).

    Units sorted by (size, arch, kernel, first variant id) first make the split independent of spec file
    order; the shards then differ by at most one unit's variants.
    """
    if not 1 <= index <= count:
        raise UsageError(f"--shard {index}/{count}: the shard index must be between 1 and {count}")
    ordered = sorted(units_of(work), key=lambda u: (-len(u), u[0][1].name, u[0][0].kernel.name, u[0][0].id))
    shards: list[list[tuple[Variant, Arch]]] = [[] for _ in range(count)]
    for unit in ordered:
        min(shards, key=len).extend(unit)
    return shards[index - 1]


@dataclass(frozen=True, kw_only=True)
class _Compiled:
    entries: dict[tuple[str, str], Path]  # (variant id, arch) -> cache entry
    hits: dict[tuple[str, str], bool]
    seconds: dict[str, float]


def _compile(options: BuildOptions, work: list[tuple[Variant, Arch]], toolchain: Toolchain,
             progress: Callable[[int], None] | None, cached_only: bool = False) -> _Compiled:
    """Render everything, then lower the misses' units and compile them (in a pool when jobs > 1): a unit's
    compile starts once its last member is lowered."""
    cache = options.build_dir / "cache"
    lower_jobs: list[LowerJob] = []
    lowering: set[Path] = set()
    unit_jobs: list[UnitJob] = []
    indexed: list[tuple[Path, str]] = []  # (code index, the entry key it names), written once the entries exist
    hits: dict[tuple[str, str], bool] = {}
    entries: dict[tuple[str, str], Path] = {}
    seconds: dict[str, float] = {arch.name: 0.0 for arch in options.archs}
    # A line table records the unit's source lines: such variants compile alone.
    for unit in units_of(work, 1 if toolchain.line_info else UNIT_SIZE):
        arch = unit[0][1]
        rendered = [render(variant, arch, options.templates, options.build_dir / "src") for variant, _ in unit]
        keys = [cache_key(r, toolchain) for r in rendered]
        members = [UnitEntry(rendered=r, key=k, lowered=cache / "lowered" / k[:2] / k, entry=cache / e[:2] / e)
                   for r, k, e in zip(rendered, keys, unit_keys(keys))]
        unit_hits = [_intact(m.entry, arch) for m in members]
        # The syntax trees cost some 20 ms a variant: taken for misses, and once for entries built before the
        # index existed.
        if not toolchain.line_info and not all(hit and (cache / "code" / "indexed" / m.entry.name).is_file()
                                               for hit, m in zip(unit_hits, members)):
            codes = unit_keys([code_key(r, toolchain) for r in rendered])
            for n, (m, code) in enumerate(zip(members, codes)):
                index = cache / "code" / code
                unit_hits[n] = unit_hits[n] or _reuse(index, cache, m.entry, arch)
                indexed.append((index, m.entry.name))
        for (variant, _), m, hit in zip(unit, members, unit_hits):
            hits[(variant.id, arch.name)] = hit
            entries[(variant.id, arch.name)] = m.entry
        if progress and any(unit_hits):
            progress(sum(unit_hits))
        if not all(unit_hits):
            unit_jobs.append(UnitJob(members=tuple(members), misses=unit_hits.count(False), toolchain=toolchain))
            for m in members:
                if m.lowered not in lowering and not _lowered_here(m, cache, arch):
                    lowering.add(m.lowered)
                    lower_jobs.append(LowerJob(rendered=m.rendered, lowered=m.lowered))
    if cached_only and unit_jobs:
        missing = [f"{variant} ({arch})" for (variant, arch), hit in hits.items() if not hit]
        raise UsageError(f"{len(missing)} variants are in none of the merged shards (e.g. {', '.join(missing[:5])}); "
                         "merge the outputs of every shard (tkc build --shard I/N for I = 1..N) built from the same "
                         "specs, templates and toolchain")
    _run(options.jobs, lower_jobs, unit_jobs, seconds, progress)
    for index, key in indexed:
        if not index.is_file():
            index.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(index, key)
        marker = cache / "code" / "indexed" / key
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(marker, index.name)
    return _Compiled(entries=entries, hits=hits, seconds=seconds)


def _lowered_here(member: UnitEntry, cache: Path, arch: Arch) -> bool:
    """Whether the member's lowered source is in the lowered store, taking it from an entry of its own key (a unit
    of one, or a build before units) when only that has it."""
    if read_lowered(member.lowered) is not None:
        return True
    own = cache / member.key[:2] / member.key
    if own == member.entry:
        return False
    try:
        found = read_entry(own, arch)
    except ToolchainError:  # a damaged entry of its own key: lowered again, and the entry left to its build
        return False
    if found is None:
        return False
    _write_lowered(member.lowered, (own / "kernel.cu").read_text(), found[1])
    return True


def _run(jobs: int, lower_jobs: list[LowerJob], unit_jobs: list[UnitJob], seconds: dict[str, float],
         progress: Callable[[int], None] | None) -> None:
    """Lower the variants in unit order and compile each unit as soon as its last member is lowered: at most
    ``jobs`` at a time, a unit ready to compile first, so that units finish (and progress moves) from the start."""
    lowering = {job.lowered for job in lower_jobs}
    waiting = {id(unit): {m.lowered for m in unit.members} & lowering for unit in unit_jobs}
    units_needing: dict[Path, list[UnitJob]] = {}
    for unit in unit_jobs:
        for lowered in waiting[id(unit)]:
            units_needing.setdefault(lowered, []).append(unit)
    ready = deque(unit for unit in unit_jobs if not waiting[id(unit)])
    queue = deque(lower_jobs)

    def next_job() -> LowerJob | UnitJob | None:
        return ready.popleft() if ready else queue.popleft() if queue else None

    def finished(job: LowerJob | UnitJob, spent: float) -> None:
        if isinstance(job, UnitJob):
            seconds[job.arch.name] += spent
            if progress:
                progress(job.misses)
            return
        seconds[job.rendered.arch.name] += spent
        for unit in units_needing.get(job.lowered, ()):
            waiting[id(unit)].discard(job.lowered)
            if not waiting[id(unit)]:
                ready.append(unit)

    def run(job: LowerJob | UnitJob) -> Callable[..., float]:  # a module's function: the pool pickles it
        return run_unit if isinstance(job, UnitJob) else run_lower

    with _pool(jobs) as pool:
        if pool is None:
            while (job := next_job()) is not None:
                finished(job, run(job)(job))
            return
        futures: dict[Future, LowerJob | UnitJob] = {}
        while True:
            while len(futures) < jobs and (job := next_job()) is not None:
                futures[pool.submit(run(job), job)] = job
            if not futures:
                return
            done, _ = wait(futures, return_when=FIRST_COMPLETED)
            for future in done:
                job = futures.pop(future)
                try:
                    spent = future.result()
                except BrokenProcessPool:
                    names = [job.rendered.variant.id] if isinstance(job, LowerJob) else \
                        [m.rendered.variant.id for m in job.members]
                    arch = job.rendered.arch.name if isinstance(job, LowerJob) else job.arch.name
                    raise ToolchainError(f"a build worker died (killed, or out of memory) while building "
                                         f"{', '.join(names)} ({arch}); the variants built so far are cached: run "
                                         "the build again, with a smaller -j if memory is short") from None
                finished(job, spent)


def _reuse(index: Path, cache: Path, entry: Path, arch: Arch) -> bool:
    """Whether ``entry`` could be made a copy of the intact entry that ``index`` names (one built from the same
    code); a missing or damaged one is no hit."""
    try:
        key = index.read_text().strip()
    except OSError:
        return False
    if not (len(key) == 64 and all(c in "0123456789abcdef" for c in key)):
        return False
    source = cache / key[:2] / key
    if source == entry or not _intact(source, arch):
        return False
    _install(entry, lambda tmp: shutil.copytree(source, tmp, dirs_exist_ok=True))
    return _intact(entry, arch)


@contextmanager
def _file_errors(options: BuildOptions) -> Iterator[None]:
    """An OSError of the build's own files (a full or read-only build folder, a file where a folder goes) as a
    PackageError naming the file and the fix, not a traceback."""
    try:
        yield
    except OSError as exc:
        where = exc.filename or options.build_dir
        raise PackageError(f"{where}: {exc.strerror or exc}; the build could not write its files: free space, or "
                           f"pick writable --build-dir and --dist folders (now {options.build_dir} and "
                           f"{options.dist_dir})") from exc  # (--debug shows where)


def build(options: BuildOptions, progress: Callable[[int], None] | None = None,
          cached_only: bool = False) -> list[ArchSummary]:
    """Build every variant for every arch and one wheel per arch; ``progress(n)`` after each n variants.

    ``cached_only`` (used by ``merge``) refuses to lower or compile anything: every
    variant must already be in the cache.
    """
    with _file_errors(options):
        return _build(options, progress, cached_only)


def _build(options: BuildOptions, progress: Callable[[int], None] | None, cached_only: bool) -> list[ArchSummary]:
    toolchain = find_toolchain(options.nvcc, line_info=options.line_info)
    work = plan(options)
    compiled = _compile(options, work, toolchain, progress, cached_only=cached_only)
    toolchain_info = {"nvcc": toolchain.version, "tilelang": tilelang_version(),
                      "nvcc_flags": " ".join(toolchain.flags)}
    launch_module = build_launch_module(options.build_dir / "cache")
    if launch_module.data is not None:
        toolchain_info["host_cc"] = launch_module.compiler
    by_arch: dict[Arch, list[BuiltVariant]] = {}
    for arch in options.archs:
        built = by_arch.setdefault(arch, [])
        for variant, a in work:
            if a != arch:
                continue
            found = read_entry(compiled.entries[(variant.id, arch.name)], arch)
            assert found is not None, f"cache entry of {variant.id} ({arch.name}) vanished during the build"
            cubin, contract, resources = found
            built.append(BuiltVariant(variant=variant, arch=arch, cubin=cubin, contract=contract,
                                      resources=resources, cached=compiled.hits[(variant.id, arch.name)]))
    packages = options.build_dir / "pkg" / options.specs.package.name
    multi: PackageResult | None = None
    if options.multi_arch:  # one project and wheel for all archs; the summary still has a row per arch
        multi = write_multi_arch_package(options.specs, options.archs, [b for a in options.archs for b in by_arch[a]],
                                         packages / "-".join(a.name for a in options.archs), options.dist_dir,
                                         toolchain_info, launch_module, options.build_dir / "cache" / "packs")
    summaries = []
    for arch, built in by_arch.items():
        result: PackageResult = multi or write_package(options.specs, arch, built, packages / arch.name,
                                                       options.dist_dir, toolchain_info, launch_module,
                                                       options.build_dir / "cache" / "packs")
        summaries.append(ArchSummary(
            arch=arch, variants=len(built), compiled=sum(not b.cached for b in built),
            cached=sum(b.cached for b in built), seconds=compiled.seconds[arch.name],
            wheel=result.wheel, wheel_bytes=result.wheel.stat().st_size, native_launch_missing=launch_module.reason,
        ))
    return summaries


def build_shard(options: BuildOptions, index: int, count: int, out: Path,
                progress: Callable[[int], None] | None = None) -> int:
    """Compile shard ``index`` of ``count`` and export its cache entries to ``out``; returns the variant count.

    ``out`` holds ``cache/<key[:2]>/<key>/`` entries and ``shard.json``; ``merge``
    takes the folders of all shards and packages byte-identical wheels.
    """
    with _file_errors(options):
        return _build_shard(options, index, count, out, progress)


def _build_shard(options: BuildOptions, index: int, count: int, out: Path,
                 progress: Callable[[int], None] | None) -> int:
    toolchain = find_toolchain(options.nvcc, line_info=options.line_info)
    work = shard_of(plan(options), index, count)
    compiled = _compile(options, work, toolchain, progress)
    if out.exists():
        shutil.rmtree(out)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for entry in compiled.entries.values():
        shutil.copytree(entry, tmp / "cache" / entry.parent.name / entry.name)
    listing = [{"variant": v, "arch": a, "key": e.name} for (v, a), e in sorted(compiled.entries.items())]
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "shard.json").write_text(json.dumps({"index": index, "count": count, "entries": listing}, indent=1))
    os.replace(tmp, out)
    return len(work)


def merge(options: BuildOptions, shard_dirs: list[Path],
          progress: Callable[[int], None] | None = None) -> list[ArchSummary]:
    """Import the cache entries of shard folders, then package every arch without compiling anything."""
    with _file_errors(options):
        _import_shards(options, shard_dirs)
    return build(options, progress, cached_only=True)


def _import_shards(options: BuildOptions, shard_dirs: list[Path]) -> None:
    counts = set()
    for shard in shard_dirs:
        meta = shard / "shard.json"
        if not meta.is_file():
            raise UsageError(f"{shard}: not a shard folder (no shard.json); pass the --out folders of "
                             "tkc build --shard")
        try:
            counts.add(int(json.loads(meta.read_text())["count"]))
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"{meta}: not a tkc shard listing (no count); build the shard again with tkc build "
                             "--shard") from None
        for entry in sorted((shard / "cache").glob("*/*")):
            target = options.build_dir / "cache" / entry.parent.name / entry.name
            if not (target / "meta.json").is_file():
                shutil.rmtree(target, ignore_errors=True)  # a damaged entry (no meta.json) of an earlier build
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{entry.name}."))
                shutil.rmtree(tmp)
                shutil.copytree(entry, tmp)
                os.replace(tmp, target)
    if len(counts) > 1:
        raise UsageError(f"the shard folders come from different splits (N = {sorted(counts)}); merge the "
                         "shards of one split")


__all__ = ["ArchSummary", "BuildOptions", "build", "build_shard", "merge", "plan", "shard_of"]
