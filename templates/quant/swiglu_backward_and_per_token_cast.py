"""SwiGLU backward fused with the per-token FP8 cast of the input gradient
(TileKernels' ``swiglu_backward_and_per_token_cast``).

The forward input arrives as an FP8 pair (x (N, 2H) e4m3, x_sf (N, 2H / npc) fp32, as
per_token_cast makes it); the op returns the weighted activation (bf16), the FP8 gradient pair,
the bf16 gradient and the top-k weight gradient. A NaN in x stays NaN through the clamps (as
torch.clamp), so its row's outputs and weight gradient are NaN there; the gradient cast's scales
skip it. The launcher validates every tensor (dtype,
device, shape, strides) and names it in its errors; this module checks the other arguments
and the shapes that tie the tensors together.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .._args import matrix, positive_int
from .._runtime import custom_op, get_kernel
from ..errors import KernelArgumentError

__all__ = ["swiglu_backward_and_per_token_cast"]

_kernel = get_kernel("swiglu_backward_and_per_token_cast")


def _outputs(
    x: torch.Tensor,
    x_sf: torch.Tensor,
    grad_out: torch.Tensor,
    weight: torch.Tensor,
    pos_to_token_topk: torch.Tensor,
    token_topk_to_pos: torch.Tensor,
    npc: int,
    round_sf: bool,
    clamp: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uninitialised (out, x_grad_fp8, x_grad_fp8_sf, x_grad, weight_grad); also the fake kernel."""
    rows, width = int(x.shape[0]), int(x.shape[1])
    out = x.new_empty((rows, width // 2), dtype=torch.bfloat16)
    x_grad_fp8 = x.new_empty((rows, width), dtype=torch.float8_e4m3fn)
    x_grad_fp8_sf = x.new_empty((rows, width // npc), dtype=torch.float32)
    x_grad = x.new_empty((rows, width), dtype=torch.bfloat16)
    weight_grad = x.new_empty(tuple(weight.shape), dtype=torch.float32)
    return out, x_grad_fp8, x_grad_fp8_sf, x_grad, weight_grad


def _launch(
    x: torch.Tensor,
    x_sf: torch.Tensor,
    grad_out: torch.Tensor,
    weight: torch.Tensor,
    pos_to_token_topk: torch.Tensor,
    token_topk_to_pos: torch.Tensor,
    npc: int,
    round_sf: bool,
    clamp: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The custom op's body: a launch into fresh outputs."""
    outputs = _outputs(x, x_sf, grad_out, weight, pos_to_token_topk, token_topk_to_pos, npc, round_sf, clamp)
    return _run(x, x_sf, grad_out, weight, pos_to_token_topk, token_topk_to_pos, npc, round_sf, clamp, outputs)


def _run(
    x: torch.Tensor,
    x_sf: torch.Tensor,
    grad_out: torch.Tensor,
    weight: torch.Tensor,
    pos_to_token_topk: torch.Tensor,
    token_topk_to_pos: torch.Tensor,
    npc: int,
    round_sf: bool,
    clamp: float,
    outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[object, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pick the variant and launch it into outputs (fresh, or the caller's: the launcher checks every
    tensor, overlaps included, and names it in errors); the launcher is then stored under key
    (None: a call not cached)."""
    launch = _kernel.select(hidden=int(x.shape[1]) // 2, npc=npc)
    round_flag = int(round_sf)
    _launch_into(launch, (x, x_sf, grad_out, weight, pos_to_token_topk, token_topk_to_pos), outputs, clamp,
                 round_flag)
    if key is not None:  # the launcher accepted the call: later ones of its signature may skip the checks
        _CALLS[key] = (launch, clamp, round_flag)
    return outputs


def _launch_into(launch: Callable[..., None], inputs: tuple[torch.Tensor, ...],
                 outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                 clamp: float, round_flag: int) -> None:
    """launch with the six inputs, the five outputs and the two scalars; weight_grad zeroed without rows."""
    launch(*inputs, *outputs, clamp, round_flag)
    if inputs[0].shape[0] == 0:
        # No expanded row owns any (token, k) pair: the grid is empty and nothing was launched, so
        # the pairs' zero gradients are written here (after the launcher checked weight_grad).
        outputs[4].zero_()


# What torch.compile sees: one opaque op with a fixed schema.
_swiglu_backward_op = custom_op("swiglu_backward_and_per_token_cast", fake=_outputs)(_launch)


# The op's outputs in its return order, as out= takes them.
_OUT_FORM = "(out, (x_grad_fp8, x_grad_fp8_sf), x_grad, weight_grad)"


def _out_tensors(out: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The five tensors of out, nested as the op returns them, or a TypeError naming out."""
    if isinstance(out, (tuple, list)) and len(out) == 4 and isinstance(out[1], (tuple, list)) and len(out[1]) == 2:
        tensors = (out[0], out[1][0], out[1][1], out[2], out[3])
        for t in tensors:  # a loop, not all(<generator>): one object less per call
            if not isinstance(t, torch.Tensor):
                break
        else:
            return tensors
    raise TypeError(f"out: expected {_OUT_FORM} as the op returns it (tensors), got {type(out).__name__}")


def _check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...], meaning: str) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape} ({meaning}), got {tuple(t.shape)}")


# Eager calls, keyed by what the checks and select read: (the dtypes of x's pair, x's width,
# num_per_channels, round_sf, swiglu_clamp_value) -> (the launcher, its clamp, its round_sf
# flag). A key is stored only after the checks passed and the launcher accepted the call, so a
# hit skips both: the contract ties every size to x's rows, hidden and weight's shape, so the
# launcher checks every tensor on every call, and where it refuses one the checks run, to name
# it. Only options of exactly the types int, bool and (the clamp) None or float are keyed:
# 128.0 == 128 and True == 1 hash alike, but positive_int refuses the float and the bool.
_CALLS: dict[tuple[object, ...], tuple[Callable[..., None], float, int]] = {}


def _key(x: object, num_per_channels: object, round_sf: object,
         swiglu_clamp_value: object) -> tuple[object, ...] | None:
    """The cache key of an eager call with x a pair of 2-D tensors and plainly typed options; None for
    anything else (a call while compiling included). A None key is never stored: its lookup misses."""
    if torch.compiler.is_compiling() or not (
            type(x) is tuple and len(x) == 2 and isinstance(x[0], torch.Tensor) and isinstance(x[1], torch.Tensor)
            and x[0].dim() == 2 and type(num_per_channels) is int and type(round_sf) is bool
            and (swiglu_clamp_value is None or type(swiglu_clamp_value) is float)):
        return None
    return (x[0].dtype, x[1].dtype, x[0].shape[1], num_per_channels, round_sf, swiglu_clamp_value)


def swiglu_backward_and_per_token_cast(
    x: tuple[torch.Tensor, torch.Tensor],
    grad_out: torch.Tensor,
    weight: torch.Tensor,
    pos_to_token_topk: torch.Tensor,
    token_topk_to_pos: torch.Tensor,
    num_per_channels: int,
    round_sf: bool = False,
    swiglu_clamp_value: float | None = None,
    *,
    out: tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor]:
    """SwiGLU backward of the FP8 forward input x, with the input gradient cast to FP8 e4m3.

    Args:
        x: the pair (data float8_e4m3fn (N, 2 * hidden), sf float32 (N, 2 * hidden / npc)),
            contiguous; hidden % 512 == 0.
        grad_out: bf16 (N, hidden), the gradient of the weighted activation.
        weight: float32 (num_tokens, num_topk) top-k weights, contiguous.
        pos_to_token_topk: int32 (N,): row n's (token, k) pair as token * num_topk + k, or -1
            (padding: weight 0, no weight gradient).
        token_topk_to_pos: int32 (num_tokens, num_topk): the row of each pair, -1 for none.
        num_per_channels: 32 or 128, the group of x's scales and of the gradient's.
        round_sf: round each gradient scale up to a power of two.
        swiglu_clamp_value: c > 0 or None: the forward clamp; clamped elements get zero gradient.
        out: ``(out, (x_grad_fp8, x_grad_fp8_sf), x_grad, weight_grad)`` to write into instead
            of allocating, nested and each exactly as this call would return it (dtype, shape,
            contiguous; e.g. the result of an earlier call), not overlapping the inputs or each
            other. Every element is written (weight_grad is zeroed here when N is 0, as the
            allocating call does). The tensors are returned as given, in a new tuple.

    Returns:
        ``(out, (x_grad_fp8, x_grad_fp8_sf), x_grad, weight_grad)``: out bf16 (N, hidden) =
        swiglu(x) * weight; the gradient as an e4m3 (N, 2 * hidden) / float32 row-major scales
        pair and as bf16 (N, 2 * hidden); weight_grad float32 (num_tokens, num_topk) =
        sum over the row of grad_out * swiglu(x), 0 for pairs without a row.
    """
    key = _key(x, num_per_channels, round_sf, swiglu_clamp_value)
    hit = _CALLS.get(key)
    if hit is not None and isinstance(weight, torch.Tensor):  # weight's shape sizes weight_grad
        launch, clamp, round_flag = hit
        outputs = _outputs(x[0], x[1], grad_out, weight, pos_to_token_topk, token_topk_to_pos, num_per_channels,
                           round_sf, clamp) if out is None else _out_tensors(out)
        try:
            _launch_into(launch, (*x, grad_out, weight, pos_to_token_topk, token_topk_to_pos), outputs, clamp,
                         round_flag)
            return outputs[0], (outputs[1], outputs[2]), outputs[3], outputs[4]
        except KernelArgumentError:
            pass  # the checks below name what is wrong
    if not (isinstance(x, tuple) and len(x) == 2):
        raise TypeError(f"x: expected the pair (data, sf) of an FP8 per-token cast, got {type(x).__name__}")
    data = matrix("x", x[0], "(N, 2 * hidden)")
    sf = matrix("x_sf", x[1], "(N, 2 * hidden / num_per_channels)")
    npc = positive_int("num_per_channels", num_per_channels)
    if npc not in (32, 128):
        raise ValueError(f"num_per_channels: expected 32 or 128, got {npc}")
    if data.dtype != torch.float8_e4m3fn:
        raise TypeError(f"x: expected the data of dtype torch.float8_e4m3fn, got {data.dtype}")
    rows, width = int(data.shape[0]), int(data.shape[1])
    if width % 1024 != 0:
        raise ValueError(f"x: the width 2 * hidden ({width}) must be a multiple of 1024 (hidden % 512 == 0)")
    grad_out = matrix("grad_out", grad_out, "(N, hidden)")
    weight = matrix("weight", weight, "(num_tokens, num_topk)")
    token_topk_to_pos = matrix("token_topk_to_pos", token_topk_to_pos, "(num_tokens, num_topk)")
    if not isinstance(pos_to_token_topk, torch.Tensor):
        raise TypeError(f"pos_to_token_topk: expected a torch.Tensor, got {type(pos_to_token_topk).__name__}")
    _check_shape("x_sf", sf, (rows, width // npc), "one scale per num_per_channels channels of x")
    _check_shape("grad_out", grad_out, (rows, width // 2), "one row per row of x, hidden channels")
    _check_shape("pos_to_token_topk", pos_to_token_topk, (rows,), "one entry per row of x")
    _check_shape("token_topk_to_pos", token_topk_to_pos, tuple(weight.shape), "the shape of weight")
    clamp = math.inf
    if swiglu_clamp_value is not None:
        clamp = float(swiglu_clamp_value)
        if not clamp > 0:  # also refuses NaN
            raise ValueError(f"swiglu_clamp_value: expected a positive float or None, got {swiglu_clamp_value!r}")

    args = (data, sf, grad_out, weight, pos_to_token_topk, token_topk_to_pos, npc, bool(round_sf), clamp)
    if torch.compiler.is_compiling():
        result = _swiglu_backward_op(*args)
        if out is None:
            act, q, q_sf, x_grad, weight_grad = result
        else:  # torch.compile sees the pure op and five copies
            act, q, q_sf, x_grad, weight_grad = _out_tensors(out)
            act.copy_(result[0])
            q.copy_(result[1])
            q_sf.copy_(result[2])
            x_grad.copy_(result[3])
            weight_grad.copy_(result[4])
    else:
        outputs = _outputs(*args) if out is None else _out_tensors(out)
        act, q, q_sf, x_grad, weight_grad = _run(*args, outputs, key)
    return act, (q, q_sf), x_grad, weight_grad
