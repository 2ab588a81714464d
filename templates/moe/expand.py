"""moe.expand_to_fused and moe.expand_to_fused_with_sf: token rows into the fused expert layout.

Both run the prebuilt ``moe_expand`` kernel (templates/moe/expand.py.j2): out[pos] = x[t] for
every pos = token_topk_to_pos[t, k] >= 0, and zero rows (and zero scales) where
pos_to_expert[pos] < 0 (segment padding). Positions reached by no token and not marked
padding keep whatever the allocator held, as in TileKernels (a mapping from get_fused_mapping
has none). num_topk, num_tokens and num_expanded_tokens are read at run time; hidden is
compile-time (2048, 4096, 7168 in the default spec).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._args import matrix, not_built, out_tensors
from .._runtime import (
    custom_op,
    dispatch,
    dtype_name,
    fast_path,
    from_input,
    from_out,
    get_kernel,
    output,
    remember,
    size_of,
)
from ..errors import KernelArgumentError

__all__ = ["expand_to_fused", "expand_to_fused_with_sf"]

_kernel = get_kernel("moe_expand")
SF_CHANNELS = 128  # channels per scale factor of the built _with_sf variants (1 x 128 groups)


def _launcher(x: torch.Tensor, with_sf: bool, col_major: bool) -> Callable[..., None]:
    # Grid order: hidden, dtype, with_sf, sf_layout.
    return _kernel.variant(int(x.shape[1]), dtype_name(x.dtype), with_sf, "col_major" if col_major else "row_major")


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


def _expand(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    return _run(x, token_topk_to_pos, pos_to_expert, None)


# expand_to_fused's launchers by (x.dtype, hidden), once a call with them passed the checks below and
# the launcher: later calls go straight to the launcher, which checks every tensor and overlap as
# the op's checks would (dimensions, the mapping's rows against x's, dtypes, strides); only where it
# refuses do the op's checks run, to name the argument or to make the mapping contiguous.
_LAUNCHERS: dict[tuple[torch.dtype, int], Callable[..., None]] = {}
# expand_to_fused(x, token_topk_to_pos, pos_to_expert, out=out) in one C call (_runtime.dispatch):
# keyed by x's dtype and hidden (the variant) and the mapping's dtypes and ranks; the launcher's
# contract checks the rest of what the op checks (the mapping's rows against x's, out's shape). An
# allocating call allocates out as _run does: pos_to_expert's length (input 2) rows, hidden (keyed) wide.
_FAST = fast_path(inputs=((1,), (), ()), outputs=1)


def _run(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
         out: torch.Tensor | None) -> torch.Tensor:
    """Launch into out, or into a fresh tensor; the launcher checks every tensor (out: also that it
    overlaps none of the others)."""
    launch = _launcher(x, False, False)
    if out is None:
        out = x.new_empty((pos_to_expert.shape[0], x.shape[1]))
    launch(x, token_topk_to_pos, pos_to_expert, out)
    if not torch.compiler.is_compiling():
        _LAUNCHERS[(x.dtype, x.shape[1])] = launch
    return out


def _fake_expand(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    return x.new_empty((pos_to_expert.shape[0], x.shape[1]))


_expand_op = custom_op("moe_expand_to_fused", fake=_fake_expand)(_expand)


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
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
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        done = dispatch(_FAST, x, token_topk_to_pos, pos_to_expert, out)
        if done is not None:
            return done  # type: ignore[no-any-return]
    fast = _LAUNCHERS.get((x.dtype, x.shape[1])) if type(x) is torch.Tensor and x.dim() == 2 else None
    if fast is not None and type(pos_to_expert) is torch.Tensor and pos_to_expert.dim() == 1 \
            and (out is None or type(out) is torch.Tensor) \
            and not torch.compiler.is_compiling():
        result = x.new_empty((pos_to_expert.shape[0], x.shape[1])) if out is None else out
        try:
            fast(x, token_topk_to_pos, pos_to_expert, result)
            _remember_fast(fast, result, x, token_topk_to_pos, pos_to_expert, out)  # dispatch() had not seen it
            return result
        except KernelArgumentError:
            pass  # the checks below name what is wrong (or make the mapping contiguous and launch)
    x = matrix("x", x)
    pos, pos_to_expert = _check_mapping(int(x.shape[0]), token_topk_to_pos, pos_to_expert)
    if out is not None:
        (out,) = out_tensors(out, ("out",))
    if torch.compiler.is_compiling():
        result = _expand_op(x, pos, pos_to_expert)
        return result if out is None else out.copy_(result)
    result = _run(x, pos, pos_to_expert, out)
    if pos is token_topk_to_pos:  # not where the launch took a contiguous copy of the mapping
        _remember_fast(_LAUNCHERS[(x.dtype, x.shape[1])], result, x, token_topk_to_pos, pos_to_expert, out)
    return result


def _remember_fast(launch: Callable[..., None], result: torch.Tensor, *call: object) -> None:
    """Let dispatch() take later expand_to_fused calls like ``call`` (x, the mapping, out) straight to launch;
    an allocating call (out None) allocates ``result`` as it did: one row per position of pos_to_expert."""
    remember(_FAST, launch, (from_input(0), from_input(1), from_input(2), from_out(0)), (), *call,
             outputs=(output(result.dtype, size_of(2, 0), result.shape[1]),))


def _sf_outputs(x: torch.Tensor, x_sf: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
                col_major: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, out_sf as returned, out_sf as the kernel writes it); also the fake kernel's outputs."""
    num_expanded = int(pos_to_expert.shape[0])
    groups = int(x_sf.shape[1])
    out = x.new_empty((num_expanded, x.shape[1]))
    if not col_major:
        sf = x_sf.new_empty((num_expanded, groups))
        return out, sf, sf
    padded = (num_expanded + 3) // 4 * 4
    storage = x_sf.new_empty((groups, padded))
    # as_strided states the strides the launcher checks (torch reports others for empty storage).
    return out, storage.T[:num_expanded], storage.as_strided((groups, padded), (padded, 1))


def _expand_with_sf(x: torch.Tensor, x_sf: torch.Tensor, token_topk_to_pos: torch.Tensor,
                    pos_to_expert: torch.Tensor, col_major: bool) -> tuple[torch.Tensor, torch.Tensor]:
    launch = _launcher(x, True, col_major)
    out, out_sf, sf_arg = _sf_outputs(x, x_sf, token_topk_to_pos, pos_to_expert, col_major)
    launch(x, x_sf, token_topk_to_pos, pos_to_expert, out, sf_arg)
    return out, out_sf


def _fake_expand_with_sf(x: torch.Tensor, x_sf: torch.Tensor, token_topk_to_pos: torch.Tensor,
                         pos_to_expert: torch.Tensor, col_major: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out, out_sf, _ = _sf_outputs(x, x_sf, token_topk_to_pos, pos_to_expert, col_major)
    return out, out_sf


_expand_with_sf_op = custom_op("moe_expand_to_fused_with_sf", fake=_fake_expand_with_sf)(_expand_with_sf)


def expand_to_fused_with_sf(
    x: tuple[torch.Tensor, torch.Tensor],
    num_per_channels: int,
    token_topk_to_pos: torch.Tensor,
    pos_to_expert: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
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
    token_topk_to_pos, pos_to_expert = _check_mapping(int(data.shape[0]), token_topk_to_pos, pos_to_expert)
    col_major = bool(use_tma_aligned_col_major_sf)
    if torch.compiler.is_compiling():
        out, out_sf = _expand_with_sf_op(data, x_sf, token_topk_to_pos, pos_to_expert, col_major)
        return out, out_sf
    return _expand_with_sf(data, x_sf, token_topk_to_pos, pos_to_expert, col_major)
