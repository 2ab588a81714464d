"""Plain-torch references for the fused SwiGLU + FP8 cast kernels (KERNELS.md, "Quantization").

The SwiGLU math runs in fp32 in the kernels' order, operation by operation, so that on the
same device the only possible difference is the last-ulp rounding of exp (torch's exp and the
kernels' IEEE expf are both correctly rounded to within one ulp, not necessarily identical).
Divisions are tensor / tensor (IEEE; a Python-scalar divisor may become a multiplication by a
rounded reciprocal on CUDA). The casts are ``swiglu_cast``: the bit-exact per-token cast of
tests/reference/quant.py for finite values, with the SwiGLU kernels' own rule for NaN and Inf.

Non-finite values (the kernels' rule, TileKernels' where its reference and its kernels agree):
the clamps keep NaN, as torch.clamp does (the kernels use min.NaN / max.NaN, not fminf / fmaxf),
so a NaN x gives a NaN activation with or without a clamp; a missing clamp is +inf in the
kernels, and skipping it here is the same function. A group's amax skips NaN (fmaxf, as
TileKernels' kernels): the NaN's code is the e4m3 NaN and the group's scale comes from its other
values. An Inf amax gives sf = Inf and the factor 0, as in the per-channel casts.
"""

from __future__ import annotations

import torch

from tests.reference.numeric import fma_f32
from tests.reference.quant import codes
from tests.reference.quant_per_channel import skip_nan_scales_from_amax


def row_weights(
    num_rows: int,
    pos_to_token_topk: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor:
    """float32 (num_rows, 1): topk_weights.flat[pos] for 0 <= pos < T * K, 0 for other positions,
    1 without weights."""
    if topk_weights is None or pos_to_token_topk is None:
        return torch.ones(num_rows, 1, dtype=torch.float32, device=device)
    flat = topk_weights.float().reshape(-1)
    pos = pos_to_token_topk.long()
    valid = (pos >= 0) & (pos < flat.numel())
    w = torch.zeros(num_rows, dtype=torch.float32, device=device)
    w[valid] = flat[pos[valid]]
    return w.reshape(num_rows, 1)


def swiglu(x: torch.Tensor, clamp: float | None) -> torch.Tensor:
    """fp32 (N, H) = min(xl, c) / (1 + exp(-min(xl, c))) * clamp(xr, -c, c) of x (N, 2H)."""
    hidden = x.shape[1] // 2
    left, right = x[:, :hidden].float(), x[:, hidden:].float()
    if clamp is not None:
        left = torch.clamp(left, max=clamp)
        right = torch.clamp(right, min=-clamp, max=clamp)
    return left / (1 + torch.exp(-left)) * right


def swiglu_cast(y: torch.Tensor, npc: int, round_sf: bool = False,
                amax_floor: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The SwiGLU kernels' per-token e4m3 cast of y (N, H): (q float8_e4m3fn (N, H), sf fp32 (N, H / npc)).

    Per group of npc values: amax = max |y| skipping NaN, then skip_nan_scales_from_amax (sf = Inf and
    the factor 0 for an Inf amax). Codes of y * factor: nearest even, saturating at +-448, NaN -> 0x7F.
    For finite y this is tests/reference/quant.py's per_token_cast_ref to the bit.
    """
    rows, hidden = y.shape
    groups = y.float().reshape(rows, hidden // npc, npc)
    magnitude = groups.abs()
    amax = torch.where(torch.isnan(magnitude), torch.zeros_like(magnitude), magnitude).amax(dim=-1)
    sf, factor = (skip_nan_scales_from_amax(amax, round_sf) if amax_floor is None
                  else skip_nan_scales_from_amax(amax, round_sf, amax_floor))
    return codes((groups * factor.unsqueeze(-1)).reshape(rows, hidden), "e4m3"), sf


def swiglu_forward_ref(
    x: torch.Tensor,
    pos_to_token_topk: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    clamp: float | None = None,
) -> torch.Tensor:
    """fp32 (N, H): swiglu(x) times each row's top-k weight (the value the per-token cast quantizes)."""
    w = row_weights(x.shape[0], pos_to_token_topk, topk_weights, x.device)
    return swiglu(x, clamp) * w


def swiglu_forward_and_per_token_cast_ref(
    x: torch.Tensor,
    num_per_channels: int,
    pos_to_token_topk: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    round_sf: bool = False,
    clamp: float | None = None,
    sf_clamp_min: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q e4m3 (N, H), sf fp32 (N, H / npc)) for every row; the kernel skips rows whose
    pos_to_expert is -1, so comparisons mask those rows. sf_clamp_min replaces the amax floor 1e-4."""
    y = swiglu_forward_ref(x, pos_to_token_topk, topk_weights, clamp)
    return swiglu_cast(y, num_per_channels, round_sf, sf_clamp_min)


def clamped_counts_ref(x: torch.Tensor, clamp: float, rows: torch.Tensor | None = None) -> torch.Tensor:
    """int64 (3,): how many xl > c, xr > c and xr < -c in x (N, 2H), over the rows where ``rows`` is True (all
    rows without it): clamped_count's increments (TileKernels' order)."""
    hidden = x.shape[1] // 2
    kept = x if rows is None else x[rows]
    left, right = kept[:, :hidden].float(), kept[:, hidden:].float()
    return torch.stack([(left > clamp).sum(), (right > clamp).sum(), (right < -clamp).sum()]).to(torch.int64)


def swiglu_backward_ref(
    x: torch.Tensor,
    x_sf: torch.Tensor,
    grad_out: torch.Tensor,
    weight: torch.Tensor,
    pos_to_token_topk: torch.Tensor,
    token_topk_to_pos: torch.Tensor,
    num_per_channels: int,
    round_sf: bool = False,
    clamp: float | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out bf16, (q, sf), x_grad bf16, weight_grad fp32, grad fp32 (N, 2H)) as the kernel computes them.

    weight_grad sums in torch's order (the kernel's order differs: compare with a tolerance).
    """
    rows, width = x.shape
    hidden = width // 2
    npc = num_per_channels
    full = x.float() * x_sf.float().repeat_interleave(npc, dim=1)
    xf, yf = full[:, :hidden], full[:, hidden:]
    if clamp is not None:
        clamped_x = xf > clamp
        clamped_y = (yf > clamp) | (yf < -clamp)
        xf = torch.where(clamped_x, torch.full_like(xf, clamp), xf)
        yf = torch.clamp(yf, min=-clamp, max=clamp)
    else:
        clamped_x = torch.zeros_like(xf, dtype=torch.bool)
        clamped_y = clamped_x
    w = row_weights(rows, pos_to_token_topk, weight, x.device)
    g = grad_out.float()
    t = 1 + torch.exp(-xf)
    act = xf / t * yf
    s = torch.ones_like(t) / t
    gws = g * w * s
    zero = torch.zeros((), dtype=torch.float32, device=x.device)
    dx = torch.where(clamped_x, zero, gws * yf * fma_f32(xf, 1 - s, 1.0))
    dy = torch.where(clamped_y, zero, gws * xf)
    grad = torch.cat([dx, dy], dim=1)
    q, q_sf = swiglu_cast(grad, npc, round_sf)

    weight_grad = torch.zeros(weight.shape, dtype=torch.float32, device=x.device)
    pos = pos_to_token_topk.long()
    valid = (pos >= 0) & (pos < weight.numel())
    sums = (g * act).sum(dim=1)
    weight_grad.view(-1)[pos[valid]] = sums[valid]
    return (act * w).bfloat16(), (q, q_sf), grad.bfloat16(), weight_grad, grad


def swiglu_forward_and_per_channel_cast_and_transpose_ref(
    x: torch.Tensor,
    num_per_tokens: int,
    round_sf: bool = False,
    without_transpose: bool = False,
    clamp: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q e4m3 (H, T) or (T, H), sf fp32 (T / npt, H)): the bf16-rounded activation cast per
    channel over groups of npt tokens (a per-token cast of its transpose)."""
    act = swiglu(x, clamp).bfloat16()
    q_t, sf_t = swiglu_cast(act.t().contiguous(), num_per_tokens, round_sf)
    q = q_t.t().contiguous() if without_transpose else q_t
    return q, sf_t.t().contiguous()


def expert_major_routing(num_tokens: int, num_topk: int, num_experts: int = 8, alignment: int = 16, seed: int = 0,
                         device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pos_to_expert, pos_to_token_topk, token_topk_to_pos) of a random top-k routing laid out
    expert-major (as get_fused_mapping lays it out), each expert's segment padded with -1 rows to a
    multiple of ``alignment``; tokens keep their order inside an expert. Built on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    topk_idx = torch.rand(num_tokens, num_experts, generator=gen).argsort(dim=1)[:, :num_topk]
    flat = topk_idx.reshape(-1)
    order = torch.sort(flat, stable=True).indices  # (token, k) pairs, expert-major, token order inside
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + alignment - 1) // alignment * alignment
    starts = torch.cumsum(padded, 0) - padded
    first = torch.cumsum(counts, 0) - counts
    experts = flat[order]
    pos = starts[experts] + torch.arange(flat.numel()) - first[experts]
    rows = int(padded.sum())
    pos_to_expert = torch.full((rows,), -1, dtype=torch.int32)
    pos_to_expert[pos] = experts.to(torch.int32)
    pos_to_token_topk = torch.full((rows,), -1, dtype=torch.int32)
    pos_to_token_topk[pos] = order.to(torch.int32)
    token_topk_to_pos = torch.full((num_tokens * num_topk,), -1, dtype=torch.int32)
    token_topk_to_pos[order] = pos.to(torch.int32)
    return (pos_to_expert.to(device), pos_to_token_topk.to(device),
            token_topk_to_pos.reshape(num_tokens, num_topk).to(device))
