"""The tkc command: exit codes, messages, and nothing written on bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner

from tests.conftest import REPO, SMALL_SPEC, TEMPLATES
from tkc.cli import main


def test_validate_shipped_specs() -> None:
    result = CliRunner().invoke(main, ["validate", "--specs", str(REPO / "kernel_specs"), "--templates", str(TEMPLATES)])
    assert result.exit_code == 0, result.output
    assert "package tile_kernels_aot" in result.output


def test_ops_folder_option(tmp_path: Path) -> None:
    # Op paths resolve under --ops (default: ops/ beside --templates); a folder without them names the path.
    args = ["validate", "--specs", str(SMALL_SPEC), "--templates", str(TEMPLATES)]
    assert CliRunner().invoke(main, [*args, "--ops", str(REPO / "ops")]).exit_code == 0
    result = CliRunner().invoke(main, [*args, "--ops", str(tmp_path)])
    assert result.exit_code == 2
    assert f"'quant/per_token_cast.py' does not exist under {tmp_path}" in result.output


def test_bad_spec_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(SMALL_SPEC.read_text().replace("fmt: [e4m3, e2m1]", "fmt: [e4m3, e2m2]"))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", "--specs", str(bad), "--templates", str(TEMPLATES),
                                       "--build-dir", str(out / "build"), "--dist", str(out / "dist")])
    assert result.exit_code == 2
    assert "bad.yaml:15: kernels.per_token_cast.grid.fmt: bad value 'e2m2'" in result.output
    assert "did you mean 'e2m1'?" in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_unknown_arch_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["build", "--specs", str(SMALL_SPEC), "--templates", str(TEMPLATES),
                                       "--arch", "sm89", "--build-dir", str(tmp_path / "b")])
    assert result.exit_code == 2 and "unknown arch 'sm89'" in result.output
    assert not (tmp_path / "b").exists()


def test_list_and_render() -> None:
    args = ["--specs", str(SMALL_SPEC), "--templates", str(TEMPLATES)]
    listed = CliRunner().invoke(main, ["list", *args])
    assert listed.exit_code == 0 and "per_token_cast (quant" in listed.output and "fmt=e2m1" in listed.output
    rendered = CliRunner().invoke(main, ["render", *args, "per_token_cast", "--set", "fmt=e2m1", "--arch", "sm100"])
    assert rendered.exit_code == 0, rendered.output
    assert "for sm100 (sm_100a)" in rendered.output and "fmt=e2m1" in rendered.output
    missing = CliRunner().invoke(main, ["render", *args, "per_token_cast", "--set", "fmt=e5m6"])
    assert missing.exit_code == 2 and "no variant of per_token_cast" in missing.output
    unpaired = CliRunner().invoke(main, ["render", *args, "per_token_cast", "--set", "fmt"])
    assert unpaired.exit_code == 2 and isinstance(unpaired.exception, SystemExit), unpaired.output
    assert "--set 'fmt': write it as KEY=VALUE" in unpaired.output and "grid keys of per_token_cast: in_dtype" in \
        unpaired.output


def test_build_progress_in_a_log_is_lines(small_build: tuple[Any, Any], tmp_path: Path) -> None:
    """Without a terminal (CI) the progress is lines with counts and times, not one 'compiling' label."""
    options, _ = small_build
    result = CliRunner().invoke(main, ["build", "--specs", str(SMALL_SPEC), "--templates", str(TEMPLATES),
                                       "--build-dir", str(options.build_dir), "--dist", str(tmp_path / "dist")])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("compiling")]
    assert lines[0] == "compiling: 6 variants" and lines[-1].startswith("compiling: 6/6 (100%), ")
    assert "s left" in lines[-1]


def test_build_one_kernel(small_build: tuple[Any, Any], tmp_path: Path) -> None:
    """--kernel builds a wheel of just that kernel (seconds, from the cache); an unknown name is exit 2."""
    import zipfile

    options, _ = small_build
    # A build folder of its own (the generated project of a one-kernel build must not replace the shared
    # build's, which other tests import), sharing the shared build's cache.
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "cache").symlink_to(options.build_dir / "cache")
    args = ["build", "--specs", str(SMALL_SPEC), "--templates", str(TEMPLATES), "--build-dir",
            str(tmp_path / "build"), "--arch", "sm90", "--dist", str(tmp_path / "dist")]
    result = CliRunner().invoke(main, [*args, "--kernel", "batched_transpose"])
    assert result.exit_code == 0, result.output
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    launchers = {n.split("/_kernels/", 1)[1] for n in zipfile.ZipFile(wheel).namelist() if "/_kernels/" in n}
    assert {n.split("/")[0] for n in launchers} == {"__init__.py", "batched_transpose", "batched_transpose.bin"}
    assert "batched_transpose/__init__.py" in launchers and len(launchers) >= 4  # the index, a module per variant
    missing = CliRunner().invoke(main, [*args, "--kernel", "per_token_cst"])
    assert missing.exit_code == 2 and "no kernel 'per_token_cst'" in missing.output
    assert "per_token_cast" in missing.output


def test_build_multi_arch(small_build: tuple[Any, Any], tmp_path: Path) -> None:
    """--multi-arch: one wheel of the plain version for every --arch (from the cache), a summary row per arch."""
    options, _ = small_build
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "cache").symlink_to(options.build_dir / "cache")
    result = CliRunner().invoke(main, ["build", "--specs", str(SMALL_SPEC), "--templates", str(TEMPLATES),
                                       "--build-dir", str(tmp_path / "build"), "--arch", "sm90,sm100",
                                       "--multi-arch", "--dist", str(tmp_path / "dist")])
    assert result.exit_code == 0, result.output
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name == "tkc_small_kernels-0.0.1-cp310-abi3-linux_x86_64.whl"
    rows = [line.split() for line in result.output.splitlines() if line.startswith("sm")]
    assert [(row[0], row[5]) for row in rows] == [("sm90", wheel.name), ("sm100", wheel.name)]
    assert (tmp_path / "build" / "pkg" / "tkc_small_kernels" / "sm90-sm100").is_dir()
    assert "--multi-arch" in CliRunner().invoke(main, ["build", "--help"]).output
