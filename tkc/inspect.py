"""``tkc inspect WHEEL``: what a built wheel holds, read from the wheel itself.

Per cubin: size, the arch in its ELF header, registers and static shared memory
from its ``.nv.info`` / ``.nv.shared`` sections, dynamic shared memory from the
launch contract, spills from the ptxas report in the manifest, the resident blocks
per SM those resources allow (and which one bounds them); and every sha256
is checked against the manifest (cubins are read out of their packs, ``cubins/<kernel>.<n>.xz``). For the
wheel: whether it carries the compiled launch module (``_launch.abi3.so``, its CPU) and whether its tag says
so. Any mismatch makes the result not ``ok``.

A multi-arch wheel (``tkc build --multi-arch``) is checked arch by arch: its ``manifest.json`` names each
arch's manifest (``manifests/<arch>.json``), whose cubins (``cubins/<arch>/``) and launchers
(``_kernels/<kernel>/<arch>/``) are checked as a per-arch wheel's are; its version must carry no local label.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import lzma
import re
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from tkc.arch import ARCHS
from tkc.compile import cubin_target
from tkc.errors import PackageError, ToolchainError
from tkc.fsutil import sha256_bytes

_EIATTR_REGCOUNT = 0x2F
_EIFMT_SVAL = 0x04
_LAUNCH_MODULE = "_launch.abi3.so"  # tkc.native.FILENAME
_ELF_MACHINES = {62: "x86-64", 183: "aarch64"}


@dataclass(frozen=True, kw_only=True)
class CubinReport:
    kernel: str
    variant: str
    params: dict[str, object]
    path: str
    bytes: int
    target: str
    registers: dict[str, int]
    static_smem: dict[str, int]
    dynamic_smem: dict[str, int]
    spill_bytes: dict[str, int]
    # Resident blocks per SM of each launch and what bounds them (tkc.arch.Arch.occupancy), e.g. "5 (registers)".
    occupancy: dict[str, str]
    sha256_ok: bool


@dataclass(frozen=True, kw_only=True)
class WheelReport:
    wheel: str
    package: str
    version: str
    arch: str
    target: str
    cubins: tuple[CubinReport, ...]
    launch_module: str = ""  # e.g. "x86-64 ELF, stable ABI (cp310-abi3)", or why there is none
    problems: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems


def _sections(elf: bytes) -> dict[str, bytes]:
    """Section name -> contents of a 64-bit little-endian ELF."""
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx]
    strtab = elf[names[4] : names[4] + names[5]]
    out = {}
    for name_off, kind, _flags, _addr, offset, size, *_ in headers:
        name = strtab[name_off : strtab.index(b"\0", name_off)].decode()
        # SHT_NOBITS (8) sections occupy no file bytes; their size is what matters.
        out[name] = b"\0" * size if kind == 8 else elf[offset : offset + size]
    return out


def _symbol_names(sections: dict[str, bytes]) -> list[str]:
    symtab, strtab = sections.get(".symtab", b""), sections.get(".strtab", b"")
    names = []
    for i in range(len(symtab) // 24):
        (name_off,) = struct.unpack_from("<I", symtab, i * 24)
        names.append(strtab[name_off : strtab.index(b"\0", name_off)].decode())
    return names


def _attributes(data: bytes) -> list[tuple[int, bytes]]:
    """(attribute, value bytes) of an ``.nv.info`` section; only EIFMT_SVAL entries carry a payload."""
    out = []
    pos = 0
    while pos + 4 <= len(data):
        fmt, attr, size = struct.unpack_from("<BBH", data, pos)
        payload = size if fmt == _EIFMT_SVAL else 0  # other formats keep their value in the size field
        out.append((attr, data[pos + 4 : pos + 4 + payload]))
        pos += 4 + payload
    return out


def cubin_resources(cubin: bytes) -> tuple[dict[str, int], dict[str, int]]:
    """Registers and static shared memory per kernel, read from the cubin's own sections.

    Register counts sit in the global ``.nv.info`` section as (symbol index, count)
    pairs (EIATTR_REGCOUNT); static shared memory is the size of ``.nv.shared.<kernel>``.
    """
    sections = _sections(cubin)
    symbols = _symbol_names(sections)
    registers: dict[str, int] = {}
    for attr, value in _attributes(sections.get(".nv.info", b"")):
        if attr == _EIATTR_REGCOUNT and len(value) == 8:
            index, count = struct.unpack("<II", value)
            if index < len(symbols):
                registers[symbols[index]] = count
    smem = {name.removeprefix(".nv.shared."): len(data) for name, data in sections.items()
            if name.startswith(".nv.shared.") and not name.startswith(".nv.shared.reserved")}
    for kernel in registers:
        smem.setdefault(kernel, 0)
    return registers, smem


def inspect_wheel(path: Path) -> WheelReport:
    """Read ``path``; raise ``PackageError`` only if it is not a tkc wheel at all."""
    try:
        wheel = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise PackageError(f"{path}: not a readable wheel ({exc})") from exc
    with wheel:
        manifests = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith("/manifest.json")]
        if len(manifests) != 1:
            raise PackageError(f"{path}: no tkc manifest.json in the wheel; was it built by tkc build?")
        root = manifests[0].split("/")[0]
        try:
            manifest = json.loads(wheel.read(manifests[0]))
            return _report(path, wheel, root, manifest)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PackageError(f"{path}: {manifests[0]} is malformed ({type(exc).__name__}: {exc}); the wheel is "
                               "damaged: rebuild it with tkc build") from None


def _report(path: Path, wheel: zipfile.ZipFile, root: str, manifest: dict) -> WheelReport:
    """The report of a tkc wheel whose manifest parsed (a key it lacks raises KeyError)."""
    problems: list[str] = []
    listed: set[str] = set()
    reports: list[CubinReport] = []
    if "archs" in manifest:  # a multi-arch wheel: each arch's manifest, cubins and launchers
        if "+" in manifest["version"]:
            problems.append(f"{root}/manifest.json: a multi-arch wheel's version {manifest['version']} has a local "
                            "label, which package indexes refuse; rebuild with tkc build --multi-arch")
        kernels: set[str] = set()
        for arch_name, member in sorted(manifest["archs"].items()):
            try:
                sub = json.loads(wheel.read(f"{root}/{member}"))
            except KeyError:
                problems.append(f"{root}/{member}: the manifest of {arch_name}, listed in manifest.json, is missing")
                continue
            if sub["arch"] != arch_name or sub["version"] != manifest["version"]:
                problems.append(f"{root}/{member}: is the manifest of {sub['arch']} {sub['version']}, not of "
                                f"{arch_name} {manifest['version']}; rebuild with tkc build --multi-arch")
            reports += _cubins(wheel, root, sub, problems, listed)
            _check_launchers(wheel, root, sub, problems, arch_dir=True)
            kernels |= set(sub["kernels"])
        names = set(wheel.namelist())
        for kernel in sorted(kernels):
            index = f"{root}/_kernels/{kernel}/__init__.py"
            if index not in names or "ArchKernels(" not in wheel.read(index).decode():
                problems.append(f"{index}: missing or not a multi-arch kernel index; rebuild with tkc build "
                                "--multi-arch")
    else:
        reports = _cubins(wheel, root, manifest, problems, listed)
        _check_launchers(wheel, root, manifest, problems)
    for name in wheel.namelist():
        if name.startswith(f"{root}/cubins/") and not name.endswith("/") and name not in listed:
            problems.append(f"{name}: a pack of cubins the manifest does not list")
    _check_record(wheel, problems)
    launch_module = _launch_module(wheel, root, problems)
    return WheelReport(wheel=str(path), package=manifest["package"], version=manifest["version"],
                       arch=manifest["arch"], target=manifest["target"], cubins=tuple(reports),
                       launch_module=launch_module, problems=tuple(problems))


def _cubins(wheel: zipfile.ZipFile, root: str, manifest: dict, problems: list[str],
            listed: set[str]) -> list[CubinReport]:
    """The reports of the cubins one arch's manifest lists (their members added to ``listed``)."""
    arch = ARCHS.get(manifest["arch"])  # None: an arch this tkc does not know (no occupancy then)
    reports = []
    packs: dict[str, bytes | None] = {}  # member -> decompressed bytes; None: missing or damaged (reported once)
    for kernel, entry in sorted(manifest["kernels"].items()):
        for v in entry["variants"]:
            member = f"{root}/{v['cubin']}"
            listed.add(member)
            if member not in packs:
                packs[member] = _read_pack(wheel, member, problems)
            pack = packs[member]
            if pack is None:
                continue
            offset, size = int(v.get("offset", 0)), int(v["bytes"])
            data = pack[offset:offset + size]
            if offset < 0 or len(data) != size:
                problems.append(f"{member}: holds {len(pack)} bytes, but the manifest puts {v['id']} at bytes "
                                f"{offset}..{offset + size}; rebuild")
                continue
            member = f"{member} (bytes {offset}..{offset + size})"
            sha_ok = sha256_bytes(data) == v["sha256"]
            if not sha_ok:
                problems.append(f"{member}: sha256 {sha256_bytes(data)[:16]}... does not match the manifest "
                                f"({v['sha256'][:16]}...); the cubin was modified after the build: rebuild")
            try:
                target = cubin_target(data)
                registers, static_smem = cubin_resources(data)
            except (ToolchainError, struct.error, ValueError) as exc:
                problems.append(f"{member}: not a valid cubin ({exc})")
                target, registers, static_smem = "?", {}, {}
            if target != manifest["target"]:
                problems.append(f"{member}: built for {target}, but the wheel is for {manifest['target']}")
            launches = v["contract"]["launches"]
            occupancy = {}
            if arch is not None:
                for launch in launches:
                    symbol = launch["symbol"]
                    occupancy[symbol] = str(arch.occupancy(
                        threads=launch["block"][0] * launch["block"][1] * launch["block"][2],
                        registers=registers.get(symbol, 0),
                        shared_memory=static_smem.get(symbol, 0) + launch["dynamic_smem"]))
            reports.append(CubinReport(
                kernel=kernel, variant=v["id"], params=v["params"], path=member, bytes=len(data),
                target=target, registers=registers, static_smem=static_smem,
                dynamic_smem={launch["symbol"]: launch["dynamic_smem"] for launch in launches},
                spill_bytes={s: r["spill_stores"] + r["spill_loads"] for s, r in v["resources"].items()},
                occupancy=occupancy, sha256_ok=sha_ok,
            ))
    return reports


def _read_pack(wheel: zipfile.ZipFile, member: str, problems: list[str]) -> bytes | None:
    """A pack's cubins, decompressed (a plain file's bytes); None, with the problem, where it is missing or not xz."""
    try:
        data = wheel.read(member)
    except KeyError:
        problems.append(f"{member}: listed in the manifest but missing from the wheel")
        return None
    if not member.endswith(".xz"):
        return data
    try:
        return lzma.decompress(data, format=lzma.FORMAT_XZ)
    except lzma.LZMAError as exc:
        problems.append(f"{member}: not a pack of cubins ({exc}); the wheel was modified: rebuild")
        return None


def _check_record(wheel: zipfile.ZipFile, problems: list[str]) -> None:
    """Every file of the wheel is in its RECORD with the hash and size it has (PEP 376 / 427)."""
    records = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        problems.append("the wheel has no RECORD (or several); rebuild with tkc build")
        return
    recorded: dict[str, tuple[str, str]] = {}
    for row in csv.reader(io.StringIO(wheel.read(records[0]).decode())):
        if row:
            recorded[row[0]] = (row[1], row[2]) if len(row) == 3 else ("", "")
    for name in wheel.namelist():
        if name == records[0] or name.endswith("/"):
            continue
        data = wheel.read(name)
        digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if name not in recorded:
            problems.append(f"{name}: in the wheel but not in its RECORD")
        elif recorded[name] != (digest, str(len(data))):
            problems.append(f"{name}: its hash or size differs from the wheel's RECORD; the wheel was modified")
    for name in sorted(set(recorded) - set(wheel.namelist())):
        problems.append(f"{name}: in the RECORD but missing from the wheel")


# A launcher module's cubin, as variant_module.py.j2 writes it: pack, sha256, [arch,] offset, size.
_CUBIN_LINE = re.compile(r'^_\w+ = Cubin\(\n    "([^"]+)",\n    "([0-9a-f]*)",\n(?:    "\w+",\n)?'
                         r'    offset=(\d+),\n    size=(-?\d+),\n\)$', re.MULTILINE)
_INDEX_ENTRY = re.compile(r'^        \(.*\): "(\w+)",$', re.MULTILINE)  # a kernel index's key: "module" lines


def _check_launchers(wheel: zipfile.ZipFile, root: str, manifest: dict, problems: list[str],
                     arch_dir: bool = False) -> None:
    """Each kernel's index names the variants the manifest lists, and each variant's launcher module loads
    the cubin the manifest lists and checks the hash it records (``arch_dir``: one arch of a multi-arch
    wheel, whose launchers are in ``_kernels/<kernel>/<arch>/`` and cubins in ``cubins/<arch>/``)."""
    names = set(wheel.namelist())
    arch = manifest["arch"]
    for kernel, entry in sorted(manifest["kernels"].items()):
        folder = f"{root}/_kernels/{kernel}/{arch}" if arch_dir else f"{root}/_kernels/{kernel}"
        index = f"{folder}/__init__.py"
        if index not in names:
            problems.append(f"{index}: missing: the manifest lists kernel {kernel}")
            continue
        expected = {v["id"]: (v["cubin"].removeprefix("cubins/"), v["sha256"], str(v.get("offset", 0)),
                              str(v["bytes"])) for v in entry["variants"]}
        indexed = set(_INDEX_ENTRY.findall(wheel.read(index).decode()))
        modules = {Path(n).stem for n in names if n.rpartition("/")[0] == folder} - {"__init__"}
        for what, found in (("its index names", indexed), ("its launcher modules are", modules)):
            if found != set(expected):
                odd = sorted(found ^ set(expected))[0]
                problems.append(f"{index}: {what} not the manifest's variants (e.g. {odd}); rebuild with tkc build")
        for variant, written in sorted(expected.items()):  # (pack, sha256, offset, size) as the launcher has them
            member = f"{folder}/{variant}.py"
            if member not in names:
                continue  # reported above
            loaded = _CUBIN_LINE.findall(wheel.read(member).decode())
            if loaded != [written] or (arch_dir and not written[0].startswith(f"{arch}/")):
                problems.append(f"{member}: its cubin or hash differs from the manifest's; rebuild with tkc build")


def _launch_module(wheel: zipfile.ZipFile, root: str, problems: list[str]) -> str:
    """What the wheel's loader launches through, checked against the wheel's tags."""
    tags = [line.split(":", 1)[1].strip() for name in wheel.namelist() if name.endswith(".dist-info/WHEEL")
            for line in wheel.read(name).decode().splitlines() if line.startswith("Tag:")]
    abi3 = any("-abi3-" in tag for tag in tags)
    member = f"{root}/{_LAUNCH_MODULE}"
    if member not in wheel.namelist():
        if abi3:
            problems.append(f"{member}: missing, but the wheel is tagged {', '.join(tags)}; rebuild with tkc build")
        return "none: the loader launches through ctypes"
    data = wheel.read(member)
    if data[:4] != b"\x7fELF" or len(data) < 0x14:
        problems.append(f"{member}: not an ELF shared object; rebuild with tkc build")
        return "invalid"
    (machine,) = struct.unpack_from("<H", data, 0x12)
    cpu = _ELF_MACHINES.get(machine, f"ELF machine {machine}")
    if not abi3:
        problems.append(f"{member}: a compiled module in a wheel tagged {', '.join(tags) or '(no tag)'}, which "
                        "promises no host code; rebuild with tkc build")
    return f"{cpu} ELF, stable ABI ({', '.join(tags)})"


def format_report(report: WheelReport) -> str:
    lines = [f"{Path(report.wheel).name}: {report.package} {report.version}, {report.arch} ({report.target}), "
             f"{len(report.cubins)} cubins", f"launch module: {report.launch_module}"]
    rows = [("kernel", "variant", "bytes", "regs", "smem static", "smem dynamic", "spills", "blocks/SM", "sha256",
             "params")]
    for c in report.cubins:
        rows.append((c.kernel, c.variant, str(c.bytes), ",".join(map(str, c.registers.values())),
                     ",".join(map(str, c.static_smem.values())) or "0",
                     ",".join(map(str, c.dynamic_smem.values())), ",".join(map(str, c.spill_bytes.values())),
                     ",".join(c.occupancy.values()) or "?", "ok" if c.sha256_ok else "MISMATCH",
                     ", ".join(f"{k}={v}" for k, v in c.params.items())))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    lines.extend(f"problem: {p}" for p in report.problems)
    lines.append("ok" if report.ok else f"FAILED: {len(report.problems)} problem(s)")
    return "\n".join(lines)
