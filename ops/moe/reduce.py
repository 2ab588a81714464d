"""moe.reduce_fused: fused expert-major rows back to tokens, and the autograd pair expand/reduce.

``reduce_fused`` runs the prebuilt ``moe_reduce`` kernel (kernels/moe/reduce.py.j2):
out[t] = sum over k (in k order, fp32, no FMA contraction) of w[t, k] * x_sf[pos] * x[pos]
with pos = token_topk_to_pos[t, k] >= 0; output of x's dtype (bf16 for an fp8 x), or e4m3
(acc * sf, clamped to +-448). The kernel reads K, T and N at run time; hidden (a multiple of 256)
takes the variant built for it where the spec has one, else the one for any hidden (the grid's
hidden 0). A weighted variant also runs unweighted calls (its weights an empty placeholder), so
the unweighted ones are built only where they are hot.

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

from .._args import matrix, one_of, placeholders
from .._op import Plan, empty, launch, op, out, pair, same_size, size, size_is
from .._runtime import dtype_name, get_kernel
from ._expand import expand_to_fused

__all__ = ["ExpandToFused", "ReduceFused", "expand_to_fused_autograd", "reduce_fused", "reduce_fused_autograd"]

_kernel = get_kernel("moe_reduce")
HIDDEN_MULTIPLE = 256
FP8 = torch.float8_e4m3fn
# x's dtypes, each with the output dtype of fp8_format '' (TileKernels returns x's dtype; fp8 rows, a tkc
# extension, sum into bf16).
OUT_DTYPES = {torch.bfloat16: torch.bfloat16, torch.float32: torch.float32, FP8: torch.bfloat16}
# device index -> float32 tensors of no elements, for x_sf (0,), topk_weights (0, 0) and sf (0,),
# passed for the parameters a call leaves out. They have no memory to write or read, so one set per
# device serves every call (the plan's constants: no allocation per call, and they live across CUDA
# graph captures, which never touch them).
_nothing: dict[object, tuple[torch.Tensor, ...]] = {}


def _vector(name: str, t: object, length: int, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a float32 torch.Tensor {what}, got {type(t).__name__}")
    if t.dtype != torch.float32 or t.dim() != 1 or t.shape[0] != length:
        raise ValueError(f"{name}: expected a float32 tensor of shape ({length},) {what}, got {t.dtype} "
                         f"{tuple(t.shape)}")
    return t


# Keyed: x's hidden, with x_sf, topk_weights and sf each keyed by whether it is given (dispatch keys an
# absent input apart). The rules state the sizes the contract leaves free: x_sf's length that of x's rows,
# topk_weights' shape that of token_topk_to_pos, sf's length 1.
@op(outputs=("out",), positional_out=True,
    inputs={"x": pair((1,), ()), "topk_weights": (), "token_topk_to_pos": (), "sf": ()})
def reduce_fused(
    x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    topk_weights: torch.Tensor | None,
    token_topk_to_pos: torch.Tensor,
    fp8_format: str = "",
    sf: torch.Tensor | None = None,
) -> Plan:
    """Sum the fused rows of each token, weighted: out[t] = sum_k w[t, k] * x[token_topk_to_pos[t, k]].

    Args:
        x: bf16 or fp32 (num_expanded_tokens, hidden), or a pair (data, x_sf float32
            (num_expanded_tokens,)) whose rows are scaled by x_sf, data bf16, fp32 or
            float8_e4m3fn (fp8 rows always come with their scales); hidden a multiple of 256.
        topk_weights: float32 (num_tokens, num_topk), or None for an unweighted sum.
        token_topk_to_pos: int32 (num_tokens, num_topk), -1 = slot not routed (contributes 0).
        fp8_format: '' (x's dtype out; bf16 for fp8 rows) or 'e4m3'.
        sf: float32 (1,) output scale for e4m3 (out = cast(acc * sf)); None means 1.
        out: a contiguous (num_tokens, hidden) tensor of the output dtype to write into
            instead of allocating (not overlapping the inputs), returned as given.

    Returns:
        (num_tokens, hidden) of x's dtype (bf16 for fp8 rows), or float8_e4m3fn for fp8_format='e4m3'.
    """
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
    if x.dtype not in OUT_DTYPES:
        raise TypeError(f"x: expected bfloat16, float32 or float8_e4m3fn rows, got {x.dtype}")
    no_x_sf, no_weights, no_sf = nothing = placeholders(
        _nothing, x, ((0,), torch.float32), ((0, 0), torch.float32), ((0,), torch.float32))
    rules = []
    if x_sf is not None:
        x_sf = _vector("x_sf", x_sf, int(x.shape[0]), "(num_expanded_tokens,)")
        rules.append(same_size("x_sf", x_sf, 0, x, 0))
    elif x.dtype == FP8:
        raise ValueError("x: float8_e4m3fn data needs its per-row scales: pass x as (data, x_sf)")
    if sf is not None:
        if fp8_format != "e4m3":
            raise ValueError("sf: an output scale needs fp8_format='e4m3'")
        sf = _vector("sf", sf, 1, "(a scalar in a 1-element tensor)")
        if sf is x_sf:  # one tensor as both: a replay, which takes inputs by position, could not tell them apart
            sf = sf.view(1)  # (not the caller's: not remembered)
        rules.append(size_is("sf", sf, 0, 1))
    elif fp8_format == "e4m3":
        sf = x.new_ones((1,), dtype=torch.float32)  # made here: such a call is not remembered
    weighted = topk_weights is not None
    if topk_weights is not None:
        topk_weights = matrix("topk_weights", topk_weights, "(num_tokens, num_topk)")
        if tuple(topk_weights.shape) != tuple(pos.shape):
            raise ValueError(f"topk_weights: expected shape {tuple(pos.shape)} (that of token_topk_to_pos), got "
                             f"{tuple(topk_weights.shape)}")
        topk_weights = topk_weights.contiguous()
        rules += [same_size("topk_weights", topk_weights, d, pos, d) for d in (0, 1)]
    out_dtype = FP8 if fp8_format == "e4m3" else OUT_DTYPES[x.dtype]
    # Neither built: the error names the variant asked for and lists what the build has.
    kernel = (find_variant(hidden, x.dtype, out_dtype, weighted)
              or _kernel.variant(hidden, dtype_name(x.dtype), dtype_name(out_dtype), weighted))
    return launch(kernel, x, no_x_sf if x_sf is None else x_sf, no_weights if topk_weights is None else topk_weights,
                  pos, out(0), no_sf if sf is None else sf, outputs=(empty(out_dtype, size(pos, 0), hidden),),
                  rules=rules, constants=nothing)


def find_variant(hidden: int, x_dtype: torch.dtype, out_dtype: torch.dtype,
                 weighted: bool) -> Callable[..., None] | None:
    """The moe_reduce variant for a call, or None where none is built: the one built for this hidden where
    there is one, else the one for any hidden (grid value 0); for an unweighted call the unweighted variant
    first, else the weighted one (its weights a placeholder). Grid order: hidden, in_dtype, out_dtype,
    with_weights."""
    names = (dtype_name(x_dtype), dtype_name(out_dtype))
    for size_key in (hidden, 0):
        for form in dict.fromkeys((weighted, True)):
            found = _kernel.find(size_key, *names, form)
            if found is not None:
                return found
    return None


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
