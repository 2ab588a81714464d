"""The tuning sweep (benchmarks/tuning) without a GPU: its spec, its knob defaults, its bookkeeping, its encode check."""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.conftest import REPO, TEMPLATES
from tkc.arch import ARCHS, DEFAULT_ARCHS
from tkc.lower import lower
from tkc.render import render, render_source
from tkc.spec import Variant, expand, load_specs

TUNING = REPO / "benchmarks" / "tuning"
sys.path.insert(0, str(TUNING))
sys.path.insert(0, str(REPO / "tests"))

import sweep  # noqa: E402  (benchmarks/tuning/sweep.py)
from reference.quant import per_token_cast_ref  # noqa: E402
from reference.quant_per_block import per_block_cast_ref  # noqa: E402

TUNED_TEMPLATES = ("quant/per_block_cast.py.j2", "quant/per_token_cast.py.j2", "transpose/batched_transpose.py.j2")


def test_sweep_spec_builds_sm90_only_with_one_baseline_per_problem() -> None:
    found = _spec_variants("tkc_tuning")
    assert len(found) <= 48  # a few dozen variants: about a minute of build per dozen on two cores
    groups = sweep.problems(found)  # raises unless each problem holds exactly one baseline
    assert len(groups) == 5


def _renders(match: Variant, knobs: tuple[tuple[str, Any], ...], arch: str) -> tuple[str, str]:
    """The render of the shipped variant ``match`` and of the same variant with ``knobs`` added to its
    grid values, both without the two header lines (they name the variant and its parameters)."""
    plain = render_source(match, ARCHS[arch], TEMPLATES).split("\n", 2)[2]
    knobbed = render_source(Variant(kernel=match.kernel, params=match.params + knobs), ARCHS[arch], TEMPLATES)
    return plain, knobbed.split("\n", 2)[2]


def _lower_candidate(spec: str, kernel: str, tmp_path: Path, **params: Any) -> tuple[Any, str]:
    """The sm_90a lowering of the variant of benchmarks/tuning/<spec> whose grid values include ``params``: its one
    launch and its CUDA source."""
    specs = load_specs([TUNING / spec], TEMPLATES)
    variant = next(v for v in expand(specs.kernel(kernel)) if all(v.param_dict[k] == p for k, p in params.items()))
    lowered = lower(render(variant, ARCHS["sm90"], TEMPLATES, tmp_path), ARCHS["sm90"])
    (launch,) = lowered.contract.launches
    return launch, lowered.cuda_source


def _assert_baselines_are_the_sweeps(found: list[sweep.Variant], package: str) -> None:
    """Every variant the sweep marks as its problem's baseline has the knobs SWEEPS[package] names for it."""
    tuning = sweep.SWEEPS[package]
    for v in found:
        if v.is_baseline:
            assert dict(v.knobs) == tuning.baseline(v.kernel, dict(v.problem))


def _spec_variants(package: str, hiddens: tuple[int, ...] = (7168,)) -> list[sweep.Variant]:
    """The variants of a tuning spec as sweep.py splits them (no launchers); sm90, production H (or ``hiddens``)."""
    tuning = sweep.SWEEPS[package]
    specs = load_specs([TUNING / tuning.spec], TEMPLATES)
    assert (specs.package.name, specs.package.version) == (package, "0.1.0")
    found = []
    for kernel in specs.kernels:
        assert kernel.archs == ("sm90",)
        for v in expand(kernel):
            assert v.param_dict.get("hidden", 7168) in hiddens  # production shapes only
            found.append(sweep.split(tuning, kernel.name, v.id, v.params, lambda *args: None))
    return found


def test_second_sweep_spec_has_one_pre_sweep_baseline_per_problem() -> None:
    found = _spec_variants("tkc_tuning2")
    assert len(found) <= 45
    groups = sweep.problems(found)
    assert {kernel for kernel, _ in groups} == set(sweep.SWEEPS["tkc_tuning2"].baselines)
    assert len(groups) == 9  # cast back x2, per-channel x3, transposed x2, expand, SwiGLU
    fp8 = next(g for (kernel, problem), g in groups.items()
               if kernel == "per_channel_cast_fused" and dict(problem)["in_dtype"] == "float8_e4m3fn")
    assert dict(next(v for v in fp8 if v.is_baseline).knobs) == {"threads": 128, "min_blocks": 4, "tile_k": 128}


def test_third_sweep_baseline_renders_the_shipped_kernel() -> None:
    # min_blocks 0 emits no launch bound, so the baseline is the shipped per_block_cast e4m3 128 x 128.
    found = _spec_variants("tkc_tuning3")
    groups = sweep.problems(found)
    assert len(groups) == 1 and len(found) == 6
    (baseline,) = [v for v in found if v.is_baseline]
    shipped = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("per_block_cast")
    match = next(x for x in expand(shipped) if all(x.param_dict[k] == val for k, val in baseline.problem))
    plain, knobbed = _renders(match, baseline.knobs, "sm90")
    assert knobbed == plain
    capped = next(v for v in found if dict(v.knobs)["min_blocks"] == 4)
    source = render_source(Variant(kernel=shipped, params=match.params + capped.knobs), ARCHS["sm90"], TEMPLATES)
    assert "T.annotate_min_blocks_per_sm(4)" in source


def test_second_sweep_baselines_are_the_shipped_kernels() -> None:
    """Rendering a shipped variant with its sweep2 baseline knobs set changes nothing (or, where the
    template's default is an expression, only that line, to the value the expression has)."""
    shipped = load_specs([REPO / "kernel_specs"], TEMPLATES)
    tuning = sweep.SWEEPS["tkc_tuning2"]
    for v in _spec_variants("tkc_tuning2"):
        if not v.is_baseline:
            continue
        kernel = shipped.kernel(v.kernel)
        match = next(x for x in expand(kernel) if all(x.param_dict[k] == val for k, val in v.problem))
        knobs = v.knobs
        if v.kernel == "swiglu_forward_and_per_token_cast":  # sweep 21 since ships 5 blocks (0 before)
            knobs = tuple((k, 5 if k == "min_blocks" else val) for k, val in knobs)
        plain, knobbed = _renders(match, knobs, "sm90")
        if v.kernel != "per_channel_cast_fused":
            assert knobbed == plain, v
            continue
        changed = {a.strip(): b.strip() for a, b in zip(plain.splitlines(), knobbed.splitlines(), strict=True) if a != b}
        scope = {"THREADS": 256, "with_sf": dict(v.problem)["in_dtype"] == "float8_e4m3fn", "arch": "sm90"}
        for line, value in changed.items():
            name, expr = line.split(" = ", 1)
            assert f"{name} = {eval(expr, scope)}" == value  # a line of our own template
        assert len(changed) == 2
        assert dict(v.knobs) == tuning.baseline(v.kernel, dict(v.problem))


def _sweep6_shipped_knobs(problem: dict[str, Any]) -> dict[str, Any]:
    """The knobs the template defaults to since the sixth sweep (its winners)."""
    return {"staged": True, "tile_t": 64 if problem["npt"] == 32 else 128, "tile_h": 32}


def test_sixth_sweep_winners_render_the_shipped_kernels() -> None:
    """sweep6.yaml: with the winning knobs set (now the template's defaults), the shipped variants of
    both archs render byte-identical sources; every other point renders something else."""
    found = _spec_variants("tkc_tuning6")
    groups = sweep.problems(found)
    assert len(groups) == 3 and len(found) <= 12
    shipped = load_specs([REPO / "kernel_specs"], TEMPLATES)
    for v in found:
        kernel = shipped.kernel(v.kernel)
        matches = [x for x in expand(kernel) if all(x.param_dict[k] == val for k, val in v.problem)]
        assert matches, v
        for arch in ("sm90", "sm100"):
            plain, knobbed = _renders(matches[0], v.knobs, arch)
            assert (knobbed == plain) == (dict(v.knobs) == _sweep6_shipped_knobs(dict(v.problem))), (v, arch)


def _shipped(kernel: str, **problem: Any) -> str:
    """The rendered source of the shipped variant of ``kernel`` with these grid values (sm90)."""
    variants = expand(load_specs([REPO / "kernel_specs"], TEMPLATES).kernel(kernel))
    match = next(v for v in variants if all(v.param_dict[k] == x for k, x in problem.items()))
    return render_source(match, ARCHS["sm90"], TEMPLATES)


def test_shipped_kernels_take_the_sweep_winners() -> None:
    # The 2026-11-30 sweep on the H200 (benchmarks/tuning/README.md): these became the defaults.
    e4m3_128 = _shipped("per_block_cast", fmt="e4m3", block_m=128, block_k=128)
    assert "\nELEMS_PER_THREAD = 128" in e4m3_128 and "\nCHUNK_VECTORS = 2" in e4m3_128
    e2m1_32 = _shipped("per_block_cast", fmt="e2m1", block_m=32, block_k=32)
    assert "\nELEMS_PER_THREAD = 64" in e2m1_32  # 32 until sweep 36 (words make 64 values fit 64 registers)
    # Sweep 19: the three-line encode (proven equal to the comparison encode by e2m1_encode_check.c), words of
    # codes, and registers capped at 64 (1024 // threads blocks per SM: 8 of 128 threads, 16 of 64 since sweep 36).
    assert "def e2m1_nibble_bits(v, below_7=False):" in e2m1_32 and "T.annotate_min_blocks_per_sm(1024 // threads)" in e2m1_32
    assert "def e2m1_code" not in e2m1_32
    # per_token_cast takes its knobs from default_config (a sweep sets them on the factory's last line).
    e2m1_token = _shipped("per_token_cast", fmt="e2m1", npc=32, hidden=7168)
    assert "def e2m1_nibble_bits(v, finite_below_7=False):" in e2m1_token and "if mode != MODE_GIVEN_SF:" in e2m1_token
    assert "def e2m1_code" not in e2m1_token and "chunk_vectors=None," in e2m1_token
    module = _rendered_module("per_token_cast", fmt="e2m1", npc=32, hidden=7168)
    config, default = module.Config, module.default_config
    # Sweep 19: four vectors per thread and registers capped (8 blocks per SM for groups, 5 for one scale per row);
    # sweep 20: bf16 -> e2m1 reads x as words; sweep 39: e4m3 runs its blocks in row order.
    assert default("e2m1", "bfloat16", 32) == config(chunk_vectors=4, x_words=True, min_blocks=8)
    assert default("e2m1", "bfloat16", 0) == config(chunk_vectors=4, x_words=True, min_blocks=5)
    assert default("e2m1", "float32", 32) == config(chunk_vectors=4, x_words=False, min_blocks=8)
    assert default("e4m3", "bfloat16", 128) == default("e4m3", "float32", 32) == config(block_order="row")
    assert config().chunk_vectors == 2 and config().min_blocks == 0 and config().elems_per_thread == 32
    # A runtime hidden reads no words (the word view needs hidden even at parse time), and keeps the 2-D grid
    # (row order would divide by a tile count known only at run time).
    assert default("e2m1", "bfloat16", 32, generic=True).x_words is False
    assert default("e4m3", "bfloat16", 128, generic=True).block_order == "column"
    assert "\nTILE = 64" in _shipped("batched_transpose", dtype="float8_e4m3fn")  # the sweep found no better


def _rendered_module(kernel: str, **problem: Any) -> Any:
    """The rendered module of the shipped variant of ``kernel`` with these grid values, imported (sm90)."""
    variants = expand(load_specs([REPO / "kernel_specs"], TEMPLATES).kernel(kernel))
    match = next(v for v in variants if all(v.param_dict[k] == x for k, x in problem.items()))
    path = Path(tempfile.mkdtemp()) / f"{match.id}.py"
    path.write_text(render_source(match, ARCHS["sm90"], TEMPLATES))
    spec = importlib.util.spec_from_file_location(f"rendered_{match.id}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_baseline_is_the_pre_sweep_setting() -> None:
    # Knobs the templates do not name would never vary; a knob missing here would make every
    # variant of a problem a "baseline".
    names: set[str] = set()
    for template in TUNED_TEMPLATES:
        names |= set(re.findall(r"\{\{ (\w+) \| default\(", (TEMPLATES / template).read_text()))
        names |= set(re.findall(r"(\w+) \| default\(\"\w+\"\) ==", (TEMPLATES / template).read_text()))
        names |= set(re.findall(r"(\w+) \| default\(\"\w+\"\) %}", (TEMPLATES / template).read_text()))  # {%- set k = k | default("v") %}
    names.add("segments_per_thread")  # the transpose factory's default argument
    shipped = load_specs([REPO / "kernel_specs"], TEMPLATES)
    grid_keys = {k for kernel in shipped.kernels for k in kernel.grid_keys}  # defaults of grid keys: no knobs
    assert names - grid_keys == set(sweep.BASELINE)


def _fake_cast(kernel: str, problem: dict[str, Any], wrong: bool = False) -> Any:
    """A launcher that writes the plain-torch reference into the outputs (CPU), optionally one bit off."""

    def launch(x: torch.Tensor, q: torch.Tensor, sf: torch.Tensor, *mode: int) -> None:
        if kernel == "per_block_cast":
            ref_q, ref_sf = per_block_cast_ref(x, problem["fmt"], (problem["block_m"], problem["block_k"]))
        else:
            ref_q, ref_sf = per_token_cast_ref(x, problem["fmt"], problem["npc"])
        q.copy_(ref_q)
        sf.copy_(ref_sf)
        if wrong:
            q.view(torch.uint8)[5, 7] ^= 1

    return launch


def test_run_problem_flags_mismatches_and_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "DEVICE", "cpu")
    monkeypatch.setattr(sweep, "TOKENS", 64)
    monkeypatch.setattr(sweep, "HIDDEN", 256)
    problem = {"in_dtype": "bfloat16", "hidden": 256, "fmt": "e2m1", "npc": 32, "round_sf": False,
               "sf_layout": "row_major"}

    def variant(name: str, threads: int, launch: Any) -> sweep.Variant:
        return sweep.Variant(kernel="per_token_cast", name=name, problem=tuple(problem.items()),
                             knobs=(("threads", threads),), launch=launch, baseline=(("threads", 128),))

    def broken(*args: Any) -> None:
        raise RuntimeError("launch failed")

    group = [variant("good", 256, _fake_cast("per_token_cast", problem)),
             variant("base", 128, _fake_cast("per_token_cast", problem)),
             variant("off", 512, _fake_cast("per_token_cast", problem, wrong=True)),
             variant("broken", 64, broken)]
    times = {"good": 40.0, "base": 50.0, "off": 30.0}
    timer = SimpleNamespace(median_us=lambda fn, inputs: times[fn.__name__ if fn is broken else
                                                               next(v.name for v in group if v.launch is fn)])
    bench = SimpleNamespace(rotating_inputs=lambda make: [make(), make()], tensor_bytes=lambda t: (
        t.nbytes if isinstance(t, torch.Tensor) else 0), reason=lambda exc: f"{type(exc).__name__}: {exc}")
    rows = sweep.run_problem(timer, bench, 4000.0, "per_token_cast", problem, group)
    by_name = {r.variant: r for r in rows}
    assert [r.variant for r in rows] == ["off", "good", "base", "broken"]  # by time, failures last
    assert by_name["base"].baseline and by_name["base"].note == "baseline == reference"
    assert by_name["good"].bit_exact and by_name["good"].speedup == pytest.approx(1.25)
    assert by_name["off"].bit_exact is False
    assert by_name["broken"].us is None and by_name["broken"].note.startswith("failed: RuntimeError")
    nbytes = 64 * 256 * 2 + 64 * 128 + 64 * 8 * 4  # x, packed q, sf
    assert by_name["base"].gb_s == pytest.approx(nbytes / 50.0 / 1e3)
    table = sweep.markdown({"gpu": "cpu", "date": "today", "torch": torch.__version__, "package": "stub",
                            "copy_gb_s": 4000.0, "reps": 1}, rows)
    assert "| base * |" in table and "**NO**" in table


def test_check_matrix_holds_the_special_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "DEVICE", "cpu")
    x = sweep.check_matrix(8, 64)
    assert x.dtype == torch.bfloat16 and not x[0].any() and torch.signbit(x[1]).all()
    assert x[3].isnan().any() and x[4].isinf().any() and (x[2].abs().max() == 6.0)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_e2m1_encodes_are_exact_over_all_fp32(tmp_path: Path) -> None:
    """benchmarks/tuning/e2m1_encode_check.c: 2^32 patterns, magic and ffma (both contractions), ffma_cast on
    |v| < 7; about 60 s on one core."""
    exe = tmp_path / "check"
    subprocess.run(["cc", "-O2", "-ffp-contract=off", "-fno-fast-math", "-o", str(exe),
                    str(TUNING / "e2m1_encode_check.c"), "-lm"], check=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    assert "0 mismatches over 2^32" in result.stdout


# The second sweep's problems on the CPU at small shapes: (kernel, problem, the launch arguments
# the fake launcher reads the reference's inputs from, bytes bench.py counts per (T, H) = (256, 256)).
_SECOND = [
    ("per_token_cast_back", {"fmt": "e4m3", "npc": 128, "out_dtype": "bfloat16", "hidden": 256,
                             "sf_layout": "row_major"}, lambda a: a[:2], 256 * 256 + 256 * 2 * 4 + 256 * 256 * 2),
    ("per_token_cast_back", {"fmt": "e2m1", "npc": 32, "out_dtype": "bfloat16", "hidden": 256,
                             "sf_layout": "row_major"}, lambda a: a[:2], 256 * 128 + 256 * 8 * 4 + 256 * 256 * 2),
    ("per_channel_cast_fused", {"in_dtype": "bfloat16", "hidden": 256, "expand": False, "round_sf": False},
     lambda a: a[:1], 256 * 256 * 2 + 256 * 256 + 2 * 256 * 4),
    ("per_channel_cast_fused", {"in_dtype": "bfloat16", "hidden": 256, "expand": True, "round_sf": False},
     lambda a: a[:2], 256 * 256 * 2 + 1280 * 256 + 10 * 256 * 4),  # pos_to_token not counted, as in bench.py
    ("per_channel_cast_fused", {"in_dtype": "float8_e4m3fn", "hidden": 256, "expand": False, "round_sf": False},
     lambda a: a[:2], 256 * 256 + 256 * 2 * 4 + 256 * 256 + 2 * 256 * 4),
    ("per_channel_cast_and_transpose", {"hidden": 256, "npt": 32, "round_sf": False},
     lambda a: a[:1], 256 * 256 * 2 + 256 * 256 + 8 * 256 * 4),
    ("moe_expand", {"hidden": 256, "dtype": "bfloat16", "with_sf": False, "sf_layout": "row_major"},
     lambda a: a[:3], 64 * 256 * 2 + 64 * 8 * 4 + 4608 * 4 + 4608 * 256 * 2),
    ("swiglu_forward_and_per_token_cast", {"hidden": 256, "npc": 128, "with_weights": True,
                                           "with_pos_to_expert": True}, lambda a: a[:1], None),
    # The sixth sweep's per-channel SwiGLU (transposed and not): x (T, 2H) bf16, q, sf (T / npt, H).
    ("swiglu_forward_and_per_channel_cast_and_transpose", {"hidden": 256, "npt": 32, "without_transpose": False},
     lambda a: a[:1], 256 * 512 * 2 + 256 * 256 + 8 * 256 * 4),
    ("swiglu_forward_and_per_channel_cast_and_transpose", {"hidden": 256, "npt": 128, "without_transpose": True},
     lambda a: a[:1], 256 * 512 * 2 + 256 * 256 + 2 * 256 * 4),
]


@pytest.mark.parametrize(("kernel", "problem", "inputs_of", "nbytes"), _SECOND, ids=[f"{k}-{i}" for i, (k, *_) in
                                                                                       enumerate(_SECOND)])
def test_second_sweep_cases_run_and_count_bench_bytes(monkeypatch: pytest.MonkeyPatch, kernel: str,
                                                     problem: dict[str, Any], inputs_of: Any,
                                                     nbytes: int | None) -> None:
    monkeypatch.setattr(sweep, "DEVICE", "cpu")
    monkeypatch.setattr(sweep, "TOKENS", 256)
    monkeypatch.setattr(sweep, "HIDDEN", 256)
    monkeypatch.setattr(sweep, "SWIGLU_TOKENS", 64)
    routing = sweep._benchmark_case("moe_route")
    monkeypatch.setattr(routing, "T", 64)
    monkeypatch.setattr(routing, "H", 256)
    monkeypatch.setattr(routing, "N", 4608)  # T K + (ALIGN - 1) E, aligned: every row routed or padding
    c = sweep.case(kernel, problem)

    def launch(*args: Any) -> None:
        assert c.reference is not None
        for out, ref in zip(c.outputs(args), c.reference(inputs_of(args)), strict=True):
            assert (out.shape, out.dtype) == (ref.shape, ref.dtype)
            out.copy_(ref)

    def off_by_one_bit(*args: Any) -> None:
        launch(*args)
        c.outputs(args)[0].view(torch.uint8).view(-1)[3] ^= 1

    group = [sweep.Variant(kernel=kernel, name=name, problem=tuple(problem.items()), knobs=(("threads", threads),),
                           launch=fn, baseline=(("threads", 1),)) for name, threads, fn in
             (("base", 1, launch), ("same", 2, lambda *args: launch(*args)), ("off", 3, off_by_one_bit))]
    launchers = {v.launch: v.name for v in group}
    timer = SimpleNamespace(median_us=lambda fn, inputs: {"base": 10.0, "same": 8.0, "off": 9.0}[launchers[fn]])
    bench = importlib.import_module("bench")  # benchmarks/bench.py, importable after _benchmark_case
    stub = SimpleNamespace(rotating_inputs=lambda make: [make(), make()], tensor_bytes=bench.tensor_bytes,
                           reason=bench.reason)
    rows = {r.variant: r for r in sweep.run_problem(timer, stub, 4000.0, kernel, problem, group)}
    assert rows["base"].note == "baseline == reference", rows["base"].note
    assert rows["same"].bit_exact and rows["off"].bit_exact is False
    counted = round(rows["base"].gb_s * 10.0 * 1e3)
    if nbytes is None:  # SwiGLU: x (N, 2H) bf16, q (N, H) e4m3 and sf (N, H / 128) fp32, not the routing
        rows_n = c.make(c.new_x())[0].shape[0]
        nbytes = rows_n * (512 * 2 + 256 + 2 * 4)
    assert counted == nbytes


def test_swiglu_reference_leaves_padding_rows_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel skips rows whose pos_to_expert is -1; the sweep starts q and sf as zeros.
    monkeypatch.setattr(sweep, "DEVICE", "cpu")
    monkeypatch.setattr(sweep, "SWIGLU_TOKENS", 64)
    c = sweep.case("swiglu_forward_and_per_token_cast",
                   {"hidden": 256, "npc": 128, "with_weights": True, "with_pos_to_expert": True})
    args = c.make(c.check_x())
    assert c.reference is not None
    q, sf = c.reference((args[0],))
    skipped = args[5] < 0
    assert skipped.any() and not q.view(torch.uint8)[skipped].any() and not sf[skipped].any()
    assert not args[1].view(torch.uint8).any() and not args[2].any()


def test_references_import_when_run_as_a_script() -> None:
    """python benchmarks/tuning/sweep.py puts only benchmarks/tuning on sys.path, not the repository."""
    names = [("quant", "per_token_cast_ref"), ("quant_per_block", "per_block_cast_ref"),
             ("quant_cast_back", "per_token_cast_back_ref"), ("quant_per_channel", "per_channel_cast_ref"),
             ("quant_per_channel", "per_channel_cast_and_transpose_ref"), ("moe_route", "expand_to_fused_ref"),
             ("quant_swiglu", "expert_major_routing"), ("quant_swiglu", "swiglu_forward_and_per_token_cast_ref")]
    code = ("import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; import sweep; "
            f"missing = [n for m, n in {names!r} if sweep._reference(m, n) is None]; "
            "routing = sweep._benchmark_case('moe_route'); print(missing, routing.N)")
    result = subprocess.run([sys.executable, "-c", code], cwd=TUNING, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(TUNING)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "[]", result.stdout + result.stderr


def test_fourth_sweep_winners_render_the_shipped_gates() -> None:
    # gate_impl=redux (the sweep's winner) is the template default since: those points are the
    # shipped MoE gates, byte for byte; the baselines (shuffle) are not. group_rank=count lost and
    # left the template. top2_sum_gate's shipped form has since taken the ninth sweep's knobs
    # (group_rank=own among them), which sweep4 does not set or sets to insert.
    winners = {"topk_gate": {"gate_impl": "redux"}, "top2_sum_gate": None}
    found = _spec_variants("tkc_tuning4")
    groups = sweep.problems(found)
    assert {kernel for kernel, _ in groups} == {"topk_gate", "top2_sum_gate"} and len(found) == 6
    shipped = load_specs([REPO / "kernel_specs"], TEMPLATES)
    for v in found:
        kernel = shipped.kernel(v.kernel)
        match = next(x for x in expand(kernel) if all(x.param_dict[k] == val for k, val in v.problem))
        plain, knobbed = _renders(match, v.knobs, "sm90")
        assert (knobbed == plain) == (dict(v.knobs) == winners[v.kernel]), v
        if dict(v.knobs)["gate_impl"] == "redux":
            assert "__reduce_max_sync" in knobbed


@pytest.mark.parametrize("kernel", ["topk_gate", "top2_sum_gate"])
def test_gate_cases_check_ties_and_non_finite_scores(monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    monkeypatch.setattr(sweep, "DEVICE", "cpu")
    monkeypatch.setattr(sweep, "GATE_TOKENS", 64)
    problem = {"num_experts": 256, "num_topk": 8}
    if kernel == "top2_sum_gate":
        problem.update(scoring="sigmoid", num_groups=8, num_topk_groups=4, physical_map=False)
    c = sweep.case(kernel, problem)
    x = c.check_x()[0]
    assert x.isnan().any() and (x == float("-inf")).any() and (x == float("inf")).any()
    assert (x.isnan().all(1)).any() and torch.signbit(x[x == 0]).any()
    assert any(row.unique().numel() < row.numel() // 2 for row in x)  # rows of many equal scores

    def launch(*args: Any) -> None:
        assert c.reference is not None
        inputs = args[:1] if kernel == "topk_gate" else args[:2]
        for out, ref in zip(c.outputs(args), c.reference(inputs), strict=True):
            assert (out.shape, out.dtype) == (ref.shape, ref.dtype)
            out.copy_(ref)

    def swapped(*args: Any) -> None:  # the first two ids of one row exchanged
        launch(*args)
        ids = c.outputs(args)[0]
        ids[5, :2] = ids[5, :2].flip(0)

    group = [sweep.Variant(kernel=kernel, name=name, problem=tuple(problem.items()), knobs=(("gate_impl", impl),),
                           launch=fn, baseline=(("gate_impl", "shuffle"),))
             for name, impl, fn in (("base", "shuffle", launch), ("off", "redux", swapped))]
    timer = SimpleNamespace(median_us=lambda fn, inputs: 1.0)
    bench = SimpleNamespace(rotating_inputs=lambda make: [make()], tensor_bytes=lambda t: (
        t.nbytes if isinstance(t, torch.Tensor) else 0), reason=lambda exc: f"{type(exc).__name__}: {exc}")
    rows = {r.variant: r for r in sweep.run_problem(timer, bench, 4000.0, kernel, problem, group)}
    assert rows["base"].note == "baseline == reference", rows["base"].note
    assert rows["off"].bit_exact is False
    per_token = 256 * 4 + 8 * 8 + (8 * 4 if kernel == "top2_sum_gate" else 0)
    bias = 256 * 4 if kernel == "top2_sum_gate" else 0
    assert round(rows["base"].gb_s * 1e3) == 64 * per_token + bias


def test_fifth_sweep_spec_has_the_shipped_setting_per_problem() -> None:
    found = _spec_variants("tkc_tuning5")
    assert len(found) == 12
    groups = sweep.problems(found)
    assert len(groups) == 3  # lossless 1 x 128 and 128 x 128, the fp8 pair of per_channel_cast_fused
    _assert_baselines_are_the_sweeps(found, "tkc_tuning5")


@pytest.mark.parametrize("arch", DEFAULT_ARCHS)  # the archs the shipped specs list
def test_fifth_sweep_winners_render_the_shipped_source(arch: str) -> None:
    """Every shipped variant of the two templates renders byte-identical with the sweep5 winners set:
    the prmt decode with paired stores for the lossless re-cast, the paired fp8 decode for fp8 inputs
    (bf16 and fp32 inputs keep the scalar path, which is theirs)."""
    shipped = load_specs([REPO / "kernel_specs"], TEMPLATES)
    winners = {
        "per_block_cast_lossless": lambda params: {"decode": "prmt", "store": "pair", "min_blocks": 3},
        # threads / min_blocks / tile_k defaults are expressions (test_second_sweep_baselines_are_the_shipped_kernels)
        "per_channel_cast_fused": lambda params: {
            "fp8_decode": "pairs" if params["in_dtype"] == "float8_e4m3fn" else "scalar"},
    }
    for name, knobs_of in winners.items():
        kernel = shipped.kernel(name)
        assert arch in kernel.archs
        for match in expand(kernel):
            knobs = tuple(knobs_of(match.param_dict).items())
            plain, knobbed = _renders(match, knobs, arch)
            assert knobbed == plain, (name, match.params)


def test_fifth_sweep_candidates_render_their_paths() -> None:
    lossless = load_specs([TUNING / "sweep5.yaml"], TEMPLATES).kernel("per_block_cast_lossless")
    for v in expand(lossless):
        source = render_source(v, ARCHS["sm90"], TEMPLATES)
        p = v.param_dict
        assert ("__byte_perm" in source) == (p["decode"] == "prmt")
        assert ("T.shfl_xor(sent, 1)" in source) == (p["store"] == "pair")
        assert f"T.annotate_min_blocks_per_sm({p['min_blocks']})" in source
    fused = load_specs([TUNING / "sweep5.yaml"], TEMPLATES).kernel("per_channel_cast_fused")
    for v in expand(fused):
        source = render_source(v, ARCHS["sm90"], TEMPLATES)
        assert ("x_f32 = T.alloc_local" in source) == (v.param_dict["fp8_decode"] == "pairs")


@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
def test_lossless_case_runs_against_its_reference(monkeypatch: pytest.MonkeyPatch, block: tuple[int, int]) -> None:
    monkeypatch.setattr(sweep, "DEVICE", "cpu")
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # bench.py, for its byte count
    monkeypatch.setattr(sweep, "TOKENS", 200)  # a partial 128-row block
    monkeypatch.setattr(sweep, "HIDDEN", 512)  # the problem's hidden wins (sweep 58's H 2560 problem)
    problem = {"hidden": 256, "block_m": block[0], "block_k": block[1]}
    c = sweep.case("per_block_cast_lossless", problem)
    assert c.reference is not None
    assert c.new_x()[0].shape == (200, 128) and c.check_x()[0].shape == (237, 128)
    assert [t.shape[1] for t in c.outputs(c.make(c.new_x()))] == [256, 256 // block[1]]

    def launch(*args: Any) -> None:
        for out, ref in zip(c.outputs(args), c.reference(args[:2]), strict=True):
            assert (out.shape, out.dtype) == (ref.shape, ref.dtype)
            out.copy_(ref)

    def off_by_one_bit(*args: Any) -> None:
        launch(*args)
        c.outputs(args)[0].view(torch.uint8).view(-1)[3] ^= 1

    _, check_sf = c.check_x()
    e = (check_sf.view(torch.int32) >> 23) & 0xFF
    assert (e.amax(dim=1) - e.amin(dim=1) > 5).any()  # some blocks take the PRMT decode's float fallback
    group = [sweep.Variant(kernel="per_block_cast_lossless", name=name, problem=tuple(problem.items()),
                           knobs=(("decode", d),), launch=fn, baseline=(("decode", "float"),))
             for name, d, fn in (("base", "float", launch), ("prmt", "prmt", lambda *a: launch(*a)),
                                 ("off", "off", off_by_one_bit))]
    launchers = {v.launch: v.name for v in group}
    timer = SimpleNamespace(median_us=lambda fn, inputs: {"base": 10.0, "prmt": 5.0, "off": 9.0}[launchers[fn]])
    bench = importlib.import_module("bench")
    stub = SimpleNamespace(rotating_inputs=lambda make: [make(), make()], tensor_bytes=bench.tensor_bytes,
                           reason=bench.reason)
    rows = {r.variant: r for r in sweep.run_problem(timer, stub, 4000.0, "per_block_cast_lossless", problem, group)}
    assert rows["base"].note == "baseline == reference", rows["base"].note
    assert rows["prmt"].bit_exact and rows["off"].bit_exact is False
    sf_rows = -(-200 // block[0])
    nbytes = 200 * 128 + 200 * 8 * 4 + 200 * 256 + sf_rows * (256 // block[1]) * 4
    assert round(rows["base"].gb_s * 10.0 * 1e3) == nbytes


def test_swiglu_backward_case_runs_against_its_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The eleventh sweep's backward case on the CPU (small shapes): its inputs launch, the reference
    matches itself, and weight_grad may differ by summation order but not by more."""
    monkeypatch.setattr(sweep, "DEVICE", "cpu")
    monkeypatch.setattr(sweep, "SWIGLU_TOKENS", 64)
    c = sweep.case("swiglu_backward_and_per_token_cast", {"hidden": 256, "npc": 128})
    x = c.new_x()
    args = c.make(x)
    assert len(args) == 13 and args[0].shape == (args[2].shape[0], 512) and args[1].shape == (args[0].shape[0], 4)
    want = c.reference(x)  # out, q, q_sf, x_grad, then weight_grad's float64 sum and its bound
    assert len(want) == 6 and want[4].dtype == torch.float64
    assert c.matches((*want[:4], want[4].float()), want)
    assert c.matches((*want[:4], (want[4] * (1 + 1e-7)).float()), want)  # another summation order
    assert not c.matches((*want[:4], want[4].float() + 1.0), want)
    assert not c.matches((*want[:2], want[2] * 2, want[3], want[4].float()), want)  # scales are exact
    check = c.check_x()
    assert torch.isnan(check[1]).any()  # the NaN / Inf rows of check_matrix give NaN scales


def test_run_problem_checks_reordered_sums_against_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward case leaves weight_grad out of the byte comparison with the baseline (its row sum follows
    sweep 25's chunk): a variant whose weight_grad differs by summation order stays bit-exact and meets the
    reference; one whose weight_grad is wrong is bit-exact in the rest but flagged against the reference; a
    wrong code is not bit-exact."""
    monkeypatch.setattr(sweep, "DEVICE", "cpu")
    monkeypatch.setattr(sweep, "SWIGLU_TOKENS", 64)
    problem = {"hidden": 256, "npc": 128}
    ref = sweep._reference("quant_swiglu", "swiglu_backward_ref")
    assert ref is not None

    def fake(wgrad_scale: float = 1.0, wgrad_shift: float = 0.0, flip_code: bool = False) -> Any:
        def launch(xq: Any, x_sf: Any, g: Any, weights: Any, pos: Any, inv: Any, out: Any, q: Any, q_sf: Any,
                   x_grad: Any, weight_grad: Any, clamp: float, round_sf: int) -> None:
            r_out, (r_q, r_sf), r_grad, r_wgrad, _ = ref(xq, x_sf, g, weights, pos, inv, 128, True)
            out.copy_(r_out), q.copy_(r_q), q_sf.copy_(r_sf), x_grad.copy_(r_grad)
            weight_grad.copy_(r_wgrad * wgrad_scale + wgrad_shift)
            if flip_code:
                q.view(torch.uint8)[3, 5] ^= 1
        return launch

    launches = {"base": fake(), "reordered": fake(wgrad_scale=1 + 2e-7), "off": fake(wgrad_shift=1.0),
                "flipped": fake(flip_code=True)}
    group = [sweep.Variant(kernel="swiglu_backward_and_per_token_cast", name=name, problem=tuple(problem.items()),
                           knobs=(("chunk", 512 if name == "base" else 1024),), launch=launch,
                           baseline=(("chunk", 512),))
             for name, launch in launches.items()]
    timer = SimpleNamespace(median_us=lambda fn, inputs: 10.0)
    bench = SimpleNamespace(rotating_inputs=lambda make: [make()], tensor_bytes=lambda t: (
        t.nbytes if isinstance(t, torch.Tensor) else 0), reason=lambda exc: f"{type(exc).__name__}: {exc}")
    rows = {r.variant: r for r in sweep.run_problem(timer, bench, 4000.0, "swiglu_backward_and_per_token_cast",
                                                    problem, group)}
    assert rows["base"].note == "baseline == reference"
    assert rows["reordered"].bit_exact and rows["reordered"].note == "== reference"
    assert rows["off"].bit_exact and rows["off"].note == "DIFFERS FROM REFERENCE"
    assert rows["flipped"].bit_exact is False


def test_twelfth_sweep_spec_has_the_shipped_setting_per_problem() -> None:
    found = _spec_variants("tkc_tuning12")
    assert len(found) <= 14
    groups = sweep.problems(found)  # raises unless each problem holds exactly one baseline
    assert {dict(problem)["npt"] for _, problem in groups} == {32, 128}
    _assert_baselines_are_the_sweeps(found, "tkc_tuning12")


@pytest.mark.parametrize("arch", DEFAULT_ARCHS)  # the archs the shipped specs list
def test_twelfth_sweep_winner_renders_the_shipped_source(arch: str) -> None:
    """Every shipped variant of per_channel_cast_and_transpose renders byte-identical with the sweep12
    winner's knobs set (the knobs' defaults); the candidates render their paths."""
    shipped = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("per_channel_cast_and_transpose")
    # The winner, now the default: the baseline with a launch bound of 8 blocks per SM.
    baseline = tuple({**sweep.SWEEPS["tkc_tuning12"].baselines["per_channel_cast_and_transpose"],
                      "min_blocks": 8}.items())
    assert arch in shipped.archs
    for match in expand(shipped):
        plain, knobbed = _renders(match, baseline, arch)
        assert knobbed == plain, match.params
    for v in _spec_variants("tkc_tuning12"):
        match = next(x for x in expand(shipped) if all(x.param_dict[k] == val for k, val in v.problem))
        source = render_source(Variant(kernel=shipped, params=match.params + v.knobs), ARCHS[arch], TEMPLATES)
        knobs = dict(v.knobs)
        assert ("v_local[i] = T.Cast" in source) == (knobs["recast"] == "keep")
        assert ("if tid < TILE_H:" in source) == (knobs["scale_by"] == "first_warp")
        assert ("T.annotate_min_blocks_per_sm(8)" in source) == (knobs["min_blocks"] == 8)
        assert f"TILE_T = {knobs['tile_t']}" in source


_SWEEP9_DEFAULTS = {"topk_gate": {"gate_impl": "redux"},
                    "top2_sum_gate": {"tp_fast": False, "group_rank": "insert", "pair_top2": "branch"}}
# The template defaults since the ninth sweep: its top2_sum_gate winner (topk_gate kept redux).
_SWEEP9_SHIPPED = {"topk_gate": {"gate_impl": "redux"},
                   "top2_sum_gate": {"tp_fast": True, "group_rank": "own", "pair_top2": "minmax"}}


@pytest.mark.parametrize("arch", DEFAULT_ARCHS)  # the archs the shipped specs list
def test_ninth_sweep_winners_render_the_shipped_gates(arch: str) -> None:
    """sweep9.yaml's winning knobs render every shipped MoE gate variant byte for byte."""
    shipped = load_specs([REPO / "kernel_specs"], TEMPLATES)
    for name, knobs in _SWEEP9_SHIPPED.items():
        kernel = shipped.kernel(name)
        assert arch in kernel.archs
        for match in expand(kernel):
            plain, knobbed = _renders(match, tuple(knobs.items()), arch)
            assert knobbed == plain, (name, match.params)


def test_ninth_sweep_spec_has_the_shipped_setting_per_problem() -> None:
    found = _spec_variants("tkc_tuning9")
    groups = sweep.problems(found)
    # topk_gate E 64 / 256 (redux alone since ballot and min_blocks lost), top2_sum_gate with and without the map
    assert len(groups) == 4 and len(found) == 9
    assert sweep.SWEEPS["tkc_tuning9"].baselines == _SWEEP9_DEFAULTS
    shipped = load_specs([REPO / "kernel_specs"], TEMPLATES)
    for members in groups.values():
        assert sum(v.is_baseline for v in members) == 1
    for v in found:
        kernel = shipped.kernel(v.kernel)
        match = next(x for x in expand(kernel) if all(x.param_dict[k] == val for k, val in v.problem))
        plain, knobbed = _renders(match, v.knobs, "sm90")
        assert (knobbed == plain) == (dict(v.knobs) == _SWEEP9_SHIPPED[v.kernel]), v
        knobs = dict(v.knobs)
        assert ("own_kept" in knobbed) == (knobs.get("group_rank") == "own")
        assert ("T.And(num_tp_ranks == 1, tp_rank == 0)" in knobbed) == bool(knobs.get("tp_fast"))
        assert ("second = T.max(second, T.min(first" in knobbed) == (knobs.get("pair_top2") == "minmax")



@pytest.mark.parametrize("package", ["tkc_tuning4", "tkc_tuning9", "tkc_tuning14"])
def test_gate_sweep_knobs_are_read_by_their_templates(package: str) -> None:
    """Every knob a gate sweep sets is one its template reads: jinja2 ignores extra variables, so a
    knob whose candidates left the template (ballot, count, min_blocks) would build copies of one kernel."""
    specs = load_specs([TUNING / sweep.SWEEPS[package].spec], TEMPLATES)
    for kernel in specs.kernels:
        source = (TEMPLATES / kernel.template).read_text()
        for knob in sweep.SWEEPS[package].knob_names(kernel.name):
            assert f"{knob} | default(" in source, (kernel.name, knob)
        assert "min_blocks" not in source and "ballot" not in source, kernel.template
        assert 'group_rank | default("own") == "count"' not in source


def test_ninth_sweep_mapped_gate_case_runs_against_its_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "DEVICE", "cpu")
    monkeypatch.setattr(sweep, "GATE_TOKENS", 64)
    problem = {"scoring": "sigmoid", "num_experts": 256, "num_topk": 8, "num_groups": 8, "num_topk_groups": 4,
               "physical_map": True}
    c = sweep.case("top2_sum_gate", problem)
    assert c.reference is not None
    logits, _, to_physical, count = c.check_x()
    assert logits.isnan().any() and (to_physical == -1).any() and (count == 0).any() and (count > 3).any()

    def launch(*args: Any) -> None:
        for out, ref in zip(c.outputs(args), c.reference(args[:4]), strict=True):
            assert (out.shape, out.dtype) == (ref.shape, ref.dtype)
            out.copy_(ref)

    def swapped(*args: Any) -> None:  # the first two ids of one row exchanged
        launch(*args)
        ids = c.outputs(args)[0]
        ids[5, :2] = ids[5, :2].flip(0)

    group = [sweep.Variant(kernel="top2_sum_gate", name=name, problem=tuple(problem.items()),
                           knobs=(("tp_fast", fast),), launch=fn, baseline=(("tp_fast", False),))
             for name, fast, fn in (("base", False, launch), ("off", True, swapped))]
    timer = SimpleNamespace(median_us=lambda fn, inputs: 1.0)
    bench = SimpleNamespace(rotating_inputs=lambda make: [make()], tensor_bytes=lambda t: (
        t.nbytes if isinstance(t, torch.Tensor) else 0), reason=lambda exc: f"{type(exc).__name__}: {exc}")
    rows = {r.variant: r for r in sweep.run_problem(timer, bench, 4000.0, "top2_sum_gate", problem, group)}
    assert rows["base"].note == "baseline == reference", rows["base"].note
    assert rows["off"].bit_exact is False
    per_token = 256 * 4 + 8 * 8 + 8 * 4
    assert round(rows["base"].gb_s * 1e3) == 64 * per_token + 256 * 4 + 256 * 3 * 4 + 256 * 4  # + bias, map, count


@pytest.mark.parametrize("in_dtype", ["bfloat16", "float32"])
def test_per_token_row_case_runs_against_its_reference(monkeypatch: pytest.MonkeyPatch, in_dtype: str) -> None:
    """npc 0 (one scale per row) has its own case: sf (T, 1), the reference at npc = H, x of the problem's dtype."""
    monkeypatch.setattr(sweep, "DEVICE", "cpu")
    monkeypatch.setattr(sweep, "TOKENS", 7)
    monkeypatch.setattr(sweep, "HIDDEN", 256)
    problem = {"in_dtype": in_dtype, "hidden": 7168, "fmt": "e2m1", "npc": 0, "round_sf": False,
               "sf_layout": "row_major"}
    c = sweep.case("per_token_cast", problem)
    x = c.check_x()
    assert x[0].dtype == c.new_x()[0].dtype == getattr(torch, in_dtype)
    args = c.make(x)
    q, sf = c.outputs(args)
    assert args[3] == 0 and q.shape == (7, 128) and q.dtype == torch.int8 and sf.shape == (7, 1)
    ref_q, ref_sf = c.reference(x)
    assert ref_q.shape == q.shape and ref_sf.shape == sf.shape
    assert ref_sf[2].item() == 1.0  # the row of e2m1 ties holds 6: scale 1, every tie exact
    assert torch.isnan(ref_sf[3]).all() and torch.isnan(ref_sf[4]).all()  # NaN and Inf rows


def test_thirteenth_sweep_winner_renders_the_shipped_lossless_cast() -> None:
    """sweep13.yaml: the float-path baseline and the table fallback (now the default) per problem; the
    winner's knobs render every shipped variant byte-identical on both archs, the baseline's do not,
    and each point renders its fallback and launch bound."""
    found = _spec_variants("tkc_tuning13")
    assert len(found) == 6
    groups = sweep.problems(found)
    assert {dict(problem)["block_m"] for _, problem in groups} == {1, 128}
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("per_block_cast_lossless")
    for match in expand(kernel):
        for arch in ("sm90", "sm100"):
            plain, winner = _renders(match, (("fallback", "table"), ("min_blocks", 3)), arch)
            _, baseline = _renders(match, tuple(sweep.SWEEPS["tkc_tuning13"].baselines[kernel.name].items()), arch)
            assert winner == plain and baseline != plain, (match.params, arch)
    for v in expand(load_specs([TUNING / "sweep13.yaml"], TEMPLATES).kernel("per_block_cast_lossless")):
        source = render_source(v, ARCHS["sm90"], TEMPLATES)
        p = v.param_dict
        assert ("e4m3_of_fp4_word_by_table(x_local[r, w], table" in source) == (p["fallback"] == "table")
        assert f"T.annotate_min_blocks_per_sm({p['min_blocks']})" in source


def test_fourteenth_sweep_winner_renders_the_shipped_topk_gate() -> None:
    """sweep14.yaml: the shipped topk_gate takes 2 tokens per warp up to 64 experts (8% faster at E 64,
    3% slower at E 256) and 1 above: those knobs render every shipped variant byte for byte on both
    archs; 2 and 4 render the interleaved path with the grid over WARPS * tokens_per_warp."""
    found = _spec_variants("tkc_tuning14")
    assert len(found) == 6
    groups = sweep.problems(found)
    assert {(dict(p)["num_experts"], dict(p)["num_topk"]) for _, p in groups} == {(64, 6), (256, 8)}
    assert sweep.SWEEPS["tkc_tuning14"].baselines == {"topk_gate": {"tokens_per_warp": 1}}
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("topk_gate")
    for match in expand(kernel):
        for arch in ("sm90", "sm100"):
            assert arch in kernel.archs
            shipped = 2 if match.param_dict["num_experts"] <= 64 else 1
            plain, winner = _renders(match, (("tokens_per_warp", shipped),), arch)
            _, other = _renders(match, (("tokens_per_warp", 3 - shipped),), arch)
            assert winner == plain and other != plain, (match.params, arch)
    for v in expand(load_specs([TUNING / "sweep14.yaml"], TEMPLATES).kernel("topk_gate")):
        source = render_source(v, ARCHS["sm90"], TEMPLATES)
        tpw = v.param_dict["tokens_per_warp"]
        assert ("T.ceildiv(num_tokens, WARPS * TOKENS_PER_WARP)" in source) == (tpw > 1), v.params
        assert (f"TOKENS_PER_WARP = {tpw}" in source) == (tpw > 1), v.params
        assert source.count("warp_max(") == 3  # the helper and the round's two reductions, once either way


def test_fifteenth_sweep_winner_renders_the_shipped_per_block_cast() -> None:
    """sweep15.yaml: per_block_cast e4m3 128 x 128 at H 7168 with the block amax per row then over the rows
    (the baseline) and in one reduce (shipped since the sweep for e4m3 128 x 128 blocks). The knob at the
    shipped value renders every shipped variant byte for byte on both archs; no variant clamps before the
    satfinite e4m3 cast any more."""
    found = _spec_variants("tkc_tuning15")
    assert len(found) == 2
    ((kernel_name, problem),) = sweep.problems(found)  # raises unless the problem holds exactly one baseline
    assert kernel_name == "per_block_cast"
    assert dict(problem) == {"in_dtype": "bfloat16", "hidden": 7168, "fmt": "e4m3", "block_m": 128, "block_k": 128,
                             "round_sf": False, "precomputed_sf": False}
    assert sweep.SWEEPS["tkc_tuning15"].baselines == {"per_block_cast": {"amax_reduce": "rows"}}
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("per_block_cast")
    for match in expand(kernel):
        p = match.param_dict
        shipped = "flat" if p["fmt"] == "e4m3" and p["block_m"] == p["block_k"] == 128 else "rows"
        for arch in ("sm90", "sm100"):
            plain, winner = _renders(match, (("amax_reduce", shipped),), arch)
            assert winner == plain, (match.params, arch)
            assert ("row_amax" in plain) == (shipped == "rows") and "T.clamp(" not in plain
    for v in expand(load_specs([TUNING / "sweep15.yaml"], TEMPLATES).kernel("per_block_cast")):
        source = render_source(v, ARCHS["sm90"], TEMPLATES)
        flat = v.param_dict["amax_reduce"] == "flat"
        assert ("T.reduce_max(T.reshape(x_abs, [1, block_m * tile_k]), amax, dim=1)" in source) == flat


_SWEEP17_CANDIDATES = {
    "per_token_cast_back": {"store": ("direct",), "block_order": ("row",)},
    "normalize_weight": {"threads": (32,), "vector": ("vec", "lanes")},
}


def test_seventeenth_sweep_spec_has_the_shipped_setting_per_problem() -> None:
    """sweep17.yaml: the cast back e4m3 npc 128 / e2m1 npc 32 -> bf16 at H 7168 with store x block_order, and
    normalize_weight K 8 with threads x vector (K 6: shipped and vec); each problem holds its baseline once."""
    found = _spec_variants("tkc_tuning17")
    assert len(found) == 16
    groups = sweep.problems(found)
    _assert_baselines_are_the_sweeps(found, "tkc_tuning17")
    assert sweep.SWEEPS["tkc_tuning17"].baselines == {
        "per_token_cast_back": {"store": "shared", "block_order": "column"},
        "normalize_weight": {"threads": 128, "vector": "scalar"},
    }
    sizes = {(kernel, dict(problem).get("fmt", dict(problem).get("num_topk"))): len(g) for (kernel, problem), g in
             groups.items()}
    assert sizes == {("per_token_cast_back", "e4m3"): 4, ("per_token_cast_back", "e2m1"): 4,
                     ("normalize_weight", 8): 6, ("normalize_weight", 6): 2}
    specs = load_specs([TUNING / "sweep17.yaml"], TEMPLATES)
    for kernel in specs.kernels:  # jinja2 ignores variables a template does not read
        source = (TEMPLATES / kernel.template).read_text()
        for knob in sweep.SWEEPS["tkc_tuning17"].knob_names(kernel.name):
            assert f"{knob} | default(" in source, (kernel.name, knob)
            assert "{# knob of benchmarks/tuning/sweep17.yaml #}" in source


def _sweep17_winner(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The knobs shipped since sweep 17: direct stores in memory order (bulk copies since sweeps 53 and 55, except
    e2m1 to bf16); lanes where K is a multiple of 4."""
    if name == "per_token_cast_back":
        direct = params["fmt"] == "e2m1" and params["out_dtype"] == "bfloat16"
        return {"store": "direct" if direct else "bulk", "block_order": "row"}
    return {"threads": 128, "vector": "lanes" if params["num_topk"] % 4 == 0 else "scalar"}


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_seventeenth_sweep_winners_render_the_shipped_kernels(arch: str) -> None:
    """The winners' knobs render every shipped per_token_cast_back and normalize_weight variant byte for byte
    (the defaults are the winners); the sweep's baseline (the kernels shipped before it) renders something
    else wherever the winner differs from it."""
    shipped = load_specs([REPO / "kernel_specs"], TEMPLATES)
    for name in _SWEEP17_CANDIDATES:
        kernel = shipped.kernel(name)
        assert arch in kernel.archs
        baseline = sweep.SWEEPS["tkc_tuning17"].baselines[name]
        for match in expand(kernel):
            winner = _sweep17_winner(name, match.param_dict)
            plain, knobbed = _renders(match, tuple(winner.items()), arch)
            assert knobbed == plain, (match.params, arch)
            _, before = _renders(match, tuple(baseline.items()), arch)
            assert (before == plain) == (winner == baseline), (match.params, arch)


def test_seventeenth_sweep_candidates_render_their_paths() -> None:
    """direct: no shared memory, one uint32x4 per chunk; row: one grid dimension in memory order; vec: vector
    loads and stores of the row; lanes: K / 4 lanes per token gathering the row by __shfl_sync."""
    specs = load_specs([TUNING / "sweep17.yaml"], TEMPLATES)
    for v in expand(specs.kernel("per_token_cast_back")):
        source = render_source(v, ARCHS["sm90"], TEMPLATES)
        p = v.param_dict
        direct = p["store"] == "direct"
        assert ('T.Tensor((num_tokens, hidden // chunk), f"uint32x{words}", out.data)' in source) == direct
        assert ("T.alloc_shared" in source) == (not direct)
        row = p["block_order"] == "row"
        assert ("T.Kernel(T.ceildiv(num_tokens, block_m) * k_tiles, threads=THREADS) as bid" in source) == row
    for v in expand(specs.kernel("normalize_weight")):
        source = render_source(v, ARCHS["sm90"], TEMPLATES)
        p = v.param_dict
        assert f"\nTHREADS = {p['threads']}\n" in source
        assert ("T.vectorized(VEC)" in source) == (p["vector"] == "vec")
        assert ("T.shfl_sync(piece[v], s, LANES)" in source) == (p["vector"] == "lanes")


def test_normalize_case_runs_against_its_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """normalize_weight's case on the CPU: the reference's sequential sum, the bytes bench.py counts, a one-bit
    difference caught; the check input has a partial last block and rows where the summation order shows."""
    monkeypatch.setattr(sweep, "DEVICE", "cpu")
    monkeypatch.setattr(sweep, "GATE_TOKENS", 64)
    problem = {"num_topk": 8, "threads": 128, "vector": "scalar"}
    c = sweep.case("normalize_weight", problem)
    assert c.reference is not None
    (w,) = c.check_x()
    assert w.shape == (61, 8) and w.isnan().any() and w.isinf().any()
    denominator, normalized = c.reference((w,))
    # Row 2 sums to 1 only in k order: its exact sum, rounded once, is 1 + 2^-21.
    assert denominator[2].item() == 1.0 and w[2].double().sum().float().item() == 1.0 + 2.0**-21
    assert denominator[7].item() == 1.0 and denominator[0].item() == pytest.approx(1e-20)
    assert torch.isinf(denominator[5]) and torch.isnan(normalized[4]).any()

    def launch(*args: Any) -> None:
        assert c.reference is not None
        for out, ref in zip(c.outputs(args), c.reference(args[:1]), strict=True):
            assert (out.shape, out.dtype) == (ref.shape, ref.dtype)
            out.copy_(ref)

    def off_by_one_bit(*args: Any) -> None:
        launch(*args)
        args[2].view(torch.int32)[3, 5] ^= 1

    group = [sweep.Variant(kernel="normalize_weight", name=name, problem=(("num_topk", 8),),
                           knobs=(("threads", 128), ("vector", vector)), launch=fn,
                           baseline=(("threads", 128), ("vector", "scalar")))
             for name, vector, fn in (("base", "scalar", launch), ("vec", "vec", lambda *a: launch(*a)),
                                      ("off", "lanes", off_by_one_bit))]
    timer = SimpleNamespace(median_us=lambda fn, inputs: 1.0)
    bench = SimpleNamespace(rotating_inputs=lambda make: [make()], tensor_bytes=lambda t: (
        t.nbytes if isinstance(t, torch.Tensor) else 0), reason=lambda exc: f"{type(exc).__name__}: {exc}")
    rows = {r.variant: r for r in sweep.run_problem(timer, bench, 4000.0, "normalize_weight", {"num_topk": 8}, group)}
    assert rows["base"].note == "baseline == reference", rows["base"].note
    assert rows["vec"].bit_exact and rows["off"].bit_exact is False
    assert round(rows["base"].gb_s * 1e3) == 64 * 8 * 4 + 64 * 4 + 64 * 8 * 4  # weights, denominator, normalized


# The eighteenth sweep (sweep18.yaml): block order. kernel -> (shipped value, candidate).
_SWEEP18_ORDERS = {
    "per_block_cast": ("column", "row"),
    "per_channel_cast_fused": ("column", "row"),
    "per_channel_cast_and_transpose": ("input", "output"),
    "swiglu_forward_and_per_channel_cast_and_transpose": ("input", "output"),
}


def test_eighteenth_sweep_spec_has_the_shipped_setting_per_problem() -> None:
    """sweep18.yaml: per_block_cast e4m3 128 x 128 and e2m1 32 x 32, per_channel_cast_fused bf16 plain and gather,
    per_channel_cast_and_transpose npt 32 / 128 and the transposed SwiGLU per-channel cast npt 32 / 128 at H 7168,
    each in the shipped block order and the candidate: one baseline per problem, the knob read by every template."""
    found = _spec_variants("tkc_tuning18")
    assert len(found) == 16
    groups = sweep.problems(found)  # raises unless each problem holds exactly one baseline
    assert len(groups) == 8 and all(len(g) == 2 for g in groups.values())
    _assert_baselines_are_the_sweeps(found, "tkc_tuning18")
    assert sweep.SWEEPS["tkc_tuning18"].baselines == {
        name: {"block_order": shipped} for name, (shipped, _) in _SWEEP18_ORDERS.items()}
    assert {kernel for kernel, _ in groups} == set(_SWEEP18_ORDERS)
    for v in found:
        assert dict(v.knobs)["block_order"] in _SWEEP18_ORDERS[v.kernel]
        assert not dict(v.problem).get("without_transpose", False)  # not transposed, q is already in order
    specs = load_specs([TUNING / "sweep18.yaml"], TEMPLATES)
    for kernel in specs.kernels:  # jinja2 ignores variables a template does not read
        source = (TEMPLATES / kernel.template).read_text()
        assert "block_order | default(" in source and "{# knob of benchmarks/tuning/sweep18.yaml #}" in source


def _sweep18_winner(name: str, params: dict[str, Any], arch: str) -> str:
    """The block order shipped since sweep 18: row for per_block_cast (e4m3 with 128-row blocks since sweep 18, the
    rectangular blocks since sweep 37, every block since sweep 38); for per_channel_cast_fused the order of sweep 32 (its shared-memory form,
    both archs): row, except for the gather; the order shipped before everywhere else."""
    if name == "per_block_cast":  # e4m3 128-row blocks since sweep 18, the rectangles since 37, all since 38
        return "row"
    if name == "per_channel_cast_fused":
        return "column" if params["expand"] else "row"
    return _SWEEP18_ORDERS[name][0]


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_eighteenth_sweep_winners_render_the_shipped_kernels(arch: str) -> None:
    """The winners' block order renders every shipped variant of the four templates byte for byte (the knob's
    default); the other order renders something else everywhere."""
    shipped = load_specs([REPO / "kernel_specs"], TEMPLATES)
    rows = 0
    for name, orders in _SWEEP18_ORDERS.items():
        kernel = shipped.kernel(name)
        assert arch in kernel.archs
        for match in expand(kernel):
            winner = _sweep18_winner(name, match.param_dict, arch)
            rows += winner == "row"
            plain, knobbed = _renders(match, (("block_order", winner),), arch)
            assert knobbed == plain, (match.params, arch)
            _, other = _renders(match, (("block_order", orders[orders[0] == winner]),), arch)
            assert other != plain, (match.params, arch)
    # per_block_cast (since sweep 38): fmt x block x H x 3 (round_sf, precomputed_sf: never both);
    # per_channel_cast_fused without the gather: in_dtype x H x round_sf
    assert rows == 2 * 4 * 5 * 3 + 3 * 5 * 2


def test_eighteenth_sweep_candidates_render_their_paths() -> None:
    """row: the grid's two dimensions swapped, channel tiles first (memory order); output: swapped the other way,
    token tiles first (q's order)."""
    specs = load_specs([TUNING / "sweep18.yaml"], TEMPLATES)
    for kernel in specs.kernels:
        for v in expand(kernel):
            source = render_source(v, ARCHS["sm90"], TEMPLATES)
            order = v.param_dict["block_order"]
            if kernel.name == "per_block_cast":
                assert ("with T.Kernel(hidden // tile_k, T.ceildiv(num_tokens, block_m), threads=threads) as "
                        "(pid_k, pid_m):" in source) == (order == "row")
                assert ("as (pid_m, pid_k):" in source) == (order == "column")
            elif kernel.name == "per_channel_cast_fused":
                assert ("with T.Kernel(hidden // TILE_K, T.ceildiv(num_tokens_out, TILE_M), threads=threads) as "
                        "(pid_k, pid_m):" in source) == (order == "row")
                assert ("as (pid_m, pid_k):" in source) == (order == "column")
            else:
                threads = "THREADS" if kernel.name == "per_channel_cast_and_transpose" else "threads"
                swapped = f"with T.Kernel(num_tokens // TILE_T, hidden // TILE_H, threads={threads}) as (pid_t, pid_h):"
                shipped = f"with T.Kernel(hidden // TILE_H, num_tokens // TILE_T, threads={threads}) as (pid_h, pid_t):"
                assert (swapped in source) == (order == "output") and (shipped in source) == (order == "input")


def test_twenty_first_sweep_spec_has_the_shipped_setting_per_problem() -> None:
    """sweep21.yaml: the SwiGLU forward per-token cast at H 7168, npc 128 and H, with the IEEE division or the
    ranged one (unbounded, 4 or 5 blocks) and either amax: one pre-sweep baseline per problem."""
    found = _spec_variants("tkc_tuning21")
    assert len(found) == 16
    groups = sweep.problems(found)
    assert len(groups) == 2 and all(len(g) == 8 for g in groups.values())
    _assert_baselines_are_the_sweeps(found, "tkc_tuning21")
    assert sweep.SWEEPS["tkc_tuning21"].baselines == {
        "swiglu_forward_and_per_token_cast": {"division": "ieee", "amax_abs": False, "min_blocks": 0}}


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_twenty_first_sweep_winner_renders_the_shipped_swiglu_forward(arch: str) -> None:
    """ranged, |y| amax, 5 blocks renders every shipped variant byte for byte (the knobs' defaults); the
    pre-sweep setting renders the IEEE division and reduce_absmax."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("swiglu_forward_and_per_token_cast")
    variants = expand(kernel)
    assert len(variants) == 40
    for match in variants:
        plain, knobbed = _renders(match, (("division", "ranged"), ("amax_abs", True), ("min_blocks", 5)), arch)
        assert knobbed == plain, match.params
        assert "T.fast_rcp(d)" in plain and "T.reduce_max(y_abs, amax, dim=1)" in plain
        assert "T.annotate_min_blocks_per_sm(5)" in plain
        _, before = _renders(match, (("division", "ieee"), ("amax_abs", False), ("min_blocks", 0)), arch)
        assert "fast_rcp" not in before and "T.reduce_absmax(y, amax, dim=1)" in before
        assert "annotate_min_blocks_per_sm" not in before


@pytest.mark.parametrize(("package", "problems", "per_problem"), [
    ("tkc_tuning23", 2, 7), ("tkc_tuning24", 2, 4), ("tkc_tuning25", 2, 4), ("tkc_tuning26", 2, 18),
    ("tkc_tuning27", 4, 9), ("tkc_tuning28", 2, 6), ("tkc_tuning29", 2, 4), ("tkc_tuning30", 2, 6),
    ("tkc_tuning31", 3, 3), ("tkc_tuning32", 4, 5), ("tkc_tuning33", 4, 2), ("tkc_tuning34", 4, 2),
    ("tkc_tuning35", 5, 2), ("tkc_tuning36", 4, 3), ("tkc_tuning37", 3, 2), ("tkc_tuning38", 5, 2),
    ("tkc_tuning39", 6, 2)])
def test_sweeps_23_on_have_the_shipped_setting_per_problem(package: str, problems: int, per_problem: int) -> None:
    """sweep23.yaml: the SwiGLU forward per-token cast at H 7168, npc 128 and H, one to 16 rows per block (the
    prefetch of the next row from 2 on), 5 blocks per SM or 6 for 4 and 8 rows. sweep24.yaml: its next row fetched
    by TMA or by cp.async, 2 or 4 rows per block. sweep25.yaml / sweep26.yaml: the SwiGLU backward at H 7168, npc 32
    and 128, steps of 512 or 1024 channels, 0 to 3 steps loaded ahead, no launch bound or 7 / 8 blocks.
    sweep27.yaml: the per-channel SwiGLU at npt 32 / 128, transposed or not, 1 / 2 / 4 token tiles per block, no
    bound or 32 / 48 warps per SM. sweep28.yaml (not a SwiGLU): the lossless re-cast to 1 x 128 and 32 x 32 blocks,
    32 / 64 / 128 rows per tile, 3 or 6 blocks per SM. sweep29.yaml: the SwiGLU backward's IEEE or ranged division,
    with or without a bound of 6 blocks. sweep30.yaml: per_channel_cast_fused's fp8 pair and bf16 gather, 1 / 2 / 4
    row tiles per block, two launch bounds each. sweep31.yaml: per_channel_cast_fused's bf16 plain and gather and fp8
    pair, the register form against the tile staged in shared memory by 128 or 256 threads. sweep32.yaml: the same
    and fp32 rows, with both block orders for the staged form. sweep33.yaml: per_block_cast e4m3 / e2m1 at 32 x 32
    and 128 x 128, with and without whole-tile copies. sweep34.yaml: the same copies in per_channel_cast_fused's
    staged form (bf16 rows, gather, fp32 rows, fp8 pair). sweep35.yaml: the same in the cast back and the lossless
    re-cast (gone again: the spec stays). sweep36.yaml: per_block_cast e2m1 as words, 32 or 64 values per thread.
    sweep37.yaml: per_block_cast's rectangular blocks in both orders. sweep38.yaml: its square blocks in both orders
    and 128 x 32 tiles of one or four scale blocks. sweep39.yaml: per_token_cast and the lossless re-cast in both
    block orders. One shipped baseline per problem."""
    found = _spec_variants(package)
    groups = sweep.problems(found)
    assert len(groups) == problems and all(len(g) == per_problem for g in groups.values())
    _assert_baselines_are_the_sweeps(found, package)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_twenty_third_sweep_winner_renders_the_shipped_swiglu_forward(arch: str) -> None:
    """rows 2, 5 blocks (the knobs' defaults) renders every shipped variant byte for byte: the prefetch loop;
    the pre-sweep rows 1 renders one row per block loaded straight into registers, as shipped before."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("swiglu_forward_and_per_token_cast")
    for match in expand(kernel):
        plain, knobbed = _renders(match, (("rows", 2), ("min_blocks", 5)), arch)
        assert knobbed == plain, match.params
        assert "ROWS = 2" in plain and "for step in T.serial(ROWS):" in plain
        _, before = _renders(match, (("rows", 1), ("min_blocks", 5)), arch)
        assert "T.tma_copy" not in before and "with T.Kernel(num_expanded_tokens, threads=THREADS) as row:" in before


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_twenty_fourth_sweep_winner_renders_the_shipped_swiglu_forward(arch: str) -> None:
    """cp_async with 2 rows (the knobs' defaults) renders every shipped variant byte for byte: no tensor map, so the
    launch keeps run()'s plan; the pre-sweep tma renders the mbarrier and the two TMA fetches."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("swiglu_forward_and_per_token_cast")
    for match in expand(kernel):
        plain, knobbed = _renders(match, (("fetch", "cp_async"), ("rows", 2)), arch)
        assert knobbed == plain, match.params
        assert plain.count("T.async_copy(") == 2 and "T.ptx_wait_group(0)" in plain and "tma_copy" not in plain
        _, before = _renders(match, (("fetch", "tma"), ("rows", 2)), arch)
        assert before.count("T.tma_copy(") == 2 and before.count("T.barrier_arrive(x_ready[0])") == 2
        assert "async_copy" not in before


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_twenty_fifth_sweep_winner_renders_the_shipped_swiglu_backward(arch: str) -> None:
    """chunk 1024, one step loaded ahead, no launch bound (the knobs' defaults) renders every shipped variant byte
    for byte; the pre-sweep chunk 512 without prefetch loads each step's operands where it computes them."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("swiglu_backward_and_per_token_cast")
    variants = expand(kernel)
    assert len(variants) == 10
    for match in variants:
        plain, knobbed = _renders(match, (("chunk", 1024), ("prefetch", 1), ("min_blocks", 0)), arch)
        assert knobbed == plain, match.params
        assert "CHUNK = 1024" in plain and "take_step(xq, yq, g_frag, x_scale, y_scale, xq_1" in plain
        assert "if k + 1 < steps:" in plain and "annotate_min_blocks_per_sm" not in plain
        _, before = _renders(match, (("chunk", 512), ("prefetch", False)), arch)
        assert "CHUNK = 512" in before and "take_step" not in before
        assert "load_step(x, x_sf, grad_out, row, k, xq, yq, g_frag, x_scale, y_scale)" in before
        _, deeper = _renders(match, (("prefetch", 3), ("min_blocks", 8)), arch)
        assert deeper.count("take_step(xq_") == 2 and "if k + 3 < steps:" in deeper
        assert "T.annotate_min_blocks_per_sm(8)" in deeper


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_thirty_first_sweep_winner_renders_the_shipped_per_channel_cast(arch: str) -> None:
    """The shared-memory form (256 threads and column order for the gather, 128 threads and row order otherwise:
    the knobs' defaults) renders every shipped variant of per_channel_cast_fused byte for byte; the register form
    shipped before renders without cp.async, through the first prim_func."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("per_channel_cast_fused")
    variants = expand(kernel)
    assert len(variants) == 50
    for match in variants:
        expand_rows = match.param_dict["expand"]
        knobs = (("stage", "shared"), ("staged_threads", 256 if expand_rows else 128),
                 ("block_order", "column" if expand_rows else "row"))
        plain, knobbed = _renders(match, knobs, arch)
        assert knobbed == plain, match.params
        assert "prim_func = per_channel_cast_fused_staged_kernel(" in plain
        assert f"STAGED_THREADS = {256 if expand_rows else 128}" in plain
        # the fp8 pair's copies twice since sweep 34 (whole tiles, and the partial last tile)
        assert plain.count("T.ptx_cp_async(") == (4 if match.param_dict["in_dtype"] == "float8_e4m3fn" else 1)
        _, before = _renders(match, (("stage", "registers"),), arch)
        assert "prim_func = per_channel_cast_fused_kernel(" in before and "T.ptx_cp_async(" not in before


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_thirty_third_sweep_winner_renders_the_shipped_per_block_cast(arch: str) -> None:
    """Whole-tile copies for e4m3 128 x 128 blocks (the knob's default) render those shipped variants byte for byte:
    the load and the store each under `if row0 + block_m <= num_tokens:` and its `else:`; every other variant renders
    as without the knob, one predicated copy each (as shipped before)."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("per_block_cast")
    variants = expand(kernel)
    winners = 0
    for match in variants:
        p = match.param_dict
        whole = p["fmt"] == "e4m3" and p["block_m"] == 128 and p["block_k"] == 128
        winners += whole
        plain, knobbed = _renders(match, (("full_tiles", whole),), arch)
        assert knobbed == plain, match.params
        assert plain.count("if row0 + block_m <= num_tokens:") == (2 if whole else 0)
        copies = plain.count("T.copy(x[row0, pid_k * tile_k], x_frag, disable_tma=True)")
        assert copies == (2 if whole else 0 if p["fmt"] == "e2m1" else 1)  # e2m1 reads words since sweep 36
    assert winners == 15


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_thirty_fourth_sweep_winner_renders_the_shipped_per_channel_cast(arch: str) -> None:
    """Whole-tile copies for the fp8 pair (the knob's default) render those shipped variants of per_channel_cast_fused
    byte for byte: step 1 (the cp.async copies) and step 3 (the q stores) each under
    `if (pid_m + 1) * TILE_M <= num_tokens_out:` and its `else:`; bf16 and fp32 rows render as without the knob."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("per_channel_cast_fused")
    pairs = 0
    for match in expand(kernel):
        pair = match.param_dict["in_dtype"] == "float8_e4m3fn"
        pairs += pair
        plain, knobbed = _renders(match, (("full_tiles", pair),), arch)
        assert knobbed == plain, match.params
        assert plain.count("if (pid_m + 1) * TILE_M <= num_tokens_out:") == (2 if pair else 0)
        assert plain.count("# Step 3: the codes, row by row") == (2 if pair else 1)
    assert pairs == 20


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_thirty_sixth_sweep_winner_renders_the_shipped_per_block_cast(arch: str) -> None:
    """Words and 64 values per thread for every e2m1 variant (the knobs' defaults; 128 x 32 blocks joined in sweep 40)
    render the shipped per_block_cast byte for byte; e4m3 keeps its bf16 fragment. The pre-sweep setting renders the
    fragment."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("per_block_cast")
    words = 0
    for match in expand(kernel):
        p = match.param_dict
        fp4 = p["fmt"] == "e2m1"
        words += fp4
        elems = 64 if fp4 else (128 if (p["block_m"], p["block_k"]) == (128, 128) else 32)
        plain, knobbed = _renders(match, (("x_words", fp4), ("elems_per_thread", elems)), arch)
        assert knobbed == plain, match.params
        assert f"ELEMS_PER_THREAD = {elems}" in plain
        assert ("x_words = T.alloc_fragment" in plain) == fp4 and ("x_frag = T.alloc_fragment" in plain) != fp4
        if fp4:
            _, before = _renders(match, (("x_words", False), ("elems_per_thread", 32)), arch)
            assert "x_frag = T.alloc_fragment" in before and "ELEMS_PER_THREAD = 32" in before
    assert words == 60


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_thirty_eighth_sweep_winners_render_the_shipped_per_block_cast(arch: str) -> None:
    """Row order and, for 128 x 32 blocks, tiles of at least 16384 values (the knobs' defaults) render every shipped
    per_block_cast byte for byte; the 128 x 32 tiles then span 128 channels."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("per_block_cast")
    wide = 0
    for match in expand(kernel):
        p = match.param_dict
        tile = 16384 if (p["block_m"], p["block_k"]) == (128, 32) else 4096
        wide += tile == 16384
        plain, knobbed = _renders(match, (("block_order", "row"), ("min_tile_elems", tile)), arch)
        assert knobbed == plain, match.params
        assert f"MIN_TILE_ELEMS = {tile}" in plain
        assert "with T.Kernel(hidden // tile_k, T.ceildiv(num_tokens, block_m), threads=threads) as (pid_k, pid_m):" in plain
    assert wide == 30


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_thirty_ninth_sweep_winners_render_the_shipped_kernels(arch: str) -> None:
    """Row order (a 1-D grid, row tile b / k_tiles, the knob's default) renders every shipped lossless re-cast
    byte for byte."""
    shipped = load_specs([REPO / "kernel_specs"], TEMPLATES)
    rows = 0
    for match in expand(shipped.kernel("per_block_cast_lossless")):
        rows += 1
        plain, knobbed = _renders(match, (("block_order", "row"),), arch)
        assert knobbed == plain, match.params
        assert "pid_m = bid // k_tiles" in plain
    assert rows == 15  # lossless (H x blocks); per_token_cast's order is default_config's (the sweep-winners test)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_forty_second_sweep_winner_renders_the_shipped_lossless_recast(arch: str) -> None:
    """Explicit 16-byte code stores (the knob's default) render every shipped per_block_cast_lossless byte for byte:
    eight st.global.v4 stores per thread through quant/_store.j2, no vectorized store loop left."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("per_block_cast_lossless")
    variants = list(expand(kernel))
    for match in variants:
        plain, knobbed = _renders(match, (("store_v4", True),), arch)
        assert knobbed == plain, match.params
        assert "T.import_source(STORE_SOURCE)" in plain and "st.global.v4.b32" in plain
        assert "store_v4(T.address_of(q_words[row, word0 + half * 8 - odd * 4])" in plain
        _, before = _renders(match, (("store_v4", False),), arch)
        assert "STORE_SOURCE" not in before and "q_words[row, word0 + half * 8 - odd * 4 + j] = staged" in before
    assert len(variants) == 15


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_forty_fifth_sweep_winner_renders_the_shipped_lossless_recast(arch: str) -> None:
    """Tiles of 32 x 1024 for 1 x 128 output blocks (64 x 512 where H % 1024 != 0), 128 x 256 for the others (the
    knobs' defaults), render every shipped per_block_cast_lossless byte for byte."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("per_block_cast_lossless")
    tiles = []
    for match in expand(kernel):
        p = match.param_dict
        tile = (128, 256) if p["block_m"] != 1 else (32, 1024) if p["hidden"] % 1024 == 0 else (64, 512)
        tiles.append(tile)
        plain, knobbed = _renders(match, (("tile_m", tile[0]), ("tile_k", tile[1])), arch)
        assert knobbed == plain, match.params
        assert f"TILE_M = {tile[0]}\n" in plain and f"TILE_K = {tile[1]}\n" in plain
    assert sorted(tiles).count((32, 1024)) == 4 and tiles.count((64, 512)) == 1 and tiles.count((128, 256)) == 10


_E5M6_HIDDENS = (4096, 6144, 7168)


@pytest.mark.parametrize(("package", "hiddens", "sizes"), [
    ("tkc_tuning59", (7168,), [4, 8, 8]), ("tkc_tuning60", (7168,), [6, 6, 6, 6]), ("tkc_tuning61", (7168,), [10] * 5),
    ("tkc_tuning62", (7168,), [4]), ("tkc_tuning64", _E5M6_HIDDENS, [3, 3, 4]), ("tkc_tuning65", (7168,), [2] * 4),
    ("tkc_tuning66", _E5M6_HIDDENS, [4, 4, 4]), ("tkc_tuning67", _E5M6_HIDDENS, [3, 3, 3])])
def test_sweeps_59_on_have_the_shipped_setting_per_problem(package: str, hiddens: tuple[int, ...],
                                                          sizes: list[int]) -> None:
    """sweep59.yaml: the cast backs e4m3 npc 128 -> fp32 and e2m1 npc 32 -> bf16 / fp32, 32 or 64 values per thread,
    direct or bulk rows, launch bounds of 12 and 16 blocks for e2m1. sweep60.yaml: 16 or 32 values per thread, with
    and without a bound of 16 blocks, e4m3 and e2m1 to bf16 and fp32. sweep61.yaml: 8 / 16 / 32 values and 128 / 256
    threads, npc 0 too. sweep62.yaml: cast_back_e5m6 -> fp32 at H 7168 in 1, 2, 7 or 14 blocks per row; sweep64.yaml:
    H 4096, 6144 and 7168 in pieces that are whole 512-column slabs. sweep65.yaml: e2m1 npc 0 and 32, to bf16 and
    fp32, the bit decode against the PRMT decode. sweep66.yaml: E5M6 -> fp32 in 1024-column pieces of 1, 2 or 4 rows;
    sweep67.yaml: the same pieces for bf16 out. Each problem's one baseline is what shipped before the sweep."""
    found = _spec_variants(package, hiddens)
    groups = sweep.problems(found)
    assert sorted(len(g) for g in groups.values()) == sizes
    assert all(sum(v.is_baseline for v in g) == 1 for g in groups.values())
    _assert_baselines_are_the_sweeps(found, package)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_sixty_first_sweep_winner_renders_the_shipped_cast_back(arch: str) -> None:
    """16 values per thread for fp32 out, 32 for bf16, 128 threads and the shipped store form (sweep 61's winner)
    render every shipped per_token_cast_back variant byte for byte; fp32 out takes half the tile it took before."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("per_token_cast_back")
    fp32 = 0
    for match in expand(kernel):
        p = match.param_dict
        store = "direct" if (p["fmt"], p["out_dtype"]) == ("e2m1", "bfloat16") else "bulk"
        values = 16 if p["out_dtype"] == "float32" else 32
        fp32 += p["out_dtype"] == "float32"
        plain, knobbed = _renders(match, (("elems_per_thread", values), ("threads", 128), ("store", store)), arch)
        assert knobbed == plain, match.params
        assert f"ELEMS_PER_THREAD = {values} " in plain and "THREADS = 128\n" in plain
        _, before = _renders(match, (("elems_per_thread", 32),), arch)
        assert (before == plain) == (values == 32)
    assert fp32 > 0


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_sixty_sixth_sweep_winner_renders_the_shipped_e5m6_cast_back(arch: str) -> None:
    """1024-column pieces of 2 rows from H 4096 up for fp32 out, a block per row otherwise (sweep 66's winner, the
    knobs' defaults), render every shipped cast_back_e5m6 byte for byte."""
    kernel = load_specs([REPO / "kernel_specs"], TEMPLATES).kernel("cast_back_e5m6")
    split = []
    for match in expand(kernel):
        p = match.param_dict
        pieces = p["hidden"] // 1024 if p["out_dtype"] == "float32" and p["hidden"] >= 4096 else 1
        plain, knobbed = _renders(match, (("row_pieces", pieces), ("piece_rows", 2)), arch)
        assert knobbed == plain, match.params
        assert ("cast_back_e5m6_f32_pieces(hidden, " in plain) == (pieces > 1)
        if pieces > 1:
            split.append(p["hidden"])
            assert f"return cast_back_e5m6_f32_pieces(hidden, {pieces}, 2)" in plain
    assert split == [4096, 6144, 7168]
