"""The package stage: wheel names and contents, manifest, cubin ELF arch, install and import without a GPU."""

from __future__ import annotations

import json
import lzma
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import packed_cubin
from tkc.build import ArchSummary, BuildOptions
from tkc.compile import cubin_target
from tkc.fsutil import sha256_bytes
from tkc.native import SOURCES
from tkc.package import RUNTIME_FILES, compress_pack, public_names

pytestmark = pytest.mark.slow


def _wheel(summaries: list[ArchSummary], arch: str) -> Path:
    return next(s.wheel for s in summaries if s.arch.name == arch)


def test_wheel_names_carry_the_arch(small_build: tuple[BuildOptions, list[ArchSummary]]) -> None:
    # cp310-abi3: the wheel holds the stable-ABI launch module (tkc/native.py), built on this host.
    _, summaries = small_build
    assert _wheel(summaries, "sm90").name == "tkc_small_kernels-0.0.1+sm90-cp310-abi3-linux_x86_64.whl"
    assert _wheel(summaries, "sm100").name == "tkc_small_kernels-0.0.1+sm100-cp310-abi3-linux_x86_64.whl"
    assert _wheel(summaries, "sm103").name == "tkc_small_kernels-0.0.1+sm103-cp310-abi3-linux_x86_64.whl"
    assert all(s.native_launch_missing == "" for s in summaries)


def test_launch_module_is_stable_abi_and_needs_no_library(small_build: tuple[BuildOptions, list[ArchSummary]]) -> None:
    # The wheel tag promises CPython >= 3.10 (abi3) and manylinux_2_17 (cibuildwheel): the module
    # may import nothing but the limited Python API, and no glibc symbol newer than 2.17.
    _, summaries = small_build
    with zipfile.ZipFile(_wheel(summaries, "sm90")) as wheel:
        data = wheel.read("tkc_small_kernels/_launch.abi3.so")
    assert data[:4] == b"\x7fELF"
    assert b"libpython" not in data and b"libcuda" not in data
    versions = [tuple(map(int, v)) for v in re.findall(rb"GLIBC_(\d+)\.(\d+)", data)]
    assert all(v <= (2, 17) for v in versions), versions
    symbols = set(re.findall(rb"\b(Py[A-Za-z_]+|_Py[A-Za-z_]+)\b", data))
    # The underscored names the limited API's own macros use (Py_RETURN_NONE, Py_RETURN_TRUE and
    # Py_RETURN_FALSE, Py_DECREF); all are in CPython's stable ABI list (Misc/stable_abi.toml).
    stable_private = {b"_Py_NoneStruct", b"_Py_TrueStruct", b"_Py_FalseStruct", b"_Py_Dealloc"}
    assert symbols and not [s for s in symbols if s.startswith(b"_Py") and s not in stable_private]


@pytest.mark.parametrize(("arch", "target"), [("sm90", "sm_90a"), ("sm100", "sm_100a"), ("sm103", "sm_103a")])
def test_wheel_contents_manifest_and_cubins(small_build: tuple[BuildOptions, list[ArchSummary]], arch: str,
                                            target: str) -> None:
    _, summaries = small_build
    with zipfile.ZipFile(_wheel(summaries, arch)) as wheel:
        names = set(wheel.namelist())
        assert names == set(sorted(names))
        for required in ("__init__.py", *RUNTIME_FILES, "_launch.abi3.so", *(part.name for part in SOURCES),
                         "_protocol.h", "_build_info.py", "manifest.json",
                         "_kernels/per_token_cast/__init__.py", "_kernels/per_token_cast.bin",
                         "_kernels/batched_transpose/__init__.py", "_kernels/batched_transpose.bin", "quant/__init__.py",
                         "quant/_per_token_cast.py", "quant/_scales.py", "transpose/__init__.py",
                         "transpose/_batched_transpose.py"):
            assert f"tkc_small_kernels/{required}" in names
        # One launcher module per variant; the cubins in one xz pack per kernel (the small spec's are small).
        packs = {n.removeprefix("tkc_small_kernels/cubins/") for n in names if n.startswith("tkc_small_kernels/cubins/")}
        assert packs == {"per_token_cast.0.xz", "batched_transpose.0.xz"}
        launchers = {n.rsplit("/", 1)[1].removesuffix(".py") for n in names
                     if n.startswith("tkc_small_kernels/_kernels/") and n.count("/") == 3} - {"__init__"}
        # Nothing of the build machine travels: no TileLang sources, no CUDA sources.
        assert not [n for n in names if n.endswith((".cu", ".j2"))]
        manifest = json.loads(wheel.read("tkc_small_kernels/manifest.json"))
        assert manifest["arch"] == arch and manifest["target"] == target
        metadata = wheel.read(f"tkc_small_kernels-0.0.1+{arch}.dist-info/METADATA").decode()
        requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
        assert requires == ["Requires-Dist: torch>=2.4"]
        variants = [v for k in manifest["kernels"].values() for v in k["variants"]]
        assert len(variants) == 3 and launchers == {v["id"] for v in variants}
        for v in variants:
            cubin = packed_cubin(wheel, "tkc_small_kernels", v)
            assert len(cubin) == v["bytes"] and sha256_bytes(cubin) == v["sha256"]
            assert cubin_target(cubin) == target
            (launch,) = v["contract"]["launches"]
            assert launch["block"][0] > 0 and launch["grid"]
            for symbol, res in v["resources"].items():
                assert symbol == launch["symbol"]
                assert res["registers"] > 0 and res["spill_stores"] == 0
        ptc = manifest["kernels"]["per_token_cast"]
        assert ptc["keys"] == ["in_dtype", "hidden", "fmt", "npc", "round_sf"]
        assert {v["params"]["fmt"] for v in ptc["variants"]} == {"e4m3", "e2m1"}
        for v in ptc["variants"]:
            assert any("num_tokens" in g for g in v["contract"]["launches"][0]["grid"])
        # One line per variant (the file diffs per variant), holding what its cache entry recorded.
        lines = wheel.read("tkc_small_kernels/manifest.json").decode().splitlines()
        for v in variants:
            (line,) = [line for line in lines if f'"id": "{v["id"]}"' in line]
            assert json.loads(line.strip().rstrip(",")) == v
    options, _ = small_build
    metas = [json.loads(p.read_text()) for p in (options.build_dir / "cache").glob("*/*/meta.json")]
    entries = {(m["variant"], m["arch"]): m for m in metas}
    for v in variants:
        meta = entries[(v["id"], arch)]
        assert v["contract"] == meta["contract"] and v["resources"] == meta["resources"]


def test_installed_wheel_imports_without_gpu_and_without_tilelang(
        small_build: tuple[BuildOptions, list[ArchSummary]], tmp_path: Path) -> None:
    _, summaries = small_build
    env_dir = tmp_path / "venv"
    # A fresh venv that sees this interpreter's torch through a .pth file (no download); the wheel itself
    # installs --no-deps. Not system_site_packages: inside a virtualenv that would be the base
    # interpreter's packages, where torch need not be.
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    torch_site = Path(torch.__file__).resolve().parents[1]
    (site_packages,) = env_dir.glob("lib/python*/site-packages")
    (site_packages / "host_torch.pth").write_text(f"{torch_site}\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(tmp_path / "site"), str(_wheel(summaries, "sm90"))], check=True)
    script = """
import sys, torch
import tkc_small_kernels as tk
from tkc_small_kernels.errors import NoGpuError, KernelArgumentError, VariantNotFoundError
assert tk.ARCH == "sm90" and tk.__version__ == "0.0.1+sm90", (tk.ARCH, tk.__version__)
assert callable(tk.quant.per_token_cast) and callable(tk.transpose.batched_transpose)
x = torch.randn(4, 2048, dtype=torch.bfloat16)
try:
    tk.quant.per_token_cast(x, "e4m3", 128, round_sf=True)
except NoGpuError as exc:
    assert "x" in str(exc) and "GPU" in str(exc), exc
else:
    raise AssertionError("a CPU tensor without a GPU must raise NoGpuError")
try:
    tk.quant.per_token_cast(torch.randn(4, 1536, dtype=torch.bfloat16), "e4m3", 128, round_sf=True)
except VariantNotFoundError as exc:
    assert "hidden=1536" in str(exc) and "small.yaml" in str(exc) and "hidden=2048" in str(exc), exc
else:
    raise AssertionError("an uncovered H must raise VariantNotFoundError")
assert "tilelang" not in sys.modules and "tkc" not in sys.modules
print("ok")
"""
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("ok")


def test_public_names_prefers_dunder_all(tmp_path: Path) -> None:
    op = tmp_path / "op.py"
    op.write_text("__all__ = ['a']\ndef a(): pass\ndef b(): pass\n")
    assert public_names(op) == ["a"]
    op.write_text("def a(): pass\ndef _hidden(): pass\n")
    assert public_names(op) == ["a"]


def _one_variant(tmp_path: Path, op_files: dict[str, str], extra: str = "") -> tuple[Any, Any]:
    """A spec set of one kernel (module fam, op fam/k.py) whose ops/ folder holds op_files, and its one built variant."""
    from tkc.arch import ARCHS
    from tkc.lower import KernelArg, Launch, LaunchContract, SizeSource, TensorParam
    from tkc.package import BuiltVariant
    from tkc.spec import expand, load_specs

    (tmp_path / "kernels" / "fam").mkdir(parents=True)
    (tmp_path / "kernels" / "fam" / "k.py.j2").write_text("prim_func = None\n")
    for rel, text in op_files.items():
        (tmp_path / "ops" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ops" / rel).write_text(text)
    spec = tmp_path / "s.yaml"
    spec.write_text("package: {name: p, version: '1'}\nkernels:\n  k:\n    module: fam\n    template: fam/k.py.j2\n"
                    "    op: fam/k.py\n    grid: {n: [1]}\n" + extra)
    specs = load_specs([spec], tmp_path / "kernels")
    launch = Launch(symbol="k_kernel", args=(KernelArg(name="x", kind="tensor", ctype="pointer", expr="x"),),
                    grid=("1", "1", "1"), block=(32, 1, 1), dynamic_smem=0, cooperative=False, cluster=None)
    contract = LaunchContract(params=(TensorParam(name="x", dtype="float32", shape=("m",), strides=(1,), written=True),),
                              sizes=(SizeSource(name="m", tensor="x", dim=0, kind="shape"),), tma=(), launches=(launch,))
    built = BuiltVariant(variant=expand(specs.kernels[0])[0], arch=ARCHS["sm90"], cubin=b"", contract=contract,
                         resources={}, cached=True)
    return specs, built


def test_an_op_familys_private_helpers_install_beside_its_op_modules(tmp_path: Path) -> None:
    from tkc.arch import ARCHS
    from tkc.package import package_files

    specs, built = _one_variant(tmp_path, {"fam/k.py": "from ._shared import twice\n__all__ = ['k']\n"
                                                       "def k(x):\n    return twice(x)\n",
                                           "fam/_shared.py": "def twice(x):\n    return 2 * x\n"})
    files = package_files(specs, ARCHS["sm90"], [built], {})
    assert files["p/fam/_shared.py"].endswith(b"def twice(x):\n    return 2 * x\n")
    assert b"from ._shared import twice" in files["p/fam/_k.py"]


def _run_installed(files: dict[str, bytes], site: Path, script: str) -> None:
    """Write the package's files into ``site`` and run ``script`` there, which must print ok."""
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=site)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr


def test_public_modules_of_the_op_tree_install_under_their_names_and_export_their_all(tmp_path: Path) -> None:
    """ops/<name>.py and ops/<family>/<name>.py that no spec names as an op are API (TileKernels'
    tile_kernels.config, tile_kernels.quant.types): installed as such, their __all__ exported lazily."""
    from tkc.arch import ARCHS
    from tkc.package import package_files

    specs, built = _one_variant(tmp_path, {"fam/k.py": "__all__ = ['k']\ndef k(x):\n    return x\n",
                                           "fam/kinds.py": "__all__ = ['Kind']\nclass Kind:\n    pass\n",
                                           "config.py": "__all__ = ['knob']\ndef knob():\n    return 7\n"})
    files = package_files(specs, ARCHS["sm90"], [built], {})
    assert files["p/fam/kinds.py"].endswith(b"class Kind:\n    pass\n")
    assert files["p/config.py"].endswith(b"def knob():\n    return 7\n")
    script = ("import sys, p\nassert 'p.config' not in sys.modules\n"  # the root imports nothing it exports
              "assert p.knob() == 7 and p.config.knob is p.knob\n"
              "assert p.fam.Kind is p.fam.kinds.Kind\n"
              "assert {'knob', 'config'} <= set(p.__all__) and {'Kind', 'kinds', 'k'} <= set(p.fam.__all__)\n"
              "print('ok')")
    _run_installed(files, tmp_path / "site", script)


def test_a_folder_of_public_modules_without_kernels_installs_as_a_module(tmp_path: Path) -> None:
    """ops/<layer>/ holding only public modules (TileKernels' modeling, a layer over the kernel modules)
    installs as module <layer>, its modules' __all__ exported lazily, importing the kernel modules."""
    from tkc.arch import ARCHS
    from tkc.package import package_files

    specs, built = _one_variant(tmp_path, {"fam/k.py": "__all__ = ['k']\ndef k(x):\n    return x + 1\n",
                                           "layer/block.py": "from ..fam import k\n__all__ = ['Block']\n"
                                                             "class Block:\n    def __call__(self, x):\n"
                                                             "        return 2 * k(x)\n",
                                           "layer/_private.py": "X = 1\n"})
    files = package_files(specs, ARCHS["sm90"], [built], {})
    assert "p/layer/block.py" in files and "p/layer/_private.py" not in files
    script = ("import sys, p\nassert 'p.layer.block' not in sys.modules\n"
              "assert p.layer.Block()(3) == 8 and p.layer.block.Block is p.layer.Block\n"
              "assert 'layer' in p.__all__ and {'Block', 'block'} <= set(p.layer.__all__)\n"
              "print('ok')")
    _run_installed(files, tmp_path / "site", script)


def test_a_layer_installs_its_sub_folders_as_sub_packages(tmp_path: Path) -> None:
    """ops/<layer>/<sub>/.../<name>.py (TileKernels' modeling.mhc.ops.pre_apply_mix) installs as
    <layer>.<sub>...<name>, at any depth, importable by its dotted path, each sub-package exporting its modules'
    __all__ and its own sub-packages."""
    from tkc.arch import ARCHS
    from tkc.package import package_files

    specs, built = _one_variant(tmp_path, {"fam/k.py": "__all__ = ['k']\ndef k(x):\n    return x + 1\n",
                                           "layer/sub/ops.py": "from ...fam import k\n__all__ = ['twice']\n"
                                                               "def twice(x):\n    return 2 * k(x)\n",
                                           "layer/deep/er/mod.py": "from ....fam import k\n__all__ = ['thrice']\n"
                                                                   "def thrice(x):\n    return 3 * k(x)\n"})
    files = package_files(specs, ARCHS["sm90"], [built], {})
    assert "p/layer/sub/ops.py" in files and "p/layer/sub/__init__.py" in files
    script = ("import p\nfrom p.layer.sub.ops import twice\n"
              "assert twice(3) == 8 and p.layer.sub.twice is twice and p.layer.sub.ops.twice is twice\n"
              "assert 'sub' in p.layer.__all__ and {'ops', 'twice'} <= set(p.layer.sub.__all__)\n"
              "from p.layer.deep.er.mod import thrice\nassert thrice(1) == 6 and p.layer.deep.er.thrice is thrice\n"
              "print('ok')")
    _run_installed(files, tmp_path / "site", script)


def test_a_layer_folder_with_a_reserved_name_is_an_error(tmp_path: Path) -> None:
    from tkc.arch import ARCHS
    from tkc.errors import PackageError
    from tkc.package import package_files

    specs, built = _one_variant(tmp_path, {"fam/k.py": "__all__ = ['k']\ndef k(x):\n    return x\n",
                                           "cubins/thing.py": "__all__ = ['T']\nT = 1\n"})
    with pytest.raises(PackageError, match="a folder of public modules installs as p/cubins, a name the package "
                                           "reserves; rename it"):
        package_files(specs, ARCHS["sm90"], [built], {})


def test_a_public_module_with_a_name_the_package_has_is_an_error(tmp_path: Path) -> None:
    from tkc.arch import ARCHS
    from tkc.errors import PackageError
    from tkc.package import package_files

    specs, built = _one_variant(tmp_path, {"fam/k.py": "__all__ = ['k']\ndef k(x):\n    return x\n",
                                           "errors.py": "X = 1\n"})
    with pytest.raises(PackageError, match="ops/errors.py: a public module of the op tree installs as p/errors.py, "
                                           "a name the package already has; rename it"):
        package_files(specs, ARCHS["sm90"], [built], {})


def test_a_helper_where_an_op_module_installs_is_an_error(tmp_path: Path) -> None:
    from tkc.arch import ARCHS
    from tkc.errors import PackageError
    from tkc.package import package_files

    specs, built = _one_variant(tmp_path, {"fam/k.py": "def k(x):\n    return x\n", "fam/_k.py": "X = 1\n"})
    with pytest.raises(PackageError, match="a helper installs as p/fam/_k.py, which is an op module's place"):
        package_files(specs, ARCHS["sm90"], [built], {})


def _launcher(files: dict[str, bytes]) -> str:
    """The launcher module of the one variant of kernel k in package p."""
    (name,) = [n for n in files if n.startswith("p/_kernels/k/") and not n.endswith("/__init__.py")]
    return files[name].decode()


def test_a_kernels_requirements_are_checked_by_its_launchers(tmp_path: Path) -> None:
    from tkc.arch import ARCHS
    from tkc.errors import PackageError
    from tkc.package import package_files

    op = {"fam/k.py": "def k(x):\n    return x\n"}
    specs, built = _one_variant(tmp_path, op, "    requires: ['m % 64 == 0']\n")
    launcher = _launcher(package_files(specs, ARCHS["sm90"], [built], {}))
    assert "and (m % 64) == (0)" in launcher  # the fast Python check
    assert 'raise KernelArgumentError(f"x: the kernel requires m % 64 == 0, got m = {m}' in launcher
    specs, built = _one_variant(tmp_path / "other", op, "    requires: ['rows % 64 == 0']\n")
    with pytest.raises(PackageError, match=r"s.yaml:3: kernels.k: requires: 'rows % 64': not a sum.*runtime sizes \(m\)"):
        package_files(specs, ARCHS["sm90"], [built], {})


def test_requirements_may_name_grid_keys_bound_per_variant(tmp_path: Path) -> None:
    """A grid key that is no runtime size of the variant is its value (hidden: [0, 2048] is a runtime size in one
    variant and a constant in the other); a requirement of constants only is decided at build time."""
    from tkc.arch import ARCHS
    from tkc.errors import PackageError
    from tkc.pack import bind
    from tkc.package import package_files

    op = {"fam/k.py": "def k(x):\n    return x\n"}
    specs, built = _one_variant(tmp_path, op, "    requires: ['m % (64 * n) == 0', 'n % 2 == 1']\n")
    launcher = _launcher(package_files(specs, ARCHS["sm90"], [built], {}))
    assert "and (m % (64 * 1)) == (0)" in launcher and "n % 2" not in launcher
    specs, built = _one_variant(tmp_path / "other", op, "    requires: ['n % 2 == 0']\n")
    with pytest.raises(PackageError, match=r"s.yaml:3: kernels.k.requires: n % 2 == 0 does not hold for n=1"):
        package_files(specs, ARCHS["sm90"], [built], {})
    assert bind([("hidden % max(npc, 64)", "0")], {"hidden": 0, "npc": 128}, ["hidden"]) == (
        ("hidden % max(128, 64)", "0"),)
    assert bind([("hidden % 64", "0")], {"hidden": 2048}, ["num_tokens"]) == ()
    with pytest.raises(ValueError, match="grid key fmt is 'e4m3' here, not an integer"):
        bind([("m % fmt", "0")], {"fmt": "e4m3"}, ["m"])


@pytest.mark.parametrize("broken", ["fam/k.py", "fam/_shared.py", "config.py"])
def test_an_op_tree_module_with_a_syntax_error_is_a_package_error_naming_it(tmp_path: Path, broken: str) -> None:
    from tkc.arch import ARCHS
    from tkc.errors import PackageError
    from tkc.package import package_files

    files = {"fam/k.py": "__all__ = ['k']\ndef k(x):\n    return x\n", "fam/_shared.py": "X = 1\n",
             "config.py": "__all__ = []\n"}
    files[broken] = "def k(:\n"
    specs, built = _one_variant(tmp_path, files)
    with pytest.raises(PackageError, match=rf"ops/{broken}:1: not valid Python \(.*\); fix the module"):
        package_files(specs, ARCHS["sm90"], [built], {})


def test_the_wheel_states_the_driver_its_cubins_need(tmp_path: Path) -> None:
    from tkc.arch import ARCHS
    from tkc.package import package_files

    specs, built = _one_variant(tmp_path, {"fam/k.py": "__all__ = ['k']\ndef k(x):\n    return x\n"})
    files = package_files(specs, ARCHS["sm90"], [built], {"nvcc": "13.0.88"})
    assert b"needs an NVIDIA driver for CUDA 13.0 or later" in files["pyproject.toml"]
    assert b"\nCUDA = (13, 0)\n" in files["p/_build_info.py"]
    unknown = package_files(specs, ARCHS["sm90"], [built], {})
    assert b"needs an NVIDIA driver" not in unknown["pyproject.toml"]
    assert b"\nCUDA = (0, 0)\n" in unknown["p/_build_info.py"]


def test_the_multi_arch_wheel_holds_every_archs_cubins_under_a_plain_version(
        small_build: tuple[BuildOptions, list[ArchSummary]],
        small_multi_build: tuple[BuildOptions, list[ArchSummary]]) -> None:
    _, per_arch = small_build
    options, summaries = small_multi_build
    (wheel_path,) = {s.wheel for s in summaries}  # one wheel, a summary row per arch
    assert [s.arch.name for s in summaries] == ["sm90", "sm100", "sm103"]
    # The plain version (a package index accepts it) and the per-arch wheels' tags.
    assert wheel_path.name == "tkc_small_kernels-0.0.1-cp310-abi3-linux_x86_64.whl"
    assert wheel_path.name.split("-")[2:] == _wheel(per_arch, "sm90").name.split("-")[2:]
    with zipfile.ZipFile(wheel_path) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read("tkc_small_kernels-0.0.1.dist-info/METADATA").decode()
        assert "Version: 0.0.1\n" in metadata and "+sm" not in metadata
        assert "H100/H200 (sm_90a), B200/GB200 (sm_100a), B300/GB300 (sm_103a)" in metadata
        root = json.loads(wheel.read("tkc_small_kernels/manifest.json"))
        assert root["version"] == "0.0.1" and root["archs"] == {a: f"manifests/{a}.json"
                                                                 for a in ("sm90", "sm100", "sm103")}
        info = wheel.read("tkc_small_kernels/_build_info.py").decode()
        assert "ARCH = 'sm90,sm100,sm103'" in info and "MULTI_ARCH = True" in info and "ALIGNMENT = 32" in info
        for s in per_arch:  # each arch's variants as its per-arch wheel has them, in folders of the arch
            arch, target = s.arch.name, s.arch.target
            manifest = json.loads(wheel.read(f"tkc_small_kernels/manifests/{arch}.json"))
            assert manifest["arch"] == arch and manifest["target"] == target and manifest["version"] == "0.0.1"
            with zipfile.ZipFile(s.wheel) as single:
                alone = json.loads(single.read("tkc_small_kernels/manifest.json"))
                for kernel, entry in manifest["kernels"].items():
                    assert f"tkc_small_kernels/_kernels/{kernel}/{arch}/__init__.py" in names
                    assert f"tkc_small_kernels/_kernels/{kernel}/{arch}.bin" in names
                    theirs = {v["id"]: v for v in alone["kernels"][kernel]["variants"]}
                    for v in entry["variants"]:
                        assert v["cubin"] == f"cubins/{arch}/{kernel}.0.xz"
                        cubin = packed_cubin(wheel, "tkc_small_kernels", v)
                        assert cubin == packed_cubin(single, "tkc_small_kernels", theirs[v["id"]])
                        assert sha256_bytes(cubin) == v["sha256"] and cubin_target(cubin) == target
                        assert v["contract"] == theirs[v["id"]]["contract"]
                        launcher = wheel.read(f"tkc_small_kernels/_kernels/{kernel}/{arch}/{v['id']}.py").decode()
                        assert (f'_CUBIN = Cubin(\n    "{arch}/{kernel}.0.xz",\n    "{v["sha256"]}",\n    "{arch}",\n'
                                f'    offset={v["offset"]},\n    size={v["bytes"]},\n)') in launcher
                        assert "from ...._runtime import" in launcher and f'table("{kernel}/{arch}")' in launcher
        for kernel in ("per_token_cast", "batched_transpose"):
            index = wheel.read(f"tkc_small_kernels/_kernels/{kernel}/__init__.py").decode()
            assert "archs=('sm90', 'sm100', 'sm103')" in index
        # One copy of everything that is the same for every arch.
        assert len([n for n in names if n.endswith("_launch.abi3.so")]) == 1
        assert not [n for n in names if n.startswith("tkc_small_kernels/cubins/") and n.count("/") == 2]
    project = options.build_dir / "pkg" / "tkc_small_kernels" / "sm90-sm100-sm103"
    assert 'version = "0.0.1"' in (project / "pyproject.toml").read_text()


def test_compressed_packs_are_kept_by_content_and_a_damaged_one_is_redone(tmp_path: Path) -> None:
    raw = bytes(range(256)) * 1000
    first = compress_pack(raw, tmp_path)
    (kept,) = tmp_path.iterdir()
    assert kept.name == f"{sha256_bytes(raw)}.xz" and kept.read_bytes() == first == compress_pack(raw)
    assert lzma.decompress(first) == raw
    kept.write_bytes(first[:-8])  # truncated: not used, written again
    assert compress_pack(raw, tmp_path) == first and kept.read_bytes() == first
    kept.write_bytes(compress_pack(raw[:-1]))  # a valid stream of other bytes under this name: not used either
    assert compress_pack(raw, tmp_path) == first
