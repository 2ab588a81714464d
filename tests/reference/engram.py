"""Plain-torch references for the Engram kernels (KERNELS.md, "Engram").

They run on CPU or GPU tensors. engram_hash is integer arithmetic (int64 products wrapping modulo
2^64, XOR, torch's floor ``%``), so the kernel matches it bit for bit. fused_weight is a product of
two bf16 values, exact in fp32. grad_w_reduce sums in the kernel's order (GRAD_W_SLICES contiguous
slices of the partials, each in row order from +0.0, the slice sums in slice order) and rounds each
product before its add as torch does, so it is bit-exact too; grad_w_reduce_torch_ref is TileKernels'
``grad_w_partial.sum(0)`` form, which the GPU tests hold to TileKernels' calc_diff < 1e-10.
"""

from __future__ import annotations

import torch

GRAD_W_SLICES = 4  # kernels/engram/grad_w_reduce.py.j2, Config.slices


def make_offsets(vocab_sizes: torch.Tensor) -> torch.Tensor:
    """int32 (L, (n - 1) * tables): per layer, the exclusive prefix sum of its flattened table sizes
    (table c of layer l starts at the sum of the sizes before it), as TileKernels' make_offsets."""
    flat = vocab_sizes.reshape(vocab_sizes.shape[0], -1)
    return flat.cumsum(1, dtype=torch.int32) - flat


def engram_hash_ref(ngram_token_ids: torch.Tensor, multipliers: torch.Tensor, vocab_sizes: torch.Tensor,
                    offsets: torch.Tensor) -> torch.Tensor:
    """int32 (L, T, (n - 1) * tables) embedding indices.

    h_i = XOR over k <= i of int64(ids[:, k]) * multipliers[l, k] (int64, wrapping); for each i >= 1 the
    columns (i - 1) * tables + j hold int32(h_i % vocab_sizes[l, i - 1, j]) + offsets[l, (i - 1) * tables + j]
    (floor modulo: the sign of the divisor; the int32 add wraps).
    """
    products = ngram_token_ids.to(torch.int64)[None] * multipliers[:, None, :]  # (L, T, n)
    h = products[..., 0]
    pieces = []
    for i in range(1, multipliers.shape[1]):
        h = h ^ products[..., i]
        pieces.append(h[..., None] % vocab_sizes[:, None, i - 1, :].to(torch.int64))  # (L, T, tables)
    return torch.cat(pieces, dim=-1).to(torch.int32) + offsets[:, None, :]


def fused_weight_ref(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    return weight_hidden.float() * weight_embed.float()


def slice_sum(grad_w_partial: torch.Tensor, slices: int = GRAD_W_SLICES) -> torch.Tensor:
    """fp32 (hc, H) sum over the partials in the kernel's order: slice k holds rows
    [k R, min((k + 1) R, P)), R = ceil(P / slices), each summed in row order from +0.0;
    the slice sums are added in slice order."""
    num_partials = grad_w_partial.shape[0]
    rows = -(-num_partials // slices)
    total: torch.Tensor | None = None
    for k in range(slices):
        s = torch.zeros(grad_w_partial.shape[1:], dtype=torch.float32, device=grad_w_partial.device)
        for p in range(k * rows, min((k + 1) * rows, num_partials)):
            s = s + grad_w_partial[p]
        total = s if total is None else total + s
    assert total is not None
    return total


def grad_w_reduce_ref(grad_w_partial: torch.Tensor, weight_hidden: torch.Tensor, weight_embed: torch.Tensor,
                      grad_weight_hidden: torch.Tensor, grad_weight_embed: torch.Tensor) -> None:
    """In place, in the kernel's summation order (bit-exact): g_h += s * w_e.float(), g_e += s * w_h.float().
    No partials (P = 0) add nothing, as the op launches nothing."""
    if grad_w_partial.shape[0] == 0:
        return
    s = slice_sum(grad_w_partial)
    grad_weight_hidden += s * weight_embed.float()
    grad_weight_embed += s * weight_hidden.float()


def grad_w_reduce_torch_ref(grad_w_partial: torch.Tensor, weight_hidden: torch.Tensor, weight_embed: torch.Tensor,
                            grad_weight_hidden: torch.Tensor, grad_weight_embed: torch.Tensor) -> None:
    """TileKernels' reference: torch's own sum order (not the kernel's; compared by calc_diff)."""
    s = grad_w_partial.sum(0)
    grad_weight_hidden += s * weight_embed.float()
    grad_weight_embed += s * weight_hidden.float()


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """TileKernels' relative difference 1 - 2 sum(x y) / sum(x^2 + y^2), in float64 (0 for equal tensors)."""
    x, y = x.detach().double(), y.detach().double()
    denominator = (x * x + y * y).sum()
    if denominator == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denominator)
