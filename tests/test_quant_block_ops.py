"""CPU tests of the block cast and cast-back op modules (ops/quant/per_block_cast.py,
per_token_cast_back.py, per_block_cast_lossless.py) on a stub runtime.

The modules are loaded into a throw-away package whose ``_runtime`` records variant selections,
launches, what the ops remember for the C dispatch and the calls they hand it, instead of loading
cubins (tests/op_stub.py), so what the op hands the kernel (the variant, fresh outputs or the
caller's ``out``), what a later call of its signature would replay and the errors it raises
itself show without a GPU. The GPU tests (tests/gpu/test_per_block_cast.py, test_out.py) check
the kernels' numbers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import CheckingKernel, WritingKernel, marked, poisoned, stub_package

PACKAGE = "block_ops_stub"
MODULES = ("per_block_cast", "per_token_cast_back", "per_block_cast_lossless")


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], Any]]:
    """(the op modules by file stem, the stub _runtime)."""
    with stub_package(tmp_path_factory.mktemp("block"), PACKAGE, "quant", MODULES) as stubbed:
        yield stubbed


@pytest.fixture()
def ops(stub: tuple[dict[str, ModuleType], Any]) -> dict[str, ModuleType]:
    for log in (stub[1].LAUNCHES, stub[1].REMEMBERED, stub[1].DISPATCHED):
        log.clear()
    return stub[0]


@pytest.fixture()
def op(ops: dict[str, ModuleType]) -> ModuleType:
    return ops["per_block_cast"]


@pytest.fixture()
def back(ops: dict[str, ModuleType]) -> ModuleType:
    return ops["per_token_cast_back"]


def _launches(stub: tuple[dict[str, ModuleType], Any]) -> list[Any]:
    launches: list[Any] = stub[1].LAUNCHES
    return launches


def _errors(stub: tuple[dict[str, ModuleType], Any]) -> Any:
    return importlib.import_module(f"{PACKAGE}.errors")


def _x(rows: int = 33, hidden: int = 2048) -> torch.Tensor:
    return torch.randn(rows, hidden).bfloat16()


def _recipe(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    """A remembered entry as plain values: (launcher arguments, the call, the allocated outputs)."""
    _, _, arguments, rules, call, outputs = entry
    assert rules == ()  # every size the ops rely on is the contract's
    sources = tuple((a.kind, a.index) if type(a).__name__ == "Source" else a for a in arguments)
    allocated = None if outputs is None else tuple((o.dtype, o.dims) for o in outputs)
    return sources, call, allocated


def _same_call(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Calls element by element: tensors by identity, the rest by type and value (as dispatch keys them)."""
    return len(a) == len(b) and all(x is y if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor)
                                    else (type(x) is type(y) and x == y) for x, y in zip(a, b))


# --- per_block_cast ---------------------------------------------------------------------------


# bf16 -> e4m3 takes the variant for any hidden (grid hidden 0), bf16 -> e2m1 the one built for 2048.
@pytest.mark.parametrize(("fmt", "block", "q_width", "sf_shape", "grid_hidden"), [
    ("e4m3", (128, 128), 2048, (1, 16), 0), ("e2m1", (32, 32), 1024, (2, 64), 2048)])
def test_cast_selects_and_allocates(op: ModuleType, stub: tuple[dict[str, ModuleType], Any], fmt: str,
                                    block: tuple[int, int], q_width: int, sf_shape: tuple[int, int],
                                    grid_hidden: int) -> None:
    x = _x()
    q, sf = op.per_block_cast(x, fmt, block, round_sf=True)
    assert q.shape == (33, q_width) and sf.shape == sf_shape and sf.dtype == torch.float32
    ((name, values, args),) = _launches(stub)
    assert name == "per_block_cast" and values == dict(in_dtype="bfloat16", hidden=grid_hidden, fmt=fmt, block_m=block[0],
                                                       block_k=block[1], round_sf=True, precomputed_sf=False,
                                                       sf_layout="row_major")
    assert args[0] is x and args[1] is q and args[2] is sf


@pytest.mark.parametrize(("hidden", "dtype", "grid_hidden"), [
    (576, torch.bfloat16, 0), (2048, torch.float32, 0), (2048, torch.bfloat16, 0)])
def test_cast_any_hidden_takes_the_generic_variant(op: ModuleType, stub: tuple[dict[str, ModuleType], Any],
                                                   hidden: int, dtype: torch.dtype, grid_hidden: int) -> None:
    # 576 = 4.5 blocks of 128: the last block of each row is partial, and sf has ceil(576 / 128) = 5 columns.
    x = torch.randn(33, hidden).to(dtype)
    q, sf = op.per_block_cast(x, "e4m3", (128, 128), round_sf=True)
    assert q.shape == (33, hidden) and sf.shape == (1, -(-hidden // 128))
    ((_, values, _),) = _launches(stub)
    assert values["hidden"] == grid_hidden and values["in_dtype"] == str(dtype).removeprefix("torch.")


@pytest.mark.parametrize(("packed", "dtype", "storage"), [(False, torch.float32, (16, 4)), (True, torch.uint8, (4, 4, 4))])
def test_cast_column_major_scales(op: ModuleType, stub: tuple[dict[str, ModuleType], Any], packed: bool,
                                  dtype: torch.dtype, storage: tuple[int, ...]) -> None:
    # 33 tokens: one row of 128 x 128 blocks, padded to 4 in the storage; sf is its transposed view (TileKernels').
    q, sf = op.per_block_cast(_x(), "e4m3", (128, 128), use_tma_aligned_col_major_sf=True, round_sf=True,
                              use_packed_ue8m0=packed)
    assert q.shape == (33, 2048) and sf.shape == (1, 4 if packed else 16) and sf.stride() == (1, 4)
    ((_, values, args),) = _launches(stub)
    assert values["sf_layout"] == ("ue8m0" if packed else "col_major")
    assert args[2].dtype == dtype and tuple(args[2].shape) == storage and args[2].data_ptr() == sf.data_ptr()


@pytest.mark.parametrize("num_tokens", [0, 1, 33])
def test_out_is_launched_into_and_returned(op: ModuleType, stub: tuple[dict[str, ModuleType], Any],
                                           num_tokens: int) -> None:
    x = _x(num_tokens)
    out = op.per_block_cast(x, "e2m1", (32, 128))  # what a caller keeps: an earlier call's pair
    result = op.per_block_cast(x, "e2m1", (32, 128), out=list(out))  # a list is taken as the tuple
    assert result[0] is out[0] and result[1] is out[1]
    assert _launches(stub)[-1][2][1:] == out
    q = torch.empty_like(out[0])
    assert op.per_block_cast_with_precomputed_sf(x, "e2m1", (32, 128), out[1], out=q) is q
    (_, values, args) = _launches(stub)[-1]
    assert values["precomputed_sf"] is True and args[1] is q and args[2] is out[1]


def test_out_of_the_wrong_kind_names_out_before_any_launch(op: ModuleType,
                                                           stub: tuple[dict[str, ModuleType], Any]) -> None:
    x = _x()
    q, sf = op.per_block_cast(x, "e4m3", (128, 128))
    for log in (stub[1].LAUNCHES, stub[1].REMEMBERED):
        log.clear()
    with pytest.raises(TypeError, match=r"^out: expected \(q, sf\) as the op returns it"):
        op.per_block_cast(x, "e4m3", (128, 128), out=q)
    with pytest.raises(TypeError, match=r"^out: expected \(q, sf\)"):
        op.per_block_cast(x, "e4m3", (128, 128), out=(q, sf, sf))
    with pytest.raises(TypeError, match=r"^out: expected q as the op returns it \(a tensor\), got tuple"):
        op.per_block_cast_with_precomputed_sf(x, "e4m3", (128, 128), sf, out=(q,))
    assert _launches(stub) == [] and stub[1].REMEMBERED == []


def test_compiling_copies_the_result_into_out(op: ModuleType, back: ModuleType,
                                              stub: tuple[dict[str, ModuleType], Any],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # While torch.compile traces, the custom op (the stub's is the function itself) computes into
    # fresh tensors and the op copies them into out: the graph holds no in-place launch.
    monkeypatch.setattr(op, "_kernel", WritingKernel(op._kernel, (1, 2)))
    monkeypatch.setattr(back, "_kernel", WritingKernel(back._kernel, (2,)))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x = _x()
    out = tuple(poisoned(t) for t in op.per_block_cast(x, "e4m3", (32, 32)))
    result = op.per_block_cast(x, "e4m3", (32, 32), out=out)
    assert result[0] is out[0] and result[1] is out[1] and marked(out[0]) and marked(out[1])
    assert all(a is not t for a in _launches(stub)[-1][2] for t in out)
    q = poisoned(torch.empty_like(out[0]))
    assert op.per_block_cast_with_precomputed_sf(x, "e4m3", (32, 32), out[1], out=q) is q and marked(q)
    assert _launches(stub)[-1][2][1] is not q
    y = poisoned(torch.empty(33, 2048, dtype=torch.bfloat16))
    assert back.per_token_cast_back((q, torch.ones(33, 16)), "bf16", 128, out=y) is y and marked(y)
    assert _launches(stub)[-1][2][2] is not y
    assert stub[1].REMEMBERED == []  # nothing a traced call could depend on


@pytest.mark.parametrize("with_out", [False, True], ids=["allocating", "out="])
@pytest.mark.parametrize(("fmt", "block", "q_dtype", "q_width"), [
    ("e4m3", (128, 128), torch.float8_e4m3fn, 2048), ("e2m1", (32, 128), torch.int8, 1024)])
def test_cast_remembers_its_call_for_dispatch(op: ModuleType, stub: tuple[dict[str, ModuleType], Any], fmt: str,
                                              block: tuple[int, int], q_dtype: torch.dtype, q_width: int,
                                              with_out: bool) -> None:
    x = _x()
    out = op.per_block_cast(x, fmt, block) if with_out else None
    for log in (stub[1].REMEMBERED, stub[1].DISPATCHED):
        log.clear()
    result = op.per_block_cast(x, fmt, block, out=out)
    call = (x, out, fmt, block, False, False, False)
    ((fast, called),) = stub[1].DISPATCHED  # asked first, with the call it remembers
    assert fast[0] == (((1,),), 2) and _same_call(called, call)
    ((arguments, remembered, allocated),) = [_recipe(e) for e in stub[1].REMEMBERED]
    assert arguments == (("input", 0), ("out", 0), ("out", 1)) and _same_call(remembered, call)
    if not with_out:  # what dispatch() would allocate: q of T rows, sf of ceil(T / block_m) rows
        assert allocated == ((q_dtype, ((0, 0, 1, 0, 1), q_width)),
                             (torch.float32, ((0, 0, 1, block[0] - 1, block[0]), 2048 // block[1])))
        assert [(t.dtype, tuple(t.shape)) for t in result] == [(q_dtype, (33, q_width)),
                                                                (torch.float32, (-(-33 // block[0]), 16))]


def test_precomputed_sf_is_remembered_as_an_input(op: ModuleType, stub: tuple[dict[str, ModuleType], Any]) -> None:
    x = _x()
    sf = op.per_block_cast_with_sf_only(x, "e4m3", (32, 128))
    assert sf.shape == (2, 16) and _launches(stub)[-1][1]["precomputed_sf"] is False  # the full cast, q dropped
    stub[1].REMEMBERED.clear()
    q = op.per_block_cast_with_precomputed_sf(x, "e4m3", (32, 128), sf, round_sf=True)
    (_, values, args) = _launches(stub)[-1]
    assert values["precomputed_sf"] is True and values["round_sf"] is False  # round_sf has no effect here
    assert args[0] is x and args[1] is q and args[2] is sf
    ((arguments, call, allocated),) = [_recipe(e) for e in stub[1].REMEMBERED]
    assert arguments == (("input", 0), ("out", 0), ("input", 1))
    assert _same_call(call, (x, sf, None, "e4m3", (32, 128), False, True, False))
    assert allocated == ((torch.float8_e4m3fn, ((0, 0, 1, 0, 1), 2048)),)


def test_options_are_keyed_as_given(op: ModuleType, stub: tuple[dict[str, ModuleType], Any]) -> None:
    # round_sf=1 is round_sf=True to the checks (the same variant) but another signature to dispatch.
    x = _x()
    op.per_block_cast(x, "e4m3", (128, 128), round_sf=1)
    assert _launches(stub)[-1][1]["round_sf"] is True
    ((_, call, _),) = [_recipe(e) for e in stub[1].REMEMBERED]
    assert type(call[5]) is int and call[5] == 1


BAD_CASTS: list[tuple[str, Callable[[ModuleType], Any], type[Exception], str]] = [
    ("block float", lambda m: m.per_block_cast(_x(), "e4m3", (128.0, 128)), TypeError, "block_size"),
    ("block bool", lambda m: m.per_block_cast(_x(), "e4m3", (True, 128)), TypeError, "block_size"),
    ("block single", lambda m: m.per_block_cast(_x(), "e4m3", 128), TypeError, "block_size"),
    ("block zero", lambda m: m.per_block_cast(_x(), "e4m3", (0, 128)), ValueError, "block_size"),
    ("fmt", lambda m: m.per_block_cast(_x(), "e5m2", (128, 128)), ValueError, "fmt"),
    ("hidden 64", lambda m: m.per_block_cast(_x(hidden=2080), "e4m3", (32, 32)), ValueError, "x"),
    ("x rank", lambda m: m.per_block_cast(torch.ones(2048), "e4m3", (128, 128)), ValueError, "x"),
    ("x pair", lambda m: m.per_block_cast((_x(), _x()), "e4m3", (128, 128)), NotImplementedError, "x"),
    ("ue8m0 row-major", lambda m: m.per_block_cast(_x(), "e4m3", (128, 128), use_packed_ue8m0=True, round_sf=True),
     ValueError, "use_packed_ue8m0"),
    ("ue8m0 unrounded", lambda m: m.per_block_cast(_x(), "e4m3", (128, 128), True, use_packed_ue8m0=True),
     ValueError, "use_packed_ue8m0"),
    ("given col major", lambda m: m.per_block_cast_with_precomputed_sf(_x(), "e4m3", (128, 128), torch.ones(1, 16),
                                                                        True), NotImplementedError,
     "use_tma_aligned_col_major_sf"),
    ("sf only fmt", lambda m: m.per_block_cast_with_sf_only(_x(), "e3m4", (128, 128)), ValueError, "fmt"),
    ("given sf", lambda m: m.per_block_cast_with_precomputed_sf(_x(), "e4m3", (128, 128), None), TypeError, "sf"),
    ("given block", lambda m: m.per_block_cast_with_precomputed_sf(_x(), "e4m3", (128.0, 128), torch.ones(1, 16)),
     TypeError, "block_size"),
]


@pytest.mark.parametrize(("name", "call", "error", "argument"), BAD_CASTS, ids=[c[0] for c in BAD_CASTS])
def test_bad_options_are_named_before_any_launch(op: ModuleType, stub: tuple[dict[str, ModuleType], Any], name: str,
                                                 call: Callable[[ModuleType], Any], error: type[Exception],
                                                 argument: str) -> None:
    op.per_block_cast(_x(), "e4m3", (128, 128))  # the signature the bad calls resemble, seen before
    for log in (stub[1].LAUNCHES, stub[1].REMEMBERED):
        log.clear()
    with pytest.raises(error, match=rf"^{argument}: "):
        call(op)
    assert _launches(stub) == [] and stub[1].REMEMBERED == []


def test_a_refused_launch_is_not_remembered(op: ModuleType, stub: tuple[dict[str, ModuleType], Any],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = CheckingKernel(op._kernel, ("x", "q", "sf"))
    monkeypatch.setattr(op, "_kernel", kernel)
    strided = _x(4, 4096)[:, ::2]
    with pytest.raises(_errors(stub).KernelArgumentError, match=r"^x: expected a contiguous tensor"):
        op.per_block_cast(strided, "e4m3", (128, 128))
    assert kernel.refused == 1 and stub[1].REMEMBERED == []


# --- per_token_cast_back ----------------------------------------------------------------------


def test_cast_back_exports_what_the_other_modules_import(back: ModuleType) -> None:
    assert set(back.__all__) == {"cast_back", "per_token_cast_back"}
    from block_ops_stub.quant._per_token_cast_back import cast_back, per_token_cast_back  # per_token_cast's import

    assert callable(cast_back) and callable(per_token_cast_back)


def _q(fmt: str, rows: int = 5, hidden: int = 2048) -> torch.Tensor:
    if fmt == "e4m3":
        return torch.zeros(rows, hidden, dtype=torch.float8_e4m3fn)
    return torch.zeros(rows, hidden // 2, dtype=torch.int8)


@pytest.mark.parametrize("with_out", [False, True], ids=["allocating", "out="])
@pytest.mark.parametrize(("fmt", "npc", "out_fmt", "values"), [
    ("e4m3", 128, "bf16", dict(fmt="e4m3", npc=128, out_dtype="bfloat16", hidden=2048, sf_layout="row_major")),
    ("e2m1", 32, torch.float32, dict(fmt="e2m1", npc=32, out_dtype="float32")),
    ("e4m3", 2048, "fp32", dict(npc=0, out_dtype="float32")),  # one scale per row: grid npc 0
])
def test_cast_back_selects_launches_and_remembers(back: ModuleType, stub: tuple[dict[str, ModuleType], Any],
                                                  fmt: str, npc: int, out_fmt: Any, values: dict[str, Any],
                                                  with_out: bool) -> None:
    q, sf = _q(fmt), torch.ones(5, 2048 // npc)
    dtype = torch.bfloat16 if out_fmt == "bf16" else torch.float32
    out = torch.empty(5, 2048, dtype=dtype) if with_out else None
    result = back.per_token_cast_back((q, sf), out_fmt, npc, out=out)
    assert result.shape == (5, 2048) and result.dtype == dtype and (out is None or result is out)
    ((name, selected, args),) = _launches(stub)
    assert name == "per_token_cast_back" and values.items() <= selected.items()
    assert args[0] is q and args[1] is sf and args[2] is result
    call = (q, sf, out, out_fmt, npc, None)  # the pair unpacked, as dispatch() keys it
    ((fast, called),) = stub[1].DISPATCHED
    assert fast[0] == (((1,), ()), 1) and _same_call(called, call)
    ((arguments, remembered, allocated),) = [_recipe(e) for e in stub[1].REMEMBERED]
    assert arguments == (("input", 0), ("input", 1), ("out", 0)) and _same_call(remembered, call)
    if out is None:
        assert allocated == ((dtype, ((0, 0, 1, 0, 1), 2048)),)


def test_cast_back_takes_a_list_pair_and_fp4x2_codes(back: ModuleType, stub: tuple[dict[str, ModuleType], Any]) -> None:
    q, sf = _q("e2m1"), torch.ones(5, 64)
    back.per_token_cast_back([q, sf], "bf16", 32)
    assert _launches(stub)[-1][2][0] is q and len(stub[1].REMEMBERED) == 1
    fp4x2 = getattr(torch, "float4_e2m1fn_x2", None)
    if fp4x2 is None:
        pytest.skip("this torch has no float4_e2m1fn_x2")
    stub[1].REMEMBERED.clear()
    back.per_token_cast_back((q.view(fp4x2), sf), "bf16", 32)
    (_, values, args) = _launches(stub)[-1]
    assert values["fmt"] == "e2m1" and args[0].dtype == torch.int8 and args[0].data_ptr() == q.data_ptr()
    assert stub[1].REMEMBERED == []  # the launcher reads a view of the codes: dispatch() cannot replay it


def test_cast_back_reads_column_major_and_ue8m0_scales_from_their_storage(
        back: ModuleType, stub: tuple[dict[str, ModuleType], Any]) -> None:
    q = _q("e4m3")
    storage = torch.rand(16, 8)  # what per_token_cast allocates: (groups, align(T, 4)), viewed (T, groups)
    back.per_token_cast_back((q, storage.t()[:5]), "bf16", 128)
    (_, values, args) = _launches(stub)[-1]
    assert values["sf_layout"] == "col_major" and args[1].shape == (16, 8) and args[1].data_ptr() == storage.data_ptr()
    short = torch.rand(16, 9).t()[1:6]  # column-major, but its storage ends before the last column's padding
    back.per_token_cast_back((q, short), "bf16", 128)
    (_, values, args) = _launches(stub)[-1]
    assert values["sf_layout"] == "col_major" and args[1].shape == (16, 5) and torch.equal(args[1], short.t())
    words = torch.randint(0, 2**30, (5, 4), dtype=torch.int32)  # UE8M0: 16 exponents of a token in 4 words
    back.per_token_cast_back((q, words), "bf16", 128)
    (_, values, args) = _launches(stub)[-1]
    assert values["sf_layout"] == "ue8m0" and args[1].dtype == torch.uint8 and args[1].shape == (4, 5, 4)
    assert torch.equal(args[1].view(torch.int32).view(4, 5).t(), words)
    # The launches went through the storage view: what the stub recorded as remembered is no launcher
    # dispatch() could replay (the real remember() stores only launchers with a plan).
    kernels = list(back._kernel.variants.values())
    assert all(entry[1] not in kernels and getattr(entry[1], "planned", None) is None
               for entry in stub[1].REMEMBERED)


def test_cast_back_traces_whole_with_column_major_scales(back: ModuleType, stub: tuple[dict[str, ModuleType], Any],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # torch.compile(fullgraph=True) traces the op's plan, which must not touch sf's storage (a graph
    # break); the storage view is made inside the custom op, on real tensors. The stub registers no
    # torch op, so the test does (a fragment of its own), and its launchers are plain functions.
    launched: list[Any] = []

    def variant(*values: Any) -> Any:  # a launcher per variant, made once (not while tracing)
        launcher = _plain_launchers.get(values)
        if launcher is None:
            launcher = _plain_launchers[values] = _plain_launcher(launched, values)
        return launcher

    monkeypatch.setattr(back._kernel, "variant", variant)
    op_module = importlib.import_module(f"{PACKAGE}._op")
    library = torch.library.Library(f"{PACKAGE}_traced", "FRAGMENT")
    library.define("per_token_cast_back(Tensor[] tensors, int template) -> Tensor[]")
    library.impl("per_token_cast_back", op_module._run_template, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{PACKAGE}_traced::per_token_cast_back", op_module._fake_template, lib=library)
    monkeypatch.setattr(back.per_token_cast_back.op, "_custom",
                        getattr(torch.ops, f"{PACKAGE}_traced").per_token_cast_back.default)
    q, storage = _q("e4m3"), torch.rand(16, 8)
    back.per_token_cast_back((q, storage.t()[:5]), "bf16", 128)  # the variant, looked up eagerly first
    launched.clear()
    traced = torch.compile(lambda q, sf: back.per_token_cast_back((q, sf), "bf16", 128) * 2, fullgraph=True,
                           backend="eager")
    y = traced(q, storage.t()[:5])
    assert y.shape == (5, 2048) and y.dtype == torch.bfloat16
    ((values, args),) = launched
    assert values[-2:] == ("col_major", 1) and args[1].shape == (16, 8) and args[1].data_ptr() == storage.data_ptr()


_plain_launchers: dict[tuple[Any, ...], Callable[..., None]] = {}


def _plain_launcher(log: list[Any], values: tuple[Any, ...]) -> Callable[..., None]:
    """A launcher torch.compile can hold as a constant (no closure cells), recording into log."""
    namespace = {"LOG": log, "VALUES": values}
    exec("def launch(*args):\n    LOG.append((VALUES, args))", namespace)  # a fixed test source
    launcher: Callable[..., None] = namespace["launch"]  # type: ignore[assignment]
    return launcher


BAD_BACKS: list[tuple[str, Callable[[ModuleType], Any], type[Exception], str]] = [
    ("fmt", lambda m: m.per_token_cast_back((_q("e4m3"), torch.ones(5, 16)), "bf16x", 128), ValueError, "fmt"),
    ("npc float", lambda m: m.per_token_cast_back((_q("e4m3"), torch.ones(5, 16)), "bf16", 128.0), TypeError,
     "num_per_channels"),
    ("npc zero", lambda m: m.per_token_cast_back((_q("e4m3"), torch.ones(5, 16)), "bf16", 0), ValueError,
     "num_per_channels"),
    # 96-channel groups of 2048 are 22 (the last partial): sf has 16 columns.
    ("groups of npc", lambda m: m.per_token_cast_back((_q("e4m3"), torch.ones(5, 16)), "bf16", 96),
     Exception, r"x\[1\] \(sf\)"),
    ("special", lambda m: m.per_token_cast_back((_q("e4m3"), torch.ones(5, 16)), "bf16", 128, "e5m7"), ValueError,
     "x_special_fmt"),
    ("e5m6 not built", lambda m: m.per_token_cast_back((_q("e4m3"), torch.ones(5, 16)), "bf16", 128, "e5m6"),
     NotImplementedError, "x_special_fmt"),
    ("x tensor", lambda m: m.per_token_cast_back(_q("e4m3"), "bf16", 128), TypeError, "x"),
    ("x triple", lambda m: m.per_token_cast_back((_q("e4m3"),) * 3, "bf16", 128), TypeError, "x"),
    ("q dtype", lambda m: m.per_token_cast_back((_x(5), torch.ones(5, 16)), "bf16", 128), Exception, r"x\[0\] \(q\)"),
    ("q rank", lambda m: m.per_token_cast_back((torch.zeros(2048, dtype=torch.float8_e4m3fn), torch.ones(5, 16)),
                                               "bf16", 128), ValueError, r"x\[0\] \(q\)"),
    ("sf shape", lambda m: m.per_token_cast_back((_q("e4m3"), torch.ones(5, 15)), "bf16", 128), Exception,
     r"x\[1\] \(sf\)"),
    ("ue8m0 shape", lambda m: m.per_token_cast_back((_q("e4m3"), torch.ones(5, 16, dtype=torch.int32)), "bf16", 128),
     Exception, r"x\[1\] \(sf\)"),
    ("out kind", lambda m: m.per_token_cast_back((_q("e4m3"), torch.ones(5, 16)), "bf16", 128,
                                                 out=[torch.empty(5, 2048)]), TypeError, "out"),
    ("block pair", lambda m: m.cast_back((_q("e4m3"), torch.ones(5, 16)), "bf16", 128), TypeError, "x_block_size"),
    ("block size", lambda m: m.cast_back((_q("e4m3"), torch.ones(1, 32)), "bf16", (64, 64)), NotImplementedError,
     "x_block_size"),
    ("block scales", lambda m: m.cast_back((_q("e4m3"), torch.ones(5, 16)), "bf16", (128, 128)), Exception,
     r"x\[1\] \(sf\)"),
]


@pytest.mark.parametrize(("name", "call", "error", "argument"), BAD_BACKS, ids=[c[0] for c in BAD_BACKS])
def test_cast_back_names_bad_arguments_before_any_launch(back: ModuleType, stub: tuple[dict[str, ModuleType], Any],
                                                         name: str, call: Callable[[ModuleType], Any],
                                                         error: type[Exception], argument: str) -> None:
    back.per_token_cast_back((_q("e4m3"), torch.ones(5, 16)), "bf16", 128)  # a signature seen before
    for log in (stub[1].LAUNCHES, stub[1].REMEMBERED):
        log.clear()
    with pytest.raises(error, match=rf"^{argument}: "):
        call(back)
    assert _launches(stub) == [] and stub[1].REMEMBERED == []


def test_cast_back_a_refused_launch_is_not_remembered(back: ModuleType, stub: tuple[dict[str, ModuleType], Any],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = CheckingKernel(back._kernel, ("q", "sf", "out"))
    monkeypatch.setattr(back, "_kernel", kernel)
    with pytest.raises(_errors(stub).KernelArgumentError, match=r"^out: expected a contiguous tensor"):
        back.per_token_cast_back((_q("e4m3"), torch.ones(5, 16)), "bf16", 128,
                                 out=torch.empty(2048, 5, dtype=torch.bfloat16).t())
    assert kernel.refused == 1 and stub[1].REMEMBERED == []


@pytest.mark.parametrize(("fmt", "block", "npc"), [("e4m3", (128, 128), 128), ("e4m3", (32, 32), 32),
                                                    ("e2m1", (32, 128), 32)])
def test_cast_back_spreads_block_scales_over_tokens(back: ModuleType, stub: tuple[dict[str, ModuleType], Any],
                                                    fmt: str, block: tuple[int, int], npc: int) -> None:
    q = _q(fmt, rows=300)
    scales = torch.rand(-(-300 // block[0]), 2048 // block[1])
    back.cast_back((q, scales.t().contiguous().t()), "bf16", block)  # column-major block scales are read too
    (_, values, args) = _launches(stub)[-1]
    assert values["npc"] == npc and values["sf_layout"] == "row_major"  # FP4 128-wide blocks: four 32-groups
    assert values["block_m"] == 1
    expected = scales.repeat_interleave(block[0], 0)[:300].repeat_interleave(block[1] // npc, 1)
    assert args[0] is q and torch.equal(args[1], expected)
    # What is remembered is the per_token_cast_back call of the spread scales (its signature's recipe).
    ((arguments, call, _),) = [_recipe(e) for e in stub[1].REMEMBERED]
    assert arguments == (("input", 0), ("input", 1), ("out", 0)) and call[0] is q and call[1] is args[1]
    stub[1].REMEMBERED.clear()
    sf = torch.ones(300, 2048 // npc)  # per-token blocks (1, npc): per_token_cast_back as it is
    back.cast_back((q, sf), "bf16", (1, npc))
    assert _launches(stub)[-1][2][:2] == (q, sf)
    ((_, call, _),) = [_recipe(e) for e in stub[1].REMEMBERED]
    assert _same_call(call, (q, sf, None, "bf16", npc, None))


@pytest.mark.parametrize(("fmt", "block", "hidden"), [("e4m3", (128, 128), 576), ("e4m3", (128, 1), 2048),
                                                       ("e4m3", (32, 1), 576), ("e2m1", (32, 128), 576)])
def test_cast_back_reads_row_major_block_scales_in_place(back: ModuleType, stub: tuple[dict[str, ModuleType], Any],
                                                         fmt: str, block: tuple[int, int], hidden: int) -> None:
    # Row-major fp32 per-block and per-channel scales go to the variant of their block_m as they are (no spread
    # copy), at any hidden: 576 = 4.5 blocks of 128, sf has ceil(576 / 128) = 5 columns.
    q = _q(fmt, rows=300, hidden=hidden)
    sf = torch.rand(-(-300 // block[0]), -(-hidden // block[1]))
    y = back.cast_back((q, sf), "fp32", block)
    (_, values, args) = _launches(stub)[-1]
    assert values == {"fmt": fmt, "npc": block[1], "out_dtype": "float32", "hidden": 0, "sf_layout": "row_major",
                      "block_m": block[0]}
    assert args[0] is q and args[1] is sf and y.shape == (300, hidden) and y.dtype == torch.float32
    with pytest.raises(_errors(stub).KernelArgumentError, match=r"^x\[1\] \(sf\)"):
        back.cast_back((q, sf[:1]), "fp32", block)


# --- per_block_cast_lossless ------------------------------------------------------------------


def test_lossless_launches_in_prim_func_order_and_keeps_its_python_path(
        ops: dict[str, ModuleType], stub: tuple[dict[str, ModuleType], Any]) -> None:
    lossless = ops["per_block_cast_lossless"]
    data, x_sf = torch.zeros(33, 1024, dtype=torch.int8), torch.ones(33, 64)
    q, sf = lossless.per_block_cast_lossless((data, x_sf), "e4m3", (1, 32), (128, 128))
    assert q.shape == (33, 2048) and q.dtype == torch.float8_e4m3fn and sf.shape == (1, 16)
    ((_, values, args),) = _launches(stub)
    assert values == {"hidden": 2048, "block_m": 128, "block_k": 128, "in_sf_layout": "row_major",
                      "sf_layout": "row_major"}
    assert [a is b for a, b in zip(args, (data, x_sf, q, sf), strict=True)] == [True] * 4
    again = lossless.per_block_cast_lossless((data, x_sf), "e4m3", (1, 32), (128, 128), out=(q, sf))
    assert again[0] is q and again[1] is sf
    # x is a (data, sf) pair, which dispatch() does not key: neither call is handed to it or remembered.
    assert stub[1].DISPATCHED == [] and stub[1].REMEMBERED == []


@pytest.mark.parametrize(("packed_in", "flags", "sf_layout"), [
    (True, {}, "row_major"), (False, {"use_tma_aligned_col_major_sf": True}, "col_major"),
    (True, {"use_tma_aligned_col_major_sf": True, "use_packed_ue8m0": True}, "ue8m0")])
def test_lossless_scale_layouts_take_the_generic_variant(
        ops: dict[str, ModuleType], stub: tuple[dict[str, ModuleType], Any], packed_in: bool,
        flags: dict[str, bool], sf_layout: str) -> None:
    # 33 tokens of hidden 576: G_in = 18 input blocks (5 UE8M0 words), 5 output blocks of 128 (the last partial).
    lossless = ops["per_block_cast_lossless"]
    data = torch.zeros(33, 288, dtype=torch.int8)
    x_sf = torch.empty(5, 36, dtype=torch.int32).T[:33] if packed_in else torch.ones(33, 18)
    q, sf = lossless.per_block_cast_lossless((data, x_sf), "e4m3", (1, 32), (1, 128), **flags)
    ((_, values, args),) = _launches(stub)
    assert values == {"hidden": 0, "block_m": 1, "block_k": 128, "in_sf_layout": "ue8m0" if packed_in else "row_major",
                      "sf_layout": sf_layout}
    assert q.shape == (33, 576) and sf.shape == ((33, 2) if sf_layout == "ue8m0" else (33, 5))
    if packed_in:  # the kernel reads the words' storage in place, as bytes (words, padded tokens, 4)
        assert args[1].shape == (5, 36, 4) and args[1].data_ptr() == x_sf.data_ptr()
    if sf_layout != "row_major":  # column-major over a (columns, align(33, 4)) storage, as per_block_cast's
        assert sf.stride() == (1, 36)


def test_lossless_refuses_a_hidden_off_64(ops: dict[str, ModuleType]) -> None:
    with pytest.raises(ValueError, match="^x: hidden"):
        ops["per_block_cast_lossless"].per_block_cast_lossless(
            (torch.zeros(3, 48, dtype=torch.int8), torch.ones(3, 3)), "e4m3", (1, 32), (1, 128))
