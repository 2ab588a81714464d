"""The benchmark tooling runs without a GPU where it can: the plot of committed results, the compiled baselines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))


def test_plot_of_committed_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from plot import plot

    results = sorted((REPO / "benchmarks" / "results").glob("*/results.json"))
    assert results, "benchmarks/results holds no results.json"
    out = tmp_path / "pct_copy.png"
    plot(results[-1], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_scripts_parse() -> None:
    import ast

    for script in ("bench.py", "runtime_overhead.py", "profile_launch.py", "plot.py", "ceilings.py"):
        ast.parse((REPO / "benchmarks" / script).read_text())


def test_ceilings_refuses_without_a_gpu() -> None:
    import subprocess

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the script would measure it")
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "ceilings.py")], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1 and "needs a CUDA GPU" in run.stderr


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_references_compile_for_the_compiled_baselines(fmt: str) -> None:
    """bench.py times torch.compile of the eager references. Their NaN code must not be written through a dtype
    view in place: Inductor cannot lower that ("make_reindexer NYI on DtypeView"), and the compiled column of
    per_block_cast and the per-channel casts read "n/a" for a while because of it. Compiled on CPU, same bytes."""
    import torch

    from tests.reference.quant import codes

    scaled = torch.randn(8, 64) * 300
    scaled[0, 1], scaled[1, 2], scaled[2, 3] = float("nan"), -float("nan"), float("inf")
    compiled = torch.compile(lambda s: codes(s, fmt), dynamic=False)(scaled)
    assert torch.equal(compiled.view(torch.uint8), codes(scaled, fmt).view(torch.uint8))
