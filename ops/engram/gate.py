"""engram.engram_gate_fwd / engram_gate_bwd: the Engram context gate with fused RMSNorm, and its gradients.

TileKernels' ``engram_gate_fwd`` and ``engram_gate_bwd`` (KERNELS.md, "Engram"); kernels in
kernels/engram/gate_fwd.py.j2 and gate_bwd.py.j2, one variant per hidden size of
kernel_specs/engram_gate.yaml. The number of tokens, the number of heads (hc_mult) and the
strides of k and v are runtime sizes. The backward's weight gradient comes out as one partial row
per block of its persistent grid, sized from the device's SM count at run time;
``grad_w_reduce`` sums them into the two RMSNorm weights' gradients.
"""

from __future__ import annotations

import torch

from .._args import real
from .._op import Plan, empty, launch, op, out, size
from .._runtime import get_kernel, sm_count

__all__ = ["engram_gate_bwd", "engram_gate_fwd"]

_fwd = get_kernel("engram_gate_fwd")
_bwd = get_kernel("engram_gate_bwd")

# Blocks of the backward's grid per SM: a block of up to 256 threads holds its head's weight row
# and its weight-gradient row in registers, which leaves room for two per SM.
_BWD_BLOCKS_PER_SM = 2  # the template's min_blocks


def _rows(name: str, x: object, dims: int = 3) -> torch.Tensor:
    """``x`` as a ``dims``-D tensor of rows, or a TypeError / ValueError naming it."""
    shape = "(num_tokens, hc_mult, hidden)" if dims == 3 else "(num_tokens, hidden)"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {shape}, got {type(x).__name__}")
    if x.dim() != dims:
        raise ValueError(f"{name}: expected a {dims}-D tensor {shape}, got shape {tuple(x.shape)}")
    return x


def _inference(output: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
    return output, None, None, None, None


def _check(hidden_states: object, k: object, v: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden_states, k, v = _rows("hidden_states", hidden_states), _rows("k", k), _rows("v", v, 2)
    if k.shape != hidden_states.shape:
        raise ValueError(f"k: expected the shape of hidden_states {tuple(hidden_states.shape)}, got {tuple(k.shape)}")
    rows = (hidden_states.shape[0], hidden_states.shape[2])
    if v.shape != rows:
        raise ValueError(f"v: expected shape (num_tokens, hidden) = {rows}, got {tuple(v.shape)}")
    return hidden_states, k, v


@op(outputs=("output", "dot", "gate_score", "rstd_x", "rstd_k"), inputs={"hidden_states": (2,)}, out=False)
def engram_gate_fwd(
    hidden_states: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_fused: torch.Tensor,
    eps: float,
    clamp_value: float,
    save_for_backward: bool = True,
) -> Plan:
    """The Engram gate: ``x + sigmoid(signed_sqrt(dot(RMSNorm(x), RMSNorm(k)) / sqrt(H))) * v`` per head.

    Args:
        hidden_states: bf16 CUDA tensor (num_tokens, hc_mult, hidden), contiguous.
        k: bf16 (num_tokens, hc_mult, hidden), unit last stride; the other strides multiples of 8
            (a view such as a slice of a wider projection is fine).
        v: bf16 (num_tokens, hidden), unit last stride, row stride a multiple of 8.
        weight_fused: fp32 (hc_mult, hidden), the product of the two RMSNorm weights
            (``fused_weight(weight_hidden, weight_embed)``), contiguous.
        eps: the RMSNorm epsilon. clamp_value: the floor of |d| under the square root.
        save_for_backward: also return the statistics ``engram_gate_bwd`` needs.

    Returns:
        ``(output, dot, gate_score, rstd_x, rstd_k)``: output bf16 like hidden_states; fp32
        (num_tokens, hc_mult) each: the raw dot sum(x * w * k), the gate, rsqrt(mean(x^2) + eps)
        and rsqrt(mean(k^2) + eps). With save_for_backward=False the last four are None.
        sign(0) is 0 (a zero dot gives gate 0.5), as in the torch reference.
    """
    hidden_states, k, v = _check(hidden_states, k, v)
    eps, clamp_value = real("eps", eps), real("clamp_value", clamp_value)
    save = bool(save_for_backward)
    rows = empty(torch.bfloat16, size(hidden_states, 0), size(hidden_states, 1), size(hidden_states, 2))
    if not save:
        launcher = _fwd.variant(int(hidden_states.shape[2]), False)
        return launch(launcher, hidden_states, k, v, weight_fused, out(0), eps, clamp_value,
                      outputs=(rows,), then=_inference)
    stats = empty(torch.float32, size(hidden_states, 0), size(hidden_states, 1))
    launcher = _fwd.variant(int(hidden_states.shape[2]), True)
    return launch(launcher, hidden_states, k, v, weight_fused, out(0), out(1), out(2), out(3), out(4), eps,
                  clamp_value, outputs=(rows, stats, stats, stats, stats))


def persistent_blocks(num_tokens: int, hc_mult: int, device: int) -> int:
    """Rows of the backward's grad_w_partial: its blocks per head, at most one per token."""
    if device < 0:
        return 1  # a tensor elsewhere: the launcher refuses it by name
    return min(num_tokens, max(1, sm_count(device) * _BWD_BLOCKS_PER_SM // max(hc_mult, 1)))


@op(outputs=("grad_x", "grad_k", "grad_v", "grad_w_partial"), inputs={"hidden_states": (2,)}, out=False)
def engram_gate_bwd(
    grad_out: torch.Tensor,
    hidden_states: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_fused: torch.Tensor,
    dot: torch.Tensor,
    gate_score: torch.Tensor,
    rstd_x: torch.Tensor,
    rstd_k: torch.Tensor,
    clamp_value: float,
) -> Plan:
    """The gradients of ``engram_gate_fwd`` by hidden_states, k, v and the fused weight.

    Args:
        grad_out: bf16 (num_tokens, hc_mult, hidden), contiguous: the gradient of the output.
        hidden_states, k, v, weight_fused: the forward's inputs (the same layouts).
        dot, gate_score, rstd_x, rstd_k: the forward's saved fp32 (num_tokens, hc_mult) statistics.
        clamp_value: the forward's clamp_value.

    Returns:
        ``(grad_x, grad_k, grad_v, grad_w_partial)``: bf16 like hidden_states (contiguous), bf16
        like hidden_states, bf16 (num_tokens, hidden), and fp32 (P, hc_mult, hidden): P partial sums
        over tokens of the fused weight's gradient (P from the device's SM count, at most
        num_tokens), which ``grad_w_reduce`` reduces (or ``grad_w_partial.sum(0)``).
    """
    hidden_states, k, v = _check(hidden_states, k, v)
    grad_out = _rows("grad_out", grad_out)
    clamp_value = real("clamp_value", clamp_value)
    num_tokens, hc_mult, hidden = (int(s) for s in hidden_states.shape)
    blocks = persistent_blocks(num_tokens, hc_mult, hidden_states.get_device())
    launcher = _bwd.variant(hidden)
    rows = empty(torch.bfloat16, size(hidden_states, 0), size(hidden_states, 1), size(hidden_states, 2))
    return launch(launcher, grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k,
                  out(0), out(1), out(2), out(3), clamp_value,
                  outputs=(rows, rows, empty(torch.bfloat16, size(hidden_states, 0), size(hidden_states, 2)),
                           empty(torch.float32, blocks, size(hidden_states, 1), size(hidden_states, 2))))
