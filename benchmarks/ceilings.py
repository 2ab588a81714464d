"""Memory ceilings of the card besides the copy: write-only, read-only, and a row gather that writes 8x what it reads.

bench.py reports each kernel against a device-to-device copy (half read, half written). Kernels whose
traffic is lopsided have other ceilings: expand_to_fused writes 8 bytes per byte it reads,
reduce_fused reads 8 per byte it writes. This measures, with bench.py's timer and in one run:

- copy: y.copy_(x), 1 GiB each way (bench.py's ceiling);
- write-only: y.fill_(1), 1 GiB written, of float32 and of uint8 elements. The uint8 fill runs at 79% of
  the copy, the float32 one above it (store_ceilings.py: a kernel storing 16 bytes per thread in
  2 KiB blocks is at 79%, one storing 64 bytes per thread at 108%): 79% is that kernel's, not the card's;
- read-only: x.amax() over 1 GiB of float32 (one 4-byte result);
- gather 1:8: torch.index_select of 16384 bf16 rows of 7168 into 131072 rows (a random permutation of
  each row repeated 8 times): the byte mix of expand_to_fused at T = 16384, K = 8, H = 7168.

GB/s counts bytes read + written, as bench.py does. Needs only torch and a CUDA GPU:

    python benchmarks/ceilings.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import COPY_BYTES, Settings, Timer, copy_bandwidth

TOKENS, TOPK, HIDDEN = 16384, 8, 7168


def measure(timer: Timer) -> dict[str, tuple[float, float]]:
    """name -> (median µs, GB/s)."""
    copy = copy_bandwidth(timer)
    results = {"copy": (2 * COPY_BYTES / copy / 1e3, copy)}
    buffers = [torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda") for _ in range(2)]
    for dtype in (torch.float32, torch.uint8):
        views = [(b.view(dtype),) for b in buffers]
        us = timer.median_us(lambda y: y.fill_(1), views)
        results[f"write-only (fill_, {str(dtype).removeprefix('torch.')})"] = (us, COPY_BYTES / us / 1e3)
    floats = [torch.rand(COPY_BYTES // 4, device="cuda") for _ in range(2)]
    del buffers
    us = timer.median_us(lambda x: x.amax(), [(f,) for f in floats])
    results["read-only (amax, float32)"] = (us, COPY_BYTES / us / 1e3)
    del floats
    index = torch.randperm(TOKENS, device="cuda").repeat_interleave(TOPK)
    rows = [(torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16), index) for _ in range(3)]
    us = timer.median_us(lambda x, i: torch.index_select(x, 0, i), rows)
    nbytes = rows[0][0].nbytes * (1 + TOPK) + index.nbytes
    results[f"gather 1:{TOPK} (index_select, T={TOKENS} K={TOPK} H={HIDDEN} bf16)"] = (us, nbytes / us / 1e3)
    return results


def publish(out: Path | None, stem: str, data: object, title: str, first_column: str,
            rows: Sequence[tuple[str, float, float]], copy: float) -> None:
    """Print the markdown table of (name, µs, GB/s) rows against ``copy`` GB/s; with ``out``, also write
    it and ``data`` (as JSON) to out/stem.md and out/stem.json. store_ceilings.py reports through it too."""
    lines = [title, "", f"| {first_column} | µs | GB/s | % of copy |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {name} | {us:.1f} | {gb:.0f} | {100 * gb / copy:.0f}% |" for name, us, gb in rows]
    table = "\n".join(lines) + "\n"
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
        (out / f"{stem}.md").write_text(table)
    print(table)


def output_folder(doc: str, stem: str) -> Path | None:
    """The --out folder of a ceilings script (None: print only); exits with status 1 where there is no CUDA GPU."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, help=f"also write {stem}.json and {stem}.md here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(f"{stem}.py needs a CUDA GPU")
    out: Path | None = args.out
    return out


def main() -> int:
    out = output_folder(__doc__, "ceilings")
    results = measure(Timer(Settings(reps=100, warmup=5)))
    publish(out, "ceilings", results, f"{torch.cuda.get_device_name()}, torch {torch.__version__}", "ceiling",
            [(name, us, gb) for name, (us, gb) in results.items()], results["copy"][1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
