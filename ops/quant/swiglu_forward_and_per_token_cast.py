"""SwiGLU forward fused with the per-token FP8 cast (TileKernels' ``swiglu_forward_and_per_token_cast``).

y = min(xl, c) * sigmoid(min(xl, c)) * clamp(xr, -c, c) * topk_weight, then per-token e4m3 with
one scale per 128 channels or per row. A NaN in x stays NaN through the clamps (as torch.clamp)
and gets the e4m3 NaN code; a group's scale skips it (as TileKernels' kernels).
This build covers the row-major fp32 scale layout; the
column-major / UE8M0 layouts, ``clamped_count`` and ``sf_clamp_min`` raise NotImplementedError.
The launcher validates every tensor (dtype, device, shape, strides) and names it in its errors;
this module checks the non-tensor arguments and the shapes that tie the tensors together.
"""

from __future__ import annotations

import math

import torch

from .._args import matrix, not_built, one_of, positive_int
from .._op import Plan, Rule, empty, launch, op, out, same_size, size
from .._runtime import get_kernel

__all__ = ["swiglu_forward_and_per_token_cast"]

_kernel = get_kernel("swiglu_forward_and_per_token_cast")

# Per device index: the 1-element (int32 positions, fp32 (1, 1) weights) placeholders passed for
# absent optional tensors, which the variant built without them never reads. Nothing reads or
# writes them, so one pair per device serves every call: no allocation per call, and dispatch
# replays a call with them as constants.
_placeholders: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _not_built(argument: str, what: str) -> NotImplementedError:
    return not_built(argument, what, "swiglu_forward_and_per_token_cast")


def _positions(name: str, t: object, rows: int) -> torch.Tensor:
    """An int32 (num_expanded_tokens,) index tensor, or a TypeError / ValueError naming it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape ({rows},), got {type(t).__name__}")
    if t.dim() != 1 or int(t.shape[0]) != rows:
        raise ValueError(f"{name}: expected shape ({rows},) (one entry per row of x), got {tuple(t.shape)}")
    return t


def _placeholder_pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The device's (int32 (1,), fp32 (1, 1)) stand-ins for absent optional tensors."""
    pair = _placeholders.get(x.get_device())
    if pair is None:  # also for CPU tensors (-1), which the launcher then refuses by name
        pair = _placeholders[x.get_device()] = (x.new_empty((1,), dtype=torch.int32),
                                                x.new_empty((1, 1), dtype=torch.float32))
    return pair


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
) -> Plan:
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
        use_tma_aligned_col_major_sf, use_packed_ue8m0: not built (must be False).
        round_sf: round each scale up to a power of two.
        swiglu_clamp_value: c > 0 or None: xl = min(xl, c), xr = clamp(xr, -c, c).
        clamped_count, sf_clamp_min: not built (must be None).
        out: ``(q, sf)`` to write into instead of allocating, each exactly as this call would
            return it (dtype, shape, contiguous; e.g. the pair of an earlier call), not
            overlapping the inputs; returned as given. Every row is written except those that
            pos_to_expert skips, which are unspecified as in the allocating call (eagerly they
            keep what out held; under torch.compile the result is copied, those rows too).

    Returns:
        ``(q, sf)``: q float8_e4m3fn (num_expanded_tokens, hidden) and sf float32
        (num_expanded_tokens, hidden / num_per_channels), row-major, with q * sf ~ y per group.
    """
    x = matrix("x", x, "(num_expanded_tokens, 2 * hidden)")
    one_of("fmt", fmt, ("e4m3",))
    npc = positive_int("num_per_channels", num_per_channels)
    if use_tma_aligned_col_major_sf:
        raise _not_built("use_tma_aligned_col_major_sf", "the column-major TMA-aligned scale layout")
    if use_packed_ue8m0:
        raise _not_built("use_packed_ue8m0", "the packed UE8M0 scale layout")
    if clamped_count is not None:
        raise _not_built("clamped_count", "counting the clamped activations")
    if sf_clamp_min is not None:
        raise _not_built("sf_clamp_min", "a custom amax floor")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x: expected dtype torch.bfloat16, got {x.dtype}")
    rows, width = int(x.shape[0]), int(x.shape[1])
    if width % 256 != 0:
        raise ValueError(f"x: the width 2 * hidden ({width}) must be a multiple of 256 (hidden % 128 == 0)")
    hidden = width // 2
    if npc not in (128, hidden):
        raise ValueError(f"num_per_channels: expected 128 or hidden ({hidden}), got {npc}")
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

    launcher = _kernel.variant(hidden, npc, topk_weights is not None, pos_to_expert is not None)
    placeholders: tuple[torch.Tensor, ...] = ()
    if pos_to_token_topk is None or pos_to_expert is None:
        positions, weights = placeholders = _placeholder_pair(x)
        if pos_to_token_topk is None:
            pos_to_token_topk, topk_weights = positions, weights
        if pos_to_expert is None:
            pos_to_expert = positions
    return launch(launcher, x, out(0), out(1), pos_to_token_topk, topk_weights, pos_to_expert, clamp,
                  int(bool(round_sf)),
                  outputs=(empty(torch.float8_e4m3fn, size(x, 0), hidden),
                           empty(torch.float32, size(x, 0), hidden // npc)),
                  rules=rules, constants=placeholders)
