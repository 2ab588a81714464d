"""SwiGLU forward fused with the per-token FP8 cast (TileKernels' ``swiglu_forward_and_per_token_cast``).

y = min(xl, c) * sigmoid(min(xl, c)) * clamp(xr, -c, c) * topk_weight, then per-token e4m3 with
one scale per 128 channels or per row. A NaN in x stays NaN through the clamps (as torch.clamp)
and gets the e4m3 NaN code; a group's scale skips it (as TileKernels' kernels).
Every hidden that is a multiple of 128 runs: the variants built for the common hiddens (row-major
scales) are preferred, and the variant for any hidden (the grid's hidden = 0) takes the rest and
every option: the column-major and packed UE8M0 scale layouts, ``clamped_count`` and ``sf_clamp_min``.
The launcher validates every tensor (dtype, device, shape, strides) and names it in its errors;
this module checks the non-tensor arguments and the shapes that tie the tensors together.
"""

from __future__ import annotations

import math

import torch

from .._args import matrix, one_of, out_tensors, placeholders, positive_int, real
from .._op import Plan, Result, Rule, empty, launch, op, result, same_size, size
from .._op import out as output  # the plan takes a parameter named out
from .._runtime import get_kernel
from ._scales import ColumnMajor, check_scales, scale_layout, storage_view, word_bytes

__all__ = ["swiglu_forward_and_per_token_cast"]

_kernel = get_kernel("swiglu_forward_and_per_token_cast")

# Stand-ins for absent optional tensors (placeholders): 1-element int32 positions, fp32 (1, 1) weights, int64
# counters, one set per device.
_stand_ins: dict[object, tuple[torch.Tensor, ...]] = {}
_AMAX_FLOOR = 1e-4  # e4m3's amax floor (TileKernels' clamp_min_value), unless sf_clamp_min replaces it


def _positions(name: str, t: object, rows: int) -> torch.Tensor:
    """An int32 (num_expanded_tokens,) index tensor, or a TypeError / ValueError naming it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape ({rows},), got {type(t).__name__}")
    if t.dim() != 1 or int(t.shape[0]) != rows:
        raise ValueError(f"{name}: expected shape ({rows},) (one entry per row of x), got {tuple(t.shape)}")
    return t


# The generic variant with clamped_count: it adds to the caller's counters, so they are an input it writes (as are q
# and sf, which swiglu_forward_and_per_token_cast allocates or takes from out=): an in-place op, which torch.compile
# sees writing exactly those three.
@op(name="swiglu_forward_and_per_token_cast_counted", out=False, mutates=("q", "sf", "clamped_count"))
def _counted(x: torch.Tensor, q: torch.Tensor, sf: torch.Tensor, pos_to_token_topk: torch.Tensor,
             topk_weights: torch.Tensor, pos_to_expert: torch.Tensor, clamped_count: torch.Tensor, clamp: float,
             round_sf: int, amax_floor: float, per_row: bool, sf_layout: str, with_weights: bool,
             with_pos_to_expert: bool) -> Plan:
    launcher = _kernel.variant(0, 0 if per_row else 128, with_weights, with_pos_to_expert, sf_layout, True)
    return launch(launcher, x, q, sf, pos_to_token_topk, topk_weights, pos_to_expert, clamped_count, clamp,
                  round_sf, amax_floor)


@op(outputs=("q", "sf"), inputs={"x": (1,), "pos_to_token_topk": (), "topk_weights": (), "pos_to_expert": ()})
def swiglu_forward_and_per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    pos_to_token_topk: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    pos_to_expert: torch.Tensor | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    swiglu_clamp_value: float | None = None,
    clamped_count: torch.Tensor | None = None,
    sf_clamp_min: float | None = None,
    *,
    out: object = None,
) -> Plan | Result:
    """SwiGLU of x's two halves, times the row's top-k weight, cast per token to FP8 e4m3.

    Args:
        x: bf16 CUDA tensor (num_expanded_tokens, 2 * hidden), contiguous; hidden % 128 == 0.
        fmt: ``'e4m3'``.
        num_per_channels: channels per scale: 128 or hidden.
        pos_to_token_topk: int32 (num_expanded_tokens,): row n's weight is
            ``topk_weights.flatten()[pos_to_token_topk[n]]`` (0 for a negative position).
            Given together with topk_weights, or neither (weight 1).
        topk_weights: float32 (num_tokens, num_topk), contiguous.
        pos_to_expert: int32 (num_expanded_tokens,); rows where it is -1 are skipped: their q
            and sf rows are left unwritten (unspecified, as in TileKernels).
        use_tma_aligned_col_major_sf: sf column-major over a (G, align(N, 4)) storage (npc 128 only).
        round_sf: round each scale up to a power of two.
        use_packed_ue8m0: sf as int32 words of four UE8M0 exponents, column-major as above (needs
            use_tma_aligned_col_major_sf and round_sf).
        swiglu_clamp_value: c > 0 or None: xl = min(xl, c), xr = clamp(xr, -c, c).
        clamped_count: int64 (3,) or None, with swiglu_clamp_value: the counts of xl > c, xr > c and
            xr < -c over the rows that are computed are added to it in place.
        sf_clamp_min: the amax floor (default 1e-4): sf = max(amax, sf_clamp_min) / 448.
        out: ``(q, sf)`` to write into instead of allocating, each exactly as this call would
            return it (dtype, shape, layout; e.g. the pair of an earlier call), not
            overlapping the inputs; returned as given. Every row is written except those that
            pos_to_expert skips, which are unspecified as in the allocating call (eagerly they
            keep what out held; under torch.compile the result is copied, those rows too).

    Returns:
        ``(q, sf)``: q float8_e4m3fn (num_expanded_tokens, hidden) and sf (num_expanded_tokens,
        hidden / num_per_channels) float32 (row-major, or column-major), or int32 UE8M0 words
        (num_expanded_tokens, ceil(G / 4)), with q * sf ~ y per group.
    """
    x = matrix("x", x, "(num_expanded_tokens, 2 * hidden)")
    one_of("fmt", fmt, ("e4m3",))
    npc = positive_int("num_per_channels", num_per_channels)
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x: expected dtype torch.bfloat16, got {x.dtype}")
    rows, width = int(x.shape[0]), int(x.shape[1])
    if width % 256 != 0:
        raise ValueError(f"x: the width 2 * hidden ({width}) must be a multiple of 256 (hidden % 128 == 0)")
    hidden = width // 2
    if npc not in (128, hidden):
        raise ValueError(f"num_per_channels: expected 128 or hidden ({hidden}), got {npc}")
    per_row = npc == hidden and npc != 128
    sf_layout = scale_layout(use_tma_aligned_col_major_sf, bool(round_sf), use_packed_ue8m0)
    if use_tma_aligned_col_major_sf and per_row:
        raise ValueError("use_tma_aligned_col_major_sf: the column-major layout takes groups of 128 channels; "
                         f"pass num_per_channels=128 with it (got {npc} = hidden)")
    if (pos_to_token_topk is None) != (topk_weights is None):
        missing = "pos_to_token_topk" if pos_to_token_topk is None else "topk_weights"
        raise ValueError(f"{missing}: pos_to_token_topk and topk_weights are given together or not at all")
    rules: list[Rule] = []  # the positions' lengths: sizes of their own in the contract
    if pos_to_token_topk is not None:
        pos_to_token_topk = _positions("pos_to_token_topk", pos_to_token_topk, rows)
        topk_weights = matrix("topk_weights", topk_weights, "(num_tokens, num_topk)")
        rules.append(same_size("pos_to_token_topk", pos_to_token_topk, 0, x, 0))
    if pos_to_expert is not None:
        pos_to_expert = _positions("pos_to_expert", pos_to_expert, rows)
        rules.append(same_size("pos_to_expert", pos_to_expert, 0, x, 0))
    clamp = math.inf
    if swiglu_clamp_value is not None:
        clamp = float(swiglu_clamp_value)
        if not clamp > 0:  # also refuses NaN
            raise ValueError(f"swiglu_clamp_value: expected a positive float or None, got {swiglu_clamp_value!r}")
    if clamped_count is not None:
        if swiglu_clamp_value is None:
            raise ValueError("clamped_count: counts the clamped values of a clamp; pass swiglu_clamp_value with it")
        if not isinstance(clamped_count, torch.Tensor):
            raise TypeError(f"clamped_count: expected a torch.Tensor, got {type(clamped_count).__name__}")
        if clamped_count.dtype != torch.int64 or tuple(clamped_count.shape) != (3,):
            raise ValueError(f"clamped_count: expected an int64 tensor of shape (3,), got {clamped_count.dtype} "
                             f"of shape {tuple(clamped_count.shape)}")
    amax_floor = _AMAX_FLOOR
    if sf_clamp_min is not None:
        amax_floor = real("sf_clamp_min", sf_clamp_min)
        if not amax_floor > 0:
            raise ValueError(f"sf_clamp_min: expected a positive float or None (the amax floor), got {sf_clamp_min!r}")

    with_weights, with_pos_to_expert = topk_weights is not None, pos_to_expert is not None
    npc_key = 0 if per_row else 128
    positions, weights, counters = stand_ins = placeholders(
        _stand_ins, x, ((1,), torch.int32), ((1, 1), torch.float32), ((1,), torch.int64))
    if pos_to_token_topk is None or topk_weights is None:
        pos_to_token_topk, topk_weights = positions, weights
    if pos_to_expert is None:
        pos_to_expert = positions
    hot = sf_layout == "row_major" and clamped_count is None and sf_clamp_min is None
    launcher = _kernel.find(hidden, npc_key, with_weights, with_pos_to_expert, "row_major", False) if hot else None
    if launcher is not None:
        return launch(launcher, x, output(0), output(1), pos_to_token_topk, topk_weights, pos_to_expert, clamp,
                      int(bool(round_sf)),
                      outputs=(empty(torch.float8_e4m3fn, size(x, 0), hidden),
                               empty(torch.float32, size(x, 0), hidden // npc)),
                      rules=rules, constants=stand_ins)
    if clamped_count is not None:
        return _counted_call(x, pos_to_token_topk, topk_weights, pos_to_expert, clamped_count, clamp, round_sf,
                             amax_floor, per_row, sf_layout, with_weights, with_pos_to_expert, rules, out)
    # Any hidden, every layout: the variant for a runtime hidden (the error names the hidden if it is not built).
    launcher = _kernel.variant(0, npc_key, with_weights, with_pos_to_expert, sf_layout, False)
    args = (pos_to_token_topk, topk_weights, pos_to_expert, counters, clamp, int(bool(round_sf)), amax_floor)
    if sf_layout == "row_major":
        return launch(launcher, x, output(0), output(1), *args,
                      outputs=(empty(torch.float8_e4m3fn, size(x, 0), hidden),
                               empty(torch.float32, size(x, 0), hidden // npc)),
                      rules=rules, constants=stand_ins)
    if out is not None:  # the kernel's view of out's sf (the launcher checks that view) assumes its shape
        check_scales(out_tensors(out, ("q", "sf"))[1], (x.shape[0], hidden), npc, sf_layout)
    return launch(launcher, x, output(0), output(1, view=storage_view(sf_layout)), *args,
                  outputs=ColumnMajor("e4m3", npc, sf_layout, x_columns=2),  # type: ignore[arg-type]  # a callable
                  rules=rules, constants=stand_ins)


def _counted_call(x: torch.Tensor, pos_to_token_topk: torch.Tensor, topk_weights: torch.Tensor,
                  pos_to_expert: torch.Tensor, clamped_count: torch.Tensor, clamp: float, round_sf: bool,
                  amax_floor: float, per_row: bool, sf_layout: str, with_weights: bool, with_pos_to_expert: bool,
                  rules: list[Rule], given: object) -> Result:
    """The call with clamped_count: (q, sf) allocated (or out=), then the in-place counted op writes all three.

    The kernel's view of a column-major sf is made from the storage allocated here, so that torch.compile can
    trace it; under torch.compile an out= is written by a copy, as the op layer does for every op.
    """
    hidden = int(x.shape[1]) // 2
    npc = hidden if per_row else 128
    for rule in rules:  # the positions' lengths, which the in-place op does not check
        if not rule.holds():
            raise rule.error()
    compiling = torch.compiler.is_compiling()
    if given is not None and not compiling:
        q, sf = out_tensors(given, ("q", "sf"))
        check_scales(sf, (x.shape[0], hidden), npc, sf_layout)
        kernel_sf = sf if sf_layout == "row_major" else storage_view(sf_layout)(sf)
    elif sf_layout == "row_major":
        q = x.new_empty((x.shape[0], hidden), dtype=torch.float8_e4m3fn)
        sf = kernel_sf = x.new_empty((x.shape[0], hidden // npc), dtype=torch.float32)
    else:
        q, storage = ColumnMajor("e4m3", npc, sf_layout, x_columns=2).storage(x)
        sf = storage.T[:x.shape[0]]
        kernel_sf = storage if sf_layout == "col_major" else word_bytes(storage)
    _counted(x, q, kernel_sf, pos_to_token_topk, topk_weights, pos_to_expert, clamped_count, clamp,
             int(bool(round_sf)), amax_floor, per_row, sf_layout, with_weights, with_pos_to_expert)
    if given is not None and compiling:
        targets = out_tensors(given, ("q", "sf"))
        q, sf = targets[0].copy_(q), targets[1].copy_(sf)
    return result((q, sf))
