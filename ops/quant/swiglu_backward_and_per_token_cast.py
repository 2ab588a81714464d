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

import torch

from .._args import matrix, positive_int
from .._op import Plan, empty, launch, op, out, size
from .._runtime import get_kernel

__all__ = ["swiglu_backward_and_per_token_cast"]

_kernel = get_kernel("swiglu_backward_and_per_token_cast")

# The op's outputs in its return order, as out= takes them.
_OUT_FORM = "(out, (x_grad_fp8, x_grad_fp8_sf), x_grad, weight_grad)"

_Results = tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor]


def _out_tensors(out: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The five tensors of out, nested as the op returns them, or a TypeError naming out."""
    if isinstance(out, (tuple, list)) and len(out) == 4 and isinstance(out[1], (tuple, list)) and len(out[1]) == 2:
        tensors = (out[0], out[1][0], out[1][1], out[2], out[3])
        if all(isinstance(t, torch.Tensor) for t in tensors):
            return tensors
    raise TypeError(f"out: expected {_OUT_FORM} as the op returns it (tensors), got {type(out).__name__}")


def _check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...], meaning: str) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape} ({meaning}), got {tuple(t.shape)}")


def _nested(act: torch.Tensor, q: torch.Tensor, q_sf: torch.Tensor, x_grad: torch.Tensor,
            weight_grad: torch.Tensor) -> _Results:
    """The five outputs as the op returns them."""
    return act, (q, q_sf), x_grad, weight_grad


def _nested_zeroed(act: torch.Tensor, q: torch.Tensor, q_sf: torch.Tensor, x_grad: torch.Tensor,
                   weight_grad: torch.Tensor) -> _Results:
    """_nested, for a call without rows: no expanded row owns any (token, k) pair, the grid is empty and
    nothing was launched, so the pairs' zero gradients are written here (after the launcher checked
    weight_grad)."""
    return act, (q, q_sf), x_grad, weight_grad.zero_()


# The op on x's two tensors and the five outputs flat (what the op layer's out= takes); the
# public op nests them. Every call ends in a `then` (the nesting, and the zeroing without rows,
# which a replayed call could not do: no rule can refuse N == 0), so no call is remembered by
# dispatch and none is keyed for it (no inputs=).
@op(outputs=("out", "x_grad_fp8", "x_grad_fp8_sf", "x_grad", "weight_grad"),
    name="swiglu_backward_and_per_token_cast")
def _backward(data: torch.Tensor, sf: torch.Tensor, grad_out: torch.Tensor, weight: torch.Tensor,
              pos_to_token_topk: torch.Tensor, token_topk_to_pos: torch.Tensor, num_per_channels: int,
              round_sf: bool, swiglu_clamp_value: float | None) -> Plan:
    data = matrix("x", data, "(N, 2 * hidden)")
    sf = matrix("x_sf", sf, "(N, 2 * hidden / num_per_channels)")
    npc = positive_int("num_per_channels", num_per_channels)
    if npc not in (32, 128):
        raise ValueError(f"num_per_channels: expected 32 or 128, got {npc}")
    if data.dtype != torch.float8_e4m3fn:
        raise TypeError(f"x: expected the data of dtype torch.float8_e4m3fn, got {data.dtype}")
    rows, width = int(data.shape[0]), int(data.shape[1])
    if width % 512 != 0 or width == 0:
        raise ValueError(f"x: the width 2 * hidden ({width}) must be a positive multiple of 512 (hidden % 256 == 0)")
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

    # The variant built for this hidden, else the one for any hidden (the grid's hidden = 0).
    launcher = _kernel.find(width // 2, npc) or _kernel.variant(0, npc)
    return launch(launcher, data, sf, grad_out, weight, pos_to_token_topk, token_topk_to_pos,
                  out(0), out(1), out(2), out(3), out(4), clamp, int(bool(round_sf)),
                  outputs=(empty(torch.bfloat16, size(data, 0), width // 2),
                           empty(torch.float8_e4m3fn, size(data, 0), width),
                           empty(torch.float32, size(data, 0), width // npc),
                           empty(torch.bfloat16, size(data, 0), width),
                           empty(torch.float32, size(weight, 0), size(weight, 1))),
                  then=_nested if rows > 0 else _nested_zeroed)


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
            contiguous; hidden % 256 == 0. data may also be (B, S, 2 * hidden), as TileKernels
            takes it: its rows are then the N = B * S rows of data.view(-1, 2 * hidden).
        grad_out: bf16 (N, hidden) (or any shape of N * hidden elements, viewed so), the
            gradient of the weighted activation.
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
    if not (isinstance(x, tuple) and len(x) == 2):
        raise TypeError(f"x: expected the pair (data, sf) of an FP8 per-token cast, got {type(x).__name__}")
    data = x[0]
    if isinstance(data, torch.Tensor) and data.dim() == 3:  # (B, S, 2H): TileKernels views it as rows
        data = data.view(-1, data.shape[-1])
        if isinstance(grad_out, torch.Tensor):
            grad_out = grad_out.view(-1, data.shape[-1] // 2)
    return _backward(data, x[1], grad_out, weight, pos_to_token_topk, token_topk_to_pos,  # type: ignore[no-any-return]
                     num_per_channels, round_sf, swiglu_clamp_value, out=None if out is None else _out_tensors(out))
