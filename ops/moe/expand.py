"""moe.expand_to_fused and moe.expand_to_fused_with_sf: token rows into the fused expert layout.

Both run the prebuilt ``moe_expand`` kernel (kernels/moe/expand.py.j2): out[pos] = x[t] for
every pos = token_topk_to_pos[t, k] >= 0, and zero rows (and zero scales) where
pos_to_expert[pos] < 0 (segment padding). Positions reached by no token and not marked
padding keep whatever the allocator held, as in TileKernels (a mapping from get_fused_mapping
has none). num_topk, num_tokens and num_expanded_tokens are read at run time, and so is the
scale row's width (any num_per_channels, fp32 scales or packed UE8M0 words).

The kernel moves bytes: rows of any dtype run as rows of its unit (bf16 without scales, e4m3
bytes with them) of the same byte length, so an fp32 row of 1024 values takes the variant built
for 2048 bf16 columns. Hidden (in units) takes the variant built for it where the spec has one,
else the one for any hidden (the grid's hidden 0; rows of whole 16-byte vectors).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._args import matrix
from .._op import Plan, empty, launch, op, out, size
from .._runtime import dtype_name, get_kernel

__all__ = ["expand_to_fused", "expand_to_fused_with_sf"]

_kernel = get_kernel("moe_expand")
# TileKernels' group sizes for expand_to_fused_with_sf; the kernel itself copies scale rows of any width.
SF_CHANNELS = (32, 128)
# The 16-byte vectors the kernel for any hidden moves: a row in units of 2 (bf16) or 1 (e4m3) bytes
# must hold whole vectors (the spec's requires: hidden % 16 == 0).
HIDDEN_MULTIPLE = 16
_ROWS, _ROWS_WITH_SF = torch.bfloat16, torch.float8_e4m3fn


def _launcher(units: int, dtype: torch.dtype, with_sf: bool, sf_layout: str) -> Callable[..., None]:
    """The variant built for this row length (in units of ``dtype``) where there is one, else the one for any
    hidden; neither: the error names the hidden asked for and lists what the build has. Grid order: hidden,
    dtype, with_sf, sf_layout."""
    name = dtype_name(dtype)
    return (_kernel.find(units, name, with_sf, sf_layout) or _kernel.find(0, name, with_sf, sf_layout)
            or _kernel.variant(units, name, with_sf, sf_layout))


def _units(name: str, x: torch.Tensor, unit: torch.dtype) -> torch.Tensor:
    """x as rows of ``unit`` elements with the same bytes (x itself when it is of that dtype)."""
    if x.dtype == unit:
        return x
    row_bytes = x.shape[1] * x.element_size()
    if row_bytes % (HIDDEN_MULTIPLE * unit.itemsize) or not x.is_contiguous():
        raise ValueError(f"{name}: {x.dtype} rows are moved as {unit} units, which needs a contiguous tensor whose "
                         f"rows hold a multiple of {HIDDEN_MULTIPLE * unit.itemsize} bytes; got shape "
                         f"{tuple(x.shape)} ({row_bytes} bytes a row)")
    return x.view(unit)


def _check_units(name: str, x: torch.Tensor, unit: torch.dtype) -> None:
    if x.shape[1] % HIDDEN_MULTIPLE:
        raise ValueError(f"{name}: hidden ({x.shape[1]}) must be a multiple of {HIDDEN_MULTIPLE} for {unit} rows "
                         "(whole 16-byte vectors)")


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    return t.view(_ROWS)


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
        x: CUDA tensor (num_tokens, hidden) of any dtype, contiguous; a row must hold a
            multiple of 32 bytes (bf16: hidden % 16 == 0).
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
    rows = _units("x", x, _ROWS)
    _check_units("x", rows, _ROWS)
    kernel = _launcher(int(rows.shape[1]), _ROWS, False, "row_major")
    # Rows of another dtype: the caller's dtype out, the kernel writing a bf16 view of it (not remembered).
    return launch(kernel, rows, pos, pos_to_expert, out(0) if rows is x else out(0, view=_as_rows),
                  outputs=(empty(x.dtype, size(pos_to_expert, 0), int(x.shape[1])),))


def _sf_storage(out_sf: torch.Tensor) -> torch.Tensor:
    """The kernel's view of a column-major out_sf: (G, align(N, 4)) int32 words, row-major over its storage.

    as_strided states the strides the launcher checks (torch reports others for empty storage)."""
    groups, padded = int(out_sf.shape[1]), (int(out_sf.shape[0]) + 3) // 4 * 4
    return out_sf.as_strided((groups, padded), (padded, 1)).view(torch.int32)


def _words(out_sf: torch.Tensor) -> torch.Tensor:
    return out_sf.view(torch.int32)


def _data(out_data: torch.Tensor) -> torch.Tensor:
    return out_data.view(_ROWS_WITH_SF)


def _col_major_outputs(dtype: torch.dtype, sf_dtype: torch.dtype) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The output function of a column-major call with data of ``dtype`` and scales of ``sf_dtype``."""

    def outputs(data: torch.Tensor, x_sf: torch.Tensor, token_topk_to_pos: torch.Tensor,
                pos_to_expert: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """out, and out_sf as returned: (N, G) over column-major storage whose positions are padded to 4
        (``data`` and ``x_sf`` are the kernel's views: e4m3 bytes and int32 words)."""
        num_expanded = int(pos_to_expert.shape[0])
        padded = (num_expanded + 3) // 4 * 4
        storage = torch.empty((int(x_sf.shape[1]), padded), dtype=sf_dtype, device=x_sf.device)
        row_bytes = int(data.shape[1]) * data.element_size()
        out_data = torch.empty((num_expanded, row_bytes // dtype.itemsize), dtype=dtype, device=data.device)
        return out_data, storage.T[:num_expanded]

    return outputs


# One output function per (data dtype, scale dtype), made at import: torch.compile keys a traced plan by the
# function, so it must be an object it finds through the module (not one made during the call).
_DATA_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.uint8, torch.int8, torch.bfloat16, torch.float16,
                torch.int16, torch.float32, torch.int32, torch.float64, torch.int64)
_COL_MAJOR_OUTPUTS = {(d, s): _col_major_outputs(d, s) for d in _DATA_DTYPES for s in (torch.float32, torch.int32)}


@op(outputs=("out", "out_sf"), out=False)
def expand_to_fused_with_sf(
    x: tuple[torch.Tensor, torch.Tensor],
    num_per_channels: int,
    token_topk_to_pos: torch.Tensor,
    pos_to_expert: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
) -> Plan:
    """Expand quantized rows and their per-row scale factors into the fused layout.

    Args:
        x: ``(data, sf)``: data (num_tokens, hidden), contiguous, of any dtype (float8_e4m3fn
            from per_token_cast; rows of a multiple of 16 bytes), and its scale factors, contiguous:
            float32 (num_tokens, ceil(hidden / num_per_channels)), or int32 packed UE8M0 words
            (num_tokens, ceil(ceil(hidden / num_per_channels) / 4)).
        num_per_channels: channels per scale factor, 32 or 128 (as TileKernels).
        token_topk_to_pos, pos_to_expert: as for expand_to_fused.
        use_tma_aligned_col_major_sf: return out_sf column-major with the position dimension
            padded to a multiple of 4 (strides (1, align(N, 4))); the padding is not written.

    Returns:
        ``(out, out_sf)``: out (N, hidden) of data's dtype, out_sf (N, sf columns) of sf's dtype;
        padding rows have zero data and zero scales.
    """
    if not isinstance(x, tuple | list) or len(x) != 2:
        raise TypeError(f"x: expected a (data, sf) pair, got {type(x).__name__}")
    data = matrix("x", x[0])
    x_sf = matrix("x_sf", x[1], "(num_tokens, hidden / num_per_channels)")
    if isinstance(num_per_channels, bool) or num_per_channels not in SF_CHANNELS:
        raise ValueError(f"num_per_channels: expected one of {', '.join(map(str, SF_CHANNELS))}, got "
                         f"{num_per_channels!r}")
    if x_sf.dtype not in (torch.float32, torch.int32):
        raise TypeError(f"x_sf: expected float32 scales or int32 packed UE8M0 words, got {x_sf.dtype}")
    hidden = int(data.shape[1])
    groups = (hidden + num_per_channels - 1) // num_per_channels
    sf_cols = (groups + 3) // 4 if x_sf.dtype == torch.int32 else groups
    if tuple(x_sf.shape) != (data.shape[0], sf_cols):
        what = "int32 UE8M0 words (four groups a word)" if x_sf.dtype == torch.int32 else "float32 scales"
        raise ValueError(f"x_sf: expected shape ({data.shape[0]}, {sf_cols}) of {what} for x of shape "
                         f"{tuple(data.shape)} and num_per_channels={num_per_channels}, got {tuple(x_sf.shape)}")
    pos, pos_to_expert = _check_mapping(int(data.shape[0]), token_topk_to_pos, pos_to_expert)
    if data.dtype not in _DATA_DTYPES:
        raise TypeError(f"x: expected data of one of {', '.join(map(str, _DATA_DTYPES))}, got {data.dtype}")
    rows = _units("x", data, _ROWS_WITH_SF)
    _check_units("x", rows, _ROWS_WITH_SF)
    col_major = bool(use_tma_aligned_col_major_sf)
    kernel = _launcher(int(rows.shape[1]), _ROWS_WITH_SF, True, "col_major" if col_major else "row_major")
    out_data = out(0) if rows is data else out(0, view=_data)
    if col_major:
        return launch(kernel, rows, x_sf.view(torch.int32), pos, pos_to_expert, out_data, out(1, view=_sf_storage),
                      outputs=_COL_MAJOR_OUTPUTS[data.dtype, x_sf.dtype])
    return launch(kernel, rows, x_sf.view(torch.int32), pos, pos_to_expert, out_data, out(1, view=_words),
                  outputs=(empty(data.dtype, size(pos_to_expert, 0), hidden),
                           empty(x_sf.dtype, size(pos_to_expert, 0), sf_cols)))
