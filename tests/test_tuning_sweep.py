"""The tuning sweep (benchmarks/tuning) without a GPU: its spec, its knob defaults, its bookkeeping, its encode check."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.conftest import REPO, TEMPLATES
from tkc.arch import ARCHS
from tkc.render import render_source
from tkc.spec import expand, load_specs

TUNING = REPO / "benchmarks" / "tuning"
sys.path.insert(0, str(TUNING))
sys.path.insert(0, str(REPO / "tests"))

import sweep  # noqa: E402  (benchmarks/tuning/sweep.py)
from reference.quant import per_token_cast_ref  # noqa: E402
from reference.quant_per_block import per_block_cast_ref  # noqa: E402

TUNED_TEMPLATES = ("quant/per_block_cast.py.j2", "quant/per_token_cast.py.j2", "transpose/batched_transpose.py.j2")


def test_sweep_spec_builds_sm90_only_with_one_baseline_per_problem() -> None:
    specs = load_specs([TUNING / "sweep.yaml"], TEMPLATES)
    assert (specs.package.name, specs.package.version) == ("tkc_tuning", "0.1.0")
    found = []
    for kernel in specs.kernels:
        assert kernel.archs == ("sm90",)
        for v in expand(kernel):
            params = v.param_dict
            assert params.get("hidden", 7168) == 7168  # production shapes only
            found.append(sweep.Variant(
                kernel=kernel.name, name=v.id, problem=tuple((k, x) for k, x in v.params if k not in sweep.DEFAULTS),
                knobs=tuple((k, x) for k, x in v.params if k in sweep.DEFAULTS), launch=lambda *args: None))
    assert len(found) <= 48  # a few dozen variants: about a minute of build per dozen on two cores
    groups = sweep.problems(found)  # raises unless each problem holds exactly one baseline
    assert len(groups) == 5


def test_sweep_defaults_are_the_templates_defaults() -> None:
    defaults: dict[str, Any] = {}
    for template in TUNED_TEMPLATES:
        text = (TEMPLATES / template).read_text()
        for key, value in re.findall(r"\{\{ (\w+) \| default\((\w+|\"\w+\")\) \}\}", text):
            defaults[key] = value.strip('"') if value.startswith('"') else int(value)
        for key, value in re.findall(r"(\w+) \| default\(\"(\w+)\"\) ==", text):
            defaults[key] = value
    defaults["segments_per_thread"] = 4  # the factory's default argument
    assert defaults == sweep.DEFAULTS


@pytest.mark.parametrize("kernel", ["per_block_cast", "per_token_cast", "batched_transpose"])
def test_baseline_variant_renders_the_shipped_kernel(kernel: str) -> None:
    """The default knobs give the shipped source (the generated header names the grid, nothing else differs)."""
    tuning = load_specs([TUNING / "sweep.yaml"], TEMPLATES).kernel(kernel)
    shipped = {tuple(sorted(v.params)): v for v in expand(load_specs([REPO / "kernel_specs"], TEMPLATES).kernel(kernel))}
    arch = ARCHS["sm90"]
    checked = 0
    for v in expand(tuning):
        params = v.param_dict
        if any(params[k] != sweep.DEFAULTS[k] for k in params if k in sweep.DEFAULTS):
            continue
        match = shipped[tuple(sorted((k, x) for k, x in v.params if k not in sweep.DEFAULTS))]
        body = render_source(v, arch, TEMPLATES).split("\n", 2)[2]
        assert body == render_source(match, arch, TEMPLATES).split("\n", 2)[2]
        checked += 1
    assert checked >= 1


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
                             knobs=(("threads", threads),), launch=launch)

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
def test_magic_e2m1_encode_is_exact_over_all_fp32(tmp_path: Path) -> None:
    """benchmarks/tuning/e2m1_encode_check.c: 2^32 patterns, about 10 s on one core."""
    exe = tmp_path / "check"
    subprocess.run(["cc", "-O2", "-ffp-contract=off", "-fno-fast-math", "-o", str(exe),
                    str(TUNING / "e2m1_encode_check.c"), "-lm"], check=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    assert "0 mismatches over 2^32" in result.stdout
