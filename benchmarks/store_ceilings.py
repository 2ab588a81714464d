"""Write and mixed read/write ceilings of the card, with Triton kernels whose stores carry each cache hint.

ceilings.py measured torch's fill_ at 79% of the copy: the write-heavy kernels (expand_to_fused, the
lossless re-cast, the cast backs, the SwiGLU backward) are held near that. This asks whether the 79% is
the card's or torch's fill kernel's, and where each read:write mix tops out:

- fill: one value into 1 GiB, per store hint (none, .cs streaming, .wt write-through, .cg, and
  evict_first), at 16 and 64 bytes per thread;
- copy 1:1 with the same hints (its ceiling moves with them too);
- mixes r:w: r input streams summed into w output streams (2:1 is a cast's mix, 1:2 a cast back's,
  1:8 expand_to_fused's), 1 GiB read plus written in all.

GB/s counts bytes read + written; % is against torch's y.copy_(x) of bench.py in the same run.
Needs torch and Triton (it ships with torch's CUDA wheels), no wheel of ours:

    python benchmarks/store_ceilings.py [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mix_ceiling
from bench import COPY_BYTES, Settings, Timer, copy_bandwidth
from ceilings import output_folder, publish

WORDS = COPY_BYTES // 4  # int32 elements of 1 GiB
MIX_BLOCK = 2048  # int32 per program of mix_kernel: 64 bytes of each stream per thread
# (cache modifier, eviction policy); ptxas refuses .cs together with evict_first.
HINTS = [("", ""), (".cs", ""), (".wt", ""), (".cg", ""), ("", "evict_first")]


@triton.jit
def fill_kernel(y, BLOCK: tl.constexpr, CACHE: tl.constexpr, EVICT: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.full([BLOCK], 1, tl.int32), cache_modifier=CACHE, eviction_policy=EVICT)


@triton.jit
def mix_kernel(x, y, n, READS: tl.constexpr, WRITES: tl.constexpr, BLOCK: tl.constexpr, CACHE: tl.constexpr,
               EVICT: tl.constexpr):
    """Sum of READS streams of n int32 (x is (READS, n)) into each of WRITES streams (y is (WRITES, n))."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.load(x + offs)
    for r in tl.static_range(1, READS):
        acc += tl.load(x + r * n + offs)
    for w in tl.static_range(WRITES):
        tl.store(y + w * n + offs, acc + w, cache_modifier=CACHE, eviction_policy=EVICT)


def hint_name(cache: str, evict: str) -> str:
    return "+".join(part for part in (cache, evict) if part) or "none"


def measure(timer: Timer) -> list[tuple[str, float, float]]:
    """(name, median µs, GB/s) per kernel; the first row is torch's copy."""
    copy = copy_bandwidth(timer)
    rows = [("torch copy_ 1:1", 2 * COPY_BYTES / copy / 1e3, copy)]
    buffers = [torch.empty(WORDS, dtype=torch.int32, device="cuda") for _ in range(2)]
    us = timer.median_us(lambda y: y.fill_(1), [(b,) for b in buffers])
    rows.append(("torch fill_", us, COPY_BYTES / us / 1e3))
    for block, warps in ((512, 4), (2048, 4)):
        per_thread = block * 4 // (warps * 32)
        for cache, evict in HINTS:
            def fill(y: torch.Tensor, block: int = block, warps: int = warps, cache: str = cache,
                     evict: str = evict) -> None:
                fill_kernel[(WORDS // block,)](y, BLOCK=block, CACHE=cache, EVICT=evict, num_warps=warps)
            us = timer.median_us(fill, [(b,) for b in buffers])
            rows.append((f"fill {per_thread} B/thread {hint_name(cache, evict)}", us, COPY_BYTES / us / 1e3))
    del buffers
    for reads, writes, hints in ((1, 1, HINTS), (2, 1, HINTS[:3]), (1, 2, HINTS), (1, 8, HINTS)):
        n = WORDS // (reads + writes) // MIX_BLOCK * MIX_BLOCK  # about 1 GiB moved per call
        sets = [(torch.randint(0, 1 << 20, (reads, n), dtype=torch.int32, device="cuda"),
                 torch.empty(writes, n, dtype=torch.int32, device="cuda")) for _ in range(2)]
        for cache, evict in hints:
            def mix(x: torch.Tensor, y: torch.Tensor, reads: int = reads, writes: int = writes, n: int = n,
                    cache: str = cache, evict: str = evict) -> None:
                mix_kernel[(n // MIX_BLOCK,)](x, y, n, READS=reads, WRITES=writes, BLOCK=MIX_BLOCK, CACHE=cache,
                                              EVICT=evict, num_warps=4)
            x, y = sets[0]
            mix(x, y)
            torch.cuda.synchronize()
            expected = x.sum(0, dtype=torch.int32)
            for w in range(writes):
                assert torch.equal(y[w], expected + w), (reads, writes, cache, evict)
            us = timer.median_us(mix, sets)
            rows.append((f"mix {reads}:{writes} {hint_name(cache, evict)}", us, 4 * n * (reads + writes) / us / 1e3))
        del sets
    # bench.py's "% mix" kernel (mix_ceiling.py: uneven shares, masked ends) at the same mixes and 1 GiB: it
    # should meet the mix kernel above, or bench.py's ceiling column would flatter the ops.
    for reads, writes in ((1, 1), (2, 1), (1, 2), (1, 8)):
        read_bytes = COPY_BYTES * reads // (reads + writes)
        for launch, us in mix_ceiling.timed_forms(read_bytes, COPY_BYTES - read_bytes,
                                                  lambda make: [make() for _ in range(2)], timer.median_us):
            per_program = 4 * (launch.reads_per_program + launch.writes_per_program) >> 10
            rows.append((f"mix_ceiling.py {reads}:{writes}, block {launch.block}, {per_program} KiB per program", us,
                         COPY_BYTES / us / 1e3))
    return rows


def main() -> int:
    out = output_folder(__doc__, "store_ceilings")
    rows = measure(Timer(Settings(reps=50, warmup=5)))
    title = f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}"
    publish(out, "store_ceilings", rows, title, "kernel", rows, rows[0][2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
