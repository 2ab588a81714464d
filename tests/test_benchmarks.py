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

    for script in ("bench.py", "runtime_overhead.py", "profile_launch.py", "plot.py", "ceilings.py", "split_stores.py",
                   "store_ceilings.py"):
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


def test_split_stores_finds_four_word_stores_of_one_vector() -> None:
    """split_stores.py: four STG.E at +0..+12 from one base are one split vector; a 16-byte store, a run broken by
    another store, an unaligned start or other bases are not."""
    from split_stores import split_stores

    def sass(*ops: str) -> str:
        return "\n".join(f"        /*{16 * i:04x}*/                   {op} ;   /* 0x0 */" for i, op in enumerate(ops))

    split = ("STG.E desc[UR6][R12.64], R5", "STG.E desc[UR6][R12.64+0x4], R17", "STG.E desc[UR6][R12.64+0x8], R5",
             "STG.E desc[UR6][R12.64+0xc], R15")
    assert split_stores(sass(*split)) == [("R12", 0)]
    assert split_stores(sass("@!P2 STG.E desc[UR4][R2.64+0x20], R7", "STG.E desc[UR4][R2.64+0x24], R9",
                             "STG.E desc[UR4][R2.64+0x28], R15", "STG.E desc[UR4][R2.64+0x2c], R11")) == [("R2", 32)]
    assert split_stores(sass("STG.E.128 desc[UR6][R12.64], R4", "STG.E.128 desc[UR6][R12.64+0x20], R8")) == []
    assert split_stores(sass(*split[:2], "STS [R3], R4", *split[2:])) == []
    assert split_stores(sass(*(f"STG.E desc[UR6][R12.64+{off:#x}], R5" for off in (4, 8, 12, 16)))) == []  # unaligned
    # A row of 4-byte stores down a column (offsets 0x1c00 apart): by design, not a split vector.
    assert split_stores(sass(*(f"@!P4 STG.E desc[UR6][R26.64+{0x1c00 * i:#x}], R21" for i in range(4)))) == []
