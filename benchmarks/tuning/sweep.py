"""Time every variant of the tuning package against its kernel's shipped setting, at production shapes.

Needs only torch and the ``tkc_tuning`` wheel built from ``benchmarks/tuning/sweep.yaml`` (no
TileLang); run from the repository root so that ``benchmarks/bench.py`` (the timer) and
``tests/reference`` (the plain-torch references) are importable:

    python benchmarks/tuning/sweep.py --out "$OUT"           # on the GPU machine
    python benchmarks/tuning/sweep.py --dry-run              # anywhere: the variants and their baselines

A *problem* is a kernel's non-knob grid values (per_block_cast e4m3 128 x 128, say); its
*baseline* is the variant whose knobs all equal ``BASELINE``, the settings shipped before the
first sweep (2026-11-30; its winners are now the templates' defaults, see README.md). Per problem, every variant runs once on a check input (random rows over a wide
range of magnitudes plus zeros, -0.0, exact e2m1 ties, a NaN and an Inf) and must match the
baseline's outputs byte for byte; the baseline itself is compared with the plain-torch reference
of tests/reference on finite random inputs. Then each variant is timed as benchmarks/bench.py
times the ops (CUDA events, warm-up, median of ``--reps`` calls, inputs rotated over more than
three times the L2 size), with a 1 GiB device-to-device copy measured in the same run as the
ceiling.

Writes OUT/sweep.json and OUT/sweep.md (sorted by time within each problem) and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "tkc_tuning"
TOKENS, HIDDEN = 8192, 7168  # the production shape of the casts
TRANSPOSE_SHAPE = (8, 512, 7168)  # (B, M, N), as in benchmarks/bench.py
DEVICE = "cuda"  # tests run the CPU pieces with "cpu" and small shapes

# The settings shipped before the first sweep: the reference every variant must match bit for bit
# and the speed-ups are measured against. Grid keys named here are knobs.
BASELINE: dict[str, Any] = {
    "elems_per_thread": 32,
    "chunk_vectors": 2,
    "min_tile_elems": 4096,
    "threads": 128,
    "e2m1_encode": "compare",
    "tile": 64,
    "segments_per_thread": 4,
}

Inputs = tuple[Any, ...]


@dataclass(frozen=True)
class Variant:
    kernel: str
    name: str  # the generated launcher's name (it carries the variant id)
    problem: tuple[tuple[str, Any], ...]  # non-knob grid values, in grid order
    knobs: tuple[tuple[str, Any], ...]
    launch: Callable[..., None] = field(compare=False, repr=False)

    @property
    def is_baseline(self) -> bool:
        return all(BASELINE[k] == v for k, v in self.knobs)

    def describe_knobs(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.knobs)


def variants(package: Any) -> list[Variant]:
    """Every built variant of the package, split into problem values and knob values."""
    runtime = importlib.import_module(f"{package.__name__}._runtime")
    info = importlib.import_module(f"{package.__name__}._build_info")
    out = []
    for name in info.KERNELS:
        kernel = runtime.get_kernel(name)
        for key, launch in kernel.variants.items():
            params = list(zip(kernel.keys, key, strict=True))
            out.append(Variant(
                kernel=name, name=launch.__name__,
                problem=tuple((k, v) for k, v in params if k not in BASELINE),
                knobs=tuple((k, v) for k, v in params if k in BASELINE), launch=launch,
            ))
    return out


def problems(found: list[Variant]) -> dict[tuple[str, tuple[tuple[str, Any], ...]], list[Variant]]:
    """Variants grouped by (kernel, problem); raises if a problem lacks its baseline."""
    groups: dict[tuple[str, tuple[tuple[str, Any], ...]], list[Variant]] = {}
    for v in found:
        groups.setdefault((v.kernel, v.problem), []).append(v)
    for (kernel, problem), group in groups.items():
        if sum(v.is_baseline for v in group) != 1:
            raise SystemExit(f"{kernel} {dict(problem)}: expected exactly one variant with the default knobs "
                             f"{BASELINE}; add it to benchmarks/tuning/sweep.yaml")
    return groups


# ---- inputs, outputs and references per kernel ------------------------------------------------


def check_matrix(tokens: int, hidden: int) -> torch.Tensor:
    """bf16 (tokens, hidden): random rows scaled over 2^-30 .. 2^30, plus the values casts get wrong.

    Row 0 is zeros, row 1 is -0.0, row 2 holds k / 4 for k = 0..24 (with 6 in every 32 channels,
    so per-token e2m1 scales are 1 and every e2m1 tie is hit exactly), row 3 has a NaN, row 4 an Inf.
    """
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(tokens, hidden, device=DEVICE, generator=gen)
    x *= torch.exp2(torch.randint(-30, 31, (tokens, 1), device=DEVICE, generator=gen).float())
    x[0] = 0.0
    x[1] = -0.0
    x[2] = (torch.arange(hidden, device=DEVICE) % 25).float() * 0.25 * torch.where(
        torch.arange(hidden, device=DEVICE) % 2 == 0, 1.0, -1.0)
    x[3, hidden // 3] = float("nan")
    x[4, hidden // 2] = float("inf")
    return x.to(torch.bfloat16)


def random_matrix(tokens: int, hidden: int) -> torch.Tensor:
    return torch.randn(tokens, hidden, device=DEVICE, dtype=torch.bfloat16)


def cast_outputs(kernel: str, problem: dict[str, Any], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, hidden = x.shape
    if problem["fmt"] == "e4m3":
        q = torch.empty(tokens, hidden, device=DEVICE, dtype=torch.float8_e4m3fn)
    else:
        q = torch.empty(tokens, hidden // 2, device=DEVICE, dtype=torch.int8)
    if kernel == "per_block_cast":
        sf_shape = (-(-tokens // problem["block_m"]), hidden // problem["block_k"])
    else:
        sf_shape = (tokens, hidden // problem["npc"])
    return q, torch.empty(sf_shape, device=DEVICE, dtype=torch.float32)


@dataclass(frozen=True)
class Case:
    """How to run one problem: make(x) gives the launch arguments; outputs picks the output tensors."""

    make: Callable[[torch.Tensor], Inputs]
    new_x: Callable[[], torch.Tensor]
    check_x: Callable[[], torch.Tensor]
    outputs: Callable[[Inputs], tuple[torch.Tensor, ...]]
    reference: Callable[[torch.Tensor], tuple[torch.Tensor, ...]] | None


def _reference(module: str, name: str) -> Callable[..., Any] | None:
    """A plain-torch reference from tests/reference, or None where it does not import."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        return getattr(importlib.import_module(f"reference.{module}"), name)
    except Exception as exc:  # optional: the table then says the reference was not checked
        print(f"no reference {module}.{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def case(kernel: str, problem: dict[str, Any]) -> Case:
    if kernel == "per_block_cast":
        ref = _reference("quant_per_block", "per_block_cast_ref")
        block = (problem["block_m"], problem["block_k"])
        return Case(
            make=lambda x: (x, *cast_outputs(kernel, problem, x)),
            new_x=lambda: random_matrix(TOKENS, HIDDEN),
            check_x=lambda: check_matrix(TOKENS, HIDDEN),
            outputs=lambda args: args[1:3],
            reference=functools.partial(ref, fmt=problem["fmt"], block_size=block, round_sf=problem["round_sf"])
            if ref else None,
        )
    if kernel == "per_token_cast":
        assert problem["sf_layout"] == "row_major" and problem["npc"] != 0, problem
        ref = _reference("quant", "per_token_cast_ref")
        return Case(
            make=lambda x: (x, *cast_outputs(kernel, problem, x), 0),  # mode 0: cast (q and sf)
            new_x=lambda: random_matrix(TOKENS, HIDDEN),
            check_x=lambda: check_matrix(TOKENS, HIDDEN),
            outputs=lambda args: args[1:3],
            reference=functools.partial(ref, fmt=problem["fmt"], npc=problem["npc"], round_sf=problem["round_sf"])
            if ref else None,
        )
    if kernel == "batched_transpose":
        dtype = getattr(torch, problem["dtype"])

        def new_x() -> torch.Tensor:
            return torch.randn(TRANSPOSE_SHAPE, device=DEVICE).to(dtype)

        return Case(
            make=lambda x: (x, torch.empty(x.shape[0], x.shape[2], x.shape[1], device=DEVICE, dtype=x.dtype)),
            new_x=new_x, check_x=new_x,
            outputs=lambda args: args[1:2],
            reference=lambda x: (x.transpose(-1, -2).contiguous(),),
        )
    raise SystemExit(f"sweep.py does not know kernel {kernel!r}; add a case for it")


def same_bytes(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    """Bit-identical, NaNs included (compared as raw bytes, not as numbers)."""
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype
        and torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
        for x, y in zip(a, b, strict=True))


# ---- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    kernel: str
    problem: str
    variant: str
    knobs: str
    baseline: bool
    us: float | None
    gb_s: float | None
    pct_copy: float | None
    speedup: float | None  # baseline time / this time
    bit_exact: bool | None  # equal to the baseline's outputs on the check input
    note: str


def run_problem(timer: Any, bench: Any, copy_gb_s: float, kernel: str, problem: dict[str, Any],
                group: list[Variant]) -> list[Row]:
    c = case(kernel, problem)
    described = ", ".join(f"{k}={v}" for k, v in problem.items())
    baseline = next(v for v in group if v.is_baseline)
    check = c.check_x()
    expected: tuple[torch.Tensor, ...] | None = None
    ref_note = "reference not checked"
    try:
        args = c.make(check)
        baseline.launch(*args)
        expected = tuple(t.clone() for t in c.outputs(args))
        if c.reference is not None:
            # On finite random inputs: how the references treat NaN and Inf is not this sweep's question.
            x = c.new_x()
            args = c.make(x)
            baseline.launch(*args)
            ref_note = "baseline == reference" if same_bytes(c.outputs(args), c.reference(x)) else \
                "BASELINE DIFFERS FROM REFERENCE"
    except Exception as exc:
        ref_note = f"baseline failed: {bench.reason(exc)}"
    inputs = bench.rotating_inputs(lambda: c.make(c.new_x()))
    nbytes = sum(bench.tensor_bytes(t) for t in inputs[0])
    measured: list[tuple[Variant, float | None, bool | None, str]] = []
    for v in sorted(group, key=lambda v: not v.is_baseline):
        note = ref_note if v.is_baseline else ""
        exact: bool | None = None
        us: float | None = None
        try:
            args = c.make(check)
            v.launch(*args)
            exact = expected is not None and same_bytes(expected, c.outputs(args))
            us = timer.median_us(v.launch, inputs)
        except Exception as exc:  # one broken variant must not cost the rest of the sweep
            note = f"failed: {bench.reason(exc)}"
        measured.append((v, us, exact, note))
    base_us = next(us for v, us, _, _ in measured if v.is_baseline)
    rows = []
    for v, us, exact, note in measured:
        gb_s = nbytes / us / 1e3 if us else None
        rows.append(Row(
            kernel=kernel, problem=described, variant=v.name, knobs=v.describe_knobs(), baseline=v.is_baseline,
            us=us, gb_s=gb_s, pct_copy=100 * gb_s / copy_gb_s if gb_s else None,
            speedup=base_us / us if us and base_us else None, bit_exact=exact, note=note,
        ))
    return sorted(rows, key=lambda r: (r.us is None, r.us or 0.0))


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def markdown(meta: dict[str, Any], rows: list[Row]) -> str:
    lines = [
        f"# Tuning sweep: {meta['gpu']}, {meta['date']}",
        "",
        f"torch {meta['torch']}, {meta['package']}, copy {meta['copy_gb_s']:.0f} GB/s (1 GiB device-to-device, "
        f"read + written), median of {meta['reps']} calls. Bit-exact: outputs equal the baseline's "
        "(the default knobs, marked *) on the check input.",
    ]
    problem = None
    for r in rows:
        if (r.kernel, r.problem) != problem:
            problem = (r.kernel, r.problem)
            lines += ["", f"## {r.kernel}: {r.problem}", "",
                      "| variant | knobs | µs | GB/s | % copy | speedup | bit-exact | note |",
                      "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
        exact = "n/a" if r.bit_exact is None else ("yes" if r.bit_exact else "**NO**")
        lines.append(f"| {r.variant}{' *' if r.baseline else ''} | {r.knobs} | {fmt(r.us)} | {fmt(r.gb_s, 0)} | "
                     f"{fmt(r.pct_copy)} | {fmt(r.speedup, 2)} | {exact} | {r.note} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if "OUT" in os.environ else None,
                        help="folder for sweep.json and sweep.md (default: $OUT)")
    parser.add_argument("--reps", type=int, default=200, help="timed calls per variant (median taken)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--dry-run", action="store_true", help="list problems, baselines and variants; no GPU")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    package = importlib.import_module(PACKAGE)
    groups = problems(variants(package))
    if args.dry_run:
        for (kernel, problem), group in groups.items():
            print(f"{kernel} {dict(problem)}: {len(group)} variants")
            for v in group:
                print(f"  {v.name}{' (baseline)' if v.is_baseline else ''}: {v.describe_knobs()}")
        return 0
    if args.out is None:
        print("--out (or $OUT) is required", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("sweep.py needs a CUDA GPU", file=sys.stderr)
        return 1
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench  # benchmarks/bench.py: the same timer, input rotation and copy ceiling

    timer = bench.Timer(bench.Settings(reps=args.reps, warmup=args.warmup))
    copy_gb_s = bench.copy_bandwidth(timer)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "package": f"{PACKAGE} {getattr(package, '__version__', '?')} ({getattr(package, 'TARGET', '?')})",
        "copy_gb_s": copy_gb_s,
        "reps": args.reps,
        "baseline": BASELINE,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    for (kernel, problem), group in groups.items():
        rows += run_problem(timer, bench, copy_gb_s, kernel, dict(problem), group)
        # Rewritten after every problem, so a run cut short keeps what it measured.
        (args.out / "sweep.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]},
                                                        indent=2) + "\n")
        table = markdown(meta, rows)
        (args.out / "sweep.md").write_text(table)
        torch.cuda.empty_cache()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
