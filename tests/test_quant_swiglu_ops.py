"""CPU tests of the swiglu op modules (ops/quant/swiglu_*.py) on a stub runtime.

The op modules are loaded into a throw-away package whose ``_runtime`` records variant
selections and launches instead of loading cubins (``_args`` is the real one), so the checks
of the non-tensor arguments and of the shapes tying tensors together run without a GPU:
every bad input must raise an error naming its argument before anything is launched.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import WritingKernel, marked, poisoned, stub_package

OPS = ("swiglu_forward_and_per_token_cast", "swiglu_backward_and_per_token_cast",
       "swiglu_forward_and_per_channel_cast_and_transpose")
@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType]]:
    """(the quant package of op modules, the stub _runtime)."""
    with stub_package(tmp_path_factory.mktemp("stub"), "swiglu_ops_stub", "quant", OPS) as (modules, runtime):
        yield _Namespace(modules), runtime


class _Namespace(ModuleType):
    def __init__(self, modules: dict[str, ModuleType]) -> None:
        super().__init__("quant")
        self.modules = modules
        for op, module in modules.items():
            setattr(self, op, getattr(module, op))


def _launches(runtime: ModuleType) -> list[Any]:
    launches: list[Any] = runtime.LAUNCHES
    return launches


@pytest.fixture()
def quant(stub: tuple[ModuleType, ModuleType]) -> Any:
    """The ops with no launch, remembered call or dispatch logged. (The stub's dispatch() always
    declines, so every call runs the op's plan: its full checks.)"""
    for log in (stub[1].LAUNCHES, stub[1].REMEMBERED, stub[1].DISPATCHED):
        log.clear()
    return stub[0]


def _x(rows: int = 4, hidden: int = 2048) -> torch.Tensor:
    return torch.randn(rows, 2 * hidden).bfloat16()


# --- forward per-token ---------------------------------------------------------------------


def test_forward_selects_and_launches(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    pos = torch.tensor([0, 1, -1, 3], dtype=torch.int32)
    q, sf = quant.swiglu_forward_and_per_token_cast(_x(), "e4m3", 128, pos, torch.rand(2, 2), round_sf=True)
    assert q.shape == (4, 2048) and q.dtype == torch.float8_e4m3fn and sf.shape == (4, 16)
    ((name, values, args),) = _launches(stub[1])
    assert name == "swiglu_forward_and_per_token_cast"
    assert values == {"hidden": 2048, "npc": 128, "with_weights": True, "with_pos_to_expert": False,
                      "sf_layout": "row_major", "count_clamp": False}
    assert args[3] is pos and args[5].shape == (1,)  # pos_to_expert: a placeholder
    assert args[6] == math.inf and args[7] == 1  # no clamp = +inf; round_sf is a runtime 0/1 flag


def test_forward_per_row_scale_and_clamp(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    _, sf = quant.swiglu_forward_and_per_token_cast(_x(hidden=2560), "e4m3", 2560, swiglu_clamp_value=7)
    assert sf.shape == (4, 1)
    ((_, values, args),) = _launches(stub[1])
    assert values["npc"] == 0 and values["with_weights"] is False and args[6:] == (7.0, 0)


@pytest.mark.parametrize("npc", [128, 0])
def test_forward_any_hidden_takes_the_generic_variant(quant: Any, stub: tuple[ModuleType, ModuleType],
                                                     npc: int) -> None:
    # 1280 is built for no hidden: the variant for a runtime hidden, with the amax floor as a scalar.
    q, sf = quant.swiglu_forward_and_per_token_cast(_x(hidden=1280), "e4m3", npc or 1280, round_sf=True)
    assert q.shape == (4, 1280) and sf.shape == (4, 10 if npc else 1) and sf.dtype == torch.float32
    ((_, values, args),) = _launches(stub[1])
    assert values == {"hidden": 0, "npc": npc, "with_weights": False, "with_pos_to_expert": False,
                      "sf_layout": "row_major", "count_clamp": False}
    assert args[6].dtype == torch.int64 and args[7:] == (math.inf, 1, 1e-4)


@pytest.mark.parametrize(("packed", "dtype", "storage"), [(False, torch.float32, (10, 8)),
                                                          (True, torch.int32, (3, 8, 4))])
def test_forward_column_major_scales(quant: Any, stub: tuple[ModuleType, ModuleType], packed: bool,
                                     dtype: torch.dtype, storage: tuple[int, ...]) -> None:
    # 5 tokens: the storage's token dimension is padded to 8; sf is its transposed view, as TileKernels returns it.
    q, sf = quant.swiglu_forward_and_per_token_cast(_x(5, 1280), "e4m3", 128, use_tma_aligned_col_major_sf=True,
                                                    round_sf=True, use_packed_ue8m0=packed)
    assert q.shape == (5, 1280) and q.dtype == torch.float8_e4m3fn
    assert sf.dtype == dtype and sf.shape == (5, 3 if packed else 10) and sf.stride() == (1, 8)
    ((_, values, args),) = _launches(stub[1])
    assert values["hidden"] == 0 and values["sf_layout"] == ("ue8m0" if packed else "col_major")
    assert tuple(args[2].shape) == storage and args[2].data_ptr() == sf.data_ptr()


def test_forward_hot_hidden_with_an_option_takes_the_generic_variant(quant: Any,
                                                                     stub: tuple[ModuleType, ModuleType]) -> None:
    quant.swiglu_forward_and_per_token_cast(_x(), "e4m3", 128, sf_clamp_min=1e-3)
    ((_, values, args),) = _launches(stub[1])
    assert values["hidden"] == 0 and args[-1] == 1e-3


def test_forward_clamped_count_is_written_in_place(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    counts = torch.zeros(3, dtype=torch.int64)
    q, sf = quant.swiglu_forward_and_per_token_cast(_x(), "e4m3", 128, swiglu_clamp_value=0.5,
                                                    clamped_count=counts)
    assert q.shape == (4, 2048) and sf.shape == (4, 16)
    ((_, values, args),) = _launches(stub[1])
    assert values["hidden"] == 0 and values["count_clamp"] is True
    assert args[1] is q and args[2] is sf and args[6] is counts and args[7] == 0.5


def test_forward_placeholders_are_allocated_once(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    # The optional tensors' stand-ins are one pair per device: no allocation per call.
    quant.swiglu_forward_and_per_token_cast(_x(), "e4m3", 128)
    quant.swiglu_forward_and_per_token_cast(_x(), "e4m3", 128, pos_to_expert=torch.zeros(4, dtype=torch.int32))
    (_, _, first), (_, _, second) = _launches(stub[1])
    assert first[3] is first[5] is second[3] and first[4] is second[4]
    assert first[3].shape == (1,) and first[4].shape == (1, 1) and first[4].dtype == torch.float32


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"x": "x"}, TypeError, "x"),
    ({"x": torch.zeros(4, 2, 4096).bfloat16()}, ValueError, "x"),
    ({"x": torch.zeros(4, 4096)}, TypeError, "x"),
    ({"x": torch.zeros(4, 300).bfloat16()}, ValueError, "x"),
    ({"fmt": "e2m1"}, ValueError, "fmt"),
    ({"num_per_channels": 64}, ValueError, "num_per_channels"),
    ({"num_per_channels": True}, ValueError, "num_per_channels"),
    ({"num_per_channels": 128.0}, TypeError, "num_per_channels"),
    ({"topk_weights": torch.rand(2, 2)}, ValueError, "pos_to_token_topk"),
    ({"pos_to_token_topk": torch.zeros(4, dtype=torch.int32)}, ValueError, "topk_weights"),
    ({"pos_to_token_topk": torch.zeros(5, dtype=torch.int32), "topk_weights": torch.rand(2, 2)}, ValueError,
     "pos_to_token_topk"),
    ({"pos_to_token_topk": torch.zeros(4, dtype=torch.int32), "topk_weights": torch.rand(4)}, ValueError,
     "topk_weights"),
    ({"pos_to_expert": torch.zeros(4, 1, dtype=torch.int32)}, ValueError, "pos_to_expert"),
    ({"swiglu_clamp_value": 0.0}, ValueError, "swiglu_clamp_value"),
    ({"swiglu_clamp_value": float("nan")}, ValueError, "swiglu_clamp_value"),
    ({"use_packed_ue8m0": True, "round_sf": True}, ValueError, "use_packed_ue8m0"),
    ({"use_packed_ue8m0": True, "use_tma_aligned_col_major_sf": True}, ValueError, "use_packed_ue8m0"),
    ({"use_tma_aligned_col_major_sf": True, "num_per_channels": 2048}, ValueError, "use_tma_aligned_col_major_sf"),
    ({"clamped_count": torch.zeros(3, dtype=torch.int64)}, ValueError, "clamped_count"),
    ({"clamped_count": torch.zeros(3, dtype=torch.int32), "swiglu_clamp_value": 1.0}, ValueError, "clamped_count"),
    ({"clamped_count": torch.zeros(2, dtype=torch.int64), "swiglu_clamp_value": 1.0}, ValueError, "clamped_count"),
    ({"clamped_count": [0, 0, 0], "swiglu_clamp_value": 1.0}, TypeError, "clamped_count"),
    ({"sf_clamp_min": 0.0}, ValueError, "sf_clamp_min"),
    ({"sf_clamp_min": "1"}, TypeError, "sf_clamp_min"),
])
def test_forward_errors_name_the_argument_before_any_launch(
        quant: Any, stub: tuple[ModuleType, ModuleType], kwargs: dict[str, Any], error: type[Exception],
        name: str) -> None:
    args: dict[str, Any] = {"x": _x(), "fmt": "e4m3", "num_per_channels": 128}
    args.update(kwargs)
    with pytest.raises(error, match=rf"^{name}\b"):
        quant.swiglu_forward_and_per_token_cast(**args)
    assert _launches(stub[1]) == []


# --- backward ------------------------------------------------------------------------------


def _bwd_args(rows: int = 4, hidden: int = 2048, npc: int = 128) -> dict[str, Any]:
    data = torch.zeros(rows, 2 * hidden).to(torch.float8_e4m3fn)
    return {
        "x": (data, torch.ones(rows, 2 * hidden // npc)),
        "grad_out": torch.zeros(rows, hidden).bfloat16(),
        "weight": torch.rand(2, 2),
        "pos_to_token_topk": torch.tensor([0, 1, 2, 3], dtype=torch.int32)[:rows],
        "token_topk_to_pos": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        "num_per_channels": npc,
    }


def test_backward_selects_and_launches(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    out, (q, q_sf), x_grad, weight_grad = quant.swiglu_backward_and_per_token_cast(**_bwd_args(npc=32),
                                                                                  swiglu_clamp_value=0.5)
    assert out.shape == (4, 2048) and out.dtype == torch.bfloat16
    assert q.shape == (4, 4096) and q_sf.shape == (4, 128) and x_grad.shape == (4, 4096)
    assert weight_grad.shape == (2, 2) and weight_grad.dtype == torch.float32
    ((name, values, args),) = _launches(stub[1])
    assert name == "swiglu_backward_and_per_token_cast" and values == {"hidden": 2048, "npc": 32}
    assert len(args) == 13 and args[-2:] == (0.5, 0)


def test_backward_any_hidden_and_3d_x(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    # hidden 1280 is built for no hidden: the variant for a runtime one. x (B, S, 2H) is TileKernels' other form.
    args = _bwd_args(hidden=1280)
    data, sf = args["x"]
    args["x"] = (data.view(2, 2, 2560), sf)
    args["grad_out"] = args["grad_out"].view(2, 2, 1280)
    out, (q, _), x_grad, _ = quant.swiglu_backward_and_per_token_cast(**args)
    assert out.shape == (4, 1280) and q.shape == (4, 2560) and x_grad.shape == (4, 2560)
    ((_, values, launched),) = _launches(stub[1])
    assert values == {"hidden": 0, "npc": 128} and launched[0].shape == (4, 2560)


def test_backward_without_rows_zeroes_weight_grad(quant: Any) -> None:
    args = _bwd_args(rows=0)
    args["token_topk_to_pos"] = torch.full((2, 2), -1, dtype=torch.int32)
    *_, weight_grad = quant.swiglu_backward_and_per_token_cast(**args)
    assert torch.equal(weight_grad, torch.zeros(2, 2))


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"x": torch.zeros(4, 4096)}, TypeError, "x"),
    ({"x": (torch.zeros(4, 4096), torch.ones(4, 32))}, TypeError, "x"),
    ({"x": (torch.zeros(4, 1280).to(torch.float8_e4m3fn), torch.ones(4, 10))}, ValueError, "x"),
    ({"x": (torch.zeros(4, 4096).to(torch.float8_e4m3fn), torch.ones(4, 31))}, ValueError, "x_sf"),
    ({"num_per_channels": 64}, ValueError, "num_per_channels"),
    ({"grad_out": torch.zeros(4, 4096).bfloat16()}, ValueError, "grad_out"),
    ({"weight": torch.rand(4)}, ValueError, "weight"),
    ({"pos_to_token_topk": torch.zeros(3, dtype=torch.int32)}, ValueError, "pos_to_token_topk"),
    ({"token_topk_to_pos": torch.zeros(2, 3, dtype=torch.int32)}, ValueError, "token_topk_to_pos"),
    ({"swiglu_clamp_value": -0.5}, ValueError, "swiglu_clamp_value"),
])
def test_backward_errors_name_the_argument_before_any_launch(
        quant: Any, stub: tuple[ModuleType, ModuleType], kwargs: dict[str, Any], error: type[Exception],
        name: str) -> None:
    args = _bwd_args()
    args.update(kwargs)
    with pytest.raises(error, match=rf"^{name}\b"):
        quant.swiglu_backward_and_per_token_cast(**args)
    assert _launches(stub[1]) == []


# --- forward per-channel -------------------------------------------------------------------


def test_per_channel_selects_and_launches(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    q, sf = quant.swiglu_forward_and_per_channel_cast_and_transpose(_x(256), "e4m3", 32, round_sf=True)
    assert q.shape == (2048, 256) and sf.shape == (8, 2048)
    q, sf = quant.swiglu_forward_and_per_channel_cast_and_transpose(_x(256), "e4m3", 128, without_transpose=True)
    assert q.shape == (256, 2048) and sf.shape == (2, 2048)
    (_, first, _), (_, second, args) = _launches(stub[1])
    assert first == {"hidden": 0, "npt": 32, "without_transpose": False}
    assert second == {"hidden": 0, "npt": 128, "without_transpose": True}
    assert args[-2:] == (math.inf, 0)


def test_per_channel_without_tokens_launches_nothing(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    q, sf = quant.swiglu_forward_and_per_channel_cast_and_transpose(_x(0), "e4m3", 128)
    assert q.shape == (2048, 0) and sf.shape == (0, 2048) and _launches(stub[1]) == []


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"x": _x(100)}, ValueError, "x"),
    ({"x": torch.zeros(128, 4096)}, TypeError, "x"),
    ({"x": torch.zeros(128, 200).bfloat16()}, ValueError, "x"),
    ({"fmt": "e5m6"}, ValueError, "fmt"),
    ({"num_per_tokens": 64}, ValueError, "num_per_tokens"),
    ({"swiglu_clamp_value": -1}, ValueError, "swiglu_clamp_value"),
])
def test_per_channel_errors_name_the_argument_before_any_launch(
        quant: Any, stub: tuple[ModuleType, ModuleType], kwargs: dict[str, Any], error: type[Exception],
        name: str) -> None:
    args: dict[str, Any] = {"x": _x(128), "fmt": "e4m3", "num_per_tokens": 128}
    args.update(kwargs)
    with pytest.raises(error, match=rf"^{name}\b"):
        quant.swiglu_forward_and_per_channel_cast_and_transpose(**args)
    assert _launches(stub[1]) == []



# --- out= ------------------------------------------------------------------------------------


def _fwd_args() -> dict[str, Any]:
    return {"x": _x(), "fmt": "e4m3", "num_per_channels": 128,
            "pos_to_token_topk": torch.tensor([0, 1, -1, 3], dtype=torch.int32), "topk_weights": torch.rand(2, 2),
            "pos_to_expert": torch.tensor([0, 0, -1, 1], dtype=torch.int32)}


def _flat(result: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
    """The backward's (out, (q, q_sf), x_grad, weight_grad) as five tensors; other results as they are."""
    if len(result) == 4:
        return (result[0], *result[1], result[2], result[3])
    return tuple(result)


# name -> (op(out=...) as a function of out, the positions of the outputs in the launch)
OUT_CALLS: dict[str, tuple[Any, tuple[int, ...]]] = {
    "forward": (lambda q, out=None: q.swiglu_forward_and_per_token_cast(**_fwd_args(), out=out), (1, 2)),
    "backward": (lambda q, out=None: q.swiglu_backward_and_per_token_cast(**_bwd_args(), out=out), (6, 7, 8, 9, 10)),
    "per-channel": (lambda q, out=None: q.swiglu_forward_and_per_channel_cast_and_transpose(
        _x(128), "e4m3", 32, without_transpose=True, out=out), (1, 2)),
}


@pytest.mark.parametrize("name", OUT_CALLS)
def test_out_is_launched_into_and_returned(quant: Any, stub: tuple[ModuleType, ModuleType], name: str) -> None:
    call, written = OUT_CALLS[name]
    out = call(quant)  # what a caller keeps: an earlier call's result
    result = call(quant, out=out)
    assert all(r is o for r, o in zip(_flat(result), _flat(out), strict=True))
    if name == "backward":
        assert result[1] is not out[1] and result is not out  # the same tensors, in new tuples
    launch_args = _launches(stub[1])[-1][2]
    assert all(launch_args[i] is t for i, t in zip(written, _flat(out), strict=True))


def test_forward_out_rows_that_pos_to_expert_skips_keep_their_bytes(quant: Any,
                                                                      stub: tuple[ModuleType, ModuleType]) -> None:
    # The op writes nothing into out itself (the stub's launch writes nothing either): the rows
    # whose pos_to_expert is -1, which the kernel skips, keep what out held, as the allocating
    # call leaves them uninitialised.
    q, sf = (poisoned(t) for t in quant.swiglu_forward_and_per_token_cast(**_fwd_args()))
    quant.swiglu_forward_and_per_token_cast(**_fwd_args(), out=(q, sf))
    assert _launches(stub[1])[-1][2][5][2] == -1
    assert bool((q.view(torch.uint8) == 0x7F).all()) and bool((sf.view(torch.uint8) == 0x7F).all())


def test_backward_without_rows_zeroes_the_out_weight_grad(quant: Any) -> None:
    args = _bwd_args(rows=0)
    args["token_topk_to_pos"] = torch.full((2, 2), -1, dtype=torch.int32)
    out = tuple(poisoned(t) for t in _flat(quant.swiglu_backward_and_per_token_cast(**args)))
    result = quant.swiglu_backward_and_per_token_cast(**args, out=(out[0], out[1:3], out[3], out[4]))
    assert result[3] is out[4] and torch.equal(out[4], torch.zeros(2, 2))


def test_per_channel_out_without_tokens_launches_nothing(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    out = quant.swiglu_forward_and_per_channel_cast_and_transpose(_x(0), "e4m3", 128)
    result = quant.swiglu_forward_and_per_channel_cast_and_transpose(_x(0), "e4m3", 128, out=out)
    assert result[0] is out[0] and result[1] is out[1] and _launches(stub[1]) == []


BACKWARD_FORM = r"\(out, \(x_grad_fp8, x_grad_fp8_sf\), x_grad, weight_grad\)"
WRONG_OUTS: dict[str, tuple[str, Any, str]] = {  # (op, out from the good one's tensors, the form named)
    "forward tensor": ("forward", lambda t: t[0], r"\(q, sf\)"),
    "forward one": ("forward", lambda t: (t[0],), r"\(q, sf\)"),
    "per-channel three": ("per-channel", lambda t: (*t, t[1]), r"\(q, sf\)"),
    "backward flat": ("backward", lambda t: t, BACKWARD_FORM),
    "backward pair as a tensor": ("backward", lambda t: (t[0], t[1], t[3], t[4]), BACKWARD_FORM),
    "backward None in the pair": ("backward", lambda t: [t[0], (t[1], None), t[3], t[4]], BACKWARD_FORM),
}


@pytest.mark.parametrize("case", WRONG_OUTS)
def test_out_of_the_wrong_kind_names_out_before_any_launch(quant: Any, stub: tuple[ModuleType, ModuleType],
                                                          case: str) -> None:
    name, wrong, form = WRONG_OUTS[case]
    call, _ = OUT_CALLS[name]
    tensors = _flat(call(quant))
    _launches(stub[1]).clear()
    with pytest.raises(TypeError, match=rf"^out: expected {form} as the op returns it"):
        call(quant, out=wrong(tensors))
    assert _launches(stub[1]) == []


@pytest.mark.parametrize("name", OUT_CALLS)
def test_compiling_copies_the_result_into_out(quant: Any, stub: tuple[ModuleType, ModuleType],
                                              monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # While torch.compile traces, the custom op (the stub's is the function itself) computes into
    # fresh tensors and the op copies them into out: the graph holds no in-place launch.
    call, written = OUT_CALLS[name]
    out = call(quant)
    for t in _flat(out):
        poisoned(t)
    module = quant.modules[{"forward": "swiglu_forward_and_per_token_cast",
                            "backward": "swiglu_backward_and_per_token_cast",
                            "per-channel": "swiglu_forward_and_per_channel_cast_and_transpose"}[name]]
    monkeypatch.setattr(module, "_kernel", WritingKernel(module._kernel, written))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    result = call(quant, out=out)
    assert all(r is o and marked(o) for r, o in zip(_flat(result), _flat(out), strict=True))
    assert all(a is not t for a in _launches(stub[1])[-1][2] for t in _flat(out))


# --- what dispatch() is handed ----------------------------------------------------------------


def _resolve(entry: tuple[Any, ...], result: Any) -> list[Any]:
    """A remembered entry's launcher arguments, resolved against its call (inputs) and result (outputs)."""
    fast, _, arguments, _, call, _ = entry
    inputs = len(fast[0][0])
    outputs = call[inputs] if call[inputs] is not None else result
    return [call[a.index] if type(a).__name__ == "Source" and a.kind == "input" else
            outputs[a.index] if type(a).__name__ == "Source" else a for a in arguments]


def _rule_holds(rule: tuple[Any, ...], args: list[Any]) -> bool:
    """A packed rule over launcher arguments, as _launch.c's rules_hold() reads it."""
    kind, a, i, *rest = rule
    if kind == "same_size":
        b, j, times = rest
        return bool(args[b].shape[j] == args[a].shape[i] * times)
    assert kind == "size_multiple"
    return bool(args[a].shape[i] % rest[0] == 0)


def test_forward_remembers_the_position_lengths_as_rules(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    # The positions' lengths are sizes of their own in the contract: a replayed call must check
    # them against x's rows (launcher argument 0) as the plan does.
    args = _fwd_args()
    for out in (None, quant.swiglu_forward_and_per_token_cast(**args)):
        stub[1].REMEMBERED.clear()
        result = quant.swiglu_forward_and_per_token_cast(**args, out=out)
        ((fast, _, _, rules, call, allocated),) = stub[1].REMEMBERED
        assert fast[0] == (((1,), (), (), ()), 2)  # keyed by x's width; the positions and weights by dtype and rank
        assert call[0] is args["x"] and call[4] is out and call[5:7] == ("e4m3", 128)
        assert rules == (("same_size", 3, 0, 0, 0, 1), ("same_size", 5, 0, 0, 0, 1))
        launched = _launches(stub[1])[-1][2]
        resolved = _resolve(stub[1].REMEMBERED[0], result)
        assert all(r is t if isinstance(t, torch.Tensor) else r == t for r, t in zip(resolved, launched, strict=True))
        assert all(_rule_holds(rule, resolved) for rule in rules)
        short = [*resolved[:5], resolved[5][:3]]
        assert not _rule_holds(rules[1], short)  # a shorter pos_to_expert would be refused on replay
        assert (allocated is None) == (out is not None)
        if out is None:
            assert [(o.dtype, o.dims) for o in allocated] == [(torch.float8_e4m3fn, ((0, 0, 1, 0, 1), 2048)),
                                                              (torch.float32, ((0, 0, 1, 0, 1), 16))]
    assert [call[0] is args["x"] for _, call in stub[1].DISPATCHED] == [True] * 3  # out= made by the second


def test_forward_with_a_placeholder_is_remembered_with_it_as_a_constant(quant: Any,
                                                                        stub: tuple[ModuleType, ModuleType]) -> None:
    # The stand-ins for absent optional tensors are the op's own per-device placeholders, which no
    # kernel reads: dispatch replays such a call with them as constants (the key holds the device).
    stub[1].REMEMBERED.clear()
    quant.swiglu_forward_and_per_token_cast(_x(), "e4m3", 128, pos_to_expert=torch.zeros(4, dtype=torch.int32))
    assert _launches(stub[1])[-1][1]["with_pos_to_expert"] is True
    ((_, _, arguments, _, call, _),) = stub[1].REMEMBERED
    positions, weights = arguments[3], arguments[4]
    assert call[1] is None and call[2] is None  # no pos_to_token_topk, no topk_weights
    assert isinstance(positions, torch.Tensor) and isinstance(weights, torch.Tensor)
    assert (positions.dtype, weights.dtype) == (torch.int32, torch.float32)
    assert type(arguments[5]).__name__ == "Source"  # the caller's pos_to_expert


@pytest.mark.parametrize(("npt", "without_transpose"), [(32, False), (128, True)])
def test_per_channel_remembers_its_rules_and_outputs(quant: Any, stub: tuple[ModuleType, ModuleType], npt: int,
                                                     without_transpose: bool) -> None:
    x = _x(256)
    for out in (None, quant.swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", npt, False,
                                                                               without_transpose)):
        stub[1].REMEMBERED.clear()
        result = quant.swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", npt, False, without_transpose,
                                                                         out=out)
        ((_, _, _, rules, call, allocated),) = stub[1].REMEMBERED
        # num_tokens a multiple of 128, and sf (argument 2) with num_tokens / npt rows
        assert rules == (("size_multiple", 0, 0, 128), ("same_size", 2, 0, 0, 0, npt))
        resolved = _resolve(stub[1].REMEMBERED[0], result)
        assert all(r is t if isinstance(t, torch.Tensor) else r == t
                   for r, t in zip(resolved, _launches(stub[1])[-1][2], strict=True))
        assert all(_rule_holds(rule, resolved) for rule in rules)
        assert not _rule_holds(rules[1], [*resolved[:2], resolved[2][:1]])
        if out is None:
            shapes = [tuple(d if isinstance(d, int) else call[d[0]].shape[d[1]] * d[2] // d[4] for d in o.dims)
                      for o in allocated]
            assert shapes == [tuple(t.shape) for t in result]


def test_per_channel_out_sf_rows_are_named_before_any_launch(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    # The grid has one row of blocks per row of sf, which the launcher cannot tie to x's rows.
    errors = __import__(quant.modules["swiglu_backward_and_per_token_cast"].__name__.split(".")[0] + ".errors",
                        fromlist=["KernelArgumentError"])
    q, sf = quant.swiglu_forward_and_per_channel_cast_and_transpose(_x(256), "e4m3", 32)
    _launches(stub[1]).clear()
    with pytest.raises(errors.KernelArgumentError, match=r"^sf: expected 8 rows"):
        quant.swiglu_forward_and_per_channel_cast_and_transpose(_x(256), "e4m3", 32, out=(q, sf[:4]))
    assert _launches(stub[1]) == []


def test_backward_is_not_dispatched_nor_remembered(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    # Without rows the op zeroes weight_grad itself, which a replayed call could not: every
    # call takes the Python path, as the allocating and the out= call do here.
    result = quant.swiglu_backward_and_per_token_cast(**_bwd_args())
    quant.swiglu_backward_and_per_token_cast(**_bwd_args(), out=result)
    assert len(_launches(stub[1])) == 2 and stub[1].REMEMBERED == [] and stub[1].DISPATCHED == []
