"""nvcc from PyPI, ptxas resource reports, and the arch a cubin carries."""

from __future__ import annotations

from pathlib import Path

import pytest

from tkc.arch import ARCHS, get_arch, parse_arch_list
from tkc.compile import compile_cubin, cubin_target, find_toolchain, parse_ptxas
from tkc.errors import ToolchainError, UsageError

SIMPLE = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n'


def test_pypi_nvcc_is_found_without_system_cuda() -> None:
    toolchain = find_toolchain()
    assert "site-packages" in str(toolchain.nvcc) or "dist-packages" in str(toolchain.nvcc)
    assert toolchain.version.startswith("13.0")


@pytest.mark.parametrize(("arch", "target"), [("sm90", "sm_90a"), ("sm100", "sm_100a")])
def test_cubin_elf_says_its_arch(arch: str, target: str) -> None:
    compiled = compile_cubin(SIMPLE, ARCHS[arch], find_toolchain(), name="k")
    assert cubin_target(compiled.cubin) == target
    assert compiled.resources["k"].registers > 0


def test_nvcc_errors_carry_the_log() -> None:
    with pytest.raises(ToolchainError, match="nvcc failed for broken"):
        compile_cubin("this is not CUDA", ARCHS["sm90"], find_toolchain(), name="broken")


def test_missing_nvcc_path(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError, match="no such file"):
        find_toolchain(str(tmp_path / "nvcc"))


def test_not_a_cubin() -> None:
    with pytest.raises(ToolchainError):
        cubin_target(b"not an elf file at all, padded out to the header size..........")


def test_parse_ptxas() -> None:
    log = """ptxas info    : Compiling entry function 'kern' for 'sm_90a'
ptxas info    : Function properties for kern
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 380 bytes cmem[0]
"""
    (res,) = parse_ptxas(log).values()
    assert (res.registers, res.stack_bytes, res.spill_stores, res.spill_loads, res.static_smem) == (40, 8, 4, 4, 1024)


def test_arch_names() -> None:
    assert get_arch("sm_90a") is ARCHS["sm90"] and get_arch("100") is ARCHS["sm100"]
    assert parse_arch_list("sm90,sm100,sm90") == (ARCHS["sm90"], ARCHS["sm100"])
    assert ARCHS["sm90"].gencode == "arch=compute_90a,code=sm_90a"
    with pytest.raises(UsageError, match="choose from sm90, sm100"):
        parse_arch_list("sm75")


def test_nvcc_works_in_a_folder_private_to_the_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """<tmp>/tkc-nvcc must be this user's own directory that nobody else can write (else a planted symlink would
    redirect nvcc's files): made so when missing or too open, refused when a symlink or another user's."""
    import os
    import stat
    import tempfile

    from tkc.build import private_nvcc_root
    from tkc.errors import ToolchainError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = private_nvcc_root()
    assert root == tmp_path / "tkc-nvcc" and stat.S_IMODE(root.stat().st_mode) == 0o700
    root.chmod(0o777)
    assert stat.S_IMODE(private_nvcc_root().stat().st_mode) == 0o700
    root.rmdir()
    (tmp_path / "elsewhere").mkdir()
    root.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ToolchainError, match="not a directory of its own .*; remove .* or point TMPDIR"):
        private_nvcc_root()
    root.unlink()
    if os.getuid() == 0:  # root can hand the folder to another user, as an attacker's would be
        root.mkdir()
        os.chown(root, 65534, 65534)
        with pytest.raises(ToolchainError, match="belongs to another user"):
            private_nvcc_root()
