"""nvcc from PyPI, ptxas resource reports, and the arch a cubin carries."""

from __future__ import annotations

from pathlib import Path

import pytest

from tkc.arch import ARCHS, get_arch, parse_arch_list
from tkc.compile import UnitMember, compile_cubin, compile_unit, cubin_target, find_toolchain, parse_ptxas
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


# A kernel that includes headers: with line info its cubin would name the include folders (the venv's).
WITH_HEADERS = ('#include <cuda_fp16.h>\nextern "C" __global__ void k(float* x) '
                '{ x[threadIdx.x] = __half2float(__float2half(x[threadIdx.x])) * 2.0f; }\n')


def _compiled_in_two_folders(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The cubins of ``source`` compiled with TMPDIR in two different folders (each left empty again)."""
    import tempfile

    toolchain = find_toolchain()
    cubins = []
    for where in ("a", "b/deeper"):
        (tmp_path / where).mkdir(parents=True)
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / where))
        cubins.append(compile_cubin(source, ARCHS["sm90"], toolchain, name="k").cubin)
        assert list((tmp_path / where).iterdir()) == []  # its folder is gone again
    return cubins


def test_cubins_name_no_folder_of_the_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvcc runs in a fresh private folder (mkdtemp) per compile, yet two compiles under different TMPDIRs give
    the same bytes: without line info the cubin records neither that folder nor the include folders."""
    cubins = _compiled_in_two_folders(WITH_HEADERS, tmp_path, monkeypatch)
    assert cubins[0] == cubins[1]
    for marker in (str(tmp_path).encode(), b"tkc-nvcc", b"site-packages", b"/include"):
        assert marker not in cubins[0]


# Internal linkage: cicc names the symbol after a hash of the path it is told the source has.
WITH_INTERNAL_SYMBOL = ('namespace { __device__ int counter; }\n'
                        'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f + counter; }\n')


def test_internal_symbols_do_not_depend_on_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels that include libcu++ (TileLang's mma and TMA templates do) carry internal-linkage symbols, which
    cicc names after the source's path: two compiles in different fresh folders still give the same bytes."""
    cubins = _compiled_in_two_folders(WITH_INTERNAL_SYMBOL, tmp_path, monkeypatch)
    assert b"_INTERNAL_" in cubins[0] and cubins[0] == cubins[1]


def test_line_info_is_an_option() -> None:
    """--lineinfo builds record source lines, and with them the folder nvcc ran in."""
    toolchain, lined = find_toolchain(), find_toolchain(line_info=True)
    assert "-lineinfo" in lined.flags and "-lineinfo" not in toolchain.flags
    cubin = compile_cubin(WITH_HEADERS, ARCHS["sm90"], lined, name="k").cubin
    assert b"kernel.cu" in cubin and b"tkc-nvcc-" in cubin


# TileLang's prologue (the block compile units share) around a few small kernels of the kinds lowering gives.
PROLOGUE = """#if defined(_MSC_VER) && !defined(__clang__) && _MSC_VER < 1940
#define _tl_orig_alignas alignas
#define alignas(N) _tl_orig_alignas((N) <= 64 ? (N) : 64)
#include <cuda.h>
#undef alignas
#define alignas _tl_orig_alignas
#endif
#include <tl_templates/cuda/reduce.h>
#ifdef ENABLE_BF16
#include <tl_templates/cuda/cuda_bf16_fallbacks.cuh>
#endif
"""
MEMBERS = [  # one kernel name and one extern shared name for all, of different types; a helper before the prologue
    '__device__ __forceinline__ float twice(float a) { return a * 2.0f; }\n' + PROLOGUE +
    'extern "C" __global__ void __launch_bounds__(128, 1) k(float* __restrict__ x, int n) {\n'
    '  extern __shared__ __align__(1024) float buf[];\n  buf[threadIdx.x] = x[threadIdx.x];\n  __syncthreads();\n'
    '  if (threadIdx.x < n) x[threadIdx.x] = twice(buf[127 - threadIdx.x]);\n}\n',
    PROLOGUE + 'extern "C" __global__ void k(half_t* __restrict__ y) {\n'
    '  extern __shared__ __align__(1024) half_t buf[];\n  buf[threadIdx.x] = y[threadIdx.x];\n  __syncthreads();\n'
    '  for (int i = 0; i < 4; ++i) { if (buf[i] > half_t(0)) y[i] = buf[threadIdx.x]; }\n}\n',
    PROLOGUE + 'extern "C" __global__ void k(int* __restrict__ z) { z[blockIdx.x] = __sinf(z[0]) > 0.f; }\n',
]


def test_a_compile_unit_gives_each_member_the_cubin_of_its_own_compile() -> None:
    """One nvcc front end for the unit, ptxas per member, the names put back: byte for byte the lone cubins."""
    toolchain = find_toolchain()
    for arch in (ARCHS["sm90"], ARCHS["sm100"]):
        alone = [compile_cubin(s, arch, toolchain, name=f"m{i}") for i, s in enumerate(MEMBERS)]
        grouped = compile_unit([UnitMember(name=f"m{i}", cuda_source=s) for i, s in enumerate(MEMBERS)], arch,
                               toolchain)
        assert [g.cubin for g in grouped] == [a.cubin for a in alone]
        assert [g.resources for g in grouped] == [a.resources for a in alone]
        assert all(b"tkcunit" not in g.cubin for g in grouped)


def test_a_unit_nvcc_cannot_take_together_is_compiled_member_by_member(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body that names the global namespace fails inside the unit's namespaces: its members are compiled alone
    (same cubins), and a member that does not compile at all is named in the error."""
    import tkc.compile

    global_name = PROLOGUE + '__device__ int g;\nextern "C" __global__ void k(int* z) { z[0] = ::g; }\n'
    toolchain, arch = find_toolchain(), ARCHS["sm90"]
    alone = compile_cubin(global_name, arch, toolchain, name="a").cubin
    grouped = compile_unit([UnitMember(name="a", cuda_source=global_name),
                            UnitMember(name="b", cuda_source=MEMBERS[2])], arch, toolchain)
    assert grouped[0].cubin == alone
    with pytest.raises(ToolchainError, match="nvcc failed for broken"):
        compile_unit([UnitMember(name="fine", cuda_source=MEMBERS[2]),
                      UnitMember(name="broken", cuda_source=PROLOGUE + "this is not CUDA")], arch, toolchain)
    # Line tables name the unit's lines: with line info every member compiles alone.
    calls = []
    monkeypatch.setattr(tkc.compile, "_compile_group", lambda *a: calls.append(a))
    compile_unit([UnitMember(name=f"m{i}", cuda_source=s) for i, s in enumerate(MEMBERS)], arch,
                 find_toolchain(line_info=True))
    assert calls == []
