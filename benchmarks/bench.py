"""Benchmark the prebuilt ops against the card's copy bandwidth, torch eager and torch.compile.

Needs only torch and an installed ``tile_kernels_aot`` wheel (no TileLang):

    python benchmarks/bench.py --out DIR [--commit SHA] [--quick]

Every number is the median GPU time of many calls, taken with CUDA events after a
warm-up. Before each timed call a GPU sleep keeps the stream busy while the host
enqueues the call, so host-side overhead (argument checks, Python) stays out of the
GPU time. Inputs rotate among buffers that together exceed three times the L2 cache, so
the cache does not serve them. Bytes count every input and output once (read +
written); GB/s is bytes / median time, and "% copy" compares it with a large
device-to-device copy measured in the same run. "% size copy" compares the op's time with
that of a copy moving the op's own bytes, timed the same way: at the benchmark shapes
(100-200 MB) the copy itself runs about 10% short of the 1 GiB figure (launch latency and
the last wave of blocks weigh more in a 40 µs call), so this column says how far an op is
from what a copy of its size reaches. "% mix" compares it with a streaming kernel that reads
and writes exactly the op's bytes (benchmarks/mix_ceiling.py, Triton): the ceiling of the op's
own size and read:write mix (the more a stream writes, the lower its rate against a copy).

Writes DIR/results.json, DIR/results.md and (with matplotlib) DIR/pct_copy.png, and prints the markdown
table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
COPY_BYTES = 1 << 30  # one buffer of the copy-bandwidth measurement: far larger than any L2
MAX_BUFFERS = 16

Inputs = tuple[Any, ...]
Op = Callable[..., Any]


@dataclass(frozen=True)
class Settings:
    reps: int
    warmup: int


@dataclass(frozen=True)
class Row:
    op: str
    shape: str
    us: float | None
    gb_s: float | None
    pct_copy: float | None
    eager_us: float | None
    compiled_us: float | None
    note: str
    # A device copy moving the op's bytes (half read, half written), timed as the op is: what the copy
    # itself reaches at this size, where launch latency and the last wave weigh more than at 1 GiB.
    size_copy_us: float | None = None
    # mix_ceiling.py's kernel streaming the op's bytes read and written (None: no Triton).
    mix_us: float | None = None
    # TileKernels' JIT kernel on the same inputs (bench.py --tilekernels; peer.py): its median time, its first
    # call's seconds (the JIT compile, or a load from TileLang's cache), and whether its outputs equal ours bit
    # for bit (None: not compared, e.g. an op writing in place).
    tk_us: float | None = None
    tk_first_s: float | None = None
    tk_same: bool | None = None
    section: str = ""  # the bench.py section that measured it (--into replaces a section's rows)

    @property
    def pct_size_copy(self) -> float | None:
        return 100 * self.size_copy_us / self.us if self.us and self.size_copy_us else None

    @property
    def pct_mix(self) -> float | None:
        return 100 * self.mix_us / self.us if self.us and self.mix_us else None

    @property
    def vs_eager(self) -> float | None:
        return self.eager_us / self.us if self.us and self.eager_us else None

    @property
    def vs_compiled(self) -> float | None:
        return self.compiled_us / self.us if self.us and self.compiled_us else None

    @property
    def vs_tk(self) -> float | None:
        return self.tk_us / self.us if self.us and self.tk_us else None


class Timer:
    """Median GPU time of a call, with the host kept ahead of the GPU by a calibrated sleep."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cycles_per_us = self._calibrate()

    @staticmethod
    def _calibrate() -> float:
        cycles = 10_000_000
        torch.cuda._sleep(cycles)  # first call loads the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) * 1e3)

    def _host_us(self, fn: Op, inputs: Sequence[Inputs]) -> float:
        """Host time to enqueue one call, while a long sleep keeps the stream from blocking the host."""
        torch.cuda._sleep(int(50_000 * self.cycles_per_us))
        t0 = time.perf_counter()
        for args in inputs[:4]:
            fn(*args)
        host = (time.perf_counter() - t0) * 1e6 / len(inputs[:4])
        torch.cuda.synchronize()
        return host

    def median_us(self, fn: Op, inputs: Sequence[Inputs]) -> float:
        for i in range(self.settings.warmup):
            fn(*inputs[i % len(inputs)])
        torch.cuda.synchronize()
        # Sleep twice the host time (plus margin), so the call is queued before the GPU gets to it.
        sleep_cycles = int((2 * self._host_us(fn, inputs) + 20) * self.cycles_per_us)
        events = []
        for i in range(self.settings.reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(sleep_cycles)
            start.record()
            fn(*inputs[i % len(inputs)])
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) * 1e3 for start, end in events)


def rotating_inputs(make: Callable[[], Inputs]) -> list[Inputs]:
    """Enough input sets that cycling through them defeats the L2 cache (3x its size, at least 2 sets)."""
    first = make()
    nbytes = sum(t.nbytes for t in first if isinstance(t, torch.Tensor))
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    count = min(MAX_BUFFERS, max(2, math.ceil(3 * l2 / max(nbytes, 1))))
    return [first] + [make() for _ in range(count - 1)]


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in a (nested) result."""
    if isinstance(value, torch.Tensor):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def reason(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"[:160]


def try_time(timer: Timer, fn: Op | None, inputs: Sequence[Inputs], notes: list[str],
             label: str) -> float | None:
    """Time ``fn``; a failure (a torch.compile error, say) becomes a note "label n/a: reason"."""
    if fn is None:
        return None
    try:
        return timer.median_us(fn, inputs)
    except Exception as exc:  # reported in the table, never hidden
        notes.append(f"{label} n/a: {reason(exc)}")
        return None


def compiled(fn: Op) -> Op:
    return torch.compile(fn, dynamic=False)


def copy_bandwidth(timer: Timer) -> float:
    """GB/s of y.copy_(x) over COPY_BYTES, counting bytes read + written."""
    inputs = [(torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda"),
               torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")) for _ in range(2)]
    us = timer.median_us(lambda x, y: y.copy_(x), inputs)
    return 2 * COPY_BYTES / us / 1e3


@functools.cache
def size_copy_us(timer: Timer, nbytes: int) -> float:
    """Median time of y.copy_(x) over nbytes // 2 bytes (nbytes moved), on rotated buffers as the ops."""
    half = nbytes // 2

    def make() -> Inputs:
        return (torch.randint(0, 256, (half,), dtype=torch.uint8, device="cuda"),
                torch.empty(half, dtype=torch.uint8, device="cuda"))

    return timer.median_us(lambda x, y: y.copy_(x), rotating_inputs(make))


@functools.cache
def mix_ceiling_us(timer: Timer, read_bytes: int, written_bytes: int) -> float | None:
    """Median time of mix_ceiling.py's kernel moving these bytes, the fastest of its forms (each checked once);
    None without Triton."""
    import mix_ceiling  # benchmarks/mix_ceiling.py, next to this script (it imports without Triton)

    if mix_ceiling.triton is None:
        return None
    return min(us for _, us in mix_ceiling.timed_forms(read_bytes, written_bytes, rotating_inputs, timer.median_us))


PEER: dict[str, bool] = {"on": False}  # set by main() when TileKernels is importable (--tilekernels)


def same_bits(a: Any, b: Any) -> str:
    """"" where two (nested) results are equal bit for bit, else what differs first."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
        if a.numel() == 0:
            return ""
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        x, y = a.contiguous().view(bits), b.contiguous().view(bits)
        differ = int((x != y).sum())
        return f"{differ} of {a.numel()} elements differ" if differ else ""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        if len(a) != len(b):
            return f"{len(a)} outputs vs {len(b)}"
        return next((f"output {i}: {d}" for i, d in enumerate(same_bits(x, y) for x, y in zip(a, b)) if d), "")
    return "" if a == b else f"{a!r} vs {b!r}"


def _peer_columns(timer: Timer, ours: Op, our_out: Any, inputs: Sequence[Inputs], notes: list[str]
                  ) -> tuple[float | None, float | None, bool | None]:
    """TileKernels' (µs, first-call s, same bits) for the case's call made through it (see peer.py); ``our_out``:
    our call's result on ``inputs[0]``."""
    from peer import as_theirs

    theirs = as_theirs(ours)
    try:
        torch.cuda.synchronize()
        start = time.perf_counter()
        their_out = theirs(*inputs[0])
        torch.cuda.synchronize()
        first_s = time.perf_counter() - start
    except Exception as exc:  # a missing op or a failed JIT is a note in the row
        notes.append(f"tilekernels n/a: {reason(exc)}")
        return None, None, None
    same = None
    if tensor_bytes(their_out):  # ops that return nothing write in place: an accumulator would differ
        diff = same_bits(our_out, their_out)
        same = not diff
        if diff:
            notes.append(f"differs from TileKernels: {diff}")
    return try_time(timer, theirs, inputs, notes, "tilekernels"), first_s, same


def bench_case(timer: Timer, copy_gb_s: float, op: str, shape: str, make: Callable[[], Inputs],
               ours: Op | None, eager: Op | None, missing: str = "") -> Row:
    """One table row: our op, torch eager and torch.compile of the eager function on the same inputs, and with
    --tilekernels the same call through TileKernels (peer.py)."""
    notes = [missing] if missing else []
    inputs = rotating_inputs(make)
    us = try_time(timer, ours, inputs, notes, "ours")
    gb_s = pct = same_size = mix = our_out = None
    if us is not None and ours is not None:
        our_out = ours(*inputs[0])
        read, written = tensor_bytes(inputs[0]), tensor_bytes(our_out)
        gb_s = (read + written) / us / 1e3
        pct = 100 * gb_s / copy_gb_s
        same_size = size_copy_us(timer, read + written)
        try:
            mix = mix_ceiling_us(timer, read, written)
        except Exception as exc:  # a Triton failure costs the column, not the row
            notes.append(f"mix n/a: {reason(exc)}")
    tk_us = tk_first_s = tk_same = None
    if PEER["on"] and us is not None and ours is not None:
        tk_us, tk_first_s, tk_same = _peer_columns(timer, ours, our_out, inputs, notes)
    eager_us = try_time(timer, eager, inputs, notes, "eager")
    compiled_us = try_time(timer, compiled(eager) if eager else None, inputs, notes, "compiled")
    return Row(op, shape, us, gb_s, pct, eager_us, compiled_us, "; ".join(notes), same_size, mix, tk_us,
               tk_first_s, tk_same)


def load_quant_reference() -> tuple[Op | None, str]:
    """per_token_cast_ref from tests/reference/quant.py, or None and why not."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from reference.quant import per_token_cast_ref
    except Exception as exc:  # the reference is optional here: the row says it is missing
        return None, f"eager/compiled n/a: tests/reference/quant.py not importable ({reason(exc)})"
    return per_token_cast_ref, ""


def torch_e4m3_cast(x: torch.Tensor, npc: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token e4m3 cast in plain torch: the eager / torch.compile baseline of per_token_cast."""
    groups = x.float().view(x.shape[0], x.shape[1] // npc, npc)
    amax = groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4)
    # full_like: a Python scalar divided by a tensor is a reciprocal times the scalar in torch
    q = (groups * (torch.full_like(amax, 448.0) / amax)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(x.shape), (amax / 448.0).squeeze(-1)


def quant_rows(timer: Timer, copy_gb_s: float, tk: Any) -> list[Row]:
    tokens, hidden = 8192, 7168
    reference, ref_note = load_quant_reference()
    quant = getattr(tk, "quant", None)
    no_op = "" if quant else "ours n/a: the wheel has no quant module"
    missing = "; ".join(n for n in (ref_note, no_op) if n)

    def make() -> Inputs:
        return (torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda"),)

    def bind(fn: Op | None, cast_fmt: str, npc: int, **kwargs: Any) -> Op | None:
        if fn is None:
            return None
        return lambda x: fn(x, cast_fmt, npc, **kwargs)

    rows = []
    for cast_fmt, npc in (("e4m3", 128), ("e4m3", 32), ("e2m1", 32)):
        ours = bind(quant.per_token_cast if quant else None, cast_fmt, npc, round_sf=False)
        # e4m3: the cast as a torch user writes it (the bit-exact reference's NaN-aware integer
        # amax is not something Inductor compiles); e2m1 needs the reference's integer encode.
        eager = (lambda x, n=npc: torch_e4m3_cast(x, n)) if cast_fmt == "e4m3" else bind(reference, cast_fmt, npc,
                                                                                           round_sf=False)
        rows.append(bench_case(timer, copy_gb_s, f"per_token_cast {cast_fmt} npc={npc}",
                               f"({tokens}, {hidden}) bf16", make, ours, eager, missing))
    return rows


def block_and_back_rows(timer: Timer, copy_gb_s: float, tk: Any) -> list[Row]:
    """per_block_cast and per_token_cast_back at T = 8192, H = 7168, against their torch references."""
    tokens, hidden = 8192, 7168
    quant = getattr(tk, "quant", None)
    sys.path.insert(0, str(REPO))
    try:
        from tests.reference.quant import per_token_cast_ref
        from tests.reference.quant_cast_back import per_token_cast_back_ref
        from tests.reference.quant_per_block import per_block_cast_ref
    except Exception as exc:  # the references are optional here: the rows say they are missing
        return [Row("per_block_cast / per_token_cast_back", "-", None, None, None, None, None,
                    f"n/a: references not importable ({reason(exc)})")]
    rows = []
    block_cast = getattr(quant, "per_block_cast", None)
    cast_back = getattr(quant, "per_token_cast_back", None)
    for cast_fmt, block in (("e4m3", (128, 128)), ("e2m1", (32, 32))):

        def make() -> Inputs:
            return (torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda"),)

        rows.append(bench_case(
            timer, copy_gb_s, f"per_block_cast {cast_fmt} {block[0]}x{block[1]}", f"({tokens}, {hidden}) bf16", make,
            (lambda x, f=cast_fmt, b=block: block_cast(x, f, b)) if block_cast else None,
            lambda x, f=cast_fmt, b=block: per_block_cast_ref(x, f, b),
            "" if block_cast else "ours n/a: the wheel has no quant.per_block_cast"))
    # fp32 out: twice the bytes written; the two paths that sweep 55 moved to bulk copies.
    for (cast_fmt, npc), (out_name, out_dtype) in itertools.product(
            (("e4m3", 128), ("e2m1", 32)), (("bf16", torch.bfloat16), ("fp32", torch.float32))):

        def make_pair(f: str = cast_fmt, n: int = npc) -> Inputs:
            x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
            return per_token_cast_ref(x, f, n, False)

        rows.append(bench_case(
            timer, copy_gb_s, f"per_token_cast_back {cast_fmt} npc={npc} -> {out_name}", f"({tokens}, {hidden})",
            make_pair,
            (lambda q, sf, n=npc, o=out_name: cast_back((q, sf), o, n)) if cast_back else None,
            lambda q, sf, n=npc, d=out_dtype: per_token_cast_back_ref(q, sf, d, n),
            "" if cast_back else "ours n/a: the wheel has no quant.per_token_cast_back"))
    return rows


def transpose_rows(timer: Timer, copy_gb_s: float, tk: Any) -> list[Row]:
    batch, m, n = 8, 512, 7168
    module = getattr(tk, "transpose", None)
    ours = module.batched_transpose if module is not None else None

    def eager(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).contiguous()

    rows = []
    for dtype, label in ((torch.bfloat16, "bf16"), (torch.float8_e4m3fn, "e4m3")):
        def make(dtype: torch.dtype = dtype) -> Inputs:
            return (torch.randn(batch, m, n, device="cuda").to(dtype),)

        rows.append(bench_case(timer, copy_gb_s, "batched_transpose", f"({batch}, {m}, {n}) {label}", make,
                               ours, eager, "" if module else "ours n/a: the wheel has no transpose module"))
    return rows


def case_sections() -> dict[str, Callable[[Timer, float, Any], list[Row]]]:
    """Module name -> section, one per ``benchmarks/cases/*.py``: each defines ``rows(timer, copy_gb_s, tk)``.

    Case modules import their helpers with ``from bench import ...``; registering this module
    under that name first makes them share its classes even when it runs as a script.
    """
    import importlib

    sys.modules.setdefault("bench", sys.modules[__name__])
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sections: dict[str, Callable[[Timer, float, Any], list[Row]]] = {}
    for path in sorted((Path(__file__).resolve().parent / "cases").glob("*.py")):
        if path.name.startswith("_"):
            continue

        def section(timer: Timer, copy_gb_s: float, tk: Any, path: Path = path) -> list[Row]:
            try:
                return list(importlib.import_module(f"cases.{path.stem}").rows(timer, copy_gb_s, tk))
            except Exception as exc:  # one broken case file is a row that says so, not a lost run
                return [Row(f"cases/{path.name}", "-", None, None, None, None, None, f"n/a: {reason(exc)}")]

        sections[path.stem] = section  # type: ignore[assignment]  # path is bound by its default
    return sections


COLD = """
import sys, time, torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()  # torch's own start and context, outside the figures
t0 = time.perf_counter()
import {package}
from {package}.modeling.mhc import mhc_pre
t1 = time.perf_counter()
{body}
torch.cuda.synchronize()
print(t1 - t0, time.perf_counter() - t1)
"""
COLD_BODIES = {
    "per_token_cast": ("the first per_token_cast e4m3/128 of (4096, 7168) bf16",
                       "x = torch.randn(4096, 7168, device='cuda').bfloat16()\n"
                       "{package}.quant.per_token_cast(x, 'e4m3', 128)"),
    "mhc_pre x50": ("mhc_pre (no grad, m 4, H 7168) at 50 token counts 1..4096",
                    "g = torch.Generator().manual_seed(0)\n"
                    "counts = sorted(set(torch.randint(1, 4097, (60,), generator=g).tolist()))[:50]\n"
                    "res = torch.randn(4096, 4, 7168, device='cuda').bfloat16()\n"
                    "fn, scale, base = torch.randn(24, 4 * 7168, device='cuda') * 1e-2, "
                    "torch.rand(3, device='cuda'), torch.randn(24, device='cuda')\n"
                    "with torch.no_grad():\n"
                    "    for t in counts:\n"
                    "        mhc_pre(res[:t], fn, scale, base)"),
}


def _fresh_processes(code: str, count: int, env: dict[str, str], timeout: float) -> tuple[list[list[float]], str]:
    """(import s, calls s) of ``count`` fresh processes running ``code``; stops at the first failure (its reason)."""
    import os
    import subprocess

    samples: list[list[float]] = []
    for _ in range(count):
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                                  env={**os.environ, **env})
        except subprocess.TimeoutExpired:
            return samples, f"over {timeout:.0f} s"
        if proc.returncode:
            last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
            return samples, last[:160]
        samples.append([float(v) for v in proc.stdout.split()[-2:]])
    return samples, ""


def cold_start(peer: bool, runs: int = 3, timeout: float = 240.0) -> list[dict[str, Any]]:
    """Import + first calls in fresh processes (median of ``runs``): the wheel, and with ``peer`` TileKernels with
    an empty TileLang cache (one process, which pays every JIT compile) and with the cache it left (warm)."""
    import tempfile

    out = []
    for body_name, (what, body) in COLD_BODIES.items():
        cache = {"TILELANG_CACHE_DIR": tempfile.mkdtemp(prefix="tilelang-cache.")}  # empty, per body
        kinds = [("tile_kernels_aot", "tile_kernels_aot", runs, {})]
        if peer:
            kinds += [("TileKernels, empty JIT cache", "tile_kernels", 1, cache),
                      ("TileKernels, warm JIT cache", "tile_kernels", runs, cache)]
        for label, package, count, env in kinds:
            code = COLD.format(package=package, body=body.format(package=package))
            samples, error = _fresh_processes(code, count, env, timeout)
            out.append({"name": f"{label}: {body_name}", "runs": len(samples), "what": what + (f"; {error}" if error
                        else ""), "import_s": statistics.median(s[0] for s in samples) if samples else None,
                        "calls_s": statistics.median(s[1] for s in samples) if samples else None})
    return out


def fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def markdown(meta: dict[str, Any], rows: Sequence[Row]) -> str:
    lines = [
        f"# tile_kernels_aot benchmarks, {meta['date']}",
        "",
        f"GPU: {meta['gpu']}; torch {meta['torch']}; tile_kernels_aot {meta['package']} "
        f"(commit {meta['commit']}); copy bandwidth {meta['copy_gb_s']:.0f} GB/s "
        f"(read + written); median of {meta['reps']} calls.",
        "",
        "\"% copy\" is against that 1 GiB copy; \"% size copy\" against a copy of the op's own bytes, timed the "
        "same way (the copy's own speed at that size); \"% mix\" against a kernel streaming exactly the op's bytes "
        "read and written (benchmarks/mix_ceiling.py: the ceiling of the op's size and read:write mix).",
        "",
        "\"TileKernels µs\" is TileKernels' JIT kernel on the same inputs through the same call (peer.py), \"first s\" "
        "its first call (the JIT compile, or a load from TileLang's cache), \"= bits\" whether its outputs equal "
        "ours bit for bit (\"-\": not compared, the op writes in place).",
        "",
        "| op | shape | µs | GB/s | % copy | % size copy | % mix | eager µs | compiled µs | vs eager | vs compiled "
        "| TileKernels µs | vs TileKernels | first s | = bits | note |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :-: | --- |",
    ]
    for r in rows:
        same = "-" if r.tk_same is None else "yes" if r.tk_same else "**no**"
        lines.append(
            f"| {r.op} | {r.shape} | {fmt(r.us)} | {fmt(r.gb_s, 0)} | {fmt(r.pct_copy, 0, '%')} "
            f"| {fmt(r.pct_size_copy, 0, '%')} | {fmt(r.pct_mix, 0, '%')} "
            f"| {fmt(r.eager_us)} | {fmt(r.compiled_us)} | {fmt(r.vs_eager, 2, 'x')} "
            f"| {fmt(r.vs_compiled, 2, 'x')} | {fmt(r.tk_us)} | {fmt(r.vs_tk, 2, 'x')} | {fmt(r.tk_first_s, 1)} "
            f"| {same if r.tk_us is not None or r.tk_same is not None else 'n/a'} | {r.note} |"
        )
    if meta.get("tilekernels"):
        lines += ["", f"TileKernels: {meta['tilekernels']}"]
    if meta.get("parts"):
        lines += ["", "Measured in parts (one GPU call each, same commit and GPU kind): " + "; ".join(
            f"{part['date']}: {', '.join(part['sections'])}" for part in meta["parts"])]
    if meta.get("cold_start"):
        lines += ["", "## Cold start (fresh processes, median)", "",
                  "| process | runs | import s | first calls s | what |", "| --- | ---: | ---: | ---: | --- |"]
        lines += [f"| {c['name']} | {c['runs']} | {fmt(c['import_s'], 2)} | {fmt(c['calls_s'], 2)} | {c['what']} |"
                  for c in meta["cold_start"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json and results.md")
    parser.add_argument("--commit", default="unknown", help="package commit to record in the header")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--only", default="", help="comma-separated sections to run (quant, block_and_back, "
                        "transpose, or a benchmarks/cases module name); default: all")
    parser.add_argument("--tilekernels", action="store_true", help="also time TileKernels' JIT kernels through the "
                        "same calls (needs tile_kernels and tilelang importable; see peer.py)")
    parser.add_argument("--cold-start", action="store_true", help="add the cold-start section (fresh processes)")
    parser.add_argument("--baseline", type=Path, help="a results.json to compare with: exit 3, naming the ops, when "
                        "an op is more than 5%% slower than there in two consecutive measurements")
    parser.add_argument("--deadline", type=float, help="seconds after which no further section starts; the sections "
                        "left are named on stderr (run them with --only ... --into results.json)")
    parser.add_argument("--into", type=Path, help="a results.json of an earlier part of this run (same GPU kind and "
                        "commit): its rows of the sections not run now are kept, so that a run too long for one "
                        "call is made in several (each call with --only)")
    return parser.parse_args(argv)


THRESHOLD = 0.05  # slower than the baseline by more than this, twice in a row: a regression


def regressions(rows: Sequence[Row], baseline: dict[str, Any], threshold: float = THRESHOLD,
                within: set[tuple[str, str]] | None = None) -> dict[tuple[str, str], str]:
    """(op, shape) -> "op (shape): now vs then" for each row more than ``threshold`` slower than the baseline's row
    of the same op and shape (rows the baseline lacks, or without a time on either side, are not compared);
    ``within``: only those rows."""
    then = {(r["op"], r["shape"]): r["us"] for r in baseline.get("rows", []) if r.get("us")}
    return {(r.op, r.shape): f"{r.op} ({r.shape}): {r.us:.1f} µs vs {then[(r.op, r.shape)]:.1f} µs" for r in rows
            if r.us and (r.op, r.shape) in then and r.us > (1 + threshold) * then[(r.op, r.shape)]
            and (within is None or (r.op, r.shape) in within)}


def earlier_part(earlier: dict[str, Any], meta: dict[str, Any], wanted: Sequence[str],
                 known: Sequence[str]) -> tuple[list[Row], dict[str, Any]]:
    """The rows of ``earlier`` (a results.json) from sections other than ``wanted``, and ``meta`` with the parts'
    dates; refuses a file of another GPU kind or commit, or one whose rows do not name their section."""
    then = earlier["meta"]
    for key in ("gpu", "commit"):
        if then.get(key) != meta[key]:
            raise SystemExit(f"--into: its {key} is {then.get(key)!r}, this run's {meta[key]!r}; the parts of one "
                             "run measure one commit on one GPU kind")
    fields = {f.name for f in dataclasses.fields(Row)}
    kept = []
    for row in earlier["rows"]:
        if row.get("section") not in known:
            raise SystemExit(f"--into: row {row.get('op')} ({row.get('shape')}) names no section of this bench.py; "
                             "write the earlier part with this version")
        if row["section"] not in wanted:
            kept.append(Row(**{k: v for k, v in row.items() if k in fields}))
    parts = then.get("parts") or [{"date": then["date"], "sections": sorted({r.section for r in kept})}]
    merged = {**then, **meta, "parts": [*parts, {"date": meta["date"], "sections": list(wanted)}]}
    if "cold_start" in then:
        merged["cold_start"] = then["cold_start"]
    if "tilekernels" in then and "tilekernels" not in meta:
        merged["tilekernels"] = then["tilekernels"]
    return kept, merged


def _driver() -> str:
    import subprocess

    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.py needs a CUDA GPU", file=sys.stderr)
        return 1
    import tile_kernels_aot as tk

    settings = Settings(reps=20, warmup=3) if args.quick else Settings(reps=200, warmup=10)
    timer = Timer(settings)
    copy_gb_s = copy_bandwidth(timer)
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(),
        "driver": _driver(),
        "torch": torch.__version__,
        "package": getattr(tk, "__version__", "unknown"),
        "commit": args.commit,
        "copy_gb_s": copy_gb_s,
        "reps": settings.reps,
    }
    cases_tk: Any = tk
    if args.tilekernels:
        start = time.perf_counter()
        try:
            import tile_kernels
            import tilelang
        except Exception as exc:  # the table says why its TileKernels columns are empty
            meta["tilekernels"] = f"not importable ({reason(exc)})"
        else:
            from peer import mirror

            meta["tilekernels"] = (f"{getattr(tile_kernels, '__version__', '?')} JIT through TileLang "
                                   f"{tilelang.__version__}, imported in {time.perf_counter() - start:.1f} s")
            cases_tk, PEER["on"] = mirror(tk, tile_kernels), True
    args.out.mkdir(parents=True, exist_ok=True)
    # Results are rewritten after every section, so a run cut short keeps what it measured.
    sections = {"quant": quant_rows, "block_and_back": block_and_back_rows, "transpose": transpose_rows,
                **case_sections()}
    wanted = [name for name in args.only.split(",") if name] or list(sections)
    unknown = [name for name in wanted if name not in sections]
    if unknown:
        print(f"--only: unknown sections {', '.join(unknown)}; choose from {', '.join(sections)}", file=sys.stderr)
        return 2
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    rows: list[Row] = []
    slow: list[str] = []
    kept: list[Row] = []
    if args.into:
        kept, meta = earlier_part(json.loads(args.into.read_text()), meta, wanted, list(sections))

    def write() -> str:
        derived = ("pct_size_copy", "pct_mix", "vs_eager", "vs_compiled", "vs_tk")
        order = list(sections)
        every = sorted(kept + rows, key=lambda r: order.index(r.section) if r.section in order else len(order))
        results = {"meta": meta, "rows": [asdict(r) | {k: getattr(r, k) for k in derived} for r in every]}
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        table = markdown(meta, every)
        (args.out / "results.md").write_text(table)
        return table

    started, cut = time.perf_counter(), False
    for index, name in enumerate(wanted):
        if args.deadline is not None and time.perf_counter() - started > args.deadline:
            left, cut = ",".join(wanted[index:]), True
            print(f"--deadline: {args.deadline:.0f} s passed; sections not run: {left} (run them with --only {left} "
                  f"--into {args.out / 'results.json'})", file=sys.stderr)
            break
        section_start = time.perf_counter()
        section_rows = [replace(r, section=name) for r in sections[name](timer, copy_gb_s, cases_tk)]
        print(f"section {name}: {len(section_rows)} rows in {time.perf_counter() - section_start:.0f} s",
              file=sys.stderr)
        first = regressions(section_rows, baseline) if baseline is not None else {}
        if first and baseline is not None:
            # Measured again before it counts: a regression is slower twice in a row, not one noisy run.
            slow += regressions(sections[name](timer, copy_gb_s, cases_tk), baseline, within=set(first)).values()
        rows += section_rows
        table = write()
    if args.cold_start and cut:
        print("--deadline: the cold-start section did not run either", file=sys.stderr)
    elif args.cold_start:
        meta["cold_start"] = cold_start(peer=PEER["on"])
        table = write()
    try:
        from plot import plot  # benchmarks/plot.py, next to this script

        plot(args.out / "results.json", args.out / "pct_copy.png")
    except ImportError as exc:  # matplotlib is optional: the numbers are in results.json
        print(f"no plot: {exc}", file=sys.stderr)
    print(table)
    if slow:
        print(f"slower than {args.baseline} by more than {THRESHOLD:.0%} twice in a row:\n  " + "\n  ".join(slow),
              file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
