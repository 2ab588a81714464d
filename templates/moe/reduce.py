"""moe.reduce_fused: fused expert-major rows back to tokens, and the autograd pair expand/reduce.

``reduce_fused`` runs the prebuilt ``moe_reduce`` kernel (templates/moe/reduce.py.j2):
out[t] = sum over k (in k order, fp32, no FMA contraction) of w[t, k] * x_sf[pos] * x[pos]
with pos = token_topk_to_pos[t, k] >= 0; bf16 output, or e4m3 (acc * sf, clamped to +-448).
The kernel reads K, T and N at run time; hidden is compile-time (a multiple of 256).

``ExpandToFused`` / ``ReduceFused`` are torch.autograd Functions over the two ops, and
``expand_to_fused_autograd`` / ``reduce_fused_autograd`` their functional forms:
  d expand / d x          = reduce_fused(grad, None, token_topk_to_pos)   (unweighted sum)
  d reduce / d x          = expand_to_fused(grad * w[t, k] ...) per position: row pos gets
                            w[t, k] * grad[t], padding rows 0
  d reduce / d topk_weights[t, k] = <grad[t], x[pos]> (0 where pos < 0)
The weighted expand is computed in torch from expand_to_fused and pos_to_token_topk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._args import matrix, not_built, one_of, out_tensors
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
    same_size,
    size_is,
    size_of,
)
from ..errors import KernelArgumentError
from ._expand import expand_to_fused

__all__ = ["ExpandToFused", "ReduceFused", "expand_to_fused_autograd", "reduce_fused", "reduce_fused_autograd"]

_kernel = get_kernel("moe_reduce")
HIDDEN_MULTIPLE = 256
# device index -> float32 tensors of no elements, (0,) and (0, 0), passed for the parameters a
# variant does not read. They have no memory to write or read, so one pair per device serves
# every call (no allocation per call; they also live across CUDA graph captures, which never
# touch them).
_nothing: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _reduce(x: torch.Tensor, x_sf: torch.Tensor | None, topk_weights: torch.Tensor | None,
            token_topk_to_pos: torch.Tensor, fp8_format: str, sf: torch.Tensor | None) -> torch.Tensor:
    return _run(x, x_sf, topk_weights, token_topk_to_pos, fp8_format, sf, None)


# Launchers by (x.dtype, hidden, x_sf given, weighted, fp8_format), once a call of that form passed
# reduce_fused's checks and the launcher: later calls go straight to the launcher, which checks every
# tensor and overlap as those checks would (dimensions, the weights' and the mapping's shapes
# against each other, dtypes, strides); only where it refuses do the checks run, to name the
# argument or to make the mapping and weights contiguous.
_LAUNCHERS: dict[tuple[object, ...], Callable[..., None]] = {}
# reduce_fused(x or (x, x_sf), topk_weights, token_topk_to_pos, fp8_format, sf, out) in one C call
# (_runtime.dispatch), called as dispatch(_FAST, x, x_sf, topk_weights, token_topk_to_pos, sf, out,
# fp8_format): keyed by x's dtype and hidden, which of x_sf / topk_weights / sf are given (and their
# dtypes and ranks) and fp8_format; checked by the launcher's contract and the sizes it leaves free
# (x_sf's, topk_weights' and sf's: _remember_fast's rules, what _run_fast tests). An allocating call
# allocates out as _launch does: token_topk_to_pos's rows (input 3), hidden (keyed) wide.
_FAST = fast_path(inputs=((1,), (), (), (), ()), outputs=1)


def _run(x: torch.Tensor, x_sf: torch.Tensor | None, topk_weights: torch.Tensor | None,
         token_topk_to_pos: torch.Tensor, fp8_format: str, sf: torch.Tensor | None,
         out: torch.Tensor | None) -> torch.Tensor:
    """Launch into out, or into a fresh tensor; the launcher checks every tensor (out: also for overlaps)."""
    out_fp8 = fp8_format == "e4m3"
    hidden, weighted = int(x.shape[1]), topk_weights is not None
    # Grid order: hidden, in_dtype, out_dtype, with_weights.
    launch = _kernel.variant(hidden, dtype_name(x.dtype), "float8_e4m3fn" if out_fp8 else "bfloat16", weighted)
    out = _launch(launch, x, x_sf, topk_weights, token_topk_to_pos, out_fp8, sf, out)
    if not torch.compiler.is_compiling():
        _LAUNCHERS[(x.dtype, hidden, x_sf is not None, weighted, fp8_format)] = launch
    return out


def _launch(launch: Callable[..., None], x: torch.Tensor, x_sf: torch.Tensor | None,
            topk_weights: torch.Tensor | None, token_topk_to_pos: torch.Tensor, out_fp8: bool,
            sf: torch.Tensor | None, out: torch.Tensor | None) -> torch.Tensor:
    """launch, with out allocated if None and the shared empty tensor for each parameter not read."""
    if out is None:
        out = x.new_empty((token_topk_to_pos.shape[0], x.shape[1]),
                          dtype=torch.float8_e4m3fn if out_fp8 else torch.bfloat16)
    nothing = _nothing.get(x.get_device())
    if nothing is None:  # also for CPU tensors (-1), which the launcher then refuses by name
        nothing = _nothing[x.get_device()] = (x.new_empty((0,), dtype=torch.float32),
                                              x.new_empty((0, 0), dtype=torch.float32))
    if out_fp8 and sf is None:
        sf = x.new_ones((1,), dtype=torch.float32)
    launch(x, nothing[0] if x_sf is None else x_sf, nothing[1] if topk_weights is None else topk_weights,
           token_topk_to_pos, out, nothing[0] if sf is None else sf)
    return out


def _run_fast(x: object, topk_weights: torch.Tensor | None, token_topk_to_pos: object, fp8_format: object,
              sf: object, out: object) -> torch.Tensor | None:
    """The call through a remembered launcher, or None where reduce_fused's checks must run first (a
    form not seen yet, anything unusual, compiling, or tensors the launcher refused)."""
    x_sf = None
    if type(x) is tuple and len(x) == 2:
        x, x_sf = x
        if type(x_sf) is not torch.Tensor:
            return None
    if type(x) is not torch.Tensor or x.dim() != 2 or type(token_topk_to_pos) is not torch.Tensor \
            or token_topk_to_pos.dim() != 2 or not (sf is None or type(sf) is torch.Tensor) \
            or not (out is None or type(out) is torch.Tensor) or type(fp8_format) is not str:
        return None
    launch = _LAUNCHERS.get((x.dtype, x.shape[1], x_sf is not None, topk_weights is not None, fp8_format))
    if launch is None or torch.compiler.is_compiling() or (sf is not None and fp8_format != "e4m3"):
        return None
    # x_sf, topk_weights and sf have sizes of their own in the contract (a variant that does not read
    # one takes an empty tensor), so the launcher cannot tie them to x and the mapping: these are ours.
    if (x_sf is not None and x_sf.shape != (x.shape[0],)) or (sf is not None and sf.shape != (1,)) \
            or (topk_weights is not None and topk_weights.shape != token_topk_to_pos.shape):
        return None
    try:
        result = _launch(launch, x, x_sf, topk_weights, token_topk_to_pos, fp8_format == "e4m3", sf, out)
    except KernelArgumentError:
        return None  # reduce_fused's checks name what is wrong (or make the mapping contiguous and launch)
    # dispatch() had not seen it, or declined
    _remember_fast(launch, result, x, x_sf, topk_weights, token_topk_to_pos, sf, out, fp8_format)
    return result


def _remember_fast(launch: Callable[..., None], result: torch.Tensor, x: torch.Tensor, x_sf: torch.Tensor | None,
                   topk_weights: torch.Tensor | None, token_topk_to_pos: object, sf: torch.Tensor | None,
                   out: object, fp8_format: object) -> None:
    """Let dispatch() take later reduce_fused calls like this one (launched as given, into out or into
    ``result``, which it allocated) straight to launch.

    The launcher's arguments: x, x_sf, topk_weights, token_topk_to_pos, out, sf, where each optional
    tensor not given is the device's shared empty one (a constant of the entry: the key holds the
    device). The rules restate the sizes the contract leaves free, as _run_fast checks them. An
    allocating call allocates out as it did: one row per token of token_topk_to_pos (input 3).
    """
    if fp8_format == "e4m3" and sf is None:
        return  # _launch allocates the scale 1 on each call: no constant of the entry stands in for it
    nothing = _nothing[x.get_device()]
    rules = []
    if x_sf is not None:
        rules.append(same_size(1, 0, 0, 0))  # x_sf: one scale per row of x
    if topk_weights is not None:
        rules += (same_size(2, 0, 3, 0), same_size(2, 1, 3, 1))  # topk_weights: token_topk_to_pos's shape
    if sf is not None:
        rules.append(size_is(5, 0, 1))  # sf: one element
    arguments = (from_input(0), nothing[0] if x_sf is None else from_input(1),
                 nothing[1] if topk_weights is None else from_input(2), from_input(3), from_out(0),
                 nothing[0] if sf is None else from_input(4))
    remember(_FAST, launch, arguments, rules, x, x_sf, topk_weights, token_topk_to_pos, sf, out, fp8_format,
             outputs=(output(result.dtype, size_of(3, 0), result.shape[1]),))


def _fake_reduce(x: torch.Tensor, x_sf: torch.Tensor | None, topk_weights: torch.Tensor | None,
                 token_topk_to_pos: torch.Tensor, fp8_format: str, sf: torch.Tensor | None) -> torch.Tensor:
    dtype = torch.float8_e4m3fn if fp8_format == "e4m3" else torch.bfloat16
    return x.new_empty((token_topk_to_pos.shape[0], x.shape[1]), dtype=dtype)


_reduce_op = custom_op("moe_reduce_fused", fake=_fake_reduce)(_reduce)


def _vector(name: str, t: object, length: int, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a float32 torch.Tensor {what}, got {type(t).__name__}")
    if t.dtype != torch.float32 or t.dim() != 1 or t.shape[0] != length:
        raise ValueError(f"{name}: expected a float32 tensor of shape ({length},) {what}, got {t.dtype} "
                         f"{tuple(t.shape)}")
    return t


def reduce_fused(
    x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    topk_weights: torch.Tensor | None,
    token_topk_to_pos: torch.Tensor,
    fp8_format: str = "",
    sf: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sum the fused rows of each token, weighted: out[t] = sum_k w[t, k] * x[token_topk_to_pos[t, k]].

    Args:
        x: bf16 (num_expanded_tokens, hidden), or a pair (data float8_e4m3fn
            (num_expanded_tokens, hidden), x_sf float32 (num_expanded_tokens,)) whose rows are
            dequantized by their scale; hidden a multiple of 256.
        topk_weights: float32 (num_tokens, num_topk), or None for an unweighted sum (bf16 only).
        token_topk_to_pos: int32 (num_tokens, num_topk), -1 = slot not routed (contributes 0).
        fp8_format: '' (bf16 output) or 'e4m3'.
        sf: float32 (1,) output scale for e4m3 (out = cast(acc * sf)); None means 1.
        out: a contiguous (num_tokens, hidden) tensor of the output dtype to write into
            instead of allocating (not overlapping the inputs), returned as given.

    Returns:
        (num_tokens, hidden) bf16, or float8_e4m3fn for fp8_format='e4m3'.
    """
    if not torch.compiler.is_compiling():  # a signature seen before: one C call
        data, data_sf = x if type(x) in (tuple, list) and len(x) == 2 else (x, None)
        done = dispatch(_FAST, data, data_sf, topk_weights, token_topk_to_pos, sf, out, fp8_format)
        if done is not None:
            return done  # type: ignore[no-any-return]
    if type(topk_weights) is torch.Tensor or topk_weights is None:
        result = _run_fast(x, topk_weights, token_topk_to_pos, fp8_format, sf, out)
        if result is not None:
            return result
    x_sf = None
    if isinstance(x, tuple | list):
        if len(x) != 2:
            raise TypeError(f"x: expected a tensor or a (data, x_sf) pair, got a sequence of {len(x)}")
        x, x_sf = x
    x = matrix("x", x, "(num_expanded_tokens, hidden)")
    pos = matrix("token_topk_to_pos", token_topk_to_pos, "(num_tokens, num_topk)").contiguous()
    one_of("fp8_format", fp8_format, ("", "e4m3"))
    hidden = int(x.shape[1])
    if hidden % HIDDEN_MULTIPLE:
        raise ValueError(f"x: hidden ({hidden}) must be a multiple of {HIDDEN_MULTIPLE}")
    if out is not None:
        (out,) = out_tensors(out, ("out",))
    if x_sf is not None:
        if x.dtype != torch.float8_e4m3fn:
            raise not_built("x", f"per-row scales with {x.dtype} data (only float8_e4m3fn)", "moe_reduce")
        x_sf = _vector("x_sf", x_sf, int(x.shape[0]), "(num_expanded_tokens,)")
    elif x.dtype == torch.float8_e4m3fn:
        raise ValueError("x: float8_e4m3fn data needs its per-row scales: pass x as (data, x_sf)")
    if sf is not None:
        if fp8_format != "e4m3":
            raise ValueError("sf: an output scale needs fp8_format='e4m3'")
        sf = _vector("sf", sf, 1, "(a scalar in a 1-element tensor)")
    weights = topk_weights
    if topk_weights is not None:
        topk_weights = matrix("topk_weights", topk_weights, "(num_tokens, num_topk)")
        if tuple(topk_weights.shape) != tuple(pos.shape):
            raise ValueError(f"topk_weights: expected shape {tuple(pos.shape)} (that of token_topk_to_pos), got "
                             f"{tuple(topk_weights.shape)}")
        topk_weights = topk_weights.contiguous()
    if torch.compiler.is_compiling():
        result = _reduce_op(x, x_sf, topk_weights, pos, fp8_format, sf)
        return result if out is None else out.copy_(result)
    result = _run(x, x_sf, topk_weights, pos, fp8_format, sf, out)
    if pos is token_topk_to_pos and topk_weights is weights:  # the caller's tensors launched
        _remember_fast(_LAUNCHERS[(x.dtype, hidden, x_sf is not None, weights is not None, fp8_format)], result, x,
                       x_sf, weights, pos, sf, out, fp8_format)
    return result


class ExpandToFused(torch.autograd.Function):
    """expand_to_fused with a backward: the gradient of each token is the sum of its rows' gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, token_topk_to_pos: torch.Tensor,
                pos_to_expert: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(token_topk_to_pos)
        return expand_to_fused(x, token_topk_to_pos, pos_to_expert)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (token_topk_to_pos,) = ctx.saved_tensors
        return reduce_fused(grad.contiguous(), None, token_topk_to_pos), None, None


class ReduceFused(torch.autograd.Function):
    """reduce_fused (bf16, weighted) with gradients for x and topk_weights."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, topk_weights: torch.Tensor, token_topk_to_pos: torch.Tensor,
                pos_to_expert: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, topk_weights, token_topk_to_pos, pos_to_expert)
        return reduce_fused(x, topk_weights, token_topk_to_pos)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        x, topk_weights, token_topk_to_pos, pos_to_expert = ctx.saved_tensors
        grad = grad.contiguous()
        # Row pos of the expanded gradient is grad[t] for its (t, k); scale it by w[t, k] in fp32.
        expanded = expand_to_fused(grad, token_topk_to_pos, pos_to_expert)
        pos = token_topk_to_pos.long()
        routed = pos >= 0
        row_weight = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
        row_weight[pos[routed]] = topk_weights[routed].float()
        grad_x = (expanded.float() * row_weight[:, None]).to(x.dtype)
        # d out[t] / d w[t, k] = <grad[t], x[pos]>: the row dot products, in fp32, one k at a time
        # (a (T, K, H) fp32 gather would take gigabytes at production sizes).
        grad_f32 = grad.float()
        grad_w = torch.stack([(x[pos[:, k].clamp(min=0)].float() * grad_f32).sum(-1) for k in range(pos.shape[1])],
                             dim=1) * routed
        return grad_x, grad_w.to(topk_weights.dtype), None, None


def expand_to_fused_autograd(x: torch.Tensor, token_topk_to_pos: torch.Tensor,
                             pos_to_expert: torch.Tensor) -> torch.Tensor:
    """expand_to_fused that records its backward (ExpandToFused)."""
    out: torch.Tensor = ExpandToFused.apply(x, token_topk_to_pos, pos_to_expert)
    return out


def reduce_fused_autograd(x: torch.Tensor, topk_weights: torch.Tensor, token_topk_to_pos: torch.Tensor,
                          pos_to_expert: torch.Tensor) -> torch.Tensor:
    """reduce_fused (bf16, weighted) that records its backward (ReduceFused)."""
    out: torch.Tensor = ReduceFused.apply(x, topk_weights, token_topk_to_pos, pos_to_expert)
    return out
