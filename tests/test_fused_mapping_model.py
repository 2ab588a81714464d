"""A Python model of the cooperative get_fused_mapping kernel, step for step, against the reference.

The GPU tests compare the kernel with tests/reference/moe_route.py; this CPU test checks the
algorithm the template implements (block runs of whole chunks, per-thread rows, the redundant
per-block scan over lanes, the chunk-by-chunk assignment with a carried running position) for
every grid size a device could give it, including grids with idle blocks: the mapping must not
depend on the SM count. It also checks that every token_topk_to_pos entry is written exactly
once (the op never pre-fills it), that the grid-stride -1 fill covers each position once and that
no position is assigned twice.
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.conftest import REPO, TEMPLATES
from tests.reference.moe_route import get_fused_mapping_ref

TEMPLATE = (TEMPLATES / "moe" / "fused_mapping.py.j2").read_text()
THREADS = int(re.search(r"^THREADS = (\d+)$", TEMPLATE, re.M).group(1))  # type: ignore[union-attr]
PER_THREAD = int(re.search(r"^PER_THREAD = (\d+)$", TEMPLATE, re.M).group(1))  # type: ignore[union-attr]
CHUNK = THREADS * PER_THREAD


def test_the_op_chunks_as_the_kernel_does() -> None:
    op = (REPO / "ops" / "moe" / "fused_mapping.py").read_text()
    assert int(re.search(r"^CHUNK = (\d+)", op, re.M).group(1)) == CHUNK  # type: ignore[union-attr]


def ceildiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def kernel_model(topk_idx: torch.Tensor, num_experts: int, size: int, alignment: int,
                 num_blocks: int) -> tuple[torch.Tensor, ...]:
    """What fused_mapping.py.j2 computes with a grid of ``num_blocks`` blocks (any order of blocks)."""
    num_tokens, num_topk = topk_idx.shape
    flat = topk_idx.reshape(-1).tolist()
    entries = len(flat)
    per_block = ceildiv(ceildiv(entries, CHUNK), num_blocks)
    lanes = THREADS // num_experts

    def owned(block: int, thread: int, chunk: int) -> list[int]:
        first = block * per_block * CHUNK + thread * PER_THREAD
        return [i for i in range(first + chunk * CHUNK, first + chunk * CHUNK + PER_THREAD) if i < entries]

    def expert_of(i: int) -> int | None:
        return flat[i] if 0 <= flat[i] < num_experts else None

    # 1. -1 fill (grid-stride) and per-block counts.
    filled = [0] * size
    for k in range(ceildiv(size, num_blocks * THREADS)):
        for block in range(num_blocks):
            for thread in range(THREADS):
                p = (k * num_blocks + block) * THREADS + thread
                if p < size:
                    filled[p] += 1
    assert filled == [1] * size
    block_counts = [[0] * num_experts for _ in range(num_blocks)]
    for block in range(num_blocks):
        for thread in range(THREADS):
            for chunk in range(per_block):
                for i in owned(block, thread, chunk):
                    e = expert_of(i)
                    if e is not None:
                        block_counts[block][e] += 1
    # 2. grid barrier. 3. Every block's scan over lanes; 4. its assignment.
    pos_to = [[-1] * size for _ in range(3)]
    token_topk_to_pos: list[int | None] = [None] * entries
    starts: list[list[int]] = []
    for block in range(num_blocks):
        total, before = [0] * num_experts, [0] * num_experts
        for e in range(num_experts):
            for lane in range(lanes):
                for k in range(ceildiv(num_blocks, lanes)):
                    b = k * lanes + lane
                    if b < num_blocks:
                        total[e] += block_counts[b][e]
                        before[e] += block_counts[b][e] if b < block else 0
        padded = [ceildiv(t, alignment) * alignment for t in total]
        start = [sum(padded[:e]) for e in range(num_experts)]
        starts.append(start + [s + p for s, p in zip(start, padded)] + padded)
        running = [s + b for s, b in zip(start, before)]
        for chunk in range(per_block):
            table = [[0] * num_experts for _ in range(THREADS)]
            for thread in range(THREADS):
                for i in owned(block, thread, chunk):
                    e = expert_of(i)
                    if e is not None:
                        table[thread][e] += 1
            for e in range(num_experts):
                for thread in range(THREADS):
                    table[thread][e], running[e] = running[e], running[e] + table[thread][e]
            for thread in range(THREADS):
                for i in owned(block, thread, chunk):
                    e = expert_of(i)
                    assert token_topk_to_pos[i] is None, "an entry assigned twice"
                    if e is None:
                        token_topk_to_pos[i] = -1
                        continue
                    pos = table[thread][e]
                    table[thread][e] = pos + 1
                    if pos < size:
                        token_topk_to_pos[i] = pos
                        assert pos_to[0][pos] == -1, "a position assigned twice"
                        pos_to[0][pos], pos_to[1][pos], pos_to[2][pos] = e, i // num_topk, i
                    else:
                        token_topk_to_pos[i] = -1
    assert None not in token_topk_to_pos, "an entry no block owns"
    assert all(s == starts[0] for s in starts), "blocks disagree on the segments"
    segments = torch.tensor(starts[0], dtype=torch.int32).reshape(3, num_experts)
    return (*(torch.tensor(p, dtype=torch.int32) for p in pos_to),
            torch.tensor(token_topk_to_pos, dtype=torch.int32).reshape(num_tokens, num_topk), *segments)


def routing(num_tokens: int, num_topk: int, num_experts: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, num_experts + 2, (num_tokens, num_topk), generator=gen)  # masked and out of range
    return idx


def upper_bound(num_tokens: int, num_topk: int, num_experts: int, alignment: int) -> int:
    return (num_tokens * num_topk + (alignment - 1) * num_experts + alignment - 1) // alignment * alignment


CASES = [  # (T, K, E, alignment, size: None = upper bound, grid sizes)
    (0, 8, 9, 128, None, [1]),
    (0, 8, 4, 1, None, [1]),
    (1, 8, 32, 128, None, [1, 3]),
    (4001, 8, 9, 128, None, [1, 7, 16, 132]),
    (4001, 3, 32, 7, None, [2, 6, 132]),
    (4001, 8, 32, 128, 1000, [16, 132]),  # a buffer too small: entries past it dropped
    (1500, 6, 4, 1, 9000, [3, 5]),  # exact size
]


@pytest.mark.parametrize("num_tokens,num_topk,num_experts,alignment,size,grids", CASES)
def test_kernel_model_equals_the_reference_for_every_grid(num_tokens: int, num_topk: int, num_experts: int,
                                                          alignment: int, size: int | None,
                                                          grids: list[int]) -> None:
    topk_idx = routing(num_tokens, num_topk, num_experts, seed=num_tokens + num_experts)
    n = upper_bound(num_tokens, num_topk, num_experts, alignment) if size is None else size
    want = get_fused_mapping_ref(topk_idx, num_experts, n, alignment)
    for grid in grids:
        got = kernel_model(topk_idx, num_experts, n, alignment, grid)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w), f"grid {grid}"
