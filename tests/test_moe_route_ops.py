"""The moe routing op modules on a machine without a GPU.

The ``slow`` tests build tests/data/specs/moe_route_small.yaml (sm90, 7 variants) once for the
module and check that every argument error fires, naming the argument, before any launch (CPU
tensors would otherwise end in NoGpuError at the launcher). The others import the op modules
over the stub runtime of tests/op_stub.py and check what they launch (variant, arguments in
kernel order, outputs) and what they hand dispatch() to remember.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.conftest import REPO, TEMPLATES
from tests.op_stub import stub_package

SPEC = REPO / "tests" / "data" / "specs" / "moe_route_small.yaml"


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    from tkc.arch import ARCHS
    from tkc.build import BuildOptions, build
    from tkc.spec import load_specs

    root = tmp_path_factory.mktemp("moe_small")
    options = BuildOptions(specs=load_specs([SPEC], TEMPLATES), templates=TEMPLATES, build_dir=root / "build",
                           dist_dir=root / "dist", archs=(ARCHS["sm90"],), jobs=2)
    build(options)
    path = str(options.build_dir / "pkg" / "tkc_moe_small" / "sm90")
    sys.path.insert(0, path)
    try:
        yield importlib.import_module("tkc_moe_small.moe")
    finally:
        sys.path.remove(path)
        for name in [m for m in sys.modules if m.startswith("tkc_moe_small")]:
            del sys.modules[name]


IDX = torch.tensor([[0, 3], [-1, 2]])
POS = torch.tensor([[0, 1], [-1, 2]], dtype=torch.int32)
P2E = torch.tensor([0, 3, 2, -1], dtype=torch.int32)
X = torch.zeros((2, 2048), dtype=torch.bfloat16)
XE = torch.zeros((4, 2048), dtype=torch.bfloat16)
W = torch.ones((2, 2))
BUF = torch.zeros((6, 2048), dtype=torch.bfloat16)  # x and an out in one buffer, apart


def _bad_calls(moe: ModuleType) -> dict[str, tuple[Callable[[], object], type[Exception], str]]:
    return {
        "ids not a tensor": (lambda: moe.get_fused_mapping([[0]], 4, 8, 1), TypeError, "topk_idx"),
        "int32 ids": (lambda: moe.get_fused_mapping(IDX.int(), 4, 8, 1), TypeError, "topk_idx"),
        "1-D ids": (lambda: moe.get_fused_mapping(IDX[0], 4, 8, 1), ValueError, "topk_idx"),
        "zero experts": (lambda: moe.get_fused_mapping(IDX, 0, 8, 1), ValueError, "num_experts"),
        "alignment 0": (lambda: moe.get_fused_mapping(IDX, 4, 8, 0), ValueError, "alignment"),
        "float N": (lambda: moe.get_fused_mapping(IDX, 4, 8.0, 1), TypeError, "num_expanded_tokens"),
        "negative N": (lambda: moe.get_fused_mapping(IDX, 4, -1, 1), ValueError, "num_expanded_tokens"),
        "expand rows": (lambda: moe.expand_to_fused(X[:1], POS, P2E), ValueError, "token_topk_to_pos"),
        "expand 2-D pos_to_expert": (lambda: moe.expand_to_fused(X, POS, P2E[None]), ValueError, "pos_to_expert"),
        "expand 1-D x": (lambda: moe.expand_to_fused(X[0], POS, P2E), ValueError, "x"),
        "with_sf not a pair": (lambda: moe.expand_to_fused_with_sf(X, 128, POS, P2E), TypeError, "x"),
        "with_sf npc": (lambda: moe.expand_to_fused_with_sf((X, torch.ones(2, 32)), 64, POS, P2E),
                        ValueError, "num_per_channels"),
        "with_sf ue8m0": (lambda: moe.expand_to_fused_with_sf((X, torch.ones(2, 16, dtype=torch.int32)), 128, POS,
                                                              P2E), ValueError, "x_sf"),
        "with_sf fp16 sf": (lambda: moe.expand_to_fused_with_sf((X, torch.ones(2, 16, dtype=torch.float16)), 128,
                                                                POS, P2E), TypeError, "x_sf"),
        "expand hidden": (lambda: moe.expand_to_fused(X[:, :24].contiguous(), POS, P2E), ValueError, "x"),
        "expand fp32 strided": (lambda: moe.expand_to_fused(torch.zeros(2, 4096)[:, :2048], POS, P2E), ValueError,
                                "x"),
        "with_sf sf shape": (lambda: moe.expand_to_fused_with_sf((X, torch.ones(2, 3)), 128, POS, P2E), ValueError,
                             "x_sf"),
        "reduce hidden": (lambda: moe.reduce_fused(XE[:, :300], W, POS), ValueError, "x"),
        "reduce format": (lambda: moe.reduce_fused(XE, W, POS, fp8_format="e5m2"), ValueError, "fp8_format"),
        "reduce sf without fp8": (lambda: moe.reduce_fused(XE, W, POS, sf=torch.ones(1)), ValueError, "sf"),
        "reduce sf shape": (lambda: moe.reduce_fused(XE, W, POS, fp8_format="e4m3", sf=torch.ones(2)), ValueError,
                            "sf"),
        "reduce weights shape": (lambda: moe.reduce_fused(XE, W[:, :1], POS), ValueError, "topk_weights"),
        "reduce fp8 without scales": (lambda: moe.reduce_fused(XE.to(torch.float8_e4m3fn), W, POS), ValueError, "x"),
        "reduce x_sf length": (lambda: moe.reduce_fused((XE.to(torch.float8_e4m3fn), torch.ones(3)), W, POS),
                               ValueError, "x_sf"),
        "reduce fp16 x": (lambda: moe.reduce_fused(XE.half(), W, POS), TypeError, "x"),
        "reduce out list": (lambda: moe.reduce_fused(XE, W, POS, out=[X]), TypeError, "out"),
        "expand out tuple": (lambda: moe.expand_to_fused(X, POS, P2E, out=(XE,)), TypeError, "out"),
        "group_count ids": (lambda: moe.group_count(IDX.float(), 4), TypeError, "group_idx"),
        "group_count groups": (lambda: moe.group_count(IDX, 2000), ValueError, "num_groups"),
        "aux_fi experts": (lambda: moe.aux_fi(IDX, 0, 2), ValueError, "num_experts"),
        "aux_fi topk": (lambda: moe.aux_fi(IDX, 4, 0), ValueError, "num_aux_topk"),
    }


NAMES = [
    "ids not a tensor", "int32 ids", "1-D ids", "zero experts", "alignment 0", "float N", "negative N",
    "expand rows", "expand 2-D pos_to_expert", "expand 1-D x", "with_sf not a pair", "with_sf npc", "with_sf ue8m0",
    "with_sf fp16 sf", "expand hidden", "expand fp32 strided",
    "with_sf sf shape", "reduce hidden", "reduce format", "reduce sf without fp8", "reduce sf shape",
    "reduce weights shape", "reduce fp8 without scales", "reduce x_sf length", "reduce fp16 x", "reduce out list",
    "expand out tuple",
    "group_count ids", "group_count groups", "aux_fi experts", "aux_fi topk",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_argument_errors_fire_before_any_launch(moe: ModuleType, name: str) -> None:
    call, exc, argument = _bad_calls(moe)[name]
    with pytest.raises(exc, match=rf"^{argument}: "):
        call()


@pytest.mark.slow
def test_good_arguments_reach_the_launcher(moe: ModuleType) -> None:
    # Valid calls pass every op check and stop at the launcher's first tensor (no GPU here).
    errors = importlib.import_module("tkc_moe_small.errors")
    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU path")
    for call, first in [(lambda: moe.get_fused_mapping(IDX, 4, 8, 1), "topk_idx"),
                        (lambda: moe.expand_to_fused(X, POS, P2E), "x"),
                        (lambda: moe.reduce_fused(XE, W, POS), "x"),
                        (lambda: moe.expand_to_fused(BUF[:2], POS, P2E, out=BUF[2:6]), "x"),
                        (lambda: moe.reduce_fused(XE, W, POS, out=BUF[:2]), "x"),
                        (lambda: moe.aux_fi(IDX, 4, 2), "topk_idx")]:
        with pytest.raises(errors.NoGpuError, match=rf"^{first}: "):
            call()


# --- over the stub runtime: what each op launches and remembers ---------------------------------


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], Any]]:
    with stub_package(tmp_path_factory.mktemp("route_stub"), "route_stub_pkg", "moe",
                      ("expand", "reduce", "fused_mapping")) as stubbed:
        yield stubbed


@pytest.fixture
def ops(stub: tuple[dict[str, ModuleType], Any]) -> tuple[dict[str, ModuleType], Any]:
    """The stub package with empty logs."""
    runtime = stub[1]
    runtime.LAUNCHES.clear()
    runtime.REMEMBERED.clear()
    runtime.DISPATCHED.clear()
    return stub


def _launch(runtime: Any) -> tuple[str, dict[str, Any], tuple[Any, ...]]:
    assert len(runtime.LAUNCHES) == 1, runtime.LAUNCHES
    launched: tuple[str, dict[str, Any], tuple[Any, ...]] = runtime.LAUNCHES.pop()
    return launched


def _same(got: Sequence[object], want: Sequence[object]) -> bool:
    return len(got) == len(want) and all(a is b for a, b in zip(got, want, strict=True))


def _words_of(words: object, t: torch.Tensor) -> bool:
    """Whether ``words`` is an int32 view of all of t (same storage, offset, shape and strides)."""
    return (isinstance(words, torch.Tensor) and words.dtype == torch.int32 and words.data_ptr() == t.data_ptr()
            and words.shape == t.shape and words.stride() == t.stride())


def _placeholder(t: object, shape: tuple[int, ...]) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.float32 and tuple(t.shape) == shape


def test_expand_launches_the_callers_tensors_and_remembers_the_call(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    expand = modules["expand"].expand_to_fused
    got = expand(X, POS, P2E)
    name, values, args = _launch(runtime)
    assert (name, values) == ("moe_expand", dict(hidden=2048, dtype="bfloat16", with_sf=False, sf_layout="row_major"))
    assert _same(args, (X, POS, P2E, got)) and got.shape == (4, 2048) and got.dtype == torch.bfloat16
    (fast, _, arguments, rules, call, outputs), = runtime.REMEMBERED
    assert fast[0] == (((1,), (), ()), 1) and rules == () and _same(call, (X, POS, P2E, None))
    assert [(a.kind, a.index) for a in arguments] == [("input", 0), ("input", 1), ("input", 2), ("out", 0)]
    assert [o.dims for o in outputs] == [((2, 0, 1, 0, 1), 2048)]  # pos_to_expert's length rows, hidden wide
    assert len(runtime.DISPATCHED) == 1 and _same(runtime.DISPATCHED[0][1], call)
    given = torch.empty(4, 2048, dtype=torch.bfloat16)
    assert expand(X, POS, P2E, out=given) is given
    assert _launch(runtime)[2][3] is given and runtime.REMEMBERED[-1][4][3] is given


def test_expand_launches_a_contiguous_copy_of_a_strided_mapping_unremembered(
        ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    strided = torch.tensor([[0, 9, 1], [-1, 9, 2]], dtype=torch.int32)[:, ::2]
    modules["expand"].expand_to_fused(X, strided, P2E)
    args = _launch(runtime)[2]
    assert args[1] is not strided and args[1].is_contiguous() and torch.equal(args[1], POS)
    assert runtime.REMEMBERED == []  # a tensor the op made cannot be replayed from the caller's


@pytest.mark.parametrize("rows", [4, 3, 0])
@pytest.mark.parametrize("col_major", [False, True])
def test_expand_with_sf_layouts(ops: tuple[dict[str, ModuleType], Any], rows: int, col_major: bool) -> None:
    modules, runtime = ops
    data, x_sf = torch.zeros(2, 2048, dtype=torch.float8_e4m3fn), torch.ones(2, 16)
    p2e = P2E[:rows]
    pos = POS if rows else torch.full((2, 2), -1, dtype=torch.int32)
    out, out_sf = modules["expand"].expand_to_fused_with_sf((data, x_sf), 128, pos, p2e, col_major)
    _, values, args = _launch(runtime)
    assert values == dict(hidden=2048, dtype="float8_e4m3fn", with_sf=True,
                          sf_layout="col_major" if col_major else "row_major")
    assert _same(args[:5:2], (data, pos, out)) and args[3] is p2e
    # The kernel moves the scales as 32-bit words: an int32 view of the caller's x_sf and of out_sf.
    assert _words_of(args[1], x_sf)
    assert out.shape == (rows, 2048) and out.dtype == torch.float8_e4m3fn
    assert out_sf.shape == (rows, 16) and out_sf.dtype == torch.float32
    if not col_major:
        assert _words_of(args[5], out_sf) and out_sf.is_contiguous()
    else:  # returned (N, G) column-major, positions padded to 4; the kernel writes (G, align(N, 4)) row-major
        padded = (rows + 3) // 4 * 4
        assert out_sf.stride() == (1, padded) or rows <= 1
        assert args[5].shape == (16, padded) and args[5].stride() == (padded, 1)
        assert args[5].dtype == torch.int32 and args[5].data_ptr() == out_sf.data_ptr()
        assert out_sf.untyped_storage().nbytes() == 16 * padded * 4
    assert runtime.REMEMBERED == []  # no out=: dispatch() never sees this op


def test_reduce_launches_every_form_with_placeholders_the_call_carries(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    reduce = modules["reduce"].reduce_fused
    fp8 = XE.to(torch.float8_e4m3fn)
    x_sf, sf = torch.ones(4), torch.ones(1)
    w0, w1, scales = ("same_size", 2, 0, 3, 0, 1), ("same_size", 2, 1, 3, 1, 1), ("same_size", 1, 0, 0, 0, 1)
    cases = [  # call, grid values, (x, x_sf, weights, sf) launched (None: a placeholder), rules
        (lambda: reduce(XE, W, POS), ("bfloat16", "bfloat16", True), (XE, None, W, None), "", [w0, w1]),
        (lambda: reduce(XE, None, POS), ("bfloat16", "bfloat16", False), (XE, None, None, None), "", []),
        (lambda: reduce((fp8, x_sf), W, POS, "e4m3", sf), ("float8_e4m3fn", "float8_e4m3fn", True),
         (fp8, x_sf, W, sf), "e4m3", [scales, ("size_is", 5, 0, 1), w0, w1]),
        (lambda: reduce([fp8, x_sf], W, POS), ("float8_e4m3fn", "bfloat16", True), (fp8, x_sf, W, None), "",
         [scales, w0, w1]),
    ]
    seen: dict[int, torch.Tensor] = {}
    for call, (in_dtype, out_dtype, weighted), tensors, fp8_format, rules in cases:
        got = call()
        name, values, args = _launch(runtime)
        assert (name, values) == ("moe_reduce", dict(hidden=2048, in_dtype=in_dtype, out_dtype=out_dtype,
                                                     with_weights=weighted))
        assert got.shape == (2, 2048) and str(got.dtype) == f"torch.{out_dtype}" and args[4] is got
        assert args[3] is POS
        for arg, given, shape in zip((args[0], args[1], args[2], args[5]), tensors, ((), (0,), (0, 0), (0,))):
            assert arg is given if given is not None else _placeholder(arg, shape)
        for slot, given in zip((1, 2, 5), tensors[1:]):
            if given is None:  # one placeholder per parameter and device, never one per call
                assert seen.setdefault(slot, args[slot]) is args[slot]
        # The call's own tensors are the remembered inputs (None where it left one out, which the key
        # tells apart); the placeholders launched in their place are the recipe's constants.
        (fast, _, arguments, remembered_rules, remembered, outputs), = runtime.REMEMBERED
        runtime.REMEMBERED.clear()
        assert fast[0] == (((1,), (), (), (), ()), 1)  # hidden: every other size is the contract's or a rule's
        assert _same(remembered[:6], (*tensors[:3], POS, tensors[3], None))
        assert remembered[6:] == (fp8_format,) and list(remembered_rules) == rules
        sources = [(a.kind, a.index) if isinstance(a, runtime.Source) else a for a in arguments]
        assert sources[0] == ("input", 0) and sources[3:5] == [("input", 3), ("out", 0)]
        for at, index, given in ((1, 1, tensors[1]), (2, 2, tensors[2]), (5, 4, tensors[3])):
            assert sources[at] == ("input", index) if given is not None else sources[at] is args[at]
        assert [o.dims for o in outputs] == [((3, 0, 1, 0, 1), 2048)]  # token_topk_to_pos's rows
    assert len({id(t) for t in seen.values()}) == 3  # distinct: a replay takes its inputs by position
    assert len(runtime.DISPATCHED) == len(cases)


def test_reduce_with_one_tensor_as_x_sf_and_sf_is_not_remembered(ops: tuple[dict[str, ModuleType], Any]) -> None:
    # Remembered, a later call with two tensors there would replay with one of them in both places.
    modules, runtime = ops
    scale = torch.ones(1)
    pos = torch.tensor([[0, -1]], dtype=torch.int32)
    modules["reduce"].reduce_fused((XE[:1].to(torch.float8_e4m3fn), scale), W[:1], pos, "e4m3", scale)
    args = _launch(runtime)[2]
    assert args[1] is scale and args[5] is not scale and args[5].data_ptr() == scale.data_ptr()
    assert runtime.REMEMBERED == []


def test_reduce_without_an_output_scale_launches_a_fresh_one_unremembered(
        ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    modules["reduce"].reduce_fused((XE.to(torch.float8_e4m3fn), torch.ones(4)), W, POS, fp8_format="e4m3")
    sf = _launch(runtime)[2][5]
    assert sf.shape == (1,) and sf.dtype == torch.float32 and sf.item() == 1.0
    assert runtime.REMEMBERED == []


def test_reduce_launches_contiguous_copies_of_strided_weights_and_mapping(
        ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    strided = torch.tensor([[0, 9, 1], [-1, 9, 2]], dtype=torch.int32)[:, ::2]
    weights = torch.ones(2, 4)[:, ::2]
    modules["reduce"].reduce_fused(XE, weights, strided)
    args = _launch(runtime)[2]
    assert torch.equal(args[2], weights) and args[2].is_contiguous() and args[2] is not weights
    assert torch.equal(args[3], POS) and args[3].is_contiguous()
    assert runtime.REMEMBERED == []


class BuiltKernel:
    """A stub kernel that has only the ``built`` variants, as a real build: find() answers None for the others,
    and variant() of one records the values asked for in ``missing`` and raises LookupError (the real kernel's
    VariantNotFoundError, which names them)."""

    def __init__(self, kernel: Any, built: Sequence[tuple[Any, ...]]) -> None:
        self.kernel, self.keys, self.built, self.missing = kernel, kernel.keys, set(built), []  # type: ignore[var-annotated]

    def find(self, *values: Any) -> Any:
        return self.kernel.variant(*values) if values in self.built else None

    def variant(self, *values: Any) -> Any:
        if values not in self.built:
            self.missing.append(values)
            raise LookupError(values)
        return self.kernel.variant(*values)


def _built(monkeypatch: pytest.MonkeyPatch, module: ModuleType, built: Sequence[tuple[Any, ...]]) -> BuiltKernel:
    kernel = BuiltKernel(module._kernel, built)
    monkeypatch.setattr(module, "_kernel", kernel)
    return kernel


def _view_of(view: object, t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> bool:
    """Whether ``view`` is a ``dtype`` view of shape ``shape`` over t's memory."""
    return (isinstance(view, torch.Tensor) and view.dtype == dtype and tuple(view.shape) == shape
            and view.data_ptr() == t.data_ptr())


def test_expand_prefers_the_variant_built_for_hidden_and_falls_back_to_any_hidden(
        ops: tuple[dict[str, ModuleType], Any], monkeypatch: pytest.MonkeyPatch) -> None:
    modules, runtime = ops
    expand = modules["expand"].expand_to_fused
    kernel = _built(monkeypatch, modules["expand"], [(h, "bfloat16", False, "row_major") for h in (0, 2048)])
    for x, hidden in [(X, 2048), (torch.zeros(2, 576, dtype=torch.bfloat16), 0),
                      (torch.zeros(2, 64, dtype=torch.bfloat16), 0), (torch.zeros(2, 13 * 64, dtype=torch.bfloat16), 0),
                      (torch.zeros(2, 2064, dtype=torch.bfloat16), 0)]:
        got = expand(x, POS, P2E)
        _, values, args = _launch(runtime)
        assert values["hidden"] == hidden and args[0] is x and args[3] is got and got.shape == (4, x.shape[1])
    # Other dtypes move as bf16 units of the same bytes: fp32 rows of 1024 take the variant built for 2048.
    for dtype, width, hidden in [(torch.float32, 1024, 2048), (torch.float32, 288, 0), (torch.float8_e4m3fn, 4096, 2048),
                                 (torch.int64, 512, 2048), (torch.float16, 2048, 2048)]:
        x = torch.zeros(2, width, dtype=dtype)
        got = expand(x, POS, P2E)
        _, values, args = _launch(runtime)
        units = width * dtype.itemsize // 2
        assert values["hidden"] == hidden and got.dtype == dtype and got.shape == (4, width)
        assert _view_of(args[0], x, torch.bfloat16, (2, units)) and _view_of(args[3], got, torch.bfloat16, (4, units))
    assert runtime.LAUNCHES == []
    # No variant for any hidden: the hot sizes still run, another hidden asks variant() for its own (the error).
    kernel.built = {(2048, "bfloat16", False, "row_major")}
    expand(X, POS, P2E)
    assert _launch(runtime)[1]["hidden"] == 2048
    with pytest.raises(LookupError):
        expand(torch.zeros(2, 576, dtype=torch.bfloat16), POS, P2E)
    assert kernel.missing == [(576, "bfloat16", False, "row_major")] and runtime.LAUNCHES == []


def test_expand_with_sf_takes_any_group_size_and_ue8m0_words(ops: tuple[dict[str, ModuleType], Any],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    modules, runtime = ops
    expand = modules["expand"].expand_to_fused_with_sf
    _built(monkeypatch, modules["expand"], [(h, "float8_e4m3fn", True, layout) for h in (0, 4096)
                                            for layout in ("row_major", "col_major")])
    for hidden, npc, words, col_major, built in [(4096, 32, False, False, 4096), (4096, 128, True, True, 4096),
                                                 (576, 32, True, True, 0), (576, 128, False, True, 0),
                                                 (832, 128, False, False, 0), (64, 32, True, False, 0)]:
        data = torch.zeros(2, hidden, dtype=torch.float8_e4m3fn)
        groups = -(-hidden // npc)
        cols = -(-groups // 4) if words else groups
        x_sf = torch.zeros(2, cols, dtype=torch.int32 if words else torch.float32)
        out, out_sf = expand((data, x_sf), npc, POS, P2E, col_major)
        _, values, args = _launch(runtime)
        assert values == dict(hidden=built, dtype="float8_e4m3fn", with_sf=True,
                              sf_layout="col_major" if col_major else "row_major")
        assert args[0] is data and _words_of(args[1], x_sf) and args[4] is out
        assert out.shape == (4, hidden) and out_sf.shape == (4, cols) and out_sf.dtype == x_sf.dtype
        if col_major:
            assert out_sf.stride() == (1, 4) and args[5].shape == (cols, 4) and args[5].dtype == torch.int32
        else:
            assert _words_of(args[5], out_sf)
    # Data of another dtype moves as e4m3 bytes: bf16 rows of 2048 take the variant built for 4096.
    data = torch.zeros(2, 2048, dtype=torch.bfloat16)
    out, out_sf = expand((data, torch.ones(2, 16)), 128, POS, P2E)
    _, values, args = _launch(runtime)
    assert values["hidden"] == 4096 and out.dtype == torch.bfloat16 and out.shape == (4, 2048)
    assert _view_of(args[0], data, torch.float8_e4m3fn, (2, 4096)) and _view_of(args[4], out, torch.float8_e4m3fn,
                                                                                 (4, 4096))


def test_reduce_prefers_the_variant_built_for_hidden_then_any_hidden_then_weighted(
        ops: tuple[dict[str, ModuleType], Any], monkeypatch: pytest.MonkeyPatch) -> None:
    modules, runtime = ops
    reduce = modules["reduce"].reduce_fused
    kernel = _built(monkeypatch, modules["reduce"], [
        (2048, "bfloat16", "bfloat16", True), (2048, "bfloat16", "bfloat16", False), (0, "bfloat16", "bfloat16", True),
        (0, "float32", "float32", True), (0, "float32", "float8_e4m3fn", True), (0, "bfloat16", "float8_e4m3fn", True)])
    x768 = torch.zeros(4, 768, dtype=torch.bfloat16)
    cases = [  # call, grid values launched
        (lambda: reduce(XE, W, POS), (2048, "bfloat16", "bfloat16", True)),
        (lambda: reduce(XE, None, POS), (2048, "bfloat16", "bfloat16", False)),
        (lambda: reduce(x768, W, POS), (0, "bfloat16", "bfloat16", True)),
        # Unweighted where only the weighted variant is built: it runs with the weights placeholder.
        (lambda: reduce(x768, None, POS), (0, "bfloat16", "bfloat16", True)),
        (lambda: reduce(XE, None, POS, "e4m3"), (0, "bfloat16", "float8_e4m3fn", True)),
        (lambda: reduce(XE.float(), W, POS), (0, "float32", "float32", True)),
        (lambda: reduce(XE.float(), None, POS), (0, "float32", "float32", True)),
        (lambda: reduce((XE.float(), torch.ones(4)), None, POS, "e4m3", torch.ones(1)),
         (0, "float32", "float8_e4m3fn", True)),
        (lambda: reduce((XE, torch.ones(4)), W, POS), (2048, "bfloat16", "bfloat16", True)),
    ]
    for call, values in cases:
        got = call()
        _, launched, args = _launch(runtime)
        assert tuple(launched.values()) == values
        out_dtype = getattr(torch, values[2])
        assert got.dtype == out_dtype and got.shape == (2, args[0].shape[1]) and args[4] is got
    # x_sf of bf16 or fp32 rows is launched, not a placeholder: the kernel reads it where its length is N's.
    reduce((x768, torch.full((4,), 2.0)), None, POS)
    assert torch.equal(_launch(runtime)[2][1], torch.full((4,), 2.0))
    with pytest.raises(LookupError):
        reduce((XE.to(torch.float8_e4m3fn), torch.ones(4)), None, POS)
    assert kernel.missing == [(2048, "float8_e4m3fn", "bfloat16", False)]
    assert runtime.LAUNCHES == []


REDUCE_ERRORS = [  # call, error, message start
    (lambda r: r(XE, W[:, :1], POS), ValueError, r"topk_weights: expected shape \(2, 2\) \(that of token_topk_to_pos\)"),
    (lambda r: r(XE, torch.ones(3, 2), POS), ValueError, r"topk_weights: expected shape \(2, 2\)"),
    (lambda r: r((XE.to(torch.float8_e4m3fn), torch.ones(3)), W, POS), ValueError,
     r"x_sf: expected a float32 tensor of shape \(4,\)"),
    (lambda r: r((XE.to(torch.float8_e4m3fn), torch.ones(4)), W, POS, "e4m3", torch.ones(2)), ValueError,
     r"sf: expected a float32 tensor of shape \(1,\)"),
    (lambda r: r(XE, W, POS, sf=torch.ones(1)), ValueError, r"sf: an output scale needs fp8_format='e4m3'"),
    (lambda r: r(XE.half(), W, POS), TypeError, r"x: expected bfloat16, float32 or float8_e4m3fn rows"),
    (lambda r: r(XE.to(torch.float8_e4m3fn), W, POS), ValueError, r"x: float8_e4m3fn data needs its per-row scales"),
    (lambda r: r((XE, torch.ones(4), None), W, POS), TypeError, r"x: expected a tensor or a \(data, x_sf\) pair"),
    (lambda r: r(XE[:, :300], W, POS), ValueError, r"x: hidden \(300\) must be a multiple of 256"),
    (lambda r: r(XE, W, POS, "e5m2"), ValueError, r"fp8_format: expected one of"),
    (lambda r: r(XE, W, POS[0]), ValueError, r"token_topk_to_pos: expected a 2-D tensor"),
    (lambda r: r(XE[0], W, POS), ValueError, r"x: expected a 2-D tensor"),
    (lambda r: r(XE, W, POS, out=[X]), TypeError, r"out: expected out as the op returns it"),
]


@pytest.mark.parametrize("index", range(len(REDUCE_ERRORS)))
def test_reduce_names_a_bad_argument_before_any_launch(ops: tuple[dict[str, ModuleType], Any], index: int) -> None:
    modules, runtime = ops
    call, error, message = REDUCE_ERRORS[index]
    with pytest.raises(error, match=f"^{message}"):
        call(modules["reduce"].reduce_fused)
    assert runtime.LAUNCHES == [] and runtime.REMEMBERED == []


def _rules_hold(rules: Sequence[tuple[Any, ...]], args: Sequence[torch.Tensor]) -> bool:
    """The remembered rules as dispatch() checks them on a replay, over the launcher's arguments."""
    for kind, argument, dim, *rest in rules:
        size = args[argument].shape[dim]
        if kind == "same_size" and size * rest[2] != args[rest[0]].shape[rest[1]]:
            return False
        if kind == "size_is" and size != rest[0]:
            return False
    return True


def test_reduce_rules_refuse_on_a_replay_what_the_plan_refuses(ops: tuple[dict[str, ModuleType], Any]) -> None:
    # A replay skips the plan: the remembered rules must refuse every size the plan refuses that
    # the contract leaves free (x_sf's length, the weights' shape, sf's length).
    modules, runtime = ops
    fp8 = XE.to(torch.float8_e4m3fn)
    modules["reduce"].reduce_fused((fp8, torch.ones(4)), W, POS, "e4m3", torch.ones(1))
    (_, _, _, rules, _, _), = runtime.REMEMBERED
    launched = _launch(runtime)[2]
    assert _rules_hold(rules, launched)
    for index, bad in ((1, torch.ones(3)), (1, torch.ones(5)), (2, torch.ones(3, 2)), (2, torch.ones(2, 1)),
                       (5, torch.ones(2))):
        args = list(launched)
        args[index] = bad
        assert not _rules_hold(rules, args), (index, bad.shape)


def test_autograd_forms_launch_the_other_op_backwards(ops: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = ops
    reduce = modules["reduce"]
    x = X.clone().requires_grad_()
    y = reduce.expand_to_fused_autograd(x, POS, P2E)
    y.backward(torch.ones_like(y))
    (_, forward, _), (name, backward, args) = runtime.LAUNCHES
    assert forward["with_sf"] is False and name == "moe_reduce" and backward["with_weights"] is False
    assert args[0].shape == (4, 2048) and args[3] is POS and x.grad is not None and x.grad.shape == X.shape
    runtime.LAUNCHES.clear()
    xe, w = XE.clone().requires_grad_(), W.clone().requires_grad_()
    out = reduce.reduce_fused_autograd(xe, w, POS, P2E)
    out.backward(torch.ones_like(out))
    (_, forward, _), (name, backward, args) = runtime.LAUNCHES
    assert forward["with_weights"] is True and name == "moe_expand" and _same(args[1:3], (POS, P2E))
    assert xe.grad is not None and xe.grad.shape == XE.shape and w.grad is not None and w.grad.shape == W.shape


def test_while_compiling_the_ops_launch_through_their_custom_ops_and_remember_nothing(
        ops: tuple[dict[str, ModuleType], Any], monkeypatch: pytest.MonkeyPatch) -> None:
    modules, runtime = ops
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    fused = torch.empty(4, 2048, dtype=torch.bfloat16)
    assert modules["expand"].expand_to_fused(X, POS, P2E, out=fused) is fused
    assert _launch(runtime)[0] == "moe_expand"
    modules["reduce"].reduce_fused((XE.to(torch.float8_e4m3fn), torch.ones(4)), W, POS, fp8_format="e4m3")
    assert _launch(runtime)[1]["out_dtype"] == "float8_e4m3fn"
    _, out_sf = modules["expand"].expand_to_fused_with_sf((X.to(torch.float8_e4m3fn), torch.ones(2, 16)), 128, POS,
                                                          P2E, True)
    assert out_sf.stride() == (1, 4) and _launch(runtime)[2][5].stride() == (4, 1)
    mapping = modules["fused_mapping"].get_fused_mapping(IDX, 4, 8, 1)
    assert mapping[7] == [] and len({t.untyped_storage().data_ptr() for t in mapping[:7]}) == 7
    assert _launch(runtime)[0] == "moe_fused_mapping"
    with pytest.raises(ValueError, match="^num_expanded_tokens: under torch.compile"):
        modules["fused_mapping"].get_fused_mapping(IDX, 4, 0, 1)
    assert runtime.LAUNCHES == [] and runtime.REMEMBERED == []


def test_fused_mapping_launches_into_outputs_of_their_own(ops: tuple[dict[str, ModuleType], Any],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel's arguments in order, the block-count table sized by num_blocks (the grid), and
    # every output a tensor of its own (what the torch.compile custom op returns too).
    modules, runtime = ops
    module = modules["fused_mapping"]
    monkeypatch.setattr(module, "num_blocks", lambda entries, device: 7)
    strided = torch.zeros(3, 4, dtype=torch.int64)[:, ::2]
    for idx, size in ((IDX, 8), (IDX, 7), (strided, 16), (torch.zeros((0, 3), dtype=torch.int64), 5)):
        out = module.get_fused_mapping(idx, 32, size, 4, force_no_sync=True)
        name, values, args = _launch(runtime)
        assert (name, values) == ("moe_fused_mapping", {"num_experts": 32}) and args[9] == 4
        assert args[0] is idx if idx.is_contiguous() else torch.equal(args[0], idx) and args[0].is_contiguous()
        assert _same((args[3], args[4], args[5], args[2], args[6], args[7], args[8]), out[:7]) and out[7] == []
        assert all(t.shape == (size,) for t in out[:3]) and out[3].shape == idx.shape
        assert all(t.shape == (32,) for t in out[4:7]) and args[1].shape == (7, 32)
        assert all(t.dtype == torch.int32 and t.is_contiguous() for t in (*out[:7], args[1]))
        assert len({t.untyped_storage().data_ptr() for t in (*out[:7], args[1]) if t.numel()}) == \
            len([t for t in (*out[:7], args[1]) if t.numel()])
    assert runtime.REMEMBERED == [] and runtime.DISPATCHED == []


def test_fused_mapping_sizes_the_buffer_and_trims_it_to_the_counts(ops: tuple[dict[str, ModuleType], Any],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    modules, _ = ops
    module = modules["fused_mapping"]
    launched: list[tuple[Any, ...]] = []

    class Counting:  # a kernel that writes segments of 4 and 8 rows for experts 0 and 2
        def variant(self, num_experts: int) -> Callable[..., None]:
            def run(*args: Any) -> None:
                launched.append(args)
                args[8].copy_(torch.tensor([4, 0, 8, 0], dtype=torch.int32))
                args[3].copy_(torch.arange(args[3].numel(), dtype=torch.int32))
            return run

    monkeypatch.setattr(module, "_kernel", Counting())
    idx = torch.zeros(5, 2, dtype=torch.int64)
    bound = module.upper_bound(5, 2, 4, 4)
    out = module.get_fused_mapping(idx, 4, 0, 4)
    assert out[7] == [4, 0, 8, 0] and all(t.shape == (12,) for t in out[:3])
    assert launched[-1][3].shape == (bound,) and out[0].data_ptr() == launched[-1][3].data_ptr()
    assert torch.equal(out[0], torch.arange(12, dtype=torch.int32))
    forced = module.get_fused_mapping(idx, 4, 0, 4, force_no_sync=True)
    assert forced[7] == [] and all(t.shape == (bound,) for t in forced[:3])


def test_fused_mapping_grid_fits_the_device(ops: tuple[dict[str, ModuleType], Any]) -> None:
    # Every block must be resident for the grid barrier: never more blocks than SMs (the stub's
    # sm_count: 132), never an idle one, always one (T = 0 still writes the segments and the -1 fill).
    module = ops[0]["fused_mapping"]
    chunk = module.CHUNK
    assert module.num_blocks(0, 0) == 1 and module.num_blocks(10**6, -1) == 1
    for entries in (1, chunk, chunk + 1, 64 * chunk, 132 * chunk, 132 * chunk + 1, 133 * chunk, 10**7):
        blocks = module.num_blocks(entries, 0)
        chunks = (entries + chunk - 1) // chunk
        per_block = (chunks + blocks - 1) // blocks  # what the kernel derives from the grid
        assert 1 <= blocks <= 132 and blocks * per_block >= chunks and (blocks - 1) * per_block < chunks
