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
offset. P is chosen so that a program moves about program_bytes (FORMS lists the (BLOCK, program_bytes)
pairs measured; the fastest is the ceiling); shares are whole 256-byte runs, and
masks stop at the ends of x and y, with one bound per phase so that Triton keeps 16-byte vectors (a
mask of the step's lanes against the share's length made every store 4 bytes, and a 1:2 mix ran at
68% of copy where store_ceilings.py's kernel runs at 90%). ``check`` recomputes y in torch, so a
mask that skipped loads or stores (and made the ceiling look fast) fails the run.

Needs Triton, which ships with torch's CUDA wheels; bench.py leaves the column n/a without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

try:  # Triton ships with torch's CUDA wheels; mix() and check() need only torch (the CPU tests use them)
    import triton
    import triton.language as tl
except ImportError:
    triton = None

BLOCK = 2048  # int32 words per step: 4 warps, 64 bytes per thread per load or store (as store_ceilings' mixes)
PROGRAM_BYTES = 24 << 10  # bytes read + written per program: an op's block moves 8-32 KiB
RUN = 64  # words: each program's shares start on 256-byte boundaries (16-byte vectors throughout)
# (block, program_bytes) forms that bench.py times for each op, keeping the fastest as the ceiling: which form
# streams a mix best depends on the mix (store_ceilings.py reports each at 1 GiB).
FORMS = ((BLOCK, PROGRAM_BYTES), (2048, 96 << 10), (4096, 64 << 10))


if triton is not None:

    @triton.jit
    def mix_kernel(x, y, reads, writes, reads_per_program, writes_per_program, BLOCK: tl.constexpr):
        p = tl.program_id(0).to(tl.int64)
        lanes = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        # One bound per phase (the end of the program's share, or of x / y): masks of 16-word runs that Triton
        # can prove uniform, so loads and stores stay 16-byte vectors.
        start = p * reads_per_program
        end = tl.minimum(start + reads_per_program, reads)
        for i in range(0, reads_per_program, BLOCK):
            offs = start + i + lanes
            acc += tl.load(x + offs, mask=offs < end, other=0)
        start = p * writes_per_program
        end = tl.minimum(start + writes_per_program, writes)
        for j in range(0, writes_per_program, BLOCK):
            offs = start + j + lanes
            tl.store(y + offs, acc + j, mask=offs < end)


@dataclass(frozen=True)
class Mix:
    """One mix's launch, in int32 words: the buffers, the programs and each program's shares."""

    reads: int
    writes: int
    programs: int
    reads_per_program: int
    writes_per_program: int
    block: int


def _words(nbytes: int) -> int:
    return max(RUN, math.ceil(nbytes / 4 / RUN) * RUN)


def mix(read_bytes: int, written_bytes: int, block: int = BLOCK, program_bytes: int = PROGRAM_BYTES) -> Mix:
    """The launch that reads read_bytes and writes written_bytes (each rounded up to 256 bytes)."""
    reads, writes = _words(read_bytes), _words(written_bytes)
    programs = max(1, round(4 * (reads + writes) / program_bytes))
    return Mix(reads=reads, writes=writes, programs=programs,
               reads_per_program=math.ceil(reads / programs / RUN) * RUN,
               writes_per_program=math.ceil(writes / programs / RUN) * RUN, block=block)


Pair = tuple[torch.Tensor, torch.Tensor]


def mix_case(m: Mix) -> tuple[Callable[[], Pair], Callable[[torch.Tensor, torch.Tensor], None]]:
    """(make, run): make() gives a fresh (x, y) pair, run(x, y) streams x's bytes in and y's out."""

    def make() -> Pair:
        # Values below 2^20: a program's sums stay far from int32 overflow, and every written word is >= 0.
        return (torch.randint(0, 1 << 20, (m.reads,), dtype=torch.int32, device="cuda"),
                torch.empty(m.writes, dtype=torch.int32, device="cuda"))

    def run(x: torch.Tensor, y: torch.Tensor) -> None:
        mix_kernel[(m.programs,)](x, y, m.reads, m.writes, m.reads_per_program, m.writes_per_program, BLOCK=m.block,
                                  num_warps=4)

    return make, run


def check(m: Mix, x: torch.Tensor, y: torch.Tensor) -> None:
    """Raise AssertionError unless y is what mix_kernel computes from x (every load and store made)."""
    steps_read, steps_write = math.ceil(m.reads_per_program / m.block), math.ceil(m.writes_per_program / m.block)
    shares = torch.zeros(m.programs * m.reads_per_program, dtype=torch.int64, device=x.device)
    shares[:m.reads] = x
    padded = torch.zeros(m.programs, steps_read * m.block, dtype=torch.int64, device=x.device)
    padded[:, :m.reads_per_program] = shares.view(m.programs, m.reads_per_program)
    acc = padded.view(m.programs, steps_read, m.block).sum(1)
    offsets = torch.arange(steps_write, device=x.device)[:, None] * m.block
    expected = (acc[:, None, :] + offsets).view(m.programs, steps_write * m.block)[:, :m.writes_per_program]
    assert torch.equal(y.long(), expected.reshape(-1)[:m.writes]), "mix_kernel skipped loads or stores"


def timed_forms(read_bytes: int, written_bytes: int, inputs_of: Callable[[Callable[[], Pair]], list[Pair]],
                median_us: Callable[[Callable[..., None], list[Pair]], float]) -> list[tuple[Mix, float]]:
    """Each of FORMS as a launch moving these bytes, checked once, with median_us(run, inputs) of it.

    ``inputs_of(make)`` builds the (x, y) pairs to rotate through; one set serves every form (the
    buffers' sizes do not depend on it).
    """
    inputs: list[Pair] = []
    timed = []
    for block, program_bytes in FORMS:
        launch = mix(read_bytes, written_bytes, block, program_bytes)
        make, run = mix_case(launch)
        inputs = inputs or inputs_of(make)
        run(*inputs[0])
        check(launch, *inputs[0])
        timed.append((launch, median_us(run, inputs)))
    return timed


__all__ = ["FORMS", "Mix", "check", "mix", "mix_case", "timed_forms"]
