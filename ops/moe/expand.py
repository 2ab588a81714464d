"""moe.expand_to_fused and moe.expand_to_fused_with_sf: token rows into the fused expert layout.

Both run the prebuilt ``moe_expand`` kernel (kernels/moe/expand.py.j2): out[pos] = x[t] for
every pos = token_topk_to_pos[t, k] >= 0, and zero rows (and zero scales) where
pos_to_expert[pos] < 0 (segment padding). Positions reached by no token and not marked
padding keep whatever the allocator held, as in TileKernels (a mapping from get_fused_mapping
has none). num_topk, num_tokens and num_expanded_tokens are read at run time; hidden is
compile-time (2048, 4096, 7168 in the default spec).
"""

from __future__ import annotations

import torch

from .._args import matrix, not_built
from .._op import Plan, empty, launch, op, out, size
from .._runtime import dtype_name, get_kernel

__all__ = ["expand_to_fused", "expand_to_fused_with_sf"]

_kernel = get_kernel("moe_expand")
SF_CHANNELS = 128  # channels per scale factor of the built _with_sf variants (1 x 128 groups)


def _check_mapping(num_tokens: int, token_topk_to_pos: object,
                   pos_to_expert: object) -> tuple[torch.Tensor, torch.Tensor]:
    pos = matrix("token_topk_to_pos", token_topk_to_pos, "(num_tokens, num_topk)")
    if pos.shape[0] != num_tokens:
        raise ValueError(f"token_topk_to_pos: expected {num_tokens} rows (one per token of x), got shape "
                         f"{tuple(pos.shape)}")
    if not isinstance(pos_to_expert, torch.Tensor) or pos_to_expert.dim() != 1:
        raise ValueError("pos_to_expert: expected a 1-D int32 tensor (num_expanded_tokens,), got "
                         f"{getattr(pos_to_expert, 'shape', type(pos_to_expert).__name__)}")
    return pos.contiguous(), pos_to_expert


@op(outputs=("out",), inputs={"x": (1,), "token_topk_to_pos": (), "pos_to_expert": ()})
def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> Plan:
    """Expand token rows into the fused expert-major layout of get_fused_mapping.

    Args:
        x: bf16 CUDA tensor (num_tokens, hidden), contiguous.
        token_topk_to_pos: int32 (num_tokens, num_topk), -1 = slot not routed.
        pos_to_expert: int32 (num_expanded_tokens,), -1 = padding row.
        out: a contiguous (num_expanded_tokens, hidden) tensor of x's dtype to write into
            instead (not overlapping the inputs), returned as given.

    Returns:
        (num_expanded_tokens, hidden) of x's dtype: row pos holds x[t] for pos =
        token_topk_to_pos[t, k], padding rows are zero.
    """
    x = matrix("x", x)
    # The launcher's contract ties the mapping's rows to x's and out's shape to x and pos_to_expert.
    pos, pos_to_expert = _check_mapping(int(x.shape[0]), token_topk_to_pos, pos_to_expert)
    hidden = int(x.shape[1])
    # Grid order: hidden, dtype, with_sf, sf_layout.
    return launch(_kernel.variant(hidden, dtype_name(x.dtype), False, "row_major"), x, pos, pos_to_expert, out(0),
                  outputs=(empty(x.dtype, size(pos_to_expert, 0), hidden),))


def _col_major_outputs(x: torch.Tensor, x_sf: torch.Tensor, token_topk_to_pos: torch.Tensor,
                       pos_to_expert: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """out, and out_sf as returned: (N, G) over column-major storage whose positions are padded to 4."""
    num_expanded = int(pos_to_expert.shape[0])
    padded = (num_expanded + 3) // 4 * 4
    storage = x_sf.new_empty((int(x_sf.shape[1]), padded))
    return x.new_empty((num_expanded, x.shape[1])), storage.T[:num_expanded]


def _sf_storage(out_sf: torch.Tensor) -> torch.Tensor:
    """The kernel's view of a column-major out_sf: (G, align(N, 4)) row-major over its storage.

    as_strided states the strides the launcher checks (torch reports others for empty storage)."""
    groups, padded = int(out_sf.shape[1]), (int(out_sf.shape[0]) + 3) // 4 * 4
    return out_sf.as_strided((groups, padded), (padded, 1))


@op(outputs=("out", "out_sf"), out=False)
def expand_to_fused_with_sf(
    x: tuple[torch.Tensor, torch.Tensor],
    num_per_channels: int,
    token_topk_to_pos: torch.Tensor,
    pos_to_expert: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
) -> Plan:
    """Expand fp8 rows and their per-row scale factors into the fused layout.

    Args:
        x: ``(data, sf)``: data float8_e4m3fn (num_tokens, hidden), sf float32
            (num_tokens, hidden / num_per_channels), both contiguous (row-major).
        num_per_channels: channels per scale factor; 128 is built.
        token_topk_to_pos, pos_to_expert: as for expand_to_fused.
        use_tma_aligned_col_major_sf: return out_sf column-major with the position dimension
            padded to a multiple of 4 (strides (1, align(N, 4))); the padding is not written.

    Returns:
        ``(out, out_sf)``: out (N, hidden) fp8, out_sf float32 (N, hidden / num_per_channels);
        padding rows have zero data and zero scales.
    """
    if not isinstance(x, tuple | list) or len(x) != 2:
        raise TypeError(f"x: expected a (data, sf) pair, got {type(x).__name__}")
    data = matrix("x", x[0])
    x_sf = matrix("x_sf", x[1], "(num_tokens, hidden / num_per_channels)")
    if isinstance(num_per_channels, bool) or num_per_channels != SF_CHANNELS:
        if num_per_channels in (32, 64):
            raise not_built("num_per_channels", f"{num_per_channels}-channel scale groups", "moe_expand")
        raise ValueError(f"num_per_channels: expected {SF_CHANNELS}, got {num_per_channels!r}")
    if x_sf.dtype == torch.int32:
        raise not_built("x", "packed UE8M0 scale factors (int32 sf)", "moe_expand")
    hidden = int(data.shape[1])
    groups = (hidden + SF_CHANNELS - 1) // SF_CHANNELS
    if tuple(x_sf.shape) != (data.shape[0], groups):
        raise ValueError(f"x_sf: expected shape ({data.shape[0]}, {groups}) for x of shape {tuple(data.shape)} "
                         f"and num_per_channels={num_per_channels}, got {tuple(x_sf.shape)}")
    pos, pos_to_expert = _check_mapping(int(data.shape[0]), token_topk_to_pos, pos_to_expert)
    col_major = bool(use_tma_aligned_col_major_sf)
    kernel = _kernel.variant(hidden, dtype_name(data.dtype), True, "col_major" if col_major else "row_major")
    if col_major:
        return launch(kernel, data, x_sf, pos, pos_to_expert, out(0), out(1, view=_sf_storage),
                      outputs=_col_major_outputs)
    return launch(kernel, data, x_sf, pos, pos_to_expert, out(0), out(1),
                  outputs=(empty(data.dtype, size(pos_to_expert, 0), hidden),
                           empty(x_sf.dtype, size(pos_to_expert, 0), groups)))
