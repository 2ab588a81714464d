"""The scale-factor layouts of the per-token casts (KERNELS.md, "Shared quantization rules"): row-major fp32,
fp32 column-major over a (columns, align(T, 4)) storage (``use_tma_aligned_col_major_sf``), and packed UE8M0
words laid out the same way (``use_packed_ue8m0``); what the kernels take for them, and the checks that name sf.

A helper of the quant op modules (tkc copies ``ops/quant/_*.py`` beside them into the wheel).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from .._args import column_storage
from ..errors import KernelArgumentError

__all__ = ["ColumnMajor", "check_scales", "column_major_storage", "given_scales", "scale_layout", "scale_width",
           "storage_view", "stored_codes", "ue8m0_bytes", "ue8m0_values", "word_bytes"]

_FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)  # torch's packed FP4 dtype, where this torch has it


def stored_codes(q: torch.Tensor) -> torch.Tensor:
    """Quantized codes as the kernels read them: torch's packed FP4 dtype viewed as int8 (the same bytes, element
    2i in the low nibble); any other dtype as it is."""
    return q.view(torch.int8) if _FP4X2 is not None and q.dtype == _FP4X2 else q


def scale_layout(col_major: bool, round_sf: bool, packed: bool) -> str:
    """The sf_layout grid value of the three flags (use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0), or a
    ValueError naming the flag: UE8M0 needs both of the others (KERNELS.md)."""
    if packed and not col_major:
        raise ValueError("use_packed_ue8m0: packed UE8M0 scales are stored column-major; pass "
                         "use_tma_aligned_col_major_sf=True with it")
    if packed and not round_sf:
        raise ValueError("use_packed_ue8m0: a UE8M0 byte holds a power-of-two scale; pass round_sf=True with it")
    return "ue8m0" if packed else "col_major" if col_major else "row_major"


def scale_width(hidden: int, npc: int, sf_layout: str) -> tuple[int, torch.dtype]:
    """(columns, dtype) of the (T, columns) scale tensor the op returns in sf_layout: G = ceil(hidden / npc)
    groups (the last one partial where npc does not divide hidden), UE8M0 four to a word."""
    groups = -(-hidden // npc)
    return ((groups + 3) // 4, torch.int32) if sf_layout == "ue8m0" else (groups, torch.float32)


class ColumnMajor(NamedTuple):
    """Allocates uninitialised (q, sf) for x with sf = storage.T[:T] of a (columns, align(T, 4)) storage, as
    TileKernels does: strides (1, align(T, 4)); the padding tokens T .. align(T, 4) - 1 are never written.
    (A value, so that torch.compile sees the same recipe on every trace.)"""

    fmt: str
    npc: int
    sf_layout: str
    x_columns: int = 1  # x's columns per channel: 2 for the SwiGLU forward, whose x holds both halves
    block_m: int = 1  # tokens per scale row: a per-block cast's rows of blocks take the tokens' place
    fp4_x: bool = False  # x holds FP4 codes two to a byte (a re-cast's input): hidden is twice its columns

    def __call__(self, x: torch.Tensor, *_others: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, storage = self.storage(x)
        return q, storage.T[:-(-int(x.shape[0]) // self.block_m)]

    def storage(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, the (columns, align(rows, 4)) storage of sf): for callers that hand the kernel the storage itself."""
        num_tokens, hidden = x.shape[0], x.shape[1] * (2 if self.fp4_x else 1) // self.x_columns
        e4m3 = self.fmt == "e4m3"
        q = x.new_empty((num_tokens, hidden // (1 if e4m3 else 2)), dtype=torch.float8_e4m3fn if e4m3 else torch.int8)
        width, dtype = scale_width(hidden, self.npc, self.sf_layout)
        rows = -(-num_tokens // self.block_m)
        return q, x.new_empty((width, (rows + 3) // 4 * 4), dtype=dtype)


def column_major_storage(sf: torch.Tensor) -> torch.Tensor:
    """The (columns, P) storage behind a column-major sf of the op's shape (an out sf must be a view with strides
    (1, P), P >= T, over whole storage, as the op returns it): what the kernel takes for col_major."""
    storage = column_storage(sf)
    if storage is not None:
        return storage
    if sf.shape[0] == 0:  # nothing is written: any storage of that rank will do
        return sf.new_empty((sf.shape[1], 0))
    raise KernelArgumentError(
        f"sf: expected the column-major layout per_token_cast returns with these flags, strides (1, P) "
        f"with P >= {sf.shape[0]} over whole storage, got strides {tuple(sf.stride())}; pass the sf of an "
        "earlier call with the same flags, or torch.empty((G, align(T, 4)), ...).T[:T]")


def ue8m0_bytes(sf: torch.Tensor) -> torch.Tensor:
    """What the kernel takes for UE8M0 words sf: the bytes (columns, P, 4) of their storage."""
    return word_bytes(column_major_storage(sf))


def word_bytes(storage: torch.Tensor) -> torch.Tensor:
    """The bytes (columns, P, 4) of an int32 (columns, P) storage of UE8M0 words."""
    return storage.view(torch.uint8).view(*storage.shape, 4)


def storage_view(sf_layout: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """What the kernel takes for an sf of a column-major layout: the fp32 storage, or the bytes of the words'."""
    return column_major_storage if sf_layout == "col_major" else ue8m0_bytes


def check_scales(sf: torch.Tensor, shape: Sequence[int], npc: int, sf_layout: str, block_m: int = 1,
                 name: str = "sf") -> None:
    """sf of the dtype and shape the op returns for the flags and x's (num_tokens, hidden) ``shape`` (one row per
    block_m tokens), or an error naming sf (``name``)."""
    num_tokens, hidden = shape
    width, dtype = scale_width(hidden, npc, sf_layout)
    rows = -(-num_tokens // block_m)
    if sf.dtype != dtype or tuple(sf.shape) != (rows, width):
        raise KernelArgumentError(f"{name}: expected {dtype} of shape {(rows, width)} for this layout, "
                                  f"got {sf.dtype} of shape {tuple(sf.shape)}")


def given_scales(sf: object, shape: Sequence[int], npc: int, sf_layout: str, name: str = "sf") -> torch.Tensor:
    """The tensor the kernel reads for user scales in ``sf_layout`` of an x of ``shape``; errors name sf (``name``).

    row_major: float32 (T, G) as given (the launcher checks it is contiguous). col_major: the
    float32 (T, G) values as the (G, P) storage, read in place when sf is a view with strides
    (1, P) over whole storage (what per_token_cast returns), else copied. ue8m0: int32 (T, G / 4)
    words, the same way, seen as bytes (G / 4, P, 4).
    """
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of scale factors, got {type(sf).__name__}")
    check_scales(sf, shape, npc, sf_layout, name=name)
    if sf_layout == "row_major":
        return sf
    if column_storage(sf) is None:
        sf = sf.t().contiguous().t()  # a column-major copy over a storage of its own
    return column_major_storage(sf) if sf_layout == "col_major" else ue8m0_bytes(sf)


def ue8m0_values(words: torch.Tensor, groups: int) -> torch.Tensor:
    """The float32 scales (R, groups) of int32 UE8M0 words (R, ceil(groups / 4)) in any layout: byte g % 4 of word
    g / 4 is the biased exponent e of scale g, read as the float with bits e << 23, as the kernels read them
    (torch integer ops on the small scale tensor; the codes are not touched)."""
    shifts = torch.arange(0, 32, 8, dtype=torch.int32, device=words.device)
    exponents = (words.unsqueeze(-1) >> shifts) & 0xFF  # (R, W, 4); the AND undoes the sign's arithmetic shift
    return (exponents.reshape(words.shape[0], 4 * words.shape[1])[:, :groups] << 23).contiguous().view(torch.float32)
