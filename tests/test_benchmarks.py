"""The benchmark tooling runs without a GPU where it can: the plot of committed results, the compiled baselines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from mix_ceiling import Mix, check, mix


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


def _mix_kernel_in_torch(x: torch.Tensor, m: Mix) -> torch.Tensor:
    """mix_kernel's loops as written (program by program, step by step, with its masks), on the CPU."""
    lanes = torch.arange(m.block)
    y = torch.full((m.writes,), -1, dtype=torch.int32)
    for p in range(m.programs):
        acc = torch.zeros(m.block, dtype=torch.int32)
        start = p * m.reads_per_program
        end = min(start + m.reads_per_program, m.reads)
        for i in range(0, m.reads_per_program, m.block):
            offs = start + i + lanes
            acc += torch.where(offs < end, x[offs.clamp(max=m.reads - 1)], 0)
        start = p * m.writes_per_program
        end = min(start + m.writes_per_program, m.writes)
        for j in range(0, m.writes_per_program, m.block):
            offs = start + j + lanes
            y[offs[offs < end]] = (acc + j)[offs < end]
    return y


@pytest.mark.parametrize(("read_bytes", "written_bytes"), [(3 << 20, 1 << 20), (1 << 20, 3_200_000), (5000, 13000),
                                                           (16 << 20, 300_000)])
def test_mix_ceiling_check_recomputes_the_kernel(read_bytes: int, written_bytes: int) -> None:
    """bench.py's "% mix" ceiling streams an op's bytes; check() must accept exactly what the kernel's loops write
    (uneven shares, ends inside a step) and reject a run that skipped a store or a load."""
    m = mix(read_bytes, written_bytes, program_bytes=96 << 10)  # several programs of several steps at test sizes
    assert m.programs > 1 or read_bytes < 1 << 16
    assert 4 * m.reads >= read_bytes and 4 * m.writes >= written_bytes and m.reads - read_bytes / 4 < 64
    x = torch.randint(0, 1 << 20, (m.reads,), dtype=torch.int32)
    y = _mix_kernel_in_torch(x, m)
    assert bool((y >= 0).all())  # every word written
    check(m, x, y)
    skipped_store = y.clone()
    skipped_store[-1] = -1
    with pytest.raises(AssertionError):
        check(m, x, skipped_store)
    skipped_load = x.clone()
    skipped_load[m.reads_per_program if m.programs > 1 else 0] += 1  # lane 0 of a program: every program writes it
    with pytest.raises(AssertionError):
        check(m, skipped_load, y)


def _modules(prefix: str, funcs: dict[str, object], sub: dict[str, object] | None = None) -> object:
    import types

    package = types.ModuleType(prefix)
    for name, value in funcs.items():
        setattr(package, name, value)
    if sub is not None:
        child = types.ModuleType(f"{prefix}.quant")
        for name, value in sub.items():
            setattr(child, name, value)
        package.quant = child  # type: ignore[attr-defined]
    return package


def test_a_call_written_once_runs_through_the_wheel_or_through_tilekernels() -> None:
    """peer.mirror: functions read from the wheel's tree are Twins, calling TileKernels' function of the same name
    inside as_theirs; a name the wheel lacks is an AttributeError; a call that reaches no TileKernels function (or
    one TileKernels lacks) is refused instead of timing ours twice."""
    from peer import as_theirs, mirror

    ours = _modules("tile_kernels_aot", {"VERSION": 1}, {"cast": lambda x: ("ours", x), "only_ours": lambda: 0})
    theirs = _modules("tile_kernels", {}, {"cast": lambda x: ("theirs", x)})
    tk = mirror(ours, theirs)
    call = lambda x: tk.quant.cast(x)  # noqa: E731  # as a benchmark case writes it
    assert call(3) == ("ours", 3) and as_theirs(call)(3) == ("theirs", 3) and call(4) == ("ours", 4)
    assert tk.VERSION == 1 and getattr(tk.quant, "missing", None) is None
    with pytest.raises(NotImplementedError, match="TileKernels has no tile_kernels.quant.only_ours"):
        as_theirs(lambda: tk.quant.only_ours())()
    captured = ours.quant.cast  # type: ignore[attr-defined]  # not read through the mirror
    with pytest.raises(LookupError, match="reaches no TileKernels function"):
        as_theirs(lambda: captured(1))()
    assert mirror(ours, None) is ours


def test_same_bits_compares_every_output_bit_for_bit() -> None:
    from bench import same_bits

    a = torch.tensor([0.0, 1.0, float("nan")])
    assert same_bits((a, a.clone()), (a.clone(), a)) == ""  # NaN equals itself bit for bit
    assert same_bits(a, torch.tensor([-0.0, 1.0, float("nan")])) == "1 of 3 elements differ"  # signed zero
    assert same_bits((a,), (a, a)) == "1 outputs vs 2"
    assert "torch.float32 vs" in same_bits(a, a.double())
    assert same_bits([a, 2], [a, 3]) == "output 1: 2 vs 3"


def test_a_regression_is_an_op_slower_than_its_baseline_by_more_than_five_percent() -> None:
    from bench import Row, regressions

    def row(op: str, us: float | None) -> Row:
        return Row(op, "s", us, None, None, None, None, "")

    baseline = {"rows": [{"op": "a", "shape": "s", "us": 100.0}, {"op": "b", "shape": "s", "us": 100.0},
                         {"op": "c", "shape": "s", "us": None}]}
    now = [row("a", 105.0), row("b", 105.1), row("c", 500.0), row("d", 1.0), row("a", None)]
    assert regressions(now, baseline) == {("b", "s"): "b (s): 105.1 µs vs 100.0 µs"}
    assert regressions(now, baseline, within={("a", "s")}) == {}


def test_a_run_in_parts_keeps_the_other_sections_rows_and_refuses_another_commit() -> None:
    from dataclasses import asdict, replace

    from bench import Row, earlier_part

    def row(op: str, section: str) -> dict[str, object]:
        return asdict(Row(op, "s", 1.0, None, None, None, None, "", section=section)) | {"pct_mix": None}

    meta = {"date": "d2", "gpu": "H200", "commit": "abc"}
    earlier = {"meta": {"date": "d1", "gpu": "H200", "commit": "abc", "cold_start": [{"name": "x"}]},
               "rows": [row("a", "quant"), row("b", "mhc"), row("c", "mhc")]}
    kept, merged = earlier_part(earlier, meta, ["mhc"], ["quant", "mhc", "engram"])
    assert kept == [Row("a", "s", 1.0, None, None, None, None, "", section="quant")]
    assert merged["date"] == "d2" and merged["cold_start"] == [{"name": "x"}]
    assert merged["parts"] == [{"date": "d1", "sections": ["quant"]}, {"date": "d2", "sections": ["mhc"]}]
    with pytest.raises(SystemExit, match="--into: its commit is 'abc', this run's 'def'"):
        earlier_part(earlier, {**meta, "commit": "def"}, ["mhc"], ["quant", "mhc"])
    unnamed = {**earlier, "rows": [row("a", "")]}
    with pytest.raises(SystemExit, match="names no section of this bench.py"):
        earlier_part(unnamed, meta, ["mhc"], ["quant", "mhc"])
    assert replace(kept[0], section="mhc").section == "mhc"
