"""GPU tests of ``tile_kernels_aot.engram``'s hash and weight ops against tests/reference/engram.py.

Tolerances: none where bits are defined. engram_hash is integer arithmetic (compared exactly, every
built (max_ngram_size, tables), num_tokens 0, 1, 13 and 4001, with TileKernels' input ranges, with
products that overflow int64 and hashes that go negative, and with negative divisors). fused_weight
is exact in fp32 (compared as int32 bits, Inf, NaN and subnormal products included). grad_w_reduce is
compared bit for bit with the reference in the kernel's summation order (tests/reference/engram.py,
slice_sum), and held to TileKernels' calc_diff < 1e-10 against ``grad_w_partial.sum(0)``.

Outputs come from a poisoned caching allocator (tests/gpu/poison.py) or are poisoned ``out=`` tensors,
so an element a kernel fails to write cannot pass by the luck of fresh memory. Bad arguments must
raise Python exceptions naming the argument, never a CUDA fault.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.gpu.poison import poison_allocator
from tests.reference.engram import (
    calc_diff,
    engram_hash_ref,
    fused_weight_ref,
    grad_w_reduce_ref,
    grad_w_reduce_torch_ref,
    make_offsets,
)

tile_kernels_aot, _, errors, runtime = installed_package()
engram = importlib.import_module("tile_kernels_aot.engram")

pytestmark = pytest.mark.gpu

TOKENS = [0, 1, 13, 4001]
POISON_INDEX = -7  # never a TileKernels-range index; with random signed inputs, a 2^-32 chance per element


def built(kernel: str) -> list[dict[str, Any]]:
    k = runtime.get_kernel(kernel)
    return [dict(zip(k.keys, v)) for v in k.variants]


def vid(v: dict[str, Any]) -> str:
    return "-".join(f"{k}={val}" for k, val in v.items())


def int32s(shape: tuple[int, ...], low: int = -(2**31), high: int = 2**31) -> torch.Tensor:
    return torch.randint(low, high, shape, dtype=torch.int64, device="cuda").to(torch.int32)


def int64s(shape: tuple[int, ...]) -> torch.Tensor:
    """Uniform over all of int64 (high word * 2^32 + low word), with both extremes planted."""
    high = torch.randint(-(2**31), 2**31, shape, dtype=torch.int64, device="cuda")
    low = torch.randint(0, 2**32, shape, dtype=torch.int64, device="cuda")
    x = high * 2**32 + low
    if x.numel() >= 2:
        x.view(-1)[0] = -(2**63)
        x.view(-1)[-1] = 2**63 - 1
    return x


def hash_inputs(num_tokens: int, n: int, layers: int, tables: int, kind: str) -> tuple[torch.Tensor, ...]:
    if kind == "tilekernels":  # TileKernels' test ranges: non-negative, no overflow of the products
        ids = int32s((num_tokens, n), 0, 100000)
        multipliers = torch.randint(0, 100000, (layers, n), dtype=torch.int64, device="cuda")
        vocab = int32s((layers, n - 1, tables), 100000, 1000000)
        return ids, multipliers, vocab, make_offsets(vocab)
    # Signed ids and multipliers over their whole range: products wrap, about half the hashes are negative.
    ids = int32s((num_tokens, n))
    multipliers = int64s((layers, n))
    if kind == "wrapping":
        vocab = int32s((layers, n - 1, tables), 1, 2**31)
    else:  # "signed divisors": floor modulo takes the divisor's sign; 1 and the int32 extremes included
        vocab = int32s((layers, n - 1, tables))
        vocab[vocab == 0] = 1
        extremes = torch.tensor([1, -(2**31), 2**31 - 1], dtype=torch.int32, device="cuda")
        vocab.view(-1)[:3] = extremes[:vocab.numel()]
    offsets = int32s((layers, (n - 1) * tables))  # the int32 add wraps
    return ids, multipliers, vocab, offsets


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    assert got.is_contiguous()
    wrong = (got != want).nonzero()
    assert wrong.numel() == 0, (f"{wrong.shape[0]} of {got.numel()} elements differ; first at {wrong[0].tolist()}: "
                                f"got {got[tuple(wrong[0])].item()}, want {want[tuple(wrong[0])].item()}")


# --- engram_hash ----------------------------------------------------------------------------

HASH = built("engram_hash")
HASH_KINDS = ["tilekernels", "wrapping", "signed divisors"]


@pytest.mark.parametrize("kind", HASH_KINDS)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("v", HASH, ids=vid)
def test_engram_hash(v: dict[str, Any], num_tokens: int, kind: str) -> None:
    n, tables = v["max_ngram_size"], v["tables"]
    args = hash_inputs(num_tokens, n, 2, tables, kind)
    if kind != "tilekernels" and num_tokens >= 13:
        products = args[0].to(torch.int64)[None] * args[1][:, None, :]
        assert ((products[..., 0] ^ products[..., 1]) < 0).any(), "the case should hold negative hashes"
    poison_allocator()
    output = engram.engram_hash(*args)
    assert output.device == args[0].device
    assert_same(output, engram_hash_ref(*args))


@pytest.mark.parametrize("v", HASH, ids=vid)
def test_engram_hash_poisoned_out(v: dict[str, Any]) -> None:
    n, tables = v["max_ngram_size"], v["tables"]
    args = hash_inputs(4001, n, 3, tables, "tilekernels")
    out = torch.full((3, 4001, (n - 1) * tables), POISON_INDEX, dtype=torch.int32, device="cuda")
    assert engram.engram_hash(*args, out=out) is out
    assert_same(out, engram_hash_ref(*args))


@pytest.mark.parametrize("layers", [0, 1, 3, 7])
def test_engram_hash_layers_are_a_runtime_size(layers: int) -> None:
    args = hash_inputs(4001, 3, layers, 8, "wrapping")
    poison_allocator()
    assert_same(engram.engram_hash(*args), engram_hash_ref(*args))


def test_engram_hash_launcher_on_poisoned_output() -> None:
    """The launcher called directly (no op): every element of the output is written."""
    args = hash_inputs(13, 3, 2, 8, "signed divisors")
    out = torch.full((2, 13, 16), POISON_INDEX, dtype=torch.int32, device="cuda")
    runtime.get_kernel("engram_hash").select(max_ngram_size=3, tables=8)(*args, out)
    assert_same(out, engram_hash_ref(*args))


def _unbuilt_ngram() -> int:
    return max(v["max_ngram_size"] for v in HASH) + 1


def _hash_call(num_tokens: int = 4, n: int = 3, layers: int = 2, tables: int = 8,
               **changes: Any) -> Callable[[], Any]:
    args = dict(zip(("ngram_token_ids", "multipliers", "vocab_sizes", "offsets"),
                    hash_inputs(num_tokens, n, layers, tables, "tilekernels")))
    args.update(changes)
    return lambda: engram.engram_hash(**args)


def _hash_out(out: torch.Tensor) -> Callable[[], Any]:
    args = hash_inputs(4, 3, 2, 8, "tilekernels")
    return lambda: engram.engram_hash(*args, out=out)


def _hash_out_over_ids() -> Callable[[], Any]:
    """out= whose memory is the ids' own (int32, (1, 4, 2) over the (4, 3) ids' storage)."""
    ids, multipliers, _, _ = hash_inputs(4, 3, 1, 1, "tilekernels")
    vocab = torch.full((1, 2, 1), 1000, dtype=torch.int32, device="cuda")
    out = ids.view(-1)[:8].view(1, 4, 2)
    return lambda: engram.engram_hash(ids, multipliers, vocab, make_offsets(vocab), out=out)


def _wide(t: torch.Tensor, extra: int = 1) -> torch.Tensor:
    """t's values as a view with a wider row stride (not contiguous)."""
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] + extra, dtype=t.dtype, device=t.device)
    wide[..., :t.shape[-1]] = t
    return wide[..., :t.shape[-1]]


# --- fused_weight ---------------------------------------------------------------------------

HC = [1, 2, 4, 8]
# TileKernels' hidden sizes, then sizes no vector width divides (the vec 1 variant) and other odd ones.
HIDDEN = [576, 2048, 2560, 3072, 4096, 6144, 7168, 1, 3, 577, 1000, 4098, 7169]


def bf16_weights(hc: int, hidden: int) -> torch.Tensor:
    """Random bf16 with magnitudes 2^-70..2^70 (products overflow to Inf and fall into fp32's subnormals),
    and an Inf, a NaN and zeros of both signs planted."""
    w = torch.randn(hc, hidden, device="cuda") * torch.pow(
        2.0, torch.randint(-70, 71, (hc, hidden), device="cuda").float())
    w = w.bfloat16()
    special = torch.tensor([float("inf"), float("nan"), 0.0, -0.0, -float("inf")], device="cuda").bfloat16()
    w.view(-1)[:special.numel()] = special[:w.numel()]
    return w


def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype == torch.float32
    assert_same(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("hc", HC)
def test_fused_weight(hc: int, hidden: int) -> None:
    wh, we = bf16_weights(hc, hidden), bf16_weights(hc, hidden).flip(1).contiguous()
    poison_allocator()
    assert_same_bits(engram.fused_weight(wh, we), fused_weight_ref(wh, we))


@pytest.mark.parametrize("hidden", [7168, 577])
def test_fused_weight_poisoned_out(hidden: int) -> None:
    wh, we = bf16_weights(4, hidden), bf16_weights(4, hidden)
    out = torch.full((4, hidden), float("nan"), device="cuda")
    assert engram.fused_weight(wh, we, out=out) is out
    assert_same_bits(out, fused_weight_ref(wh, we))


def test_fused_weight_of_no_rows_or_columns() -> None:
    for shape in ((0, 2048), (4, 0)):
        w = torch.ones(shape, dtype=torch.bfloat16, device="cuda")
        assert engram.fused_weight(w, w).shape == shape


# --- grad_w_reduce --------------------------------------------------------------------------

PARTIALS = [1, 7, 132]
REDUCE_HIDDEN = [576, 2048, 4096, 7168, 577, 1000]


def reduce_inputs(partials: int, hc: int, hidden: int) -> tuple[torch.Tensor, ...]:
    # Magnitudes 2^-12..2^12 so that the fp32 sums depend on their order.
    g = torch.randn(partials, hc, hidden, device="cuda") * torch.pow(
        2.0, torch.randint(-12, 13, (partials, hc, hidden), device="cuda").float())
    wh = torch.randn(hc, hidden, device="cuda").bfloat16()
    we = torch.randn(hc, hidden, device="cuda").bfloat16()
    return g, wh, we, torch.randn(hc, hidden, device="cuda"), torch.randn(hc, hidden, device="cuda")


@pytest.mark.parametrize("hidden", REDUCE_HIDDEN)
@pytest.mark.parametrize("hc", [1, 4, 8])
@pytest.mark.parametrize("partials", PARTIALS)
def test_grad_w_reduce(partials: int, hc: int, hidden: int) -> None:
    g, wh, we, gh, ge = reduce_inputs(partials, hc, hidden)
    ref_h, ref_e = gh.clone(), ge.clone()
    grad_w_reduce_ref(g, wh, we, ref_h, ref_e)
    torch_h, torch_e = gh.clone(), ge.clone()
    grad_w_reduce_torch_ref(g, wh, we, torch_h, torch_e)
    pointers = gh.data_ptr(), ge.data_ptr()
    assert engram.grad_w_reduce(g, wh, we, gh, ge) is None
    assert (gh.data_ptr(), ge.data_ptr()) == pointers
    assert_same_bits(gh, ref_h)  # the kernel's summation order: bit-exact
    assert_same_bits(ge, ref_e)
    # TileKernels' tolerance against its own torch.sum order.
    assert calc_diff(gh, torch_h) < 1e-10 and calc_diff(ge, torch_e) < 1e-10


def test_grad_w_reduce_with_the_device_s_persistent_grid() -> None:
    partials = torch.cuda.get_device_properties(0).multi_processor_count  # the gate backward's P
    g, wh, we, gh, ge = reduce_inputs(partials, 4, 7168)
    ref_h, ref_e = gh.clone(), ge.clone()
    grad_w_reduce_ref(g, wh, we, ref_h, ref_e)
    engram.grad_w_reduce(g, wh, we, gh, ge)
    assert_same_bits(gh, ref_h)
    assert_same_bits(ge, ref_e)


def test_grad_w_reduce_without_partials_adds_nothing() -> None:
    g, wh, we, gh, ge = reduce_inputs(0, 4, 2048)
    wh.view(-1)[0] = float("inf")  # 0 * Inf would be NaN: nothing may be computed at all
    gh.view(-1)[1] = -0.0
    before_h, before_e = gh.clone(), ge.clone()
    assert engram.grad_w_reduce(g, wh, we, gh, ge) is None
    assert_same_bits(gh, before_h)
    assert_same_bits(ge, before_e)


def test_grad_w_reduce_accumulates_across_calls() -> None:
    g, wh, we, gh, ge = reduce_inputs(7, 4, 2048)
    ref_h, ref_e = gh.clone(), ge.clone()
    for _ in range(3):
        grad_w_reduce_ref(g, wh, we, ref_h, ref_e)
        engram.grad_w_reduce(g, wh, we, gh, ge)
    assert_same_bits(gh, ref_h)
    assert_same_bits(ge, ref_e)


def _reduce_call(**changes: Any) -> Callable[[], Any]:
    args = dict(zip(("grad_w_partial", "weight_hidden", "weight_embed", "grad_weight_hidden", "grad_weight_embed"),
                    reduce_inputs(7, 4, 2048)))
    args.update(changes)
    return lambda: engram.grad_w_reduce(**args)


def _aliased_grads() -> Callable[[], Any]:
    g, wh, we, gh, _ = reduce_inputs(7, 4, 2048)
    return lambda: engram.grad_w_reduce(g, wh, we, gh, gh)


def _grad_in_partials() -> Callable[[], Any]:
    g, wh, we, _, ge = reduce_inputs(7, 4, 2048)
    return lambda: engram.grad_w_reduce(g, wh, we, g[3], ge)


# --- bad arguments: Python exceptions that name the argument, never a CUDA fault ------------

BAD_CALLS: dict[str, tuple[Callable[[], Callable[[], Any]], type[Exception], str]] = {
    "hash ngram size not built": (lambda: _hash_call(n=_unbuilt_ngram()), errors.VariantNotFoundError,
                                  "ngram_token_ids"),
    "hash tables not built": (lambda: _hash_call(tables=3), errors.VariantNotFoundError, "vocab_sizes"),
    "hash ids int64": (lambda: _hash_call(ngram_token_ids=torch.zeros(4, 3, dtype=torch.int64, device="cuda")),
                       errors.KernelArgumentError, "ngram_token_ids"),
    "hash multipliers int32": (lambda: _hash_call(multipliers=torch.ones(2, 3, dtype=torch.int32, device="cuda")),
                               errors.KernelArgumentError, "multipliers"),
    "hash vocab layers": (lambda: _hash_call(vocab_sizes=torch.ones(3, 2, 8, dtype=torch.int32, device="cuda")),
                          errors.KernelArgumentError, "vocab_sizes"),
    "hash vocab ngram rows": (lambda: _hash_call(vocab_sizes=torch.ones(2, 3, 8, dtype=torch.int32, device="cuda")),
                              errors.KernelArgumentError, "vocab_sizes"),
    "hash offsets width": (lambda: _hash_call(offsets=torch.zeros(2, 8, dtype=torch.int32, device="cuda")),
                           errors.KernelArgumentError, "offsets"),
    "hash ids strided": (lambda: _hash_call(ngram_token_ids=_wide(int32s((4, 3), 0, 100))),
                         errors.KernelArgumentError, "ngram_token_ids"),
    "hash vocab strided": (lambda: _hash_call(vocab_sizes=_wide(int32s((2, 2, 8), 1, 100))),
                           errors.KernelArgumentError, "vocab_sizes"),
    "hash ids on cpu": (lambda: _hash_call(ngram_token_ids=torch.zeros(4, 3, dtype=torch.int32)), errors.KernelError,
                        "ngram_token_ids"),
    "hash ids 1-D": (lambda: _hash_call(ngram_token_ids=torch.zeros(4, dtype=torch.int32, device="cuda")),
                     ValueError, "ngram_token_ids"),
    "hash out shape": (lambda: _hash_out(torch.empty(2, 4, 8, dtype=torch.int32, device="cuda")),
                       errors.KernelArgumentError, "output"),
    "hash out overlaps ids": (lambda: _hash_out_over_ids(), errors.KernelArgumentError, "output"),
    "fused dtype": (lambda: lambda: engram.fused_weight(torch.ones(4, 64, device="cuda"),
                                                        torch.ones(4, 64, device="cuda")),
                    errors.KernelArgumentError, "weight_hidden"),
    "fused shapes differ": (lambda: lambda: engram.fused_weight(bf16_weights(4, 64), bf16_weights(4, 68)),
                            errors.KernelArgumentError, "weight_embed"),
    "fused strided": (lambda: lambda: engram.fused_weight(_wide(bf16_weights(4, 64), 8), bf16_weights(4, 64)),
                      errors.KernelArgumentError, "weight_hidden"),
    "fused transposed": (lambda: lambda: engram.fused_weight(bf16_weights(64, 4).t(), bf16_weights(4, 64)),
                         errors.KernelArgumentError, "weight_hidden"),
    "fused out dtype": (lambda: lambda: engram.fused_weight(bf16_weights(4, 64), bf16_weights(4, 64),
                                                            out=torch.empty(4, 64, dtype=torch.bfloat16,
                                                                            device="cuda")),
                        errors.KernelArgumentError, "weight_fused"),
    "reduce partial dtype": (lambda: _reduce_call(grad_w_partial=torch.zeros(7, 4, 2048, dtype=torch.bfloat16,
                                                                             device="cuda")),
                             errors.KernelArgumentError, "grad_w_partial"),
    "reduce partial permuted": (lambda: _reduce_call(grad_w_partial=torch.zeros(4, 7, 2048, device="cuda")
                                                     .transpose(0, 1)),
                                errors.KernelArgumentError, "grad_w_partial"),
    "reduce weight dtype": (lambda: _reduce_call(weight_hidden=torch.zeros(4, 2048, device="cuda")),
                            errors.KernelArgumentError, "weight_hidden"),
    "reduce grad shape": (lambda: _reduce_call(grad_weight_embed=torch.zeros(4, 2052, device="cuda")),
                          errors.KernelArgumentError, "grad_weight_embed"),
    "reduce grad strided": (lambda: _reduce_call(grad_weight_hidden=_wide(torch.zeros(4, 2048, device="cuda"), 4)),
                            errors.KernelArgumentError, "grad_weight_hidden"),
    "reduce grads alias": (_aliased_grads, errors.KernelArgumentError, "grad_weight_(hidden|embed)"),
    "reduce grad inside the partials": (_grad_in_partials, errors.KernelArgumentError, "grad_weight_hidden"),
    "reduce partial 2-D": (lambda: _reduce_call(grad_w_partial=torch.zeros(4, 2048, device="cuda")), ValueError,
                           "grad_w_partial"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_input_names_the_argument(name: str) -> None:
    make, error, argument = BAD_CALLS[name]
    call = make()
    with pytest.raises(error, match=rf"\b{argument}\b"):
        call()
    torch.cuda.synchronize()  # nothing was launched that could fault
