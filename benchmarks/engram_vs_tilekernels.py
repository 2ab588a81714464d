"""The Engram kernels against TileKernels' own JIT kernels, same inputs, same run.

Needs the wheel (``tile_kernels_aot``) and, on sys.path, TileKernels 1.0.0 with TileLang 0.1.15
(which JIT-compiles with the machine's nvcc on first call; see the README's side-by-side notes):

    PYTHONPATH=$site:$tk python benchmarks/engram_vs_tilekernels.py --out DIR

Each op is timed with bench.py's Timer (median GPU time, inputs rotating past the L2 cache); bytes
are every input and output once. T = 8192, hc_mult 4, H = 7168 (the Engram issue's target shape);
the hash at its test shape (n 3, 2 layers, 8 tables).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Settings, Timer, copy_bandwidth, rotating_inputs, tensor_bytes

T, HC, H, EPS, CLAMP = 8192, 4, 7168, 1e-20, 1e-6


def cases(ours, theirs):  # type: ignore[no-untyped-def]
    """(name, make, our call, their call) per op."""

    def gate_inputs() -> tuple[torch.Tensor, ...]:
        x, k = (torch.randn(T, HC, H, device="cuda").bfloat16() for _ in range(2))
        return x, k, torch.randn(T, H, device="cuda").bfloat16(), torch.randn(HC, H, device="cuda")

    def bwd_inputs() -> tuple[torch.Tensor, ...]:
        x, k, v, w = gate_inputs()
        _, dot, gate, rx, rk = ours.engram_gate_fwd(x, k, v, w, EPS, CLAMP)
        return torch.randn(T, HC, H, device="cuda").bfloat16(), x, k, v, w, dot, gate, rx, rk

    def hash_inputs() -> tuple[torch.Tensor, ...]:
        ids = torch.randint(0, 100000, (T, 3), dtype=torch.int32, device="cuda")
        mult = torch.randint(0, 100000, (2, 3), dtype=torch.int64, device="cuda")
        sizes = torch.randint(100000, 1000000, (2, 2, 8), dtype=torch.int32, device="cuda")
        flat = sizes.view(2, -1)
        offsets = torch.cat([torch.zeros(2, 1, dtype=torch.int32, device="cuda"),
                             flat[:, :-1].cumsum(1, dtype=torch.int32)], 1)
        return ids, mult, sizes, offsets

    def weight_inputs() -> tuple[torch.Tensor, ...]:
        return tuple(torch.randn(HC, H, device="cuda").bfloat16() for _ in range(2))

    def reduce_inputs() -> tuple[torch.Tensor, ...]:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        return (torch.randn(sms, HC, H, device="cuda"), *weight_inputs(), torch.zeros(HC, H, device="cuda"),
                torch.zeros(HC, H, device="cuda"))

    return [
        ("engram_gate_fwd save", gate_inputs, lambda *a: ours.engram_gate_fwd(*a, EPS, CLAMP),
         lambda *a: theirs.engram_gate_fwd(*a, EPS, CLAMP, save_for_backward=True)),
        ("engram_gate_fwd inference", gate_inputs,
         lambda *a: ours.engram_gate_fwd(*a, EPS, CLAMP, save_for_backward=False)[0],
         lambda *a: theirs.engram_gate_fwd(*a, EPS, CLAMP, save_for_backward=False)[0]),
        ("engram_gate_bwd", bwd_inputs, lambda *a: ours.engram_gate_bwd(*a, CLAMP),
         lambda *a: theirs.engram_gate_bwd(*a, CLAMP)),
        ("engram_hash", hash_inputs, ours.engram_hash, theirs.engram_hash),
        ("fused_weight", weight_inputs, ours.fused_weight, theirs.fused_weight),
        ("grad_w_reduce", reduce_inputs, ours.grad_w_reduce, theirs.grad_w_reduce),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import tile_kernels_aot.engram as ours

    start = time.perf_counter()
    import tile_kernels.engram as theirs

    import_s = time.perf_counter() - start
    timer = Timer(Settings(reps=100, warmup=5))
    copy = copy_bandwidth(timer)
    rows = []
    for name, make, mine, tk in cases(ours, theirs):
        inputs = rotating_inputs(make)
        row: dict[str, object] = {"op": name}
        written = tensor_bytes(mine(*inputs[0]))
        # The in-place reduce writes its two gradients: count them as written, not only read.
        nbytes = tensor_bytes(inputs[0]) + (written or 2 * inputs[0][-1].nbytes)
        row["ours_us"] = timer.median_us(mine, inputs)
        try:
            t0 = time.perf_counter()
            tk(*inputs[0])
            torch.cuda.synchronize()
            row["tk_first_call_s"] = time.perf_counter() - t0  # the JIT compile (or its disk cache)
            row["tk_us"] = timer.median_us(tk, inputs)
        except Exception as exc:  # a kernel TileKernels cannot build here is a note, not a lost run
            row["tk_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        row["ours_gb_s"] = nbytes / row["ours_us"] / 1e3  # type: ignore[operator]
        print(row, flush=True)
        rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "copy_gb_s": copy, "tk_import_s": import_s, "T": T, "hc": HC, "H": H}
    (args.out / "engram_vs_tilekernels.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [f"{meta['gpu']}; copy {copy:.0f} GB/s; TileKernels import {import_s:.1f} s; T {T}, hc {HC}, H {H}", "",
             "| op | ours µs | ours GB/s | TileKernels µs | speedup | TileKernels first call s |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        tk_us = r.get("tk_us")
        speed = f"{tk_us / r['ours_us']:.2f}x" if tk_us else r.get("tk_error", "n/a")  # type: ignore[operator]
        first = f"{r['tk_first_call_s']:.1f}" if "tk_first_call_s" in r else "-"
        lines.append(f"| {r['op']} | {r['ours_us']:.1f} | {r['ours_gb_s']:.0f} | "
                     f"{tk_us:.1f} | {speed} | {first} |" if tk_us else
                     f"| {r['op']} | {r['ours_us']:.1f} | {r['ours_gb_s']:.0f} | - | {speed} | {first} |")
    (args.out / "engram_vs_tilekernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
