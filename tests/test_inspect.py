"""tkc inspect: per-cubin facts read from the wheel, and a tampered cubin fails naming the file."""

from __future__ import annotations

import hashlib
import json
import lzma
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from tkc.build import ArchSummary, BuildOptions
from tkc.cli import main
from tkc.inspect import inspect_wheel

pytestmark = pytest.mark.slow


def test_inspect_reads_arch_registers_and_shared_memory(small_build: tuple[BuildOptions, list[ArchSummary]]) -> None:
    options, summaries = small_build
    for s in summaries:
        report = inspect_wheel(s.wheel)
        assert report.ok and report.arch == s.arch.name and len(report.cubins) == s.variants
        manifest = json.loads((options.build_dir / "pkg" / "tkc_small_kernels" / s.arch.name / "tkc_small_kernels" / "manifest.json")
                              .read_text())
        for c in report.cubins:
            assert c.target == s.arch.target
            variant = next(v for v in manifest["kernels"][c.kernel]["variants"] if v["id"] == c.variant)
            # Registers read from the cubin's .nv.info agree with ptxas's report at build time.
            assert c.registers == {k: r["registers"] for k, r in variant["resources"].items()}
            # Resident blocks per SM of every launch, from the cubin's resources and the launch's block.
            for launch in variant["contract"]["launches"]:
                symbol = launch["symbol"]
                expected = s.arch.occupancy(threads=launch["block"][0] * launch["block"][1] * launch["block"][2],
                                            registers=c.registers[symbol],
                                            shared_memory=c.static_smem[symbol] + launch["dynamic_smem"])
                assert c.occupancy[symbol] == str(expected) and expected.blocks >= 1


def _flipped_in_pack(pack: bytes, at: int) -> bytes:
    """A pack of cubins with byte ``at`` of its decompressed contents flipped, recompressed (a valid xz stream)."""
    data = bytearray(lzma.decompress(pack))
    data[at] ^= 0xFF
    return lzma.compress(bytes(data), format=lzma.FORMAT_XZ)


def test_tampered_cubin_fails_naming_the_file(small_build: tuple[BuildOptions, list[ArchSummary]],
                                              tmp_path: Path) -> None:
    """A cubin changed inside its pack fails naming the pack and the cubin's bytes; a damaged pack (no valid xz
    stream) fails naming the pack."""
    _, summaries = small_build
    original = summaries[0].wheel
    with zipfile.ZipFile(original) as wheel:
        root = next(n for n in wheel.namelist() if n.endswith("/manifest.json")).split("/")[0]
        variant = json.loads(wheel.read(f"{root}/manifest.json"))["kernels"]["per_token_cast"]["variants"][-1]
        victim = f"{root}/{variant['cubin']}"
        pack = wheel.read(victim)
    end = variant["offset"] + variant["bytes"]
    tampered = tmp_path / original.name
    with zipfile.ZipFile(original) as src, zipfile.ZipFile(tampered, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, _flipped_in_pack(pack, end - 1) if info.filename == victim else src.read(info))
    ok = CliRunner().invoke(main, ["inspect", str(original)])
    assert ok.exit_code == 0 and ok.output.strip().endswith("ok")
    bad = CliRunner().invoke(main, ["inspect", str(tampered)])
    assert bad.exit_code == 1
    assert f"problem: {victim} (bytes {variant['offset']}..{end}): sha256" in bad.output
    assert bad.output.count(": sha256 ") == 1  # the pack's other cubins are intact
    as_json = CliRunner().invoke(main, ["inspect", "--json", str(tampered)])
    assert as_json.exit_code == 1 and json.loads(as_json.output)["ok"] is False
    damaged = _rewritten(original, tmp_path / "d.whl", {victim: pack[:-1] + bytes([pack[-1] ^ 0xFF])})
    out = CliRunner().invoke(main, ["inspect", str(damaged)])
    assert out.exit_code == 1 and f"problem: {victim}: not a pack of cubins" in out.output


def test_launch_module_and_wheel_tag_must_agree(small_build: tuple[BuildOptions, list[ArchSummary]],
                                                tmp_path: Path) -> None:
    # The report names what the loader launches through; a wheel whose tag promises the compiled
    # module but lacks it (or carries it under a pure tag) is not ok, naming the member.
    _, summaries = small_build
    original = summaries[0].wheel
    assert inspect_wheel(original).launch_module.startswith("x86-64 ELF, stable ABI (cp310-abi3-")
    stripped = tmp_path / original.name
    with zipfile.ZipFile(original) as src, zipfile.ZipFile(stripped, "w") as dst:
        for info in src.infolist():
            if not info.filename.endswith("_launch.abi3.so"):
                dst.writestr(info, src.read(info))
    report = inspect_wheel(stripped)
    assert report.launch_module.startswith("none") and not report.ok
    assert any("_launch.abi3.so: missing, but the wheel is tagged cp310-abi3" in p for p in report.problems)


def test_not_a_tkc_wheel(tmp_path: Path) -> None:
    plain = tmp_path / "x-1.0-py3-none-any.whl"
    with zipfile.ZipFile(plain, "w") as z:
        z.writestr("x/__init__.py", "")
    result = CliRunner().invoke(main, ["inspect", str(plain)])
    assert result.exit_code == 5 and "no tkc manifest.json" in result.output


def _rewritten(original: Path, out: Path, change: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(original) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, change.get(info.filename, src.read(info)))
    return out


def test_inspect_checks_the_record_and_the_launchers_against_the_manifest(
        small_build: tuple[BuildOptions, list[ArchSummary]], tmp_path: Path) -> None:
    """A consistent forgery (cubin and manifest hash changed together) still fails: the RECORD and the launcher
    module's recorded hash disagree; an edited launcher alone fails the RECORD and the manifest comparison."""
    _, summaries = small_build
    original = summaries[0].wheel
    with zipfile.ZipFile(original) as wheel:
        root = next(n for n in wheel.namelist() if n.endswith("/manifest.json")).split("/")[0]
        manifest = json.loads(wheel.read(f"{root}/manifest.json"))
        variant = manifest["kernels"]["per_token_cast"]["variants"][0]
        cubin = f"{root}/{variant['cubin']}"
        forged = _flipped_in_pack(wheel.read(cubin), variant["offset"] + variant["bytes"] - 1)
        launcher = f"{root}/_kernels/per_token_cast/{variant['id']}.py"
        source = wheel.read(launcher).decode()
    start = variant["offset"]
    variant["sha256"] = hashlib.sha256(lzma.decompress(forged)[start:start + variant["bytes"]]).hexdigest()
    consistent = _rewritten(original, tmp_path / "a.whl", {cubin: forged, f"{root}/manifest.json":
                                                           json.dumps(manifest).encode()})
    out = CliRunner().invoke(main, ["inspect", str(consistent)]).output
    assert f"problem: {cubin}: its hash or size differs from the wheel's RECORD" in out
    assert f"problem: {launcher}: its cubin or hash differs from the manifest's" in out
    edited = _rewritten(original, tmp_path / "b.whl", {launcher: source.replace(
        f'"{variant["cubin"].removeprefix("cubins/")}"', '"other.0.xz"', 1).encode()})
    out = CliRunner().invoke(main, ["inspect", str(edited)]).output
    assert f"problem: {launcher}: its hash or size differs" in out and "differs from the manifest's" in out


def test_a_malformed_manifest_is_a_package_error_not_a_traceback(
        small_build: tuple[BuildOptions, list[ArchSummary]], tmp_path: Path) -> None:
    _, summaries = small_build
    original = summaries[0].wheel
    with zipfile.ZipFile(original) as wheel:
        manifest = next(n for n in wheel.namelist() if n.endswith("/manifest.json"))
    for text in (b'{"package": 1', b'{"package": "p"}', b"[]"):
        bad = _rewritten(original, tmp_path / "m.whl", {manifest: text})
        result = CliRunner().invoke(main, ["inspect", str(bad)])
        assert result.exit_code == 5 and isinstance(result.exception, SystemExit), result.output
        assert f"{manifest} is malformed" in result.output and "rebuild it with tkc build" in result.output


def test_inspect_checks_every_arch_of_a_multi_arch_wheel(small_multi_build: tuple[BuildOptions, list[ArchSummary]],
                                                         tmp_path: Path) -> None:
    """Every arch's cubins against its own manifest (manifests/<arch>.json), and its launchers; a tampered
    cubin of one arch, or an arch's missing manifest, fails naming the file."""
    _, summaries = small_multi_build
    original = summaries[0].wheel
    report = inspect_wheel(original)
    assert report.ok, report.problems
    assert report.version == "0.0.1" and report.arch == "sm90,sm100,sm103"
    assert len(report.cubins) == sum(s.variants for s in summaries)
    targets = {s.arch.name: s.arch.target for s in summaries}
    for c in report.cubins:
        arch = c.path.split("/")[2]  # tkc_small_kernels/cubins/<arch>/<kernel>.<n>.xz (bytes a..b)
        assert c.target == targets[arch] and c.sha256_ok and c.occupancy
    with zipfile.ZipFile(original) as wheel:
        victim = next(n for n in wheel.namelist() if n.startswith("tkc_small_kernels/cubins/sm100/"))
        data = wheel.read(victim)
    tampered = _rewritten(original, tmp_path / "a.whl", {victim: _flipped_in_pack(data, 0)})
    out = CliRunner().invoke(main, ["inspect", str(tampered)])
    assert out.exit_code == 1 and f"problem: {victim} (bytes 0.." in out.output and ": sha256" in out.output
    with zipfile.ZipFile(original) as src, zipfile.ZipFile(tmp_path / "b.whl", "w") as dst:
        for info in src.infolist():
            if info.filename != "tkc_small_kernels/manifests/sm90.json":
                dst.writestr(info, src.read(info))
    problems = inspect_wheel(tmp_path / "b.whl").problems
    assert any("manifests/sm90.json: the manifest of sm90, listed in manifest.json, is missing" in p
               for p in problems)
    assert any(p.startswith("tkc_small_kernels/cubins/sm90/") and "does not list" in p for p in problems)
