"""The ceiling of an op's own byte mix: a streaming Triton kernel that reads and writes the op's byte counts.

bench.py's "% mix" column. "% size copy" compares an op with a copy of its bytes, half read and half
written; but the card's rate depends on the mix (store_ceilings.py at 1 GiB: a 2:1 read:write stream
at 100% of copy, 1:2 at 90-91%, 1:8 at 89-90%), and a cast back writes three bytes per byte read
where a cast reads two per byte written. This kernel moves exactly an op's bytes read and written, in
blocks as the ops' kernels do (each program loads its share of the input, then stores its share of
the output: no arithmetic worth the name), so "% mix" says how far an op is from streaming its own
reads and writes at its own size; 100% or more means the op is at that ceiling.

Program p of P sums, lane by lane, the int32 words [p * reads_per_program, (p + 1) * reads_per_program)
of x in steps of BLOCK, then writes words [p * writes_per_program, ...) of y as that sum plus the step's
offset. P is chosen so that a program moves about PROGRAM_BYTES; shares are whole 256-byte runs, and
masks stop at the ends of x and y. ``check`` recomputes y in torch, so a mask that skipped loads or
stores (and made the ceiling look fast) fails the run.

Needs Triton, which ships with torch's CUDA wheels; bench.py leaves the column n/a without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

try:  # Triton ships with torch's CUDA wheels; shares() and check() need only torch (the CPU tests use them)
    import triton
    import triton.language as tl
except ImportError:
    triton = None

BLOCK = 1024  # int32 words per step: 4 warps, 32 bytes per thread per load or store
PROGRAM_BYTES = 24 << 10  # bytes read + written per program: an op's block moves 8-32 KiB
RUN = 64  # words: each program's shares start on 256-byte boundaries (16-byte vectors throughout)


if triton is not None:

    @triton.jit
    def mix_kernel(x, y, reads, writes, reads_per_program, writes_per_program, BLOCK: tl.constexpr):
        p = tl.program_id(0).to(tl.int64)
        lanes = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for i in range(0, reads_per_program, BLOCK):
            offs = p * reads_per_program + i + lanes
            acc += tl.load(x + offs, mask=(i + lanes < reads_per_program) & (offs < reads), other=0)
        for j in range(0, writes_per_program, BLOCK):
            offs = p * writes_per_program + j + lanes
            tl.store(y + offs, acc + j, mask=(j + lanes < writes_per_program) & (offs < writes))


def _words(nbytes: int) -> int:
    return max(RUN, math.ceil(nbytes / 4 / RUN) * RUN)


def shares(read_bytes: int, written_bytes: int, program_bytes: int = PROGRAM_BYTES) -> tuple[int, int, int, int, int]:
    """(reads, writes, programs, reads_per_program, writes_per_program), all in int32 words."""
    reads, writes = _words(read_bytes), _words(written_bytes)
    programs = max(1, round(4 * (reads + writes) / program_bytes))
    per_read = math.ceil(reads / programs / RUN) * RUN
    per_write = math.ceil(writes / programs / RUN) * RUN
    return reads, writes, programs, per_read, per_write


def mix_case(read_bytes: int, written_bytes: int) -> tuple[Callable[[], tuple[torch.Tensor, torch.Tensor]],
                                                             Callable[[torch.Tensor, torch.Tensor], None]]:
    """(make, run): make() gives a fresh (x, y) pair, run(x, y) streams x's bytes in and y's out."""
    reads, writes, programs, per_read, per_write = shares(read_bytes, written_bytes)

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        # Values below 2^20: a program's sums stay far from int32 overflow, and every written word is >= 0.
        return (torch.randint(0, 1 << 20, (reads,), dtype=torch.int32, device="cuda"),
                torch.empty(writes, dtype=torch.int32, device="cuda"))

    def run(x: torch.Tensor, y: torch.Tensor) -> None:
        mix_kernel[(programs,)](x, y, reads, writes, per_read, per_write, BLOCK=BLOCK, num_warps=4)

    return make, run


def check(read_bytes: int, written_bytes: int, x: torch.Tensor, y: torch.Tensor,
          program_bytes: int = PROGRAM_BYTES) -> None:
    """Raise AssertionError unless y is what mix_kernel computes from x (every load and store made)."""
    reads, writes, programs, per_read, per_write = shares(read_bytes, written_bytes, program_bytes)
    steps_read, steps_write = math.ceil(per_read / BLOCK), math.ceil(per_write / BLOCK)
    shared = torch.zeros(programs * per_read, dtype=torch.int64, device=x.device)
    shared[:reads] = x
    padded = torch.zeros(programs, steps_read * BLOCK, dtype=torch.int64, device=x.device)
    padded[:, :per_read] = shared.view(programs, per_read)
    acc = padded.view(programs, steps_read, BLOCK).sum(1)
    offsets = torch.arange(steps_write, device=x.device)[:, None] * BLOCK
    expected = (acc[:, None, :] + offsets).view(programs, steps_write * BLOCK)[:, :per_write].reshape(-1)
    assert torch.equal(y.long(), expected[:writes]), "mix_kernel skipped loads or stores"


__all__ = ["check", "mix_case", "shares"]
