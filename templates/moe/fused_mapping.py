"""moe.get_fused_mapping: the expert-major layout of a top-k routing and the maps into and out of it.

One prebuilt cooperative kernel (templates/moe/fused_mapping.py.j2) does it all: the -1 fill of
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

from collections.abc import Callable

import torch

from .._args import matrix, positive_int
from .._build_info import ALIGNMENT
from .._runtime import custom_op, get_kernel, sm_count

__all__ = ["get_fused_mapping"]

CHUNK = 2048  # flattened entries per chunk of the kernel (its CHUNK): the unit a block owns

_kernel = get_kernel("moe_fused_mapping")
_STEP = ALIGNMENT // 4  # int32 elements from one aligned view start to the next
# The kernel's int32 indices run up to a grid's worth past the data (blocks own whole chunks,
# the -1 fill is grid-stride): 2**24 of headroom covers grids of up to 8192 blocks.
_INT32_LIMIT = 2**31 - 2**24

Mapping = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


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


def _outputs(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int) -> Mapping:
    """Uninitialised outputs; also the fake kernel torch.compile traces with."""
    device = topk_idx.device

    def vector(n: int) -> torch.Tensor:
        return torch.empty((n,), dtype=torch.int32, device=device)

    return (vector(num_expanded_tokens), vector(num_expanded_tokens), vector(num_expanded_tokens),
            torch.empty(topk_idx.shape, dtype=torch.int32, device=device),
            vector(num_experts), vector(num_experts), vector(num_experts))


def _launcher_of(num_experts: int) -> Callable[..., None]:
    """The kernel for E; VariantNotFoundError for an unbuilt E, before anything is allocated."""
    return _kernel.variant(num_experts)


def _mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int) -> Mapping:
    """The torch custom op's body: every output a tensor of its own (a custom op's outputs may not alias)."""
    launch = _launcher_of(num_experts)
    topk_idx = topk_idx if topk_idx.is_contiguous() else topk_idx.contiguous()
    outputs = _outputs(topk_idx, num_experts, num_expanded_tokens, alignment)
    pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end, per_expert = outputs
    blocks = num_blocks(topk_idx.numel(), topk_idx.get_device())
    block_counts = torch.empty((blocks, num_experts), dtype=torch.int32, device=topk_idx.device)
    launch(topk_idx, block_counts, token_topk_to_pos, pos_to_expert, pos_to_token, pos_to_token_topk,
           expert_start, expert_end, per_expert, alignment)
    return outputs


def _mapping_eager(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int) -> Mapping:
    """The direct path: the seven outputs and the block-count table are views of one int32 buffer.

    Host cost is what this op is made of (its kernel runs a few microseconds), so it takes one
    torch.empty, one split_with_sizes and two reshapes, then one launch; the kernel itself
    writes the -1 of pos_to_*. Each view starts on an ALIGNMENT boundary (the launcher checks
    it): the split interleaves gap pieces of -size % _STEP elements (usually 0) after every
    view but the last, so no view needs trimming. The outputs keep the buffer alive, which
    costs the block-count table's E ints per SM.
    """
    launch = _launcher_of(num_experts)
    topk_idx = topk_idx if topk_idx.is_contiguous() else topk_idx.contiguous()
    num_tokens, num_topk = topk_idx.shape
    entries = num_tokens * num_topk
    blocks = num_blocks(entries, topk_idx.get_device())
    n, n_gap, e_gap = num_expanded_tokens, -num_expanded_tokens % _STEP, -num_experts % _STEP
    sizes = (n, n_gap, n, n_gap, n, n_gap, entries, -entries % _STEP, num_experts, e_gap, num_experts, e_gap,
             num_experts, e_gap, blocks * num_experts)
    buffer = torch.empty((sum(sizes),), dtype=torch.int32, device=topk_idx.device)
    (pos_to_expert, _, pos_to_token, _, pos_to_token_topk, _, token_topk_to_pos, _, expert_start, _, expert_end, _,
     per_expert, _, block_counts) = buffer.split_with_sizes(sizes)
    token_topk_to_pos = token_topk_to_pos.view(num_tokens, num_topk)
    launch(topk_idx, block_counts.view(blocks, num_experts), token_topk_to_pos, pos_to_expert, pos_to_token,
           pos_to_token_topk, expert_start, expert_end, per_expert, alignment)
    return pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end, per_expert


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
    if num_tokens * num_topk + num_experts * alignment >= _INT32_LIMIT:
        raise ValueError(f"topk_idx: {num_tokens} x {num_topk} entries overflow the kernel's int32 positions")
    sync = num_expanded_tokens == 0 and not force_no_sync
    compiling = torch.compiler.is_compiling()
    if sync and compiling:
        raise ValueError("num_expanded_tokens: under torch.compile pass the fused buffer size (or "
                         "force_no_sync=True); trimming it needs a host synchronization")
    size = num_expanded_tokens or upper_bound(num_tokens, num_topk, num_experts, alignment)
    if size >= _INT32_LIMIT:
        raise ValueError(f"num_expanded_tokens: {size} positions overflow the kernel's int32 indices "
                         f"(at most {_INT32_LIMIT - 1})")
    if compiling:
        return (*_mapping_op(topk_idx, num_experts, size, alignment), [])
    mapping = _mapping_eager(topk_idx, num_experts, size, alignment)
    if not sync:
        return (*mapping, [])
    counts = mapping[6].tolist()  # the one host synchronization
    used = sum(counts)
    return (mapping[0][:used], mapping[1][:used], mapping[2][:used], *mapping[3:], counts)
