"""engram.engram_hash: n-gram hash embedding indices (TileKernels' ``engram_hash``).

One prebuilt variant per (max_ngram_size, num_embed_table_per_ngram) of kernel_specs/engram.yaml;
num_tokens and num_ngram_layers are runtime sizes. Bit-exact with torch's int64 arithmetic:
wrap-around products, XOR, and ``%`` as floor modulo (the sign of the divisor).
"""

from __future__ import annotations

import torch

from .._args import matrix
from .._op import Plan, empty, launch, op, out, size
from .._runtime import get_kernel
from ..errors import VariantNotFoundError

__all__ = ["engram_hash"]

_kernel = get_kernel("engram_hash")


def _built(axis: int) -> list[int]:
    """The values of grid key ``axis`` (0: max_ngram_size, 1: tables) the package has variants for."""
    return sorted({int(v[axis]) for v in _kernel.variants})


@op(outputs=("output",), inputs={"ngram_token_ids": (1,), "multipliers": (), "vocab_sizes": (2,), "offsets": ()})
def engram_hash(ngram_token_ids: torch.Tensor, multipliers: torch.Tensor, vocab_sizes: torch.Tensor,
                offsets: torch.Tensor) -> Plan:
    """Compute n-gram hash embedding indices.

    For each layer l, token t and n-gram length i + 1 (1 <= i < max_ngram_size), with
    h_i = XOR over k <= i of int64(ngram_token_ids[t, k]) * multipliers[l, k] (int64, wrapping):
    ``output[l, t, (i - 1) * tables + j] = (h_i % vocab_sizes[l, i - 1, j]) + offsets[l, (i - 1) * tables + j]``
    in int32, ``%`` being torch's int64 floor modulo. Vocab sizes must be nonzero.

    Args:
        ngram_token_ids: int32 CUDA tensor (num_tokens, max_ngram_size), contiguous.
        multipliers: int64 (num_ngram_layers, max_ngram_size), contiguous.
        vocab_sizes: int32 (num_ngram_layers, max_ngram_size - 1, num_embed_table_per_ngram), contiguous.
        offsets: int32 (num_ngram_layers, (max_ngram_size - 1) * num_embed_table_per_ngram), contiguous.
        out: the int32 output tensor to write into instead (contiguous, overlapping no input); returned.

    Returns:
        int32 (num_ngram_layers, num_tokens, (max_ngram_size - 1) * num_embed_table_per_ngram).
    """
    ids = matrix("ngram_token_ids", ngram_token_ids, "(num_tokens, max_ngram_size)")
    matrix("multipliers", multipliers, "(num_ngram_layers, max_ngram_size)")
    matrix("offsets", offsets, "(num_ngram_layers, (max_ngram_size - 1) * num_embed_table_per_ngram)")
    if not isinstance(vocab_sizes, torch.Tensor):
        raise TypeError(f"vocab_sizes: expected a torch.Tensor, got {type(vocab_sizes).__name__}")
    if vocab_sizes.dim() != 3:
        raise ValueError("vocab_sizes: expected a 3-D tensor (num_ngram_layers, max_ngram_size - 1, "
                         f"num_embed_table_per_ngram), got shape {tuple(vocab_sizes.shape)}")
    ngram, tables = int(ids.shape[1]), int(vocab_sizes.shape[2])
    launcher = _kernel.find(ngram, tables)
    if launcher is None:
        if ngram not in _built(0):
            raise VariantNotFoundError(
                f"ngram_token_ids: max_ngram_size (dimension 1) {ngram} is not built into this package (built: "
                f"{', '.join(map(str, _built(0)))}); add it to the grid of kernel engram_hash in {_kernel.spec}")
        raise VariantNotFoundError(
            f"vocab_sizes: num_embed_table_per_ngram (dimension 2) {tables} is not built into this package for "
            f"max_ngram_size {ngram} (built: {', '.join(map(str, _built(1)))}); add it to the grid of kernel "
            f"engram_hash in {_kernel.spec}")
    # The launcher checks every tensor against (num_layers, num_tokens) read from the arguments.
    return launch(launcher, ids, multipliers, vocab_sizes, offsets, out(0),
                  outputs=(empty(torch.int32, size(multipliers, 0), size(ids, 0), (ngram - 1) * tables),))
