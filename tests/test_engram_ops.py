"""CPU tests of the Engram hash and weight op modules (ops/engram/{hash,fused_weight,grad_w_reduce}.py).

The op modules run inside a stand-in package (tests/op_stub.py) whose kernels record the variant
selected and the launch instead of running anything: the tests check TileKernels' signatures, the
variant and the launch arguments each call makes, the outputs' shapes, and that a bad argument
raises, naming it, before anything is launched. No build and no GPU is needed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import stub_package

OPS = ("hash", "fused_weight", "grad_w_reduce")


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], Any]]:
    with stub_package(tmp_path_factory.mktemp("engram_ops"), "engram_ops_pkg", "engram", OPS) as stubbed:
        yield stubbed


def i32(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.int32)


def hash_args(tokens: int = 5, n: int = 3, layers: int = 2, tables: int = 8) -> tuple[torch.Tensor, ...]:
    vocab = torch.full((layers, n - 1, tables), 7, dtype=torch.int32)
    return i32(tokens, n), torch.ones(layers, n, dtype=torch.int64), vocab, i32(layers, (n - 1) * tables)


def bf16(*shape: int) -> torch.Tensor:
    return torch.ones(shape, dtype=torch.bfloat16)


def f32(*shape: int) -> torch.Tensor:
    return torch.zeros(shape)


def reduce_args(partials: int = 7, hc: int = 4, hidden: int = 2048) -> tuple[torch.Tensor, ...]:
    return f32(partials, hc, hidden), bf16(hc, hidden), bf16(hc, hidden), f32(hc, hidden), f32(hc, hidden)


def _spelled(fn: Callable[..., Any]) -> str:
    """fn's signature without annotations: names, kinds and defaults."""
    signature = inspect.signature(fn)
    return str(signature.replace(parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                                 return_annotation=signature.empty))


@pytest.mark.parametrize(("module", "name", "signature"), [
    ("hash", "engram_hash", "(ngram_token_ids, multipliers, vocab_sizes, offsets, *, out=None)"),
    ("fused_weight", "fused_weight", "(weight_hidden, weight_embed, *, out=None)"),
    ("grad_w_reduce", "grad_w_reduce",
     "(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)"),
])
def test_tilekernels_signatures(ops: tuple[dict[str, ModuleType], Any], module: str, name: str,
                                signature: str) -> None:
    """TileKernels 1.0.0's positional arguments (out= is this catalog's addition, keyword-only)."""
    fn = getattr(ops[0][module], name)
    assert _spelled(fn) == signature
    assert ops[0][module].__all__ == [name]


BAD: dict[str, tuple[str, Callable[[Any], Any], type[Exception], str]] = {
    "hash ids 1-D": ("hash", lambda m: m.engram_hash(i32(5), *hash_args()[1:]), ValueError, "ngram_token_ids"),
    "hash ids list": ("hash", lambda m: m.engram_hash([[1, 2, 3]], *hash_args()[1:]), TypeError, "ngram_token_ids"),
    "hash multipliers 1-D": ("hash", lambda m: m.engram_hash(hash_args()[0], torch.ones(3, dtype=torch.int64),
                                                             *hash_args()[2:]), ValueError, "multipliers"),
    "hash vocab 2-D": ("hash", lambda m: m.engram_hash(*hash_args()[:2], i32(2, 16), hash_args()[3]), ValueError,
                       "vocab_sizes"),
    "hash vocab list": ("hash", lambda m: m.engram_hash(*hash_args()[:2], [[1]], hash_args()[3]), TypeError,
                        "vocab_sizes"),
    "hash offsets 3-D": ("hash", lambda m: m.engram_hash(*hash_args()[:3], i32(2, 2, 8)), ValueError, "offsets"),
    "hash out tuple": ("hash", lambda m: m.engram_hash(*hash_args(), out=(i32(2, 5, 16),)), TypeError, "out"),
    "fused 1-D": ("fused_weight", lambda m: m.fused_weight(bf16(8), bf16(4, 2)), ValueError, "weight_hidden"),
    "fused embed 3-D": ("fused_weight", lambda m: m.fused_weight(bf16(4, 8), bf16(1, 4, 8)), ValueError,
                        "weight_embed"),
    "fused not tensor": ("fused_weight", lambda m: m.fused_weight(None, bf16(4, 8)), TypeError, "weight_hidden"),
    "reduce partial 2-D": ("grad_w_reduce", lambda m: m.grad_w_reduce(f32(4, 8), *reduce_args()[1:]), ValueError,
                           "grad_w_partial"),
    "reduce partial list": ("grad_w_reduce", lambda m: m.grad_w_reduce([0.0], *reduce_args()[1:]), TypeError,
                            "grad_w_partial"),
    "reduce grad 1-D": ("grad_w_reduce", lambda m: m.grad_w_reduce(*reduce_args()[:3], f32(8), reduce_args()[4]),
                        ValueError, "grad_weight_hidden"),
    "reduce weight not tensor": ("grad_w_reduce", lambda m: m.grad_w_reduce(reduce_args()[0], 1.0,
                                                                            *reduce_args()[2:]),
                                 TypeError, "weight_hidden"),
    "reduce no partials, embed grad shape": (
        "grad_w_reduce", lambda m: m.grad_w_reduce(*reduce_args(partials=0)[:4], f32(4, 2047)), ValueError,
        "grad_weight_embed"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_arguments_raise_before_any_launch(ops: tuple[dict[str, ModuleType], Any], name: str) -> None:
    modules, runtime = ops
    op, call, error, argument = BAD[name]
    runtime.LAUNCHES.clear()
    with pytest.raises(error, match=rf"\b{argument}\b"):
        call(modules[op])
    assert runtime.LAUNCHES == []


@pytest.mark.parametrize(("tokens", "n", "layers", "tables"), [(5, 3, 2, 8), (0, 3, 2, 8), (1, 4, 3, 16),
                                                                (13, 2, 1, 1)])
def test_hash_launches_the_variant_of_its_ngram_size_and_tables(ops: tuple[dict[str, ModuleType], Any], tokens: int,
                                                                 n: int, layers: int, tables: int) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    args = hash_args(tokens, n, layers, tables)
    output = modules["hash"].engram_hash(*args)
    ((name, values, launched),) = runtime.LAUNCHES
    assert name == "engram_hash" and values == {"max_ngram_size": n, "tables": tables}
    assert all(a is b for a, b in zip(launched[:4], args, strict=True)) and launched[4] is output
    assert output.shape == (layers, tokens, (n - 1) * tables) and output.dtype == torch.int32
    assert output.is_contiguous()


def test_hash_writes_into_out(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    given = i32(2, 5, 16)
    assert modules["hash"].engram_hash(*hash_args(), out=given) is given
    ((_, _, launched),) = runtime.LAUNCHES
    assert launched[4] is given


@pytest.mark.parametrize(("hc", "hidden", "vec"), [(4, 7168, 4), (1, 576, 4), (8, 2048, 4), (2, 577, 1),
                                                   (4, 1002, 1), (0, 4096, 4)])
def test_fused_weight_takes_16_byte_vectors_where_hidden_allows(ops: tuple[dict[str, ModuleType], Any], hc: int,
                                                                 hidden: int, vec: int) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    wh, we = bf16(hc, hidden), bf16(hc, hidden)
    fused = modules["fused_weight"].fused_weight(wh, we)
    ((name, values, launched),) = runtime.LAUNCHES
    assert name == "engram_fused_weight" and values == {"vec": vec}
    assert launched[0] is wh and launched[1] is we and launched[2] is fused
    assert fused.shape == (hc, hidden) and fused.dtype == torch.float32


@pytest.mark.parametrize(("partials", "hidden", "vec"), [(1, 7168, 4), (7, 576, 4), (132, 4096, 4), (3, 577, 1)])
def test_grad_w_reduce_launches_in_place(ops: tuple[dict[str, ModuleType], Any], partials: int, hidden: int,
                                         vec: int) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    args = reduce_args(partials, 4, hidden)
    assert modules["grad_w_reduce"].grad_w_reduce(*args) is None
    ((name, values, launched),) = runtime.LAUNCHES
    assert name == "engram_grad_w_reduce" and values == {"vec": vec}
    assert len(launched) == 5 and all(a is b for a, b in zip(launched, args, strict=True))


def test_grad_w_reduce_without_partials_launches_nothing(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    runtime.LAUNCHES.clear()
    args = reduce_args(partials=0)
    assert modules["grad_w_reduce"].grad_w_reduce(*args) is None
    assert runtime.LAUNCHES == []


def test_grad_w_reduce_takes_no_out(ops: tuple[dict[str, ModuleType], Any]) -> None:
    with pytest.raises(TypeError, match="out"):
        ops[0]["grad_w_reduce"].grad_w_reduce(*reduce_args(), out=f32(4, 2048))


def test_slices_agree_with_the_reference() -> None:
    """The op's stated slice count, the template's default and the reference's are one number."""
    from tests.conftest import REPO
    from tests.reference.engram import GRAD_W_SLICES

    source = (REPO / "ops" / "engram" / "grad_w_reduce.py").read_text()
    template = (REPO / "kernels" / "engram" / "grad_w_reduce.py.j2").read_text()
    assert f"SLICES = {GRAD_W_SLICES} " in source
    assert f"slices: int = {GRAD_W_SLICES} " in template
