"""tkc.arch: arch lookup and the occupancy model tkc inspect reports (resident blocks per SM)."""

from __future__ import annotations

import pytest

from tkc.arch import ARCHS, get_arch, parse_arch_list
from tkc.errors import UsageError


@pytest.mark.parametrize("name", ["sm90", "sm_90a", "90", "SM90"])
def test_get_arch_accepts_the_usual_spellings(name: str) -> None:
    assert get_arch(name) is ARCHS["sm90"]


def test_unknown_arch_names_the_choices() -> None:
    with pytest.raises(UsageError, match="sm90, sm100"):
        parse_arch_list("sm80")


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("threads,registers,smem,blocks,limit", [
    # per_channel_cast_fused's fp8 pair as shipped: 84 registers round up to 2816 per warp, 23 warps, 5 blocks of
    # 4 warps, where its 20 KiB of shared memory (plus the 1 KiB each block reserves) would allow 11.
    (128, 84, 1024 + 18944, 5, "registers"),
    # per_channel_cast_and_transpose under its launch bound: 8 blocks of 256 threads fill the SM's 2048 threads and
    # its 64 Ki registers at once; threads are named first.
    (256, 32, 8192, 8, "threads"),
    # per_channel_cast_fused bf16: 36 KiB of shared memory per block (with the reserve) -> 6 of 228 KiB.
    (128, 48, 1024 + 34816, 6, "shared memory"),
    # One warp per block and few registers: the 32-block limit.
    (32, 16, 0, 32, "blocks"),
    # A kernel without a register count (none in the cubin) is bounded by the rest.
    (128, 0, 0, 16, "threads"),
    # More shared memory than an SM has: no block fits.
    (128, 32, 300 * 1024, 0, "shared memory"),
])
def test_occupancy_names_the_bounding_resource(arch: str, threads: int, registers: int, smem: int, blocks: int,
                                               limit: str) -> None:
    occupancy = ARCHS[arch].occupancy(threads=threads, registers=registers, shared_memory=smem)
    assert (occupancy.blocks, occupancy.limit) == (blocks, limit)
    assert str(occupancy) == f"{blocks} ({limit})"


def test_occupancy_rounds_registers_per_warp() -> None:
    # 33 registers take 1056 per warp, allocated as 1280: 51 warps, so 12 blocks of 4 warps (not 15).
    assert ARCHS["sm90"].occupancy(threads=128, registers=33, shared_memory=0).blocks == 12
    assert ARCHS["sm90"].occupancy(threads=128, registers=32, shared_memory=0).blocks == 16
