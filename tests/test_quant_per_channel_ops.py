"""CPU tests of the per-channel and lossless op modules on a stub runtime.

The op modules (ops/quant/per_channel_cast.py, per_channel_cast_and_transpose.py,
per_block_cast_lossless.py) are loaded into a throw-away package whose ``_runtime`` records
variant selections and launches instead of loading cubins (``_args`` is the real one). So the
checks of the non-tensor arguments run without a GPU: every bad input must raise an error
naming its argument before anything is launched, and good inputs must select the right variant
with the tensors in prim_func order and outputs of the documented shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import WritingKernel, marked, poisoned, stub_package

MODULES = ("per_channel_cast", "per_channel_cast_and_transpose", "per_block_cast_lossless")
PACKAGE = "per_channel_ops_stub"
@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], ModuleType]]:
    """(op modules by file stem, the stub _runtime)."""
    with stub_package(tmp_path_factory.mktemp("stub"), PACKAGE, "quant", MODULES) as stubbed:
        yield stubbed


@pytest.fixture()
def ops(stub: tuple[dict[str, ModuleType], ModuleType]) -> dict[str, ModuleType]:
    for log in (stub[1].LAUNCHES, stub[1].REMEMBERED, stub[1].DISPATCHED):
        log.clear()
    return stub[0]


@pytest.fixture()
def launches(stub: tuple[dict[str, ModuleType], ModuleType]) -> list[Any]:
    recorded: list[Any] = stub[1].LAUNCHES
    return recorded


def bf16(rows: int, cols: int) -> torch.Tensor:
    return torch.ones(rows, cols, dtype=torch.bfloat16)


def fp8_pair(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(rows, cols).to(torch.float8_e4m3fn), torch.ones(rows, cols // 128)


def fp4_pair(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(rows, cols // 2, dtype=torch.int8), torch.ones(rows, cols // 32)


BAD_CALLS: list[tuple[str, Callable[[dict[str, ModuleType]], Any], type[Exception], str]] = [
    ("cast fmt", lambda m: m["per_channel_cast"].per_channel_cast(bf16(128, 256), "e5m2", 128), ValueError, "fmt"),
    ("cast npt", lambda m: m["per_channel_cast"].per_channel_cast(bf16(128, 256), "e4m3", 32), ValueError,
     "num_per_tokens"),
    ("cast npt bool", lambda m: m["per_channel_cast"].per_channel_cast(bf16(128, 256), "e4m3", True), ValueError,
     "num_per_tokens"),
    ("cast tokens", lambda m: m["per_channel_cast"].per_channel_cast(bf16(4001, 256), "e4m3", 128), ValueError, "x"),
    ("cast dtype", lambda m: m["per_channel_cast"].per_channel_cast(bf16(128, 256).half(), "e4m3", 128), TypeError,
     "x"),
    ("cast rank", lambda m: m["per_channel_cast"].per_channel_cast(torch.ones(256), "e4m3", 128), ValueError, "x"),
    ("cast list", lambda m: m["per_channel_cast"].per_channel_cast([[1.0]], "e4m3", 128), TypeError, "x"),
    ("fused plain npc", lambda m: m["per_channel_cast"].per_channel_cast_fused(bf16(128, 256), "e4m3", 128,
                                                                               num_per_channels=128),
     ValueError, "num_per_channels"),
    ("fused pair npc", lambda m: m["per_channel_cast"].per_channel_cast_fused(fp8_pair(128, 256), "e4m3", 128),
     ValueError, "num_per_channels"),
    ("fused pair npc 64", lambda m: m["per_channel_cast"].per_channel_cast_fused(fp8_pair(128, 256), "e4m3", 128,
                                                                                 num_per_channels=64),
     ValueError, "num_per_channels"),
    ("fused pair hidden 576", lambda m: m["per_channel_cast"].per_channel_cast_fused(
        (fp8_pair(128, 576)[0], torch.ones(128, 5)), "e4m3", 128, num_per_channels=128), ValueError, "x"),
    ("fused pair dtype", lambda m: m["per_channel_cast"].per_channel_cast_fused(
        (bf16(128, 256), torch.ones(128, 2)), "e4m3", 128, num_per_channels=128), TypeError, "x"),
    ("fused triple", lambda m: m["per_channel_cast"].per_channel_cast_fused(
        (bf16(128, 256),) * 3, "e4m3", 128), ValueError, "x"),
    ("fused pair without sf", lambda m: m["per_channel_cast"].per_channel_cast_fused(
        (fp8_pair(128, 256)[0], None), "e4m3", 128, num_per_channels=128), TypeError, "x_sf"),
    ("fused pair sf rank", lambda m: m["per_channel_cast"].per_channel_cast_fused(
        (fp8_pair(128, 256)[0], torch.ones(256)), "e4m3", 128, num_per_channels=128), ValueError, "x_sf"),
    ("fused npt float", lambda m: m["per_channel_cast"].per_channel_cast_fused(bf16(128, 256), "e4m3", 128.0),
     TypeError, "num_per_tokens"),
    ("fused pos list", lambda m: m["per_channel_cast"].per_channel_cast_fused(
        bf16(10, 256), "e4m3", 128, pos_to_token=[0] * 16), ValueError, "pos_to_token"),
    ("fused pos length", lambda m: m["per_channel_cast"].per_channel_cast_fused(
        bf16(10, 256), "e4m3", 128, pos_to_token=torch.zeros(24, dtype=torch.int32)), ValueError, "pos_to_token"),
    ("fused pos rank", lambda m: m["per_channel_cast"].per_channel_cast_fused(
        bf16(10, 256), "e4m3", 128, pos_to_token=torch.zeros(16, 1, dtype=torch.int32)), ValueError, "pos_to_token"),
    ("fused tokens", lambda m: m["per_channel_cast"].per_channel_cast_fused(bf16(100, 256), "e4m3", 128),
     ValueError, "x"),
    ("transpose dtype", lambda m: m["per_channel_cast_and_transpose"].per_channel_cast_and_transpose(
        bf16(128, 256).float(), "e4m3", 32), TypeError, "x"),
    ("transpose npt", lambda m: m["per_channel_cast_and_transpose"].per_channel_cast_and_transpose(
        bf16(128, 256), "e4m3", 64), ValueError, "num_per_tokens"),
    ("transpose tokens", lambda m: m["per_channel_cast_and_transpose"].per_channel_cast_and_transpose(
        bf16(4001, 256), "e4m3", 32), ValueError, "x"),
    ("transpose hidden", lambda m: m["per_channel_cast_and_transpose"].per_channel_cast_and_transpose(
        bf16(128, 96), "e4m3", 32), ValueError, "x"),
    ("transpose npt float", lambda m: m["per_channel_cast_and_transpose"].per_channel_cast_and_transpose(
        bf16(128, 256), "e4m3", 32.0), TypeError, "num_per_tokens"),
    ("transpose fmt", lambda m: m["per_channel_cast_and_transpose"].per_channel_cast_and_transpose(
        bf16(128, 256), "e2m1", 32), ValueError, "fmt"),
    ("lossless plain", lambda m: m["per_block_cast_lossless"].per_block_cast_lossless(
        bf16(4, 256), "e4m3", (1, 32), (1, 128)), TypeError, "x"),
    ("lossless fmt", lambda m: m["per_block_cast_lossless"].per_block_cast_lossless(
        fp4_pair(4, 256), "e2m1", (1, 32), (1, 128)), ValueError, "fmt"),
    ("lossless in block", lambda m: m["per_block_cast_lossless"].per_block_cast_lossless(
        fp4_pair(4, 256), "e4m3", (1, 128), (1, 128)), ValueError, "x_block_size"),
    ("lossless out block", lambda m: m["per_block_cast_lossless"].per_block_cast_lossless(
        fp4_pair(4, 256), "e4m3", (1, 32), (64, 64)), ValueError, "out_block_size"),
    ("lossless out block type", lambda m: m["per_block_cast_lossless"].per_block_cast_lossless(
        fp4_pair(4, 256), "e4m3", (1, 32), "1x128"), TypeError, "out_block_size"),
    ("lossless data dtype", lambda m: m["per_block_cast_lossless"].per_block_cast_lossless(
        (torch.zeros(4, 128, dtype=torch.uint8), torch.ones(4, 8)), "e4m3", (1, 32), (1, 128)), TypeError, "x"),
    ("lossless sf rows", lambda m: m["per_block_cast_lossless"].per_block_cast_lossless(
        (torch.zeros(4, 128, dtype=torch.int8), torch.ones(3, 8)), "e4m3", (1, 32), (1, 128)), ValueError, "x_sf"),
    ("lossless ue8m0 in shape", lambda m: m["per_block_cast_lossless"].per_block_cast_lossless(
        (torch.zeros(4, 128, dtype=torch.int8), torch.ones(4, 3, dtype=torch.int32)), "e4m3", (1, 32), (1, 128)),
     ValueError, "x_sf"),  # UE8M0 words of 8 input blocks: 2 per token (a KernelArgumentError, a ValueError)
    ("lossless ue8m0 out row-major", lambda m: m["per_block_cast_lossless"].per_block_cast_lossless(
        fp4_pair(4, 256), "e4m3", (1, 32), (1, 128), use_packed_ue8m0=True), ValueError, "use_packed_ue8m0"),
]


@pytest.mark.parametrize(("name", "call", "error", "argument"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_names_the_argument_and_launches_nothing(
    ops: dict[str, ModuleType], launches: list[Any], name: str, call: Callable[[dict[str, ModuleType]], Any],
    error: type[Exception], argument: str,
) -> None:
    with pytest.raises(error, match=rf"^{argument}:"):
        call(ops)
    assert launches == []


def test_per_channel_cast_selects_and_allocates(ops: dict[str, ModuleType], launches: list[Any]) -> None:
    x = torch.ones(256, 2048)
    q, sf = ops["per_channel_cast"].per_channel_cast(x, "e4m3", 128, round_sf=True)
    assert q.shape == (256, 2048) and q.dtype == torch.float8_e4m3fn and sf.shape == (2, 2048)
    (name, values, args), = launches
    assert name == "per_channel_cast_fused"
    assert values == {"in_dtype": "float32", "hidden": 0, "expand": False, "round_sf": True}
    assert args[0] is x and args[1] is q and args[2] is sf


def test_a_plain_x_takes_any_multiple_of_64(ops: dict[str, ModuleType], launches: list[Any]) -> None:
    q, sf = ops["per_channel_cast"].per_channel_cast(bf16(128, 576), "e4m3", 128)
    assert q.shape == (128, 576) and sf.shape == (1, 576)
    (name, values, _), = launches
    assert name == "per_channel_cast_fused"
    assert values == {"in_dtype": "bfloat16", "hidden": 0, "expand": False, "round_sf": False}


def test_fused_passes_tensors_in_prim_func_order(ops: dict[str, ModuleType], launches: list[Any]) -> None:
    x, x_sf = fp8_pair(10, 256)
    pos = torch.full((144,), -1, dtype=torch.int32)
    q, sf = ops["per_channel_cast"].per_channel_cast_fused((x, x_sf), "e4m3", 128, num_per_channels=128,
                                                           pos_to_token=pos)
    assert q.shape == (144, 256) and sf.shape == (2, 256)  # ceil(144 / 128) scale rows
    (_, values, args), = launches
    assert values == {"in_dtype": "float8_e4m3fn", "hidden": 0, "expand": True, "round_sf": False}
    assert [a is b for a, b in zip(args, (x, x_sf, pos, q, sf), strict=True)] == [True] * 5


def test_transpose_allocates_transposed_codes(ops: dict[str, ModuleType], launches: list[Any]) -> None:
    q, sf = ops["per_channel_cast_and_transpose"].per_channel_cast_and_transpose(bf16(256, 128), "e4m3", 32)
    assert q.shape == (128, 256) and q.is_contiguous() and sf.shape == (8, 128)
    (_, values, _), = launches
    assert values == {"hidden": 0, "npt": 32, "round_sf": False}


@pytest.mark.parametrize(("block", "sf_shape"), [((1, 128), (33, 2)), ((32, 32), (2, 8)), ((128, 128), (1, 2))])
def test_lossless_allocates_block_scales(ops: dict[str, ModuleType], launches: list[Any], block: tuple[int, int],
                                         sf_shape: tuple[int, int]) -> None:
    q, sf = ops["per_block_cast_lossless"].per_block_cast_lossless(fp4_pair(33, 256), "e4m3", (1, 32), block)
    assert q.shape == (33, 256) and q.dtype == torch.float8_e4m3fn and sf.shape == sf_shape
    (_, values, _), = launches
    # 256 has no variant of its own: the one for any hidden.
    assert values == {"hidden": 0, "block_m": block[0], "block_k": block[1], "in_sf_layout": "row_major",
                      "sf_layout": "row_major"}


# --- out= ------------------------------------------------------------------------------------


OUT_CALLS: list[tuple[str, str, Callable[..., Any], Callable[[], tuple[Any, ...]]]] = [
    # (name, module, op(inputs..., out=...), fresh inputs)
    ("per_channel_cast", "per_channel_cast",
     lambda m, x, out=None: m.per_channel_cast(x, "e4m3", 128, round_sf=True, out=out), lambda: (bf16(256, 256),)),
    ("per_channel_cast_fused", "per_channel_cast",
     lambda m, x, x_sf, pos, out=None: m.per_channel_cast_fused((x, x_sf), "e4m3", 128, num_per_channels=128,
                                                                 pos_to_token=pos, out=out),
     lambda: (*fp8_pair(10, 256), torch.full((144,), -1, dtype=torch.int32))),
    ("per_channel_cast_and_transpose", "per_channel_cast_and_transpose",
     lambda m, x, out=None: m.per_channel_cast_and_transpose(x, "e4m3", 32, out=out), lambda: (bf16(256, 128),)),
    ("per_block_cast_lossless", "per_block_cast_lossless",
     lambda m, x, x_sf, out=None: m.per_block_cast_lossless((x, x_sf), "e4m3", (1, 32), (32, 32), out=out),
     lambda: fp4_pair(33, 256)),
]
OUT_IDS = [c[0] for c in OUT_CALLS]


@pytest.mark.parametrize(("name", "module", "call", "inputs"), OUT_CALLS, ids=OUT_IDS)
def test_out_is_launched_into_and_returned(ops: dict[str, ModuleType], launches: list[Any], name: str, module: str,
                                           call: Callable[..., Any], inputs: Callable[[], tuple[Any, ...]]) -> None:
    args = inputs()
    out = call(ops[module], *args)  # what a caller keeps: an earlier call's (q, sf)
    result = call(ops[module], *args, out=list(out))  # a list is taken as the tuple
    assert result[0] is out[0] and result[1] is out[1]
    assert launches[-1][2][-2:] == out  # q and sf are the kernel's last arguments, in this order


@pytest.mark.parametrize(("name", "module", "call", "inputs"), OUT_CALLS, ids=OUT_IDS)
def test_out_of_the_wrong_kind_names_out_before_any_launch(
        ops: dict[str, ModuleType], launches: list[Any], name: str, module: str, call: Callable[..., Any],
        inputs: Callable[[], tuple[Any, ...]]) -> None:
    args = inputs()
    q, sf = call(ops[module], *args)
    launches.clear()
    for bad in (q, (q,), (q, sf, sf), (q, None)):
        with pytest.raises(TypeError, match=r"^out: expected \(q, sf\) as the op returns it"):
            call(ops[module], *args, out=bad)
    assert launches == []


@pytest.mark.parametrize(("name", "module", "call", "inputs"), OUT_CALLS, ids=OUT_IDS)
def test_compiling_copies_the_result_into_out(
        ops: dict[str, ModuleType], launches: list[Any], monkeypatch: pytest.MonkeyPatch, name: str, module: str,
        call: Callable[..., Any], inputs: Callable[[], tuple[Any, ...]]) -> None:
    # While torch.compile traces, the custom op (the stub's is the function itself) computes into
    # fresh tensors and the op copies them into out: the graph holds no in-place launch.
    args = inputs()
    out = tuple(poisoned(t) for t in call(ops[module], *args))
    monkeypatch.setattr(ops[module], "_kernel", WritingKernel(ops[module]._kernel, (-2, -1)))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    result = call(ops[module], *args, out=out)
    assert result[0] is out[0] and result[1] is out[1] and marked(out[0]) and marked(out[1])
    assert all(a is not t for a in launches[-1][2] for t in out)


# --- what dispatch() is handed -----------------------------------------------------------------


def _gather(length: int = 144) -> torch.Tensor:
    return torch.full((length,), -1, dtype=torch.int32)


# (name, module, call(op module, *tensors, out=None), fresh tensors, the inputs dispatch() keys in
# order (by position in the tensors, None: absent), the options it keys, (rule's tensor, multiple)):
# the fused form declares x a pair input, which dispatch() keys as q and x_sf, so a pair call is replayed too.
REMEMBERED_CALLS: list[tuple[str, str, Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]],
                             tuple[int | None, ...], tuple[object, ...], tuple[int, int]]] = [
    ("cast", "per_channel_cast", lambda m, x, out=None: m.per_channel_cast(x, "e4m3", 128, True, out=out),
     lambda: (bf16(256, 256),), (0,), ("e4m3", 128, True), (0, 128)),
    ("fused plain", "per_channel_cast", lambda m, x, out=None: m.per_channel_cast_fused(x, "e4m3", 128, out=out),
     lambda: (torch.ones(128, 256),), (0, None, None), ("e4m3", 128, False, None), (0, 128)),
    ("fused gather", "per_channel_cast",
     lambda m, x, pos, out=None: m.per_channel_cast_fused(x, "e4m3", 128, pos_to_token=pos, out=out),
     lambda: (bf16(10, 256), _gather()), (0, None, 1), ("e4m3", 128, False, None), (1, 16)),
    ("fused pair", "per_channel_cast",
     lambda m, x, x_sf, out=None: m.per_channel_cast_fused((x, x_sf), "e4m3", 128, False, 128, out=out),
     lambda: fp8_pair(128, 256), (0, 1, None), ("e4m3", 128, False, 128), (0, 128)),
    ("fused pair gather", "per_channel_cast",
     lambda m, x, x_sf, pos, out=None: m.per_channel_cast_fused((x, x_sf), "e4m3", 128, True, 128, pos, out=out),
     lambda: (*fp8_pair(10, 256), _gather()), (0, 1, 2), ("e4m3", 128, True, 128), (2, 16)),
    ("transpose", "per_channel_cast_and_transpose",
     lambda m, x, out=None: m.per_channel_cast_and_transpose(x, "e4m3", 32, out=out),
     lambda: (bf16(256, 128),), (0,), ("e4m3", 32, False), (0, 128)),
]
REMEMBERED_IDS = [c[0] for c in REMEMBERED_CALLS]


def _resolved(arguments: tuple[Any, ...], call: tuple[Any, ...], inputs: int, out: Any) -> list[Any]:
    """A remembered recipe's launcher arguments for ``call`` (its inputs, then out, then options)."""
    return [(call[a.index] if a.kind == "input" else out[a.index]) if type(a).__name__ == "Source" else a
            for a in arguments]


def _replay(entry: tuple[Any, ...], call: tuple[Any, ...]) -> tuple[list[Any], bool] | None:
    """What dispatch() would launch for ``call`` under a remembered ``entry`` of an allocating call,
    and whether the entry's rules hold over it; None where the call does not key as the entry."""
    fast, _, arguments, rules, remembered, outputs = entry
    (masks, _), inputs = fast[0], len(fast[0][0])
    for dims, a, b in zip(masks, call[:inputs], remembered[:inputs], strict=True):
        if (a is None) != (b is None) or (a is not None and (a.dtype, a.dim(), [a.shape[d] for d in dims]) !=
                                          (b.dtype, b.dim(), [b.shape[d] for d in dims])):
            return None
    if [(type(o), o) for o in call[inputs + 1:]] != [(type(o), o) for o in remembered[inputs + 1:]]:
        return None
    out = [torch.empty([d if isinstance(d, int) else (call[d[0]].shape[d[1]] * d[2] + d[3]) // d[4]
                        for d in o.dims], dtype=o.dtype) for o in outputs]
    launched = _resolved(arguments, call, inputs, out)
    holds = all(launched[a].shape[dim] % k == 0 for kind, a, dim, k in rules if kind == "size_multiple")
    return launched, holds


@pytest.mark.parametrize("given", [False, True], ids=["allocating", "out="])
@pytest.mark.parametrize(("name", "module", "call", "tensors", "keyed", "options", "rule"), REMEMBERED_CALLS,
                         ids=REMEMBERED_IDS)
def test_a_call_is_remembered_as_its_launch_with_the_rule_it_relies_on(
        ops: dict[str, ModuleType], stub: tuple[dict[str, ModuleType], ModuleType], given: bool, name: str,
        module: str, call: Callable[..., Any], tensors: Callable[[], tuple[torch.Tensor, ...]],
        keyed: tuple[int | None, ...], options: tuple[object, ...], rule: tuple[int, int]) -> None:
    runtime, args = stub[1], tensors()
    out = call(ops[module], *args) if given else None
    for log in (runtime.LAUNCHES, runtime.REMEMBERED, runtime.DISPATCHED):
        log.clear()
    result = call(ops[module], *args, out=out)
    expected = (*(None if i is None else args[i] for i in keyed), out, *options)
    (fast, dispatched), = runtime.DISPATCHED  # asked first, with the inputs unpacked and the options as given
    assert len(dispatched) == len(expected) and all(
        a is b if isinstance(b, torch.Tensor) or b is None else (type(a), a) == (type(b), b)
        for a, b in zip(dispatched, expected, strict=True))
    (remembered_fast, _, arguments, rules, remembered, outputs), = runtime.REMEMBERED
    assert remembered_fast is fast and all(a is b for a, b in zip(remembered, dispatched, strict=True))
    (_, _, launched), = runtime.LAUNCHES
    resolved = _resolved(arguments, remembered, len(keyed), result)
    assert len(resolved) == len(launched) and all(a is b for a, b in zip(resolved, launched, strict=True))
    # the rule the contract cannot see: a size of x (num_tokens) or pos_to_token (its length)
    tensor, k = rule
    (kind, argument, dim, multiple), = rules
    assert (kind, dim, multiple) == ("size_multiple", 0, k) and launched[argument] is args[tensor]
    if given:
        assert result[0] is out[0] and result[1] is out[1]
    else:  # dispatch() allocates (q, sf) as the op did
        shapes = [tuple(d if isinstance(d, int) else (remembered[d[0]].shape[d[1]] * d[2] + d[3]) // d[4]
                        for d in o.dims) for o in outputs]
        assert [(o.dtype, s) for o, s in zip(outputs, shapes, strict=True)] == [(t.dtype, t.shape) for t in result]


# (name, the remembered call's tensors, another call's of the same signature: more tokens / rows)
REPLAYS = [("cast", (bf16(384, 256),)), ("fused gather", (bf16(3, 256), _gather(48))),
           ("fused pair", fp8_pair(384, 256)), ("fused pair gather", (*fp8_pair(1, 256), _gather(16))),
           ("transpose", (bf16(384, 128),))]


@pytest.mark.parametrize(("name", "other"), REPLAYS, ids=[r[0] for r in REPLAYS])
def test_a_replay_on_other_sizes_is_the_launch_of_the_python_path(
        ops: dict[str, ModuleType], stub: tuple[dict[str, ModuleType], ModuleType], name: str,
        other: tuple[torch.Tensor, ...]) -> None:
    _, module, call, tensors, keyed, options, _ = REMEMBERED_CALLS[REMEMBERED_IDS.index(name)]
    runtime = stub[1]
    call(ops[module], *tensors())
    entry, = runtime.REMEMBERED
    replay = _replay(entry, (*(None if i is None else other[i] for i in keyed), None, *options))
    assert replay is not None and replay[1]
    runtime.LAUNCHES.clear()
    call(ops[module], *other)
    (_, _, launched), = runtime.LAUNCHES
    inputs = len(launched) - 2  # the caller's tensors, then q and sf (which the replay allocates)
    assert len(replay[0]) == len(launched) and all(a is b for a, b in zip(replay[0][:inputs], launched[:inputs]))
    assert [(t.dtype, t.shape) for t in replay[0][inputs:]] == [(t.dtype, t.shape) for t in launched[inputs:]]


# (name, a call of the remembered signature whose size the rule refuses, the error the op raises)
REFUSED = [("cast", (bf16(200, 256),), "x: num_tokens \\(200\\) must be a multiple of 128"),
           ("fused plain", (torch.ones(64, 256),), "x: num_tokens \\(64\\) must be a multiple of 128"),
           ("fused gather", (bf16(10, 256), _gather(40)), "pos_to_token: its length \\(40\\) must be a multiple of 16"),
           ("fused pair", fp8_pair(100, 256), "x: num_tokens \\(100\\) must be a multiple of 128"),
           ("transpose", (bf16(96, 128),), "x: num_tokens \\(96\\) must be a multiple of 128")]


@pytest.mark.parametrize(("name", "other", "message"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_size_the_rule_refuses_is_not_replayed_and_the_op_names_it(
        ops: dict[str, ModuleType], stub: tuple[dict[str, ModuleType], ModuleType], name: str,
        other: tuple[torch.Tensor, ...], message: str) -> None:
    _, module, call, tensors, keyed, options, _ = REMEMBERED_CALLS[REMEMBERED_IDS.index(name)]
    runtime = stub[1]
    call(ops[module], *tensors())
    entry, = runtime.REMEMBERED
    replay = _replay(entry, (*(None if i is None else other[i] for i in keyed), None, *options))
    assert replay is not None and not replay[1]  # keyed as the entry: only the rule stops dispatch()
    runtime.LAUNCHES.clear()
    with pytest.raises(ValueError, match=rf"^{message}"):
        call(ops[module], *other)
    assert runtime.LAUNCHES == []


def test_the_plain_and_the_pair_forms_are_signatures_of_their_own(
        ops: dict[str, ModuleType], stub: tuple[dict[str, ModuleType], ModuleType]) -> None:
    # A pair call never keys as a plain call of its q (x_sf is an input, absent in a plain call), nor
    # per_channel_cast as the fused op's plain form (each op has its own table).
    fused, runtime = ops["per_channel_cast"].per_channel_cast_fused, stub[1]
    x, x_sf = fp8_pair(128, 256)
    fused((x, x_sf), "e4m3", 128, num_per_channels=128)
    ops["per_channel_cast"].per_channel_cast(bf16(128, 256), "e4m3", 128)
    pair, plain = runtime.REMEMBERED
    assert pair[0] is not plain[0]
    assert _replay(pair, (x, None, None, None, "e4m3", 128, False, 128)) is None
    assert _replay(pair, (x, x_sf, None, None, "e4m3", 128, False, 128.0)) is None  # 128.0 == 128, not a hit
    assert _replay(pair, (x, x_sf, None, None, "e4m3", 128, False, 128)) is not None
