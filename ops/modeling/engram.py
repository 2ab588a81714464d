"""modeling.engram: the Engram gate with autograd, and the whole Engram block as a layer.

``EngramGateFn`` / ``engram_gate`` are TileKernels' ``tile_kernels.modeling.engram`` (the same
arguments and semantics, ``main_grad`` included). ``EngramGatingLayer`` is the block a model author
drops in: n-gram hashing of the token ids into hashed embedding tables, a lookup, key and value
projections, and the fused gate, all on the prebuilt kernels.
"""

from __future__ import annotations

import torch
from torch import nn

from ..engram import engram_gate_bwd, engram_gate_fwd, engram_hash, fused_weight, grad_w_reduce

__all__ = ["EngramGateFn", "EngramGatingLayer", "engram_gate", "ngram_token_ids"]


class EngramGateFn(torch.autograd.Function):
    """The fused Engram gate with RMSNorm:
    ``output = hidden_states + sigmoid(signed_sqrt(dot(RMSNorm(x, wh), RMSNorm(k, we)) / sqrt(H))) * v``.

    Args:
        hidden_states: bf16 (..., hc_mult, hidden). k: bf16 (..., hc_mult, hidden). v: bf16 (..., hidden).
        weight_hidden, weight_embed: bf16 (hc_mult, hidden), the two RMSNorm weights.
        clamp_value: the floor of |d| under the square root. eps: the RMSNorm epsilon.

    Returns:
        output, bf16 with the shape of hidden_states.

    A weight with a ``main_grad`` attribute (a Megatron-style fp32 gradient buffer) has its gradient
    added into ``main_grad`` in place and gets None from the backward; otherwise its gradient is
    returned (computed in fp32).
    """

    @staticmethod
    def forward(ctx, hidden_states, k, v, weight_hidden, weight_embed, clamp_value, eps):  # type: ignore[override]
        shape = hidden_states.shape
        hc_mult, hidden = shape[-2], shape[-1]
        x = hidden_states.reshape(-1, hc_mult, hidden).contiguous()
        k = k.reshape(-1, hc_mult, hidden)
        v = v.reshape(-1, hidden)
        weight_fused = fused_weight(weight_hidden, weight_embed)
        output, dot, gate_score, rstd_x, rstd_k = engram_gate_fwd(x, k, v, weight_fused, eps, clamp_value)
        ctx.save_for_backward(x, k, v, weight_hidden, weight_embed, weight_fused, dot, gate_score, rstd_x, rstd_k)
        ctx.clamp_value, ctx.shape = clamp_value, shape
        return output.view(shape)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        x, k, v, weight_hidden, weight_embed, weight_fused, dot, gate_score, rstd_x, rstd_k = ctx.saved_tensors
        shape = ctx.shape
        grad_out = grad_output.reshape(x.shape).contiguous()
        grad_x, grad_k, grad_v, grad_w_partial = engram_gate_bwd(
            grad_out, x, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, ctx.clamp_value)
        main_wh = getattr(weight_hidden, "main_grad", None)
        main_we = getattr(weight_embed, "main_grad", None)
        grad_wh = main_wh if main_wh is not None else torch.zeros_like(weight_hidden, dtype=torch.float32)
        grad_we = main_we if main_we is not None else torch.zeros_like(weight_embed, dtype=torch.float32)
        grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_wh, grad_we)
        return (grad_x.view(shape), grad_k.view(shape), grad_v.view(*shape[:-2], shape[-1]),
                None if main_wh is not None else grad_wh, None if main_we is not None else grad_we, None, None)


def engram_gate(hidden_states: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight_hidden: torch.Tensor,
                weight_embed: torch.Tensor, clamp_value: float, eps: float) -> torch.Tensor:
    """``EngramGateFn.apply``: the fused Engram gate with autograd (see EngramGateFn)."""
    return EngramGateFn.apply(hidden_states, k, v, weight_hidden, weight_embed, clamp_value, eps)  # type: ignore[no-any-return]


def ngram_token_ids(token_ids: torch.Tensor, max_ngram_size: int, pad_id: int = 0) -> torch.Tensor:
    """The (num_tokens, max_ngram_size) int32 ids ``engram_hash`` takes, from (..., seq_len) token ids.

    Column j holds the token j places back in its sequence (column 0 the token itself), ``pad_id``
    before the sequence's start; the leading dimensions are flattened into tokens.
    """
    if token_ids.dim() < 1:
        raise ValueError(f"token_ids: expected a tensor (..., seq_len), got shape {tuple(token_ids.shape)}")
    ids = token_ids.to(torch.int32)
    columns = [ids]
    for j in range(1, max_ngram_size):
        shifted = torch.full_like(ids, pad_id)
        if ids.shape[-1] > j:
            shifted[..., j:] = ids[..., :-j]
        columns.append(shifted)
    return torch.stack(columns, dim=-1).reshape(-1, max_ngram_size)


def _primes_from(start: int, count: int) -> list[int]:
    """The ``count`` smallest primes >= start: table sizes that share no factor, so that one hash
    collides in different rows of different tables."""
    primes: list[int] = []
    n = max(start, 2)
    while len(primes) < count:
        if all(n % d for d in range(2, int(n**0.5) + 1)):
            primes.append(n)
        n += 1
    return primes


class EngramGatingLayer(nn.Module):
    """The Engram block: hashed n-gram memory read into the residual stream through the fused gate.

    ``out = layer(x, token_ids)``: for each token, the ids of the n-grams ending at it (orders 2 to
    ``max_ngram_size``) are hashed (``engram_hash``: multiplicative XOR) into ``num_tables`` tables per
    order of ``memory_slots`` rows each (distinct primes from ``memory_slots`` up, so collisions differ
    between tables); the rows looked up are concatenated into the token's memory vector ``e``;
    ``k = W_k e`` (one key per head) and ``v = W_v e``; and the fused gate
    (``engram_gate``: RMSNorm of x and k, signed-sqrt sigmoid of their scaled dot) adds ``gate * v``
    to x.

    Args:
        hidden_dim: H, the model's hidden size (one the gate kernels are built for, e.g. 4096 or 7168).
        memory_slots: rows of each hashed embedding table (the size of the hashed memory per table).
        max_ngram_size: the longest n-gram hashed (n-grams of 2 .. max_ngram_size tokens).
        num_tables: hashed tables per n-gram order.
        embed_dim: width of one table's rows (default: hidden_dim // (number of tables)).
        hc_mult: heads of the residual stream (1: x is (..., H); more: x is (..., hc_mult, H)).
        clamp_value, eps: the gate's clamp floor and RMSNorm epsilon.
        seed: seeds the hash multipliers (part of the state_dict, as buffers).
        device, dtype: of the parameters (default bf16: the gate computes in bf16 inputs).

    Forward: ``x`` bf16 (..., H) (or (..., hc_mult, H)), ``token_ids`` integer (...,) with the
    leading shape of x (the sequence is the last of those dimensions). Returns bf16 like x.
    """

    def __init__(self, hidden_dim: int, memory_slots: int, *, max_ngram_size: int = 3, num_tables: int = 8,
                 embed_dim: int | None = None, hc_mult: int = 1, clamp_value: float = 1e-6, eps: float = 1e-6,
                 seed: int = 0, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        if max_ngram_size < 2:
            raise ValueError(f"max_ngram_size: expected at least 2 (bigrams), got {max_ngram_size}")
        if memory_slots < 1:
            raise ValueError(f"memory_slots: expected a positive number of rows per table, got {memory_slots}")
        tables = (max_ngram_size - 1) * num_tables
        embed_dim = embed_dim if embed_dim is not None else max(1, hidden_dim // tables)
        self.hidden_dim, self.memory_slots, self.hc_mult = hidden_dim, memory_slots, hc_mult
        self.max_ngram_size, self.num_tables, self.embed_dim = max_ngram_size, num_tables, embed_dim
        self.clamp_value, self.eps = clamp_value, eps
        sizes = torch.tensor(_primes_from(memory_slots, tables), dtype=torch.int32).view(1, max_ngram_size - 1,
                                                                                          num_tables)
        generator = torch.Generator().manual_seed(seed)
        # Odd multipliers below 2**31: the int64 products of int32 ids never overflow into the sign.
        multipliers = torch.randint(0, 2**30, (1, max_ngram_size), generator=generator, dtype=torch.int64) * 2 + 1
        flat = sizes.view(-1)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int32), flat[:-1].cumsum(0, dtype=torch.int32)]).view(1, -1)
        self.register_buffer("vocab_sizes", sizes.to(device))
        self.register_buffer("multipliers", multipliers.to(device))
        self.register_buffer("offsets", offsets.to(device))
        self.memory = nn.Embedding(int(flat.sum()), embed_dim, device=device, dtype=dtype)
        self.key = nn.Linear(tables * embed_dim, hc_mult * hidden_dim, bias=False, device=device, dtype=dtype)
        self.value = nn.Linear(tables * embed_dim, hidden_dim, bias=False, device=device, dtype=dtype)
        self.weight_hidden = nn.Parameter(torch.ones(hc_mult, hidden_dim, device=device, dtype=dtype))
        self.weight_embed = nn.Parameter(torch.ones(hc_mult, hidden_dim, device=device, dtype=dtype))
        nn.init.normal_(self.memory.weight, std=embed_dim**-0.5)

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-2] if self.hc_mult > 1 else x.shape[:-1]
        if x.shape[-1] != self.hidden_dim or (self.hc_mult > 1 and x.shape[-2] != self.hc_mult):
            heads = f"{self.hc_mult}, " if self.hc_mult > 1 else ""
            raise ValueError(f"x: expected shape (..., {heads}{self.hidden_dim}), got {tuple(x.shape)}")
        if tuple(token_ids.shape) != tuple(lead):
            raise ValueError(f"token_ids: expected shape {tuple(lead)} (x's leading dimensions), "
                             f"got {tuple(token_ids.shape)}")
        ids = ngram_token_ids(token_ids, self.max_ngram_size)
        rows = engram_hash(ids, self.multipliers, self.vocab_sizes, self.offsets)[0]  # (tokens, tables)
        memory = self.memory(rows).flatten(1).to(torch.bfloat16)
        k = self.key.weight.to(torch.bfloat16)
        keys = torch.nn.functional.linear(memory, k).view(-1, self.hc_mult, self.hidden_dim)
        values = torch.nn.functional.linear(memory, self.value.weight.to(torch.bfloat16))
        hidden = x.to(torch.bfloat16).reshape(-1, self.hc_mult, self.hidden_dim)
        out = engram_gate(hidden, keys, values, self.weight_hidden.to(torch.bfloat16),
                          self.weight_embed.to(torch.bfloat16), self.clamp_value, self.eps)
        return out.view(x.shape)

    def extra_repr(self) -> str:
        return (f"hidden_dim={self.hidden_dim}, memory_slots={self.memory_slots}, "
                f"max_ngram_size={self.max_ngram_size}, num_tables={self.num_tables}, embed_dim={self.embed_dim}, "
                f"hc_mult={self.hc_mult}")
