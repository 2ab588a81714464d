"""The benchmark tooling runs without a GPU where it can: the plot of committed results."""

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
