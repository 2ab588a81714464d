"""moe.get_fused_mapping: the expert-major layout of a top-k routing and the maps into and out of it.

One prebuilt cooperative kernel (kernels/moe/fused_mapping.py.j2) does it all: the -1 fill of
pos_to_*, per-block expert counts of the flattened topk_idx, a grid-wide barrier, the scan into
expert segments (every block redundantly) and the position assignment. Layout: expert e owns
positions [expert_start[e], expert_end[e]), a segment of align(count_e, alignment) rows; its
count_e entries come first, in ascending (token, k) order (flat index token * K + k), the rest
is padding. Every position that holds no entry reads -1 in pos_to_expert, pos_to_token and
pos_to_token_topk. Ids outside [0, num_experts) (-1 = masked) take no position: their
token_topk_to_pos is -1.

TileKernels orders the entries of an expert by warp and SM of its persistent kernel, which
depends on the device's SM count; this build fixes ascending (token, k) instead, so the
mapping is the same on every device (and for every grid size) and equal to
tests/reference/moe_route.py bit for bit.
"""

from __future__ import annotations

import torch

from .._args import matrix, no_host_sync_under_compile, positive_int
from .._op import Plan, empty, launch, op, out, size
from .._runtime import get_kernel, sm_count

__all__ = ["get_fused_mapping"]

CHUNK = 2048  # flattened entries per chunk of the kernel (its CHUNK): the unit a block owns

_kernel = get_kernel("moe_fused_mapping")
# The kernel's int32 indices run up to a grid's worth past the data (blocks own whole chunks,
# the -1 fill is grid-stride): 2**24 of headroom covers grids of up to 8192 blocks.
_INT32_LIMIT = 2**31 - 2**24

def upper_bound(num_tokens: int, num_topk: int, num_experts: int, alignment: int) -> int:
    """The largest fused size any routing of (num_tokens, num_topk) ids can need."""
    return (num_tokens * num_topk + (alignment - 1) * num_experts + alignment - 1) // alignment * alignment


def num_blocks(num_entries: int, device: int) -> int:
    """The cooperative grid: at most one block per SM, so every block is resident at once.

    The kernel's grid-wide barrier deadlocks unless all blocks run together; one block of 128
    threads, 48 registers and under 19 KiB of shared memory per SM always fits (the driver refuses a cooperative
    grid that cannot, rather than hanging). Blocks own whole runs of chunks, so the grid is
    trimmed to the fewest blocks that take the same number of chunks each. ``device`` is a
    CUDA index, or -1 for a tensor elsewhere (the launcher then refuses it by name).
    """
    chunks = (num_entries + CHUNK - 1) // CHUNK
    if chunks <= 1 or device < 0:
        return 1  # also T = 0: one block still writes the segments and the -1 fill
    sms = sm_count(device)
    per_block = (chunks + sms - 1) // sms
    return (chunks + per_block - 1) // per_block


def _mapping(*outputs: torch.Tensor) -> tuple[torch.Tensor | list[int], ...]:
    """The op's result from the launch's outputs: the seven maps (not the block-count table), no counts."""
    return (*outputs[:7], [])


def _trimmed(*outputs: torch.Tensor) -> tuple[torch.Tensor | list[int], ...]:
    """The op's result with the fused buffer trimmed to sum(num_tokens_per_expert): one host sync."""
    counts = outputs[6].tolist()
    used = sum(counts)
    return (outputs[0][:used], outputs[1][:used], outputs[2][:used], *outputs[3:7], counts)


def _index_matrix(topk_idx: object) -> torch.Tensor:
    topk_idx = matrix("topk_idx", topk_idx, "(num_tokens, num_topk)")
    if topk_idx.dtype != torch.int64:
        raise TypeError(f"topk_idx: expected dtype torch.int64, got {topk_idx.dtype}")
    if topk_idx.shape[1] == 0:
        raise ValueError("topk_idx: num_topk (dimension 1) must be at least 1")
    return topk_idx


@op(out=False, name="moe_get_fused_mapping")
def get_fused_mapping(
    topk_idx: torch.Tensor,
    num_experts: int,
    num_expanded_tokens: int,
    alignment: int,
    force_no_sync: bool = False,
) -> Plan:
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
    if num_tokens * num_topk + num_experts * alignment >= _INT32_LIMIT:
        raise ValueError(f"topk_idx: {num_tokens} x {num_topk} entries overflow the kernel's int32 positions")
    sync = num_expanded_tokens == 0 and not force_no_sync
    if sync:
        no_host_sync_under_compile("num_expanded_tokens", "pass the fused buffer size (or force_no_sync=True)")
    n = num_expanded_tokens or upper_bound(num_tokens, num_topk, num_experts, alignment)
    if n >= _INT32_LIMIT:
        raise ValueError(f"num_expanded_tokens: {n} positions overflow the kernel's int32 indices "
                         f"(at most {_INT32_LIMIT - 1})")
    kernel = _kernel.variant(num_experts)  # VariantNotFoundError for an unbuilt E, before anything is allocated
    topk_idx = topk_idx if topk_idx.is_contiguous() else topk_idx.contiguous()
    # The kernel's grid is the block-count table's rows: out(7), a scratch output the result leaves out.
    blocks = num_blocks(num_tokens * num_topk, topk_idx.get_device())
    positions, experts = empty(torch.int32, n), empty(torch.int32, num_experts)
    return launch(kernel, topk_idx, out(7), out(3), out(0), out(1), out(2), out(4), out(5), out(6), alignment,
                  outputs=(positions, positions, positions, empty(torch.int32, size(topk_idx, 0), size(topk_idx, 1)),
                           experts, experts, experts, empty(torch.int32, blocks, num_experts)),
                  then=_trimmed if sync else _mapping)
