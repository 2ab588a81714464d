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
from collections.abc import Callable

import torch

from .._args import copied_into, matrix, not_built, one_of, out_tensors, positive_int
from .._runtime import (
    custom_op,
    dispatch,
    fast_path,
    from_input,
    from_out,
    get_kernel,
    output,
    remember,
    same_size,
    size_of,
)
from ..errors import KernelArgumentError

__all__ = ["swiglu_forward_and_per_token_cast"]

_kernel = get_kernel("swiglu_forward_and_per_token_cast")

# Per device index: the 1-element (int32 positions, fp32 (1, 1) weights) placeholders passed for
# absent optional tensors, which the variant built without them never reads. Nothing reads or
# writes them, so one pair per device serves every call: no allocation per call (the op used to
# allocate one even when given both tensors), which out= callers would otherwise still pay.
_placeholders: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _not_built(argument: str, what: str) -> NotImplementedError:
    return not_built(argument, what, "swiglu_forward_and_per_token_cast")


def _outputs(
    x: torch.Tensor,
    npc: int,
    round_sf: bool,
    pos_to_token_topk: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    pos_to_expert: torch.Tensor | None,
    clamp: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf); also the fake (meta) kernel that torch.compile traces with."""
    return _fresh(x, npc)


def _fresh(x: torch.Tensor, npc: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, sf) for x and npc."""
    rows, hidden = int(x.shape[0]), int(x.shape[1]) // 2
    q = x.new_empty((rows, hidden), dtype=torch.float8_e4m3fn)
    sf = x.new_empty((rows, hidden // npc), dtype=torch.float32)
    return q, sf


def _launch(
    x: torch.Tensor,
    npc: int,
    round_sf: bool,
    pos_to_token_topk: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    pos_to_expert: torch.Tensor | None,
    clamp: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The custom op's body: a launch into fresh outputs."""
    return _run(x, npc, round_sf, pos_to_token_topk, topk_weights, pos_to_expert, clamp, None)


def _run(
    x: torch.Tensor,
    npc: int,
    round_sf: bool,
    pos_to_token_topk: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    pos_to_expert: torch.Tensor | None,
    clamp: float,
    out: object,
    key: tuple[object, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the variant and launch it into fresh (q, sf), or into out's (checked by the launcher,
    overlaps included); the launcher is then stored under key (None: a call not cached)."""
    launch = _kernel.select(hidden=int(x.shape[1]) // 2, npc=npc, with_weights=topk_weights is not None,
                            with_pos_to_expert=pos_to_expert is not None)
    q, sf = _fresh(x, npc) if out is None else out_tensors(out, ("q", "sf"))
    round_flag = int(round_sf)
    launch(x, q, sf, *_optional(x, pos_to_token_topk, topk_weights, pos_to_expert), clamp, round_flag)
    if key is not None:  # the launcher accepted the call: later ones of its signature may skip the checks
        _CALLS[key] = (launch, clamp, round_flag, npc)
    return q, sf


def _optional(x: torch.Tensor, pos_to_token_topk: torch.Tensor | None, topk_weights: torch.Tensor | None,
              pos_to_expert: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The optional tensors as the launcher takes them: an absent one is the device's placeholder."""
    if pos_to_token_topk is None or pos_to_expert is None:
        placeholders = _placeholders.get(x.get_device())
        if placeholders is None:  # also for CPU tensors (-1), which the launcher then refuses by name
            placeholders = _placeholders[x.get_device()] = (x.new_empty((1,), dtype=torch.int32),
                                                            x.new_empty((1, 1), dtype=torch.float32))
        if pos_to_token_topk is None:
            pos_to_token_topk, topk_weights = placeholders
        if pos_to_expert is None:
            pos_to_expert = placeholders[0]
    return pos_to_token_topk, topk_weights, pos_to_expert  # type: ignore[return-value]


# What torch.compile sees: one opaque op with a fixed schema.
_swiglu_forward_op = custom_op("swiglu_forward_and_per_token_cast", fake=_outputs)(_launch)


def _positions(name: str, t: object, rows: int) -> torch.Tensor:
    """An int32 (num_expanded_tokens,) index tensor, or a TypeError / ValueError naming it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape ({rows},), got {type(t).__name__}")
    if t.dim() != 1 or int(t.shape[0]) != rows:
        raise ValueError(f"{name}: expected shape ({rows},) (one entry per row of x), got {tuple(t.shape)}")
    return t


# Eager calls, keyed by what the checks and select read: (x.dtype, x's width, fmt,
# num_per_channels, which optional tensors are given, the flags, swiglu_clamp_value) -> (the
# launcher, its clamp, its round_sf flag, npc). A key is stored only after the checks passed and
# the launcher accepted the call, so a hit skips both; the launcher checks every tensor on every
# call, and where it refuses one the checks run, to name it. The lengths of pos_to_token_topk
# and pos_to_expert are sizes of their own in the contract (num_positions, num_expert_positions:
# the launcher cannot tie them to x's rows), so the hit checks them. Only options of exactly the
# types str, int, bool and (the clamp) None or float are keyed: 128.0 == 128 and True == 1 hash
# alike, but positive_int refuses the float and the bool.
_CALLS: dict[tuple[object, ...], tuple[Callable[..., None], float, int, int]] = {}
# The same calls in one C call (_runtime.dispatch): keyed by x's dtype and width, which of the
# optional tensors are given and the options as passed; the launcher's contract checks every
# tensor, and the rules are the position lengths that _run_cached checks (sizes of their own in the
# contract). An allocating call (out None) has dispatch() allocate (q, sf) as _fresh does.
_FAST = fast_path(inputs=((1,), (), (), ()), outputs=2)


def _remember_fast(hit: tuple[Callable[..., None], float, int, int], result: tuple[torch.Tensor, torch.Tensor],
                   x: torch.Tensor, pos_to_token_topk: object, topk_weights: object, pos_to_expert: object, out: object,
                   *options: object) -> None:
    """Let dispatch() take later calls like this one (options: those after out in its dispatch call), which
    returned ``result``; an allocating call (out None) allocates (q, sf) as it did: a row per row of x, the
    widths fixed by the key (x's width, num_per_channels)."""
    launch, clamp, round_flag, _ = hit
    q, sf = result
    placeholders = _placeholders.get(x.get_device(), (None, None))  # what _optional passed for absent tensors
    arguments = (from_input(0), from_out(0), from_out(1),
                 placeholders[0] if pos_to_token_topk is None else from_input(1),
                 placeholders[1] if topk_weights is None else from_input(2),
                 placeholders[0] if pos_to_expert is None else from_input(3), clamp, round_flag)
    rules = [same_size(3, 0, 0, 0)] if pos_to_token_topk is not None else []
    if pos_to_expert is not None:
        rules.append(same_size(5, 0, 0, 0))
    remember(_FAST, launch, arguments, rules, x, pos_to_token_topk, topk_weights, pos_to_expert, out, *options,
             outputs=(output(q.dtype, size_of(0, 0), q.shape[1]), output(sf.dtype, size_of(0, 0), sf.shape[1])))


def _key(x: object, fmt: object, num_per_channels: object, pos_to_token_topk: object, topk_weights: object,
         pos_to_expert: object, use_tma_aligned_col_major_sf: object, round_sf: object, use_packed_ue8m0: object,
         swiglu_clamp_value: object) -> tuple[object, ...] | None:
    """The cache key of an eager call on a 2-D tensor x with plainly typed options; None for anything else
    (a call while compiling included). A None key is never stored: its lookup misses."""
    if torch.compiler.is_compiling() or not (
            isinstance(x, torch.Tensor) and x.dim() == 2 and type(fmt) is str and type(num_per_channels) is int
            and type(use_tma_aligned_col_major_sf) is bool and type(round_sf) is bool
            and type(use_packed_ue8m0) is bool and (swiglu_clamp_value is None or type(swiglu_clamp_value) is float)):
        return None
    return (x.dtype, x.shape[1], fmt, num_per_channels, pos_to_token_topk is None, topk_weights is None,
            pos_to_expert is None, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, swiglu_clamp_value)


def _run_cached(hit: tuple[Callable[..., None], float, int, int], x: torch.Tensor,
                pos_to_token_topk: object, topk_weights: torch.Tensor | None, pos_to_expert: object,
                out: object) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The call through a cached launcher, or None where the checks must run (a position tensor of
    another length than x's rows, or tensors the launcher refused)."""
    rows = x.shape[0]
    for positions in (pos_to_token_topk, pos_to_expert):
        if positions is not None and not (isinstance(positions, torch.Tensor) and positions.shape == (rows,)):
            return None
    launch, clamp, round_flag, npc = hit
    q, sf = _fresh(x, npc) if out is None else out_tensors(out, ("q", "sf"))
    try:
        launch(x, q, sf, *_optional(x, pos_to_token_topk, topk_weights, pos_to_expert),  # type: ignore[arg-type]
               clamp, round_flag)
    except KernelArgumentError:
        return None
    return q, sf


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
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
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
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        done = dispatch(_FAST, x, pos_to_token_topk, topk_weights, pos_to_expert, out, fmt, num_per_channels,
                        use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, swiglu_clamp_value, clamped_count,
                        sf_clamp_min)
        if done is not None:
            return done  # type: ignore[no-any-return]
    # What follows out in the dispatch call above, for remember(): the same objects in the same order.
    options = (fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, swiglu_clamp_value,
               clamped_count, sf_clamp_min)
    key = None
    if clamped_count is None and sf_clamp_min is None:
        key = _key(x, fmt, num_per_channels, pos_to_token_topk, topk_weights, pos_to_expert,
                   use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, swiglu_clamp_value)
        hit = _CALLS.get(key)
        if hit is not None:
            result = _run_cached(hit, x, pos_to_token_topk, topk_weights, pos_to_expert, out)  # type: ignore[arg-type]
            if result is not None:  # dispatch() had not seen it, or declined
                _remember_fast(hit, result, x, pos_to_token_topk, topk_weights, pos_to_expert, out, *options)  # type: ignore[arg-type]
                return result
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
    if pos_to_token_topk is not None:
        pos_to_token_topk = _positions("pos_to_token_topk", pos_to_token_topk, rows)
        topk_weights = matrix("topk_weights", topk_weights, "(num_tokens, num_topk)")
    if pos_to_expert is not None:
        pos_to_expert = _positions("pos_to_expert", pos_to_expert, rows)
    clamp = math.inf
    if swiglu_clamp_value is not None:
        clamp = float(swiglu_clamp_value)
        if not clamp > 0:  # also refuses NaN
            raise ValueError(f"swiglu_clamp_value: expected a positive float or None, got {swiglu_clamp_value!r}")

    args = (x, npc, bool(round_sf), pos_to_token_topk, topk_weights, pos_to_expert, clamp)
    if torch.compiler.is_compiling():
        result = _swiglu_forward_op(*args)
        return result if out is None else copied_into(out, ("q", "sf"), result)
    result = _run(*args, out, key)
    if key is not None:  # _run stored the launcher under key
        _remember_fast(_CALLS[key], result, x, pos_to_token_topk, topk_weights, pos_to_expert, out, *options)
    return result
