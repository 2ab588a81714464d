"""The build stage: cache hits call neither TileLang nor nvcc; wheels are byte-identical across builds."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

import tkc.build
from tests.conftest import SMALL_SPEC, small_options
from tkc.build import ArchSummary, BuildOptions, build, plan
from tkc.errors import ToolchainError

pytestmark = pytest.mark.slow


def test_first_build_compiles_every_variant_for_every_arch(small_build: tuple[BuildOptions, list[ArchSummary]]) -> None:
    options, summaries = small_build
    assert [s.arch.name for s in summaries] == ["sm90", "sm100", "sm103"]
    per_arch = len(plan(options)) // 3
    for s in summaries:
        assert s.variants == per_arch == 3
        assert s.compiled == per_arch and s.cached == 0
        assert s.wheel.is_file() and f"+{s.arch.name}-" in s.wheel.name


def test_rebuild_is_all_cache_hits_and_calls_neither_tilelang_nor_nvcc(
        small_build: tuple[BuildOptions, list[ArchSummary]], monkeypatch: pytest.MonkeyPatch) -> None:
    options, first = small_build

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached rebuild must not lower or compile")

    monkeypatch.setattr(tkc.build, "lower", forbidden)
    monkeypatch.setattr(tkc.build, "compile_unit", forbidden)
    again = build(options)
    assert all(s.compiled == 0 and s.cached == s.variants for s in again)
    assert [s.wheel.read_bytes() for s in again] == [s.wheel.read_bytes() for s in first]


def test_clean_rebuild_in_another_folder_gives_byte_identical_wheels(
        small_build: tuple[BuildOptions, list[ArchSummary]], tmp_path: Path) -> None:
    _, first = small_build
    # Serial this time, and with another temporary folder: neither the job count nor TMPDIR may change a byte.
    import tempfile

    (tmp_path / "other-tmp").mkdir()
    saved, tempfile.tempdir = tempfile.tempdir, str(tmp_path / "other-tmp")
    try:
        second = build(small_options(tmp_path, jobs=1))
    finally:
        tempfile.tempdir = saved
    for a, b in zip(first, second):
        assert a.wheel.name == b.wheel.name
        assert a.wheel.read_bytes() == b.wheel.read_bytes()


def test_changed_template_misses_the_cache(small_build: tuple[BuildOptions, list[ArchSummary]],
                                           tmp_path: Path) -> None:
    options, _ = small_build
    variant, arch = plan(options)[0]
    from tkc.compile import find_toolchain
    from tkc.render import Helper, render

    toolchain = find_toolchain()
    a = render(variant, arch, options.templates, tmp_path / "a")
    key_a = tkc.build.cache_key(a, toolchain)
    changed = dataclasses.replace(a, source=a.source + "\n# touched\n")
    assert tkc.build.cache_key(changed, toolchain) != key_a
    # The helper modules a variant imports are keyed with it: an edit of one rebuilds its users only.
    helper = Helper(module="tkc_templates.quant.common", path=tmp_path / "common.py", source="X = 1\n")
    with_helper = dataclasses.replace(a, helpers=(helper,))
    key_h = tkc.build.cache_key(with_helper, toolchain)
    assert key_h != key_a
    edited = dataclasses.replace(with_helper, helpers=(dataclasses.replace(helper, source="X = 2\n"),))
    assert tkc.build.cache_key(edited, toolchain) != key_h
    assert tkc.build.cache_key(a, toolchain) == key_a
    # A --lineinfo build is cached apart; tkc's own source is not part of the key (a comment in it must not
    # rebuild the catalog), the stages' FORMAT versions are.
    assert tkc.build.cache_key(a, find_toolchain(line_info=True)) != key_a
    from tkc import compile as compile_stage

    original = compile_stage.FORMAT
    try:
        compile_stage.FORMAT = original + 1
        assert tkc.build.cache_key(a, toolchain) != key_a
    finally:
        compile_stage.FORMAT = original


def test_rebuild_into_another_dist_replaces_a_stale_wheel_of_the_same_name(
        small_build: tuple[BuildOptions, list[ArchSummary]], tmp_path: Path) -> None:
    """Builds that share a build folder but not a dist folder: nothing changed since the last build, but the other
    dist folder holds an older wheel of the same name. It must be rebuilt there, not reused."""
    options, first = small_build
    other = dataclasses.replace(options, dist_dir=tmp_path / "dist")
    other.dist_dir.mkdir()
    for s in first:
        (other.dist_dir / s.wheel.name).write_bytes(b"a wheel of an older build")
    again = build(other)
    for a, b in zip(first, again):
        assert b.wheel == other.dist_dir / a.wheel.name
        assert b.wheel.read_bytes() == a.wheel.read_bytes()
    # The first dist folder's wheels are still the stamped ones: reused, not rebuilt.
    assert [s.wheel.read_bytes() for s in build(options)] == [s.wheel.read_bytes() for s in first]


def _entries(options: BuildOptions) -> list[Path]:
    return sorted(p.parent for p in (options.build_dir / "cache").glob("*/*/meta.json"))


def test_damaged_cache_entries_are_rebuilt_with_a_warning(small_build: tuple[BuildOptions, list[ArchSummary]],
                                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A truncated cubin, a flipped byte, another variant's cubin, a meta.json that is no JSON, an entry
    without its recorded sha256 whose cubin is garbage, and an entry folder without meta.json: each is named on
    stderr, removed and compiled again, and the wheels come out byte-identical to the first build's."""
    import shutil

    options, first = small_build
    copy = dataclasses.replace(options, build_dir=tmp_path / "build", dist_dir=tmp_path / "dist")
    shutil.copytree(options.build_dir / "cache", copy.build_dir / "cache")
    entries = _entries(copy)
    assert len(entries) == 3 * len(options.archs)  # 3 variants per arch
    a, b, c, d, e, f, *_ = entries
    cubin = (a / "kernel.cubin").read_bytes()
    (a / "kernel.cubin").write_bytes(cubin[: len(cubin) // 2])
    flipped = bytearray((b / "kernel.cubin").read_bytes())
    flipped[len(flipped) // 2] ^= 0x01
    (b / "kernel.cubin").write_bytes(bytes(flipped))
    (c / "kernel.cubin").write_bytes((d / "kernel.cubin").read_bytes())
    (d / "meta.json").write_text("{not json")
    meta = json.loads((e / "meta.json").read_text())
    del meta["cubin_sha256"]
    (e / "meta.json").write_text(json.dumps(meta))
    (e / "kernel.cubin").write_bytes(b"\x7fELF garbage")
    (f / "meta.json").unlink()  # the folder stays: the new entry must still take its place
    capsys.readouterr()
    again = build(copy)
    warned = capsys.readouterr().err
    for entry in (a, b, c, d, e, f):
        assert f"cache entry {entry}" in warned and "rebuilding it" in warned
    assert sum(s.compiled for s in again) == 6
    assert [s.wheel.read_bytes() for s in again] == [s.wheel.read_bytes() for s in first]


def test_a_units_missing_entry_is_compiled_again_beside_its_unit_mates_without_tilelang(
        small_build: tuple[BuildOptions, list[ArchSummary]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """per_token_cast's two variants share a compile unit (one nvcc front end): each entry is keyed over the whole
    unit, the lowered sources are kept apart, so one lost entry costs nvcc only and the wheels come out the same."""
    import shutil

    from tkc.build import units_of

    options, first = small_build
    copy = dataclasses.replace(options, build_dir=tmp_path / "build", dist_dir=tmp_path / "dist")
    shutil.copytree(options.build_dir / "cache", copy.build_dir / "cache")
    units = units_of(plan(options))
    assert sorted(len(u) for u in units) == [1] * len(options.archs) + [2] * len(options.archs)
    metas = [json.loads((e / "meta.json").read_text()) for e in _entries(copy)]
    pair = [m for m in metas if len(m["unit"]) == 2]
    assert len(pair) == 2 * len(options.archs) and all(m["variant"] in m["unit"] for m in pair)
    lost = next(e for e in _entries(copy) if json.loads((e / "meta.json").read_text())["variant"] == pair[0]["variant"]
                and json.loads((e / "meta.json").read_text())["arch"] == pair[0]["arch"])
    shutil.rmtree(lost)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the lowered sources are kept: nothing is lowered again")

    monkeypatch.setattr(tkc.build, "lower", forbidden)
    again = build(copy)
    assert sum(s.compiled for s in again) == 1 and (lost / "meta.json").is_file()
    assert [s.wheel.read_bytes() for s in again] == [s.wheel.read_bytes() for s in first]


def _damage(entry: Path, damage: str, other_arch: Path) -> None:
    from tkc.build import meta_sha256

    meta = json.loads((entry / "meta.json").read_text())
    if damage == "edited contract":
        launch = meta["contract"]["launches"][0]
        launch["block"] = [launch["block"][0] // 2, *launch["block"][1:]]
    elif damage == "edited resources":
        for resources in meta["resources"].values():
            resources["registers"] += 100
    elif damage == "wrongly typed resources":
        meta["resources"] = []
    elif damage == "another arch's cubin, hashes made to match":
        cubin = (other_arch / "kernel.cubin").read_bytes()
        (entry / "kernel.cubin").write_bytes(cubin)
        meta["cubin_sha256"] = hashlib.sha256(cubin).hexdigest()
        meta["meta_sha256"] = meta_sha256(meta)
    elif damage == "garbage cubin, hashes made to match":
        garbage = b"\x7fELF\x02" + bytes(4000)
        (entry / "kernel.cubin").write_bytes(garbage)
        meta["cubin_sha256"] = hashlib.sha256(garbage).hexdigest()
        meta["meta_sha256"] = meta_sha256(meta)
    elif damage == "no meta.json":
        (entry / "meta.json").unlink()
        return
    (entry / "meta.json").write_text(json.dumps(meta, indent=1))


@pytest.mark.parametrize("damage", ["edited contract", "edited resources", "wrongly typed resources",
                                    "another arch's cubin, hashes made to match", "garbage cubin, hashes made to match",
                                    "no meta.json"])
def test_a_cache_hit_verifies_every_part_of_its_entry(small_build: tuple[BuildOptions, list[ArchSummary]],
                                                     tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     damage: str) -> None:
    """meta.json records the sha256 of its own fields (contract, resources) beside the cubin's, and a hit checks
    both and the cubin itself (an ELF of the arch with the contract's kernels): a damaged entry is named on
    stderr and removed, so that the build compiles it again (no compile here)."""
    import shutil

    from tkc.arch import ARCHS
    from tkc.build import _intact, read_entry

    options, _ = small_build
    by_arch = {}
    for entry in _entries(options):
        by_arch.setdefault(json.loads((entry / "meta.json").read_text())["arch"], entry)
    entry = tmp_path / "cache" / by_arch["sm90"].parent.name / by_arch["sm90"].name
    shutil.copytree(by_arch["sm90"], entry)
    assert read_entry(entry, ARCHS["sm90"]) is not None
    _damage(entry, damage, by_arch["sm100"])
    capsys.readouterr()
    assert not _intact(entry, ARCHS["sm90"])
    warned = capsys.readouterr().err
    assert f"tkc: cache entry {entry}: " in warned and warned.rstrip().endswith("rebuilding it")
    assert not entry.exists()


def test_an_entry_from_before_the_hashes_gets_them_once_its_cubin_passes(
        small_build: tuple[BuildOptions, list[ArchSummary]], tmp_path: Path) -> None:
    import shutil

    from tkc.arch import ARCHS
    from tkc.build import read_entry

    options, _ = small_build
    source = next(e for e in _entries(options) if json.loads((e / "meta.json").read_text())["arch"] == "sm90")
    entry = tmp_path / source.name
    shutil.copytree(source, entry)
    written = json.loads((entry / "meta.json").read_text())
    old = {k: v for k, v in written.items() if k not in ("cubin_sha256", "meta_sha256")}
    (entry / "meta.json").write_text(json.dumps(old, indent=1))
    with pytest.raises(ToolchainError, match="no recorded sha256"):
        read_entry(entry)  # without the arch there is nothing to check the cubin against
    assert read_entry(entry, ARCHS["sm90"]) is not None
    assert json.loads((entry / "meta.json").read_text()) == written  # what the build writes today


def test_an_unwritable_build_folder_is_a_package_error_not_a_traceback(tmp_path: Path) -> None:
    from tkc.errors import PackageError

    blocked = tmp_path / "build"
    blocked.write_text("a file where the build folder should be")
    options = dataclasses.replace(small_options(tmp_path, jobs=1), build_dir=blocked / "inner")
    with pytest.raises(PackageError, match=rf"^{blocked}/inner\S*: Not a directory; the build could not write its "
                                           r"files: free space, or pick writable --build-dir and --dist") as info:
        build(options)
    assert info.value.exit_code == 5 and not options.dist_dir.exists()


def test_nvcc_output_is_checked(small_build: tuple[BuildOptions, list[ArchSummary]]) -> None:
    """Not a cubin, a cubin of the other arch, a cubin without the kernel: each named, never packaged."""
    from tkc.arch import ARCHS
    from tkc.build import check_cubin, read_entry

    options, _ = small_build
    by_arch = {}
    for entry in _entries(options):
        meta = json.loads((entry / "meta.json").read_text())
        by_arch.setdefault(meta["arch"], entry)
    cubin, contract, _ = read_entry(by_arch["sm90"], ARCHS["sm90"])  # type: ignore[misc]
    assert check_cubin(cubin, ARCHS["sm90"], contract) is None
    assert check_cubin(b"random bytes", ARCHS["sm90"], contract).startswith("not a cubin")  # type: ignore[union-attr]
    assert check_cubin(cubin, ARCHS["sm100"], contract) == "a cubin for sm_90a, not sm_100a"
    renamed = dataclasses.replace(contract, launches=tuple(dataclasses.replace(launch, symbol="other_kernel")
                                                           for launch in contract.launches))
    assert check_cubin(cubin, ARCHS["sm90"], renamed) == "no kernel other_kernel in it"


def test_an_unwritable_dist_folder_is_a_package_error_and_leaves_nothing(
        small_build: tuple[BuildOptions, list[ArchSummary]], tmp_path: Path) -> None:
    from tkc.errors import PackageError

    options, _ = small_build
    blocked = tmp_path / "dist"
    blocked.write_text("a file where the dist folder should be")
    with pytest.raises(PackageError, match=rf"cannot write the wheel into {blocked}/wheels: .*writable --dist folder"):
        build(dataclasses.replace(options, dist_dir=blocked / "wheels"))
    assert blocked.read_text() == "a file where the dist folder should be"
    assert not list(tmp_path.glob("**/*.tmp"))


def test_nvcc_exiting_0_without_a_cubin_is_a_toolchain_error(small_build: tuple[BuildOptions, list[ArchSummary]],
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tkc.errors import ToolchainError

    options, _ = small_build
    fresh = dataclasses.replace(options, build_dir=tmp_path / "build", dist_dir=tmp_path / "dist", jobs=1)

    def no_output(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", "kernel.cubin")

    monkeypatch.setattr(tkc.build, "compile_unit", no_output)
    with pytest.raises(ToolchainError, match=r"nvcc exited 0 for .* without writing kernel.cubin; check the nvcc"):
        build(fresh)
    assert not (tmp_path / "dist").exists()


def test_two_concurrent_builds_into_one_build_and_dist_folder_agree(
        small_build: tuple[BuildOptions, list[ArchSummary]]) -> None:
    import subprocess
    import sys

    from tests.conftest import SMALL_SPEC, TEMPLATES

    options, first = small_build
    command = [sys.executable, "-m", "tkc", "build", "--specs", str(SMALL_SPEC), "--templates", str(TEMPLATES),
               "--build-dir", str(options.build_dir), "--dist", str(options.dist_dir)]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert [s.wheel.read_bytes() for s in first] == [s.wheel.read_bytes() for s in build(options)]
    assert not list(options.dist_dir.glob(".*.tmp"))


def test_an_arch_that_no_kernel_declares_is_refused(tmp_path: Path) -> None:
    """--arch sm103 over specs whose kernels list only sm90 would make an empty wheel: a UsageError says why."""
    from tests.conftest import SMALL_SPEC, TEMPLATES
    from tkc.arch import ARCHS
    from tkc.errors import UsageError
    from tkc.spec import load_specs

    spec = tmp_path / "sm90_only.yaml"
    spec.write_text(SMALL_SPEC.read_text().replace("archs: [sm90, sm100, sm103]", "archs: [sm90]"))
    options = dataclasses.replace(small_options(tmp_path), specs=load_specs([spec], TEMPLATES),
                                  archs=(ARCHS["sm90"], ARCHS["sm103"]))
    with pytest.raises(UsageError, match=r"^--arch sm103: no kernel to build declares sm103 \(their archs: name sm90\)"):
        plan(options)
    assert {arch.name for _, arch in plan(dataclasses.replace(options, archs=(ARCHS["sm90"],)))} == {"sm90"}


def test_the_multi_arch_wheel_is_byte_identical_across_builds(
        small_multi_build: tuple[BuildOptions, list[ArchSummary]], tmp_path: Path) -> None:
    """Packaged again from the same cache entries, in another build and dist folder: the same bytes (the
    per-arch test above shows the cubins themselves come out the same from a clean compile)."""
    import shutil

    options, first = small_multi_build
    assert all(s.compiled == 0 for s in first)  # packaged from the small build's cache entries
    shutil.copytree(options.build_dir / "cache", tmp_path / "build" / "cache")
    second = build(dataclasses.replace(options, build_dir=tmp_path / "build", dist_dir=tmp_path / "dist"))
    assert {s.wheel.name for s in second} == {first[0].wheel.name}
    assert second[0].wheel.read_bytes() == first[0].wheel.read_bytes()
    again = build(options)  # nothing changed: the wheel in dist is reused, not rebuilt
    assert again[0].wheel.read_bytes() == first[0].wheel.read_bytes()


def test_an_edit_of_comments_or_layout_reuses_the_entries_and_a_code_edit_does_not(
        small_build: tuple[BuildOptions, list[ArchSummary]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A template whose code is unchanged (a comment added, a line rewrapped) keys a new cache entry, which is a copy
    of the entry built from the same syntax tree: neither TileLang nor nvcc runs, and the wheels are the same bytes.
    A change of its code is a miss."""
    import shutil

    from tkc.spec import load_specs

    options, first = small_build
    templates = tmp_path / "kernels"
    shutil.copytree(options.templates, templates)
    shutil.copytree(options.build_dir / "cache", tmp_path / "build" / "cache")
    moved = dataclasses.replace(options, templates=templates, specs=load_specs([SMALL_SPEC], templates, options.specs.ops),
                                build_dir=tmp_path / "build", dist_dir=tmp_path / "dist")
    assert all(s.compiled == 0 for s in build(moved))  # the same text: the entries themselves (and now indexed)
    template = templates / "transpose" / "batched_transpose.py.j2"
    text = template.read_text()
    template.write_text("# a comment, then the same code\n" + text.replace("import tilelang.language as T",
                                                                          "import tilelang.language as T  # layout"))

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("an edit of comments only must not lower or compile")

    with monkeypatch.context() as patched:
        patched.setattr(tkc.build, "lower", forbidden)
        patched.setattr(tkc.build, "compile_unit", forbidden)
        again = build(moved)
    assert all(s.compiled == 0 and s.cached == s.variants for s in again)
    assert [s.wheel.read_bytes() for s in again] == [s.wheel.read_bytes() for s in first]
    template.write_text(text.replace("import tilelang.language as T", "import tilelang.language as T\n\nUNUSED = 1"))
    changed = build(moved)
    assert sum(s.compiled for s in changed) == sum(1 for v, _ in plan(moved) if v.kernel.name == "batched_transpose")
