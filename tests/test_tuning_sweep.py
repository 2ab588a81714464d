"""The tuning harness (benchmarks/tuning/sweep.py) without a GPU: its example sweep, its bookkeeping, its cases against
the references, the e2m1 encode check."""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.conftest import REPO, TEMPLATES
from tkc.spec import expand, load_specs

TUNING = REPO / "benchmarks" / "tuning"
sys.path.insert(0, str(TUNING))
sys.path.insert(0, str(REPO / "tests"))

import sweep  # noqa: E402  (benchmarks/tuning/sweep.py)
from reference.quant import per_token_cast_ref  # noqa: E402
from reference.quant_per_block import per_block_cast_ref  # noqa: E402


def test_example_sweep_builds_sm90_only_with_one_baseline_per_problem() -> None:
    tuning = sweep.SWEEPS[sweep.DEFAULT_PACKAGE]
    specs = load_specs([TUNING / tuning.spec], TEMPLATES)
    assert (specs.package.name, specs.package.version) == (tuning.package, "0.1.0")
    found = []
    for kernel in specs.kernels:
        assert kernel.archs == ("sm90",)
        found += [sweep.split(tuning, kernel.name, v.id, v.params, lambda *args: None) for v in expand(kernel)]
    groups = sweep.problems(found)  # raises unless each problem holds exactly one baseline
    assert len(groups) == 3 and all(len(group) > 1 for group in groups.values())
    for v in found:  # the baseline of each problem is what the template ships
        if v.is_baseline:
            assert dict(v.knobs) == tuning.baseline(v.kernel, dict(v.problem))


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


# The harness's cases on the CPU at small shapes: (kernel, problem, the launch arguments
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
def test_cases_run_and_count_bench_bytes(monkeypatch: pytest.MonkeyPatch, kernel: str,
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


def test_mapped_gate_case_runs_against_its_reference(monkeypatch: pytest.MonkeyPatch) -> None:
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
