"""moe.get_fused_mapping: the expert-major layout of a top-k routing and the maps into and out of it.

Three prebuilt kernels run in sequence (templates/moe/fused_mapping_{count,scan,assign}.py.j2):
per-block expert counts of the flattened topk_idx, a one-block scan into expert segments, and
the position assignment. Layout: expert e owns positions [expert_start[e], expert_end[e]), a
segment of align(count_e, alignment) rows; its count_e entries come first, in ascending
(token, k) order (flat index token * K + k), the rest is padding. Every position that holds no
entry reads -1 in pos_to_expert, pos_to_token and pos_to_token_topk. Ids outside
[0, num_experts) (-1 = masked) take no position: their token_topk_to_pos is -1.

TileKernels orders the entries of an expert by warp and SM of its persistent kernel, which
depends on the device's SM count; this build fixes ascending (token, k) instead, so the
mapping is the same on every device and equal to tests/reference/moe_route.py bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._args import matrix, positive_int
from .._build_info import ALIGNMENT
from .._runtime import custom_op, get_kernel

__all__ = ["get_fused_mapping"]

CHUNK = 2048  # flattened entries per block of the count and assign kernels (their CHUNK)

_count = get_kernel("moe_fused_mapping_count")
_scan = get_kernel("moe_fused_mapping_scan")
_assign = get_kernel("moe_fused_mapping_assign")
_STEP = ALIGNMENT // 4  # int32 elements from one aligned view start to the next

Mapping = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def upper_bound(num_tokens: int, num_topk: int, num_experts: int, alignment: int) -> int:
    """The largest fused size any routing of (num_tokens, num_topk) ids can need."""
    return (num_tokens * num_topk + (alignment - 1) * num_experts + alignment - 1) // alignment * alignment


def _outputs(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int) -> Mapping:
    """Uninitialised outputs; also the fake kernel torch.compile traces with."""
    device = topk_idx.device

    def vector(n: int) -> torch.Tensor:
        return torch.empty((n,), dtype=torch.int32, device=device)

    return (vector(num_expanded_tokens), vector(num_expanded_tokens), vector(num_expanded_tokens),
            torch.empty(topk_idx.shape, dtype=torch.int32, device=device),
            vector(num_experts), vector(num_experts), vector(num_experts))


Launchers = tuple[Callable[..., None], Callable[..., None], Callable[..., None]]


def _launchers_of(num_experts: int) -> Launchers:
    """(count, scan, assign) for E; VariantNotFoundError for an unbuilt E, before anything is allocated."""
    return _count.variant(num_experts), _scan.variant(num_experts), _assign.variant(num_experts)


def _run(launchers: Launchers, topk_idx: torch.Tensor, alignment: int, outputs: Mapping, block_counts: torch.Tensor,
         block_offsets: torch.Tensor) -> Mapping:
    """Launch the three kernels into ``outputs`` (the pos_to_* vectors already -1); no host synchronization."""
    pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end, per_expert = outputs
    count, scan, assign = launchers
    flat = topk_idx.contiguous().view(-1)
    count(flat, block_counts)
    scan(block_counts, block_offsets, expert_start, expert_end, per_expert, alignment)
    assign(flat, block_offsets, token_topk_to_pos.view(-1), pos_to_expert, pos_to_token, pos_to_token_topk,
           topk_idx.shape[1])
    return outputs


def _mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int) -> Mapping:
    """The torch custom op's body: every output a tensor of its own (a custom op's outputs may not alias)."""
    launchers = _launchers_of(num_experts)
    device = topk_idx.device
    outputs = _outputs(topk_idx, num_experts, num_expanded_tokens, alignment)
    for pos in outputs[:3]:  # positions that receive no entry (segment padding, an oversized tail) read -1
        pos.fill_(-1)
    num_blocks = (topk_idx.numel() + CHUNK - 1) // CHUNK
    block_counts = torch.empty((num_blocks, num_experts), dtype=torch.int32, device=device)
    return _run(launchers, topk_idx, alignment, outputs, block_counts, torch.empty_like(block_counts))


def _mapping_eager(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int) -> Mapping:
    """The direct path: the seven outputs and the two scratch tables are views of one int32 buffer.

    One allocation and one fill instead of nine allocations and three fills: the host cost of
    this op is its allocations and launches, not its kernels. Each view starts on an ALIGNMENT
    boundary (the kernels' vector accesses need it); the outputs keep the buffer alive, which
    costs the scratch tables' few bytes per block of 2048 entries.
    """
    launchers = _launchers_of(num_experts)
    num_tokens, num_topk = topk_idx.shape
    num_blocks = (num_tokens * num_topk + CHUNK - 1) // CHUNK
    sizes = (num_expanded_tokens, num_expanded_tokens, num_expanded_tokens, num_tokens * num_topk,
             num_experts, num_experts, num_experts, num_blocks * num_experts, num_blocks * num_experts)
    padded = [(size + _STEP - 1) // _STEP * _STEP for size in sizes]
    buffer = torch.empty((sum(padded),), dtype=torch.int32, device=topk_idx.device)
    # One split into nine views (slicing nine times costs twice as much host time); only views
    # whose size is not a whole number of alignment steps are trimmed.
    views = [view if size == step else view[:size] for view, size, step in zip(buffer.split(padded), sizes, padded)]
    buffer[:3 * padded[0]].fill_(-1)  # the three pos_to_* vectors (and their padding)
    outputs = (views[0], views[1], views[2], views[3].view(num_tokens, num_topk), views[4], views[5], views[6])
    return _run(launchers, topk_idx, alignment, outputs, views[7].view(num_blocks, num_experts),
                views[8].view(num_blocks, num_experts))


_mapping_op = custom_op("moe_get_fused_mapping", fake=_outputs)(_mapping)


def _index_matrix(topk_idx: object) -> torch.Tensor:
    topk_idx = matrix("topk_idx", topk_idx, "(num_tokens, num_topk)")
    if topk_idx.dtype != torch.int64:
        raise TypeError(f"topk_idx: expected dtype torch.int64, got {topk_idx.dtype}")
    if topk_idx.shape[1] == 0:
        raise ValueError("topk_idx: num_topk (dimension 1) must be at least 1")
    return topk_idx


def get_fused_mapping(
    topk_idx: torch.Tensor,
    num_experts: int,
    num_expanded_tokens: int,
    alignment: int,
    force_no_sync: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
           list[int]]:
    """Map the (token, k) slots of a routing to an expert-major fused buffer and back.

    Args:
        topk_idx: int64 CUDA tensor (num_tokens, num_topk) of expert ids; ids outside
            [0, num_experts) (-1 = masked) are dropped.
        num_experts: local experts E (a built value: 4, 9 or 32 in the default specs).
        num_expanded_tokens: size N of the fused buffer. With N > 0 nothing synchronizes with
            the host; entries that would land at N or beyond (a buffer too small for the
            routing) are dropped (token_topk_to_pos -1), never written out of bounds. With 0,
            the op sizes the buffer for the worst case, waits for the counts and trims it to
            sum(num_tokens_per_expert) (one host synchronization), unless force_no_sync.
        alignment: each expert's segment is padded to a multiple of it (runtime, >= 1).
        force_no_sync: with num_expanded_tokens == 0, keep the worst-case buffer
            (upper_bound(...) rows, the tail all -1) instead of synchronizing to trim it.

    Returns:
        ``(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start,
        expert_end, num_tokens_per_expert, num_tokens_per_expert_list)``: int32 (N,) x 3 with
        -1 at positions holding no entry; pos_to_token_topk is the flat index token * K + k;
        int32 (num_tokens, num_topk); int32 (E,) x 3, num_tokens_per_expert being the padded
        segment size (expert_end - expert_start), as in TileKernels; and the host list of
        num_tokens_per_expert when the op synchronized, else [].
    """
    topk_idx = _index_matrix(topk_idx)
    num_experts = positive_int("num_experts", num_experts)
    alignment = positive_int("alignment", alignment)
    if isinstance(num_expanded_tokens, bool) or not isinstance(num_expanded_tokens, int):
        raise TypeError(f"num_expanded_tokens: expected an int, got {type(num_expanded_tokens).__name__}")
    if num_expanded_tokens < 0:
        raise ValueError(f"num_expanded_tokens: expected 0 (size it here) or a positive int, got {num_expanded_tokens}")
    num_tokens, num_topk = (int(s) for s in topk_idx.shape)
    if num_tokens * num_topk + num_experts * alignment >= 2**31:
        raise ValueError(f"topk_idx: {num_tokens} x {num_topk} entries overflow the kernels' int32 positions")
    sync = num_expanded_tokens == 0 and not force_no_sync
    compiling = torch.compiler.is_compiling()
    if sync and compiling:
        raise ValueError("num_expanded_tokens: under torch.compile pass the fused buffer size (or "
                         "force_no_sync=True); trimming it needs a host synchronization")
    size = num_expanded_tokens or upper_bound(num_tokens, num_topk, num_experts, alignment)
    if compiling:
        return (*_mapping_op(topk_idx, num_experts, size, alignment), [])
    mapping = _mapping_eager(topk_idx, num_experts, size, alignment)
    if not sync:
        return (*mapping, [])
    counts = mapping[6].tolist()  # the one host synchronization
    used = sum(counts)
    return (mapping[0][:used], mapping[1][:used], mapping[2][:used], *mapping[3:], counts)
