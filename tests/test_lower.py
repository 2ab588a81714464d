"""Lowering with TileLang for both archs with no GPU, and the launch contract read back from the IR."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import REPO, SMALL_SPEC, TEMPLATES
from tkc.arch import ARCHS
from tkc.lower import ScalarParam, TensorParam, lower, py_expr
from tkc.render import render
from tkc.spec import expand, load_specs


def _variant(kernel: str, specs: Path = SMALL_SPEC, **params: object):  # type: ignore[no-untyped-def]
    spec = load_specs([specs], TEMPLATES).kernel(kernel)
    return next(v for v in expand(spec) if all(v.param_dict[k] == p for k, p in params.items()))


def _lower_shipped(kernel: str, arch: str, tmp_path: Path, **params: object):  # type: ignore[no-untyped-def]
    """The lowered variant of a shipped kernel (kernel_specs/) whose grid values include ``params``: its one launch
    and its CUDA source."""
    variant = _variant(kernel, REPO / "kernel_specs", **params)
    lowered = lower(render(variant, ARCHS[arch], TEMPLATES, tmp_path), ARCHS[arch])
    (launch,) = lowered.contract.launches
    return launch, lowered.cuda_source


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_per_token_cast_contract(arch: str, fmt: str, tmp_path: Path) -> None:
    rendered = render(_variant("per_token_cast", fmt=fmt), ARCHS[arch], TEMPLATES, tmp_path)
    lowered = lower(rendered, ARCHS[arch])
    c = lowered.contract
    # The parameters keep the prim_func's names (the launcher's errors name them): the e2m1 kernel
    # reads x and stores q through uint32 views, and a view bound to a name would rename its tensor.
    assert [p.name for p in c.params] == ["x", "q", "sf", "mode"]
    x, q, sf, mode = c.params
    assert isinstance(x, TensorParam) and x.dtype == "bfloat16" and x.shape == ("num_tokens", 2048)
    # x's row stride is a runtime size read from the tensor (x[:, :H] of a wider tensor).
    assert x.strides == ("x_row_stride", 1)
    npc = 128 if fmt == "e4m3" else 32
    if fmt == "e4m3":
        assert isinstance(q, TensorParam) and q.dtype in ("float8_e4m3fn", "float8_e4m3")
    else:
        assert isinstance(q, TensorParam) and q.dtype == "int8" and q.shape == ("num_tokens", 1024)
    assert isinstance(sf, TensorParam) and sf.shape == ("num_tokens", 2048 // npc) and sf.dtype == "float32"
    assert isinstance(mode, ScalarParam) and mode.dtype == "int32"  # cast / sf only / precomputed sf
    assert (x.written, q.written, sf.written) == (False, True, True)  # what the overlap check guards
    sizes = {(s.name, s.tensor, s.dim, s.kind) for s in c.sizes}
    assert sizes == {("num_tokens", "x", 0, "shape"), ("x_row_stride", "x", 0, "stride")}
    (launch,) = c.launches
    # Every tensor reaches the kernel, whatever order the lowered host code uses.
    assert {a.name for a in launch.args if a.kind == "tensor"} == {"x", "q", "sf"}
    assert any(a.kind == "size" and a.name == "num_tokens" for a in launch.args)
    assert "num_tokens" in " ".join(launch.grid)
    grid0 = eval(launch.grid[0], {}, {"num_tokens": 0})
    assert grid0 == 0 and eval(launch.grid[0], {}, {"num_tokens": 1}) >= 1
    assert "extern \"C\" __global__" in lowered.cuda_source and launch.symbol in lowered.cuda_source
    assert "__fdividef" not in lowered.cuda_source


@pytest.mark.slow
def test_transpose_contract_records_tma_descriptors(tmp_path: Path) -> None:
    rendered = render(_variant("batched_transpose"), ARCHS["sm90"], TEMPLATES, tmp_path)
    c = lower(rendered, ARCHS["sm90"]).contract
    assert {s.name for s in c.sizes} >= {s for p in c.params if isinstance(p, TensorParam)
                                        for s in p.shape if isinstance(s, str)}
    assert [p.name for p in c.params if isinstance(p, TensorParam) and p.written] == ["y"]
    (launch,) = c.launches
    for desc in c.tma:
        assert desc.tensor in {"x", "y"} and desc.rank == len(desc.global_dims) == len(desc.box_dims)
        assert any(a.kind == "tma" and a.name == desc.name for a in launch.args)
        # The element size is the first global stride: bf16 is 2 bytes.
        assert desc.global_strides[0] == "2"


def test_py_expr_prints_python() -> None:
    from tilelang import tvm

    n = tvm.tirx.Var("n", "int32")
    expr = tvm.tirx.floordiv(n + 63, 64) * 2 + tvm.tirx.floormod(n, 4)
    text = py_expr(expr)
    for value in (0, 1, 63, 64, 4001):
        assert eval(text, {}, {"n": value}) == ((value + 63) // 64) * 2 + value % 4
    assert py_expr(tvm.tirx.Max(n, 1)) == "max(n, 1)"


@pytest.mark.slow
@pytest.mark.parametrize(("cluster", "cooperative", "expected_cluster"), [(1, True, None), (2, False, (2, 1, 1))])
def test_cooperative_and_cluster_launches_are_recorded(tmp_path: Path, cluster: int, cooperative: bool,
                                                       expected_cluster: tuple[int, int, int] | None) -> None:
    from tkc.codegen import launcher_source

    templates = REPO / "tests" / "data" / "kernels"
    spec = load_specs([REPO / "tests" / "data" / "specs" / "loader.yaml"], templates).kernel("grid_rotate")
    variant = next(v for v in expand(spec) if v.param_dict["cluster"] == cluster)
    contract = lower(render(variant, ARCHS["sm90"], templates, tmp_path), ARCHS["sm90"]).contract
    (launch,) = contract.launches
    assert launch.cooperative is cooperative and launch.cluster == expected_cluster
    source = launcher_source(func="f", doc="", cubin="f.cubin", key="()", contract=contract)
    (function,) = (expr for _, expr in source.functions)  # the Function(...) of the one launch
    assert ("cooperative=True" in function) is cooperative
    # A cooperative launch takes the compiled fast path too; a cluster launch goes through ctypes.
    assert ("launch_cooperative(" in "\n".join(source.body)) is cooperative
    assert (f"{source.functions[0][0]}.launch(device, grid," in "\n".join(source.body)) is (expected_cluster is not None)
    assert ("cluster=(2, 1, 1)" in function) is (expected_cluster is not None)
    # run() takes a plain or cooperative launch in one C call; a cluster launch has no plan.
    assert (f"if run(_CONTRACT, _PLAN, {source.functions[0][0]}.handles, " in "\n".join(source.body)) is (
        expected_cluster is None)
    assert [var for var, _ in source.contract] == ["_CONTRACT", "_PLAN"][:1 + (expected_cluster is None)]
    if expected_cluster is not None:  # the grid is checked against the cluster before the launch
        assert "must be a multiple of the thread-block cluster" in "\n".join(source.body)


def test_unknown_pass_config_names_the_spec_key(tmp_path: Path) -> None:
    from tkc.errors import LowerError

    text = SMALL_SPEC.read_text().replace("    grid:\n      dtype: [bfloat16]",
                                          "    pass_configs:\n      tl.disable_tma_lowr: true\n"
                                          "    grid:\n      dtype: [bfloat16]")
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(text)
    variant = expand(load_specs([spec_file], TEMPLATES).kernel("batched_transpose"))[0]
    with pytest.raises(LowerError, match=r"s.yaml:\d+: kernels.batched_transpose.pass_configs.tl.disable_tma_lowr: "
                                         r"TileLang .* no such pass config \(did you mean 'tl.disable_tma_lower'\?\)"):
        lower(render(variant, ARCHS["sm90"], TEMPLATES, tmp_path), ARCHS["sm90"])


@pytest.mark.slow
def test_tma_stores_and_scratch_tensors_count_as_written(tmp_path: Path) -> None:
    """tma_transpose writes y only through a TMA store (its descriptor); grid_rotate writes its
    scratch tensor and y with plain stores and reads x."""
    from tkc.codegen import launcher_source

    templates = REPO / "tests" / "data" / "kernels"
    specs = load_specs([REPO / "tests" / "data" / "specs" / "loader.yaml"], templates)
    for kernel, written in (("tma_transpose", ["y"]), ("grid_rotate", ["tmp", "y"])):
        variant = next(iter(expand(specs.kernel(kernel))))
        contract = lower(render(variant, ARCHS["sm90"], templates, tmp_path), ARCHS["sm90"]).contract
        assert [p.name for p in contract.params if isinstance(p, TensorParam) and p.written] == written, kernel
        assert any(a.kind == "tma" for launch in contract.launches for a in launch.args) is (kernel == "tma_transpose")
        # A TMA descriptor is encoded (and cached) in Python: such a launcher has no plan for run().
        source = launcher_source(func="f", doc="", cubin="f.cubin", key="()", contract=contract)
        assert ("_PLAN" in dict(source.contract)) is (kernel != "tma_transpose")


@pytest.mark.slow
@pytest.mark.parametrize(("kernel", "params"), [
    ("swiglu_forward_and_per_token_cast", {"hidden": 2048, "npc": 128, "with_weights": True}),
    ("swiglu_backward_and_per_token_cast", {"hidden": 2048, "npc": 128}),
    ("swiglu_forward_and_per_channel_cast_and_transpose", {"hidden": 0, "npt": 32, "without_transpose": False}),
])
def test_swiglu_clamps_keep_nan(kernel: str, params: dict[str, object], tmp_path: Path) -> None:
    """The shipped SwiGLU kernels clamp through PTX min.NaN / max.NaN (clamp_min_max in kernels/quant/common.py),
    as torch.clamp keeps NaN; T.min / T.max would lower to fminf / fmaxf, which turn a NaN x into the bound. The GPU
    tests check the outputs; this catches the mechanism on a machine without a GPU."""
    spec = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel(kernel)
    variant = next(v for v in expand(spec) if all(v.param_dict[k] == p for k, p in params.items()))
    source = lower(render(variant, ARCHS["sm90"], TEMPLATES, tmp_path), ARCHS["sm90"]).cuda_source
    assert 'asm("min.NaN.f32' in source and 'asm("max.NaN.f32' in source
    assert "tkc_min_nan(tkc_max_nan(" in source  # xr's two-sided clamp
    assert "fminf(" not in source and "min(swiglu_clamp_value" not in source


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize(("dtype", "with_sf"), [("bfloat16", False), ("float8_e4m3fn", True)])
def test_expand_rows_leave_as_bulk_copies(arch: str, dtype: str, with_sf: bool, tmp_path: Path) -> None:
    """expand_to_fused writes each expanded row with one cp.async.bulk from a row in shared memory (benchmarks/tuning
    sweep 52): no tensor map, the row's bytes as dynamic shared memory, the generic-proxy writes fenced before the
    copies and the block waiting for the copies' reads before it exits. The GPU tests check the outputs; this catches
    a TileLang that lowers T.tma_copy differently, on a machine without a GPU."""
    launch, source = _lower_shipped("moe_expand", arch, tmp_path, hidden=2048, dtype=dtype, with_sf=with_sf,
                                    sf_layout="row_major")
    assert launch.dynamic_smem == 2048 * (2 if dtype == "bfloat16" else 1)
    assert not any(a.kind == "tma" for a in launch.args)
    assert source.count("tl::tma_store(") == 2  # a token's copies and a padding row's zeros
    assert "tl::fence_proxy_async()" in source and "tl::tma_store_wait<0, true>()" in source
    # Scale rows are plain stores by every thread, outside the elected thread's copies.
    assert ("out_sf[" in source) is with_sf


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_moe_rows_of_any_hidden_move_as_16_byte_vectors(arch: str, tmp_path: Path) -> None:
    """The variants for any hidden (grid value 0) cannot stage a row of unknown length in shared memory: expand walks
    the row in chunks through registers and reduce accumulates chunk by chunk, both with one 16-byte (or for an e4m3
    output 8-byte) access per thread and run, predicated per run rather than per element."""
    launch, source = _lower_shipped("moe_expand", arch, tmp_path, hidden=0, dtype="bfloat16", with_sf=False,
                                    sf_layout="row_major")
    assert launch.dynamic_smem == 0 and "tl::tma_store(" not in source and "__shared__" not in source
    assert source.count("*(uint4*)(out + ") == 2  # a token's copies and a padding row's zeros
    assert "*(uint4*)(x + " in source and "((hidden + 2047) >> 11)" in source  # chunks of 2048 columns
    _, source = _lower_shipped("moe_reduce", arch, tmp_path, hidden=0, in_dtype="bfloat16",
                               out_dtype="float8_e4m3fn", with_weights=True)
    assert "*(uint4*)(x + " in source and "*(fp8_e4_8_t*)(out + " in source and "out[" not in source
    # Each step one FMA (TileKernels' rounding), the scale's product rounded on its own.
    assert "__fadd_rn(" not in source and "__fmaf_rn(" in source and "__fmul_rn(" in source


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize(("fmt", "npc", "out_dtype", "bulk"),
                         [("e4m3", 128, "bfloat16", True), ("e2m1", 32, "bfloat16", False),
                          ("e2m1", 32, "float32", True)])
def test_cast_back_rows_leave_by_format(arch: str, fmt: str, npc: int, out_dtype: str, bulk: bool,
                                        tmp_path: Path) -> None:
    """per_token_cast_back writes its decoded rows through shared memory and one cp.async.bulk per row piece
    (benchmarks/tuning sweeps 53 and 55 on the H200: e4m3 1.01-1.02x, e2m1 to fp32 1.10x), except e2m1 to bf16,
    whose direct stores from registers won (the bulk form was 0.98x); no tensor map either way. fp32 out takes a
    tile of 2048 elements, bf16 4096 (sweeps 60 and 61: e2m1 to fp32 1.27x)."""
    launch, source = _lower_shipped("per_token_cast_back", arch, tmp_path, hidden=7168, fmt=fmt, npc=npc,
                                    out_dtype=out_dtype, sf_layout="row_major")
    assert not any(a.kind == "tma" for a in launch.args)
    assert ("tl::tma_store(" in source) is bulk
    assert ("tl::tma_store_wait<0, true>()" in source) is bulk
    itemsize = 2 if out_dtype == "bfloat16" else 4
    tile = 4096 if out_dtype == "bfloat16" else 2048
    assert launch.dynamic_smem == (tile * itemsize if bulk else 0)  # the block's tile: 8 KiB either way


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_e5m6_fp32_cast_back_copies_row_pieces_without_a_tensor_map(arch: str, tmp_path: Path) -> None:
    """cast_back_e5m6 -> fp32 at H 7168 gives a block two rows of one 1024-column piece (sweep 66 on the H200:
    1.02x): ceil(T / 2) x 7 blocks, an 8 KiB tile, and two 4096-byte bulk copies under row tests. Without the row
    tests TileLang lowered the copy through a tensor map (sweeps 62 and 64), which the dispatch path does not take."""
    launch, source = _lower_shipped("cast_back_e5m6", arch, tmp_path, hidden=7168, out_dtype="float32")
    assert [eval(launch.grid[0], {}, {"num_tokens": t}) for t in (0, 1, 2, 5)] == [0, 7, 7, 21]
    assert not any(a.kind == "tma" for a in launch.args)
    assert launch.dynamic_smem == 8192 and source.count(", 4096);") == 1 and "tl::tma_store(" in source


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_e5m6_cast_back_rows_leave_as_bulk_copies(arch: str, out_dtype: str, tmp_path: Path) -> None:
    """cast_back_e5m6 writes each row through shared memory and one cp.async.bulk of the row's hidden elements
    (benchmarks/tuning sweeps 54 and 55 on the H200: bf16 1.01-1.02x, fp32 1.04x). H 2560's bf16 row tile is
    padded to 3072 elements; the copy takes only the row's 2560."""
    launch, source = _lower_shipped("cast_back_e5m6", arch, tmp_path, hidden=2560, out_dtype=out_dtype)
    assert not any(a.kind == "tma" for a in launch.args)
    assert source.count("tl::tma_store(") == 1 and "tl::tma_store_wait<0, true>()" in source
    itemsize = 2 if out_dtype == "bfloat16" else 4
    assert f", {2560 * itemsize});" in source  # the copy's size in bytes
    assert launch.dynamic_smem == (3072 if out_dtype == "bfloat16" else 2560) * itemsize


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_mhc_norm_fn_gemm_runs_on_tf32_tensor_cores(arch: str, tmp_path: Path) -> None:
    """The mma stage of mhc_pre_norm_fn lowers to TF32 mma.sync on both archs (the spec disables wgmma, as
    TileKernels' kernel does, whose order of the sums it keeps), fed by TMA from warp-specialized producers, with
    the token count, K and the split count at run time."""
    launch, source = _lower_shipped("mhc_norm_fn_mma", arch, tmp_path, stage="mma")
    assert "tl::mma_sync<tl::DataType::kTensorFloat32, tl::DataType::kTensorFloat32, tl::DataType::kFloat32, " \
           "16, 8, 8" in source
    assert "wgmma" not in source and "tcgen05" not in source
    assert "tl::tma_load(x_desc" in source and "tl::tma_load(fn_eff_desc" in source
    assert launch.block == (256, 1, 1)  # 128 consumer threads and a producer warpgroup
    assert [a.name for a in launch.args if a.kind == "size"] == ["mhc_hidden", "n_splits", "num_tokens"]


def test_templates_import_shared_helpers_of_their_own_folder(tmp_path: Path) -> None:
    """``tkc_templates`` names the folder of the kernel being lowered: two catalogs with a helper of the same name
    each get their own, and a helper edited between two lowerings in one process is imported again."""
    from tests.test_render import _helper_catalog

    def lowered_cuda(root: Path) -> str:
        templates = root / "kernels"
        variant = expand(load_specs([root / "s.yaml"], templates).kernels[0])[0]
        return lower(render(variant, ARCHS["sm90"], templates, root / "out"), ARCHS["sm90"]).cuda_source

    _helper_catalog(tmp_path / "a", factor="2.0")
    _helper_catalog(tmp_path / "b", factor="3.0")
    assert "2.000000e+00*/" in lowered_cuda(tmp_path / "a")
    assert "3.000000e+00*/" in lowered_cuda(tmp_path / "b")
    consts = tmp_path / "a" / "kernels" / "lib" / "consts.py"
    consts.write_text("FACTOR = 5.0\n")
    os.utime(consts, ns=(consts.stat().st_atime_ns, consts.stat().st_mtime_ns + 1_000_000))
    assert "5.000000e+00*/" in lowered_cuda(tmp_path / "a")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_engram_gate_rows_carry_l2_eviction_hints(arch: str, tmp_path: Path) -> None:
    """The Engram gate reads and writes its once-touched rows evict-first and, in the backward, the rows other
    heads' blocks read again (v, grad_out) evict-last (kernels/memory.py; benchmarks/tuning sweep 71): every 16-byte
    access of x, k and the outputs goes through the helpers, none through TileLang's plain vector copies, and the
    backward's token range needs no guard of each load by 0 <= token. The GPU tests check the outputs; this
    catches the mechanism on a machine without a GPU."""
    _, source = _lower_shipped("engram_gate_fwd", arch, tmp_path, hidden=7168, save=True)
    assert "ld.global.cs.v4.b32" in source and "st.global.cs.v4.b32" in source
    assert source.count("tkc_load_once_v4(") == 1 + 2 * 2  # the helper, then x and k at the first and next steps
    assert "*(uint4*)(hidden_states + " not in source and "*(uint4*)(output + " not in source
    assert "*(uint4*)(v + " in source  # v stays a plain load: an evict-last v was slower
    _, source = _lower_shipped("engram_gate_bwd", arch, tmp_path, hidden=7168)
    assert "createpolicy.fractional.L2::evict_last.b64" in source
    assert source.count("tkc_load_again_v4(") == 1 + 2  # the helper, then grad_out and v
    assert source.count("tkc_store_once_v4(") == 1 + 3  # the helper, then grad_x, grad_k and grad_v
    for name in ("hidden_states", "k", "grad_x", "grad_k", "grad_v"):
        assert f"*(uint4*)({name} + " not in source
    assert "(0 <= token)" not in source
