"""mhc.expand_to_mhc and its backward: the (..., H) bf16 hidden state copied into mhc_mult streams.

TileKernels 1.0.0 exposes ``expand_to_mhc(hidden, mhc_mult, out=None)`` (an autograd function in
``tile_kernels.modeling.mhc.ops``) over its ``expand_to_mhc_fwd_tl`` / ``expand_to_mhc_bwd_tl``
kernels; here ``expand_to_mhc`` is the forward kernel's op and ``expand_to_mhc_bwd`` the backward's
(``modeling.mhc`` adds the autograd). num_tokens, mhc_mult and hidden are runtime sizes;
kernel_specs/mhc.yaml builds a variant with 16-byte vectors (hidden % 8 == 0) and one for any hidden.
Leading dimensions are flattened into tokens (a call with exactly one leading dimension takes the
dispatch fast path; others stay on the Python path, through views).
"""

from __future__ import annotations

import torch

from .._args import positive_int
from .._op import Plan, Result, empty, launch, op, result, size
from .._op import out as output
from .._runtime import get_kernel
from ._shapes import check_out

__all__ = ["expand_to_mhc", "expand_to_mhc_bwd"]

_kernel = get_kernel("mhc_expand")


def _tensor(name: str, x: object, min_dim: int, shape: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {shape}, got {type(x).__name__}")
    if x.dim() < min_dim:
        raise ValueError(f"{name}: expected a tensor of shape {shape}, got shape {tuple(x.shape)}")
    return x


def _vec(hidden: int) -> int:
    return 8 if hidden % 8 == 0 else 1


# hidden is keyed (dimension 1): it picks the vector width, so a call is replayed only for its own hidden.
@op(outputs=("out",), inputs={"hidden": (1,)})
def expand_to_mhc(hidden: torch.Tensor, mhc_mult: int, *, out: torch.Tensor | None = None) -> Plan | Result:
    """Copy hidden into mhc_mult streams: ``out[..., j, :] = hidden[..., :]`` for every j < mhc_mult.

    Args:
        hidden: bfloat16 CUDA tensor (..., hidden_size), contiguous (at least 1-D).
        mhc_mult: the number of streams (a positive int).
        out: the bfloat16 (..., mhc_mult, hidden_size) tensor to write into instead (contiguous, not
            overlapping hidden); returned as given.

    Returns:
        bfloat16 (..., mhc_mult, hidden_size), bit-exact copies.
    """
    x = _tensor("hidden", hidden, 1, "(..., hidden_size)")
    m = positive_int("mhc_mult", mhc_mult)
    h = int(x.shape[-1])
    if x.dim() == 2:
        return launch(_kernel.variant("fwd", _vec(h)), x, output(0),
                      outputs=(empty(torch.bfloat16, size(x, 0), m, size(x, 1)),))
    # Other leading dimensions: the same op over the flattened tokens, viewed back (a plan, not a closure over
    # the shape: torch.compile keys a traced plan by its functions).
    shape = (*x.shape[:-1], m, h)
    check_out(out, shape)
    flat = expand_to_mhc(x.reshape(-1, h), m, out=None if out is None else out.view(-1, m, h))
    return result(out if out is not None else flat.view(shape))


@op(outputs=("hidden_grad",), inputs={"out_grad": (1, 2)})
def expand_to_mhc_bwd(out_grad: torch.Tensor, *, out: torch.Tensor | None = None) -> Plan | Result:
    """The backward of expand_to_mhc: ``hidden_grad = bf16(sum over j of out_grad[..., j, :])``.

    The sum runs in fp32 over j = 0, 1, ... from +0.0 and is rounded to bfloat16 once.

    Args:
        out_grad: bfloat16 CUDA tensor (..., mhc_mult, hidden_size), contiguous (at least 2-D).
        out: the bfloat16 (..., hidden_size) tensor to write into instead (contiguous, not overlapping
            out_grad); returned as given.

    Returns:
        bfloat16 (..., hidden_size).
    """
    g = _tensor("out_grad", out_grad, 2, "(..., mhc_mult, hidden_size)")
    m, h = int(g.shape[-2]), int(g.shape[-1])
    if g.dim() == 3:
        return launch(_kernel.variant("bwd", _vec(h)), g, output(0),
                      outputs=(empty(torch.bfloat16, size(g, 0), size(g, 2)),))
    shape = (*g.shape[:-2], h)
    check_out(out, shape)
    flat = expand_to_mhc_bwd(g.reshape(-1, m, h), out=None if out is None else out.view(-1, h))
    return result(out if out is not None else flat.view(shape))
