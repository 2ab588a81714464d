"""The MoE conveniences (ops/moe/gating.py: topk_gating, ops/moe/routing.py: moe_routing) on a
machine without a GPU.

They are public modules of the op tree over the op modules, imported here over the stub runtime
of tests/op_stub.py with the five kernels they launch replaced by ``ReferenceKernel``s, stub
kernels whose launches compute with the plain-torch references of tests/reference/ (on CPU
tensors). So the whole pipeline runs: mapping, expand, experts, reduce and the autograd pair's
backward, and is checked against tests/reference/moe_conveniences.py, forward and gradients.
Also: argument errors name the argument before any launch, unbuilt sizes name the built ones,
the packager installs both modules and exports their names, and mypy checks them.
"""

from __future__ import annotations

import ast
import importlib
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.conftest import REPO
from tests.op_stub import stub_package
from tests.reference.moe_conveniences import moe_routing_ref, topk_gating_ref
from tests.reference.moe_gate import normalize_weight_ref, topk_gate_ref
from tests.reference.moe_route import expand_to_fused_ref, get_fused_mapping_ref, reduce_fused_ref

OPS = ("topk_gate", "normalize_weight", "fused_mapping", "expand", "reduce")
PUBLIC = ("gating", "routing")
HIDDEN = 256  # reduce_fused's plan wants a multiple of 256; the stub builds every size


class ReferenceKernel:
    """A stub kernel whose launches compute their outputs with the torch references (arguments in the
    kernel's order, as the op modules launch them). ``built``: the grid values find() and variants
    know (None: every value, as the stub's), for the conveniences' checks of what is built."""

    def __init__(self, kernel: Any, compute: Callable[..., None], built: list[tuple[Any, ...]] | None = None) -> None:
        self.kernel, self.keys, self.compute = kernel, kernel.keys, compute
        self.spec = "kernel_specs/stub.yaml"
        self.variants: dict[tuple[Any, ...], Any] = {key: self.variant(*key) for key in built or ()}
        self.built = built

    def variant(self, *values: Any) -> Any:
        return self.select(**dict(zip(self.keys, values)))

    def find(self, *values: Any) -> Any:
        return self.variant(*values) if self.has(*values) else None

    def has(self, *values: Any) -> bool:
        return self.built is None or values in self.built

    def select(self, **values: Any) -> Any:
        launch = self.kernel.select(**values)

        def run(*args: Any) -> None:
            launch(*args)
            self.compute(values, *args)
        return run


def _topk_gate(values: dict[str, Any], scores: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(topk_gate_ref(scores, values["num_topk"]))


def _normalize(values: dict[str, Any], w: torch.Tensor, denominator: torch.Tensor, normalized: torch.Tensor) -> None:
    d, n = normalize_weight_ref(w)
    denominator.copy_(d)
    normalized.copy_(n)


def _mapping(values: dict[str, Any], topk_idx: torch.Tensor, blocks: torch.Tensor, tk2p: torch.Tensor,
             *rest: Any) -> None:
    *maps, alignment = rest  # pos_to_expert, pos_to_token, pos_to_token_topk, start, end, count
    p2e, p2t, p2tk, want_tk2p, start, end, count = get_fused_mapping_ref(topk_idx, values["num_experts"],
                                                                        int(maps[0].shape[0]), alignment)
    for out, want in zip((tk2p, *maps), (want_tk2p, p2e, p2t, p2tk, start, end, count), strict=True):
        out.copy_(want)


def _expand(values: dict[str, Any], x: torch.Tensor, pos: torch.Tensor, p2e: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(expand_to_fused_ref(x, pos, p2e))


def _reduce(values: dict[str, Any], x: torch.Tensor, x_sf: torch.Tensor, w: torch.Tensor, pos: torch.Tensor,
            out: torch.Tensor, sf: torch.Tensor) -> None:
    # A weighted variant runs unweighted calls with an empty placeholder for the weights, as the kernel reads them.
    out.copy_(reduce_fused_ref(x, w if values["with_weights"] and w.numel() else None, pos))


COMPUTE: dict[str, Callable[..., None]] = {"topk_gate": _topk_gate, "normalize_weight": _normalize, "fused_mapping": _mapping, "expand": _expand,
           "reduce": _reduce}


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], Any]]:
    root = tmp_path_factory.mktemp("moe_conveniences")
    with stub_package(root, "moe_conv_pkg", "moe", OPS) as (modules, runtime):
        for name in PUBLIC:  # public modules install under their own names, beside the op modules
            shutil.copy(REPO / "ops" / "moe" / f"{name}.py", root / "moe_conv_pkg" / "moe" / f"{name}.py")
            modules[name] = importlib.import_module(f"moe_conv_pkg.moe.{name}")
        yield modules, runtime


@pytest.fixture
def moe(stub: tuple[dict[str, ModuleType], Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """(gating, routing, runtime) with computing kernels, LAUNCHES cleared."""
    modules, runtime = stub
    for op, compute in COMPUTE.items():
        monkeypatch.setattr(modules[op], "_kernel", ReferenceKernel(modules[op]._kernel, compute))
    runtime.LAUNCHES.clear()
    yield modules["gating"], modules["routing"], runtime


def kernels(runtime: Any) -> list[str]:
    return [name for name, _, _ in runtime.LAUNCHES]


# --- topk_gating -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(37, 16), (2, 5, 64), (0, 16)])
@pytest.mark.parametrize("normalize", [True, False])
def test_topk_gating_matches_the_reference(moe: Any, shape: tuple[int, ...], normalize: bool) -> None:
    gating, _, runtime = moe
    logits = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    idx, w = gating.topk_gating(logits, 6, normalize=normalize)
    want_idx, want_w = topk_gating_ref(logits, 6, normalize)
    assert idx.shape == w.shape == (*shape[:-1], 6) and idx.dtype == torch.int64 and w.dtype == torch.float32
    assert torch.equal(idx, want_idx) and torch.equal(w, want_w)  # the same references: bit for bit
    assert kernels(runtime) == ["topk_gate", "normalize_weight"][:1 + normalize]
    if normalize and shape[0]:
        torch.testing.assert_close(w.sum(-1), torch.ones(shape[:-1]), rtol=1e-6, atol=1e-6)


def test_topk_gating_gradient_matches_the_reference_autograd(moe: Any) -> None:
    gating, _, _ = moe
    logits = torch.randn((4, 8, 16), generator=torch.Generator().manual_seed(2), requires_grad=True)
    idx, w = gating.topk_gating(logits, 2)
    grad = torch.randn(w.shape, generator=torch.Generator().manual_seed(3))
    (w * grad).sum().backward()
    ref_logits = logits.detach().clone().requires_grad_()
    want_idx, want_w = topk_gating_ref(ref_logits, 2)
    (want_w * grad).sum().backward()
    assert torch.equal(idx, want_idx) and not idx.requires_grad
    # NormalizeWeight's closed-form backward against torch's autograd of w / (1e-20 + sum w): fp32 rounding.
    torch.testing.assert_close(logits.grad, ref_logits.grad, rtol=1e-5, atol=1e-7)


GATING_ERRORS = [  # call, error, message start
    (lambda g: g([[0.0]], 2), TypeError, "gate_logits: expected a torch.Tensor"),
    (lambda g: g(torch.zeros(16), 2), ValueError, "gate_logits: expected a 2-D"),
    (lambda g: g(torch.zeros(1, 2, 3, 16), 2), ValueError, "gate_logits: expected a 2-D"),
    (lambda g: g(torch.zeros(4, 16, dtype=torch.int64), 2), TypeError, "gate_logits: expected a float32"),
    (lambda g: g(torch.zeros(4, 16), 0), ValueError, "k: expected a positive int"),
    (lambda g: g(torch.zeros(4, 16), 2.0), TypeError, "k: expected an int"),
    (lambda g: g(torch.zeros(4, 16), 17), ValueError, r"k: expected at most num_experts \(16"),
]


@pytest.mark.parametrize("index", range(len(GATING_ERRORS)))
def test_topk_gating_names_a_bad_argument_before_any_launch(moe: Any, index: int) -> None:
    gating, _, runtime = moe
    call, error, message = GATING_ERRORS[index]
    with pytest.raises(error, match=message):
        call(gating.topk_gating)
    assert runtime.LAUNCHES == []


def _gating_built(moe: Any, monkeypatch: pytest.MonkeyPatch, topk: list[tuple[int, int, int]]) -> tuple[Any, Any]:
    """(gating, errors) with topk_gate built for the grid values ``topk`` and normalize_weight for num_topk 2."""
    gating = moe[0]
    monkeypatch.setattr(gating, "_topk_kernel", ReferenceKernel(gating._topk_kernel, _topk_gate, topk))
    monkeypatch.setattr(gating, "_normalize_kernel", ReferenceKernel(gating._normalize_kernel, _normalize, [(2,)]))
    return gating, importlib.import_module("moe_conv_pkg.errors")


def test_topk_gating_names_the_built_sizes(moe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = moe[2]
    gating, errors = _gating_built(moe, monkeypatch, [(16, 2, 256), (64, 2, 256), (16, 6, 256)])
    with pytest.raises(errors.VariantNotFoundError, match=r"gate_logits: topk_gating is not built for num_experts=32 "
                       r"with k=2 \(topk_gate is built for num_experts 16, 64 and num_topk 2, 6\); add them to the "
                       r"grid of kernel topk_gate in kernel_specs/stub.yaml"):
        gating.topk_gating(torch.zeros(4, 32), 2)
    with pytest.raises(errors.VariantNotFoundError, match=r"k: normalize_weight is not built for num_topk=6 "
                       r"\(built: 2\)"):
        gating.topk_gating(torch.zeros(4, 16), 6)
    assert runtime.LAUNCHES == []
    gating.topk_gating(torch.zeros(4, 16), 6, normalize=False)  # no normalize_weight needed
    assert kernels(runtime) == ["topk_gate"]


def test_topk_gating_takes_the_variant_for_any_e(moe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An E built for none takes topk_gate's variant for any E (a multiple of 4 up to 256), as topk_gate itself."""
    runtime = moe[2]
    gating, errors = _gating_built(moe, monkeypatch, [(16, 2, 256), (0, 2, 128), (0, 2, 256)])
    logits = torch.randn(4, 32)
    expert_idx, _ = gating.topk_gating(logits, 2)
    assert torch.equal(expert_idx, torch.softmax(logits, -1).topk(2, dim=-1).indices)
    for experts in (30, 260):  # not a multiple of 4; more than the variants for any E hold
        with pytest.raises(errors.VariantNotFoundError, match=rf"num_experts={experts} with k=2 \(topk_gate is built "
                           r"for num_experts 16, any multiple of 4 up to 256 and num_topk 2\)"):
            gating.topk_gating(torch.zeros(4, experts), 2)
    assert kernels(runtime) == ["topk_gate", "normalize_weight"]  # the E = 32 call alone


# --- moe_routing -------------------------------------------------------------------------------


def routing(shape: tuple[int, ...], num_experts: int, k: int, seed: int, masked: float = 0.2) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bf16 hidden states of shape + (HIDDEN,), int64 ids with about ``masked`` of them -1, float32 weights)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((*shape, HIDDEN), generator=gen).to(torch.bfloat16)
    idx = torch.rand((*shape, num_experts), generator=gen).topk(k, dim=-1).indices
    idx = torch.where(torch.rand(idx.shape, generator=gen) < masked, -1, idx)
    return x, idx, torch.rand(idx.shape, generator=gen)


class Linears(torch.nn.Module):
    """num_experts bf16 linear layers called as experts(expert_id, segment); records the calls."""

    def __init__(self, num_experts: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN, dtype=torch.bfloat16)
                                           for _ in range(num_experts))
        self.calls: list[tuple[int, int]] = []

    def forward(self, expert: int, segment: torch.Tensor) -> torch.Tensor:
        self.calls.append((expert, int(segment.shape[0])))
        return self.layers[expert](segment)  # type: ignore[no-any-return]


@pytest.mark.parametrize("shape", [(23,), (2, 9)])
def test_identity_routing_is_the_weighted_sum_of_the_token(moe: Any, shape: tuple[int, ...]) -> None:
    _, route, runtime = moe
    x, idx, w = routing(shape, 9, 2, seed=4)
    out = route.moe_routing(x, idx, w, num_experts=9)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    assert torch.equal(out, moe_routing_ref(x, idx, w, num_experts=9))
    assert kernels(runtime) == ["moe_fused_mapping", "moe_expand", "moe_reduce"]
    # Masked slots contribute nothing: out = x * (sum of the routed weights), up to bf16 rounding.
    total = torch.where(idx >= 0, w, 0).sum(-1, keepdim=True)
    torch.testing.assert_close(out.float(), (x.float() * total), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("alignment", [1, 4])
def test_per_expert_linears_match_the_reference_forward_and_backward(moe: Any, alignment: int) -> None:
    _, route, _ = moe
    x, idx, w = routing((2, 7), 4, 2, seed=5)
    experts = Linears(4, seed=6)
    x.requires_grad_()
    w.requires_grad_()
    out = route.moe_routing(x, idx, w, experts, num_experts=4, alignment=alignment)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    out.backward(grad)
    got = [x.grad, w.grad, *(p.grad for p in experts.parameters())]
    calls = list(experts.calls)
    x.grad = w.grad = None
    experts.zero_grad(set_to_none=True)
    want_out = moe_routing_ref(x, idx, w, experts, num_experts=4)
    want_out.backward(grad)
    want = [x.grad, w.grad, *(p.grad for p in experts.parameters())]
    counts = [int((idx == e).sum()) for e in range(4)]
    # Each expert with tokens is called once, on its segment: its rows, padded to the alignment.
    assert calls == [(e, -(-n // alignment) * alignment) for e, n in enumerate(counts) if n]
    if alignment == 1:  # the experts see the reference's rows exactly: the same values, bit for bit
        assert torch.equal(out, want_out)
    else:  # padding rows change the GEMM's row count, which may change the last bits of a CPU GEMM
        torch.testing.assert_close(out, want_out, rtol=1e-2, atol=1e-2)
    # Gradients: bf16 rows on both sides, the op rounding the expanded gradient to bf16 once more (ReduceFused).
    for name, g, r in zip(["x", "w", *(n for n, _ in experts.named_parameters())], got, want, strict=True):
        assert g is not None and r is not None, name
        assert g.shape == r.shape and g.dtype == r.dtype, name
        torch.testing.assert_close(g.float(), r.float(), rtol=2e-2, atol=2e-2, msg=name)
    assert w.grad is not None and bool((w.grad[idx < 0] == 0).all())  # masked slots: no gradient


def test_a_module_list_is_called_by_index_and_sets_num_experts(moe: Any) -> None:
    _, route, _ = moe
    x, idx, w = routing((11,), 9, 2, seed=8)
    experts = Linears(9, seed=9).layers
    out = route.moe_routing(x, idx, w, experts)
    assert torch.equal(out, moe_routing_ref(x, idx, w, experts))


def test_ids_past_num_experts_are_dropped_and_num_experts_defaults_to_the_largest_id(moe: Any) -> None:
    _, route, _ = moe
    x, idx, w = routing((16,), 9, 2, seed=10)
    calls: list[int] = []

    def double(expert: int, rows: torch.Tensor) -> torch.Tensor:
        calls.append(expert)
        return rows * 2

    assert torch.equal(route.moe_routing(x, idx, w, double, num_experts=5),
                       moe_routing_ref(x, idx, w, double, num_experts=5))
    assert max(calls) < 5
    calls.clear()
    assert torch.equal(route.moe_routing(x, idx, w, double), moe_routing_ref(x, idx, w, double))
    assert max(calls) == int(idx.max())


def test_fewer_experts_run_the_next_larger_mapping_with_the_extra_ids_dropped(
        moe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, route, runtime = moe
    monkeypatch.setattr(route, "_mapping_kernel", ReferenceKernel(route._mapping_kernel, _mapping,
                                                                  [(4,), (9,), (32,)]))
    x, idx, w = routing((2, 8), 16, 2, seed=11, masked=0.0)
    idx[0, 0, 0] = 20  # outside the routing's 16 experts, inside the mapping's 32: still dropped
    linears = Linears(16, seed=12)
    out = route.moe_routing(x, idx, w, linears, num_experts=16)
    assert torch.equal(out, moe_routing_ref(x, idx, w, linears, num_experts=16))
    mapping = next(values for name, values, _ in runtime.LAUNCHES if name == "moe_fused_mapping")
    assert mapping == {"num_experts": 32}
    errors = importlib.import_module("moe_conv_pkg.errors")
    with pytest.raises(errors.VariantNotFoundError, match=r"num_experts: moe_routing is not built for 64 experts "
                       r"\(get_fused_mapping is built for num_experts 4, 9, 32"):
        route.moe_routing(x, idx, w, num_experts=64)


def test_every_slot_masked_and_no_tokens(moe: Any) -> None:
    _, route, _ = moe
    x, idx, w = routing((5,), 4, 2, seed=13)
    out = route.moe_routing(x, torch.full_like(idx, -1), w, lambda e, rows: rows, num_experts=4)
    assert torch.equal(out, torch.zeros_like(x))
    empty = route.moe_routing(x[:0], idx[:0], w[:0], lambda e, rows: rows, num_experts=4)
    assert empty.shape == (0, HIDDEN)


def test_unbuilt_hidden_names_the_sizes_all_three_kernels_share(moe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, route, runtime = moe
    errors = importlib.import_module("moe_conv_pkg.errors")
    # The unweighted reduce of 2560 runs on its weighted variant; the expand of 2560 is missing.
    monkeypatch.setattr(route, "_expand_kernel", ReferenceKernel(route._expand_kernel, _expand, [
        (h, "bfloat16", False, "row_major") for h in (256, 2048, 4096)]))
    monkeypatch.setattr(route, "_reduce_kernel", ReferenceKernel(route._reduce_kernel, _reduce, [
        *((h, "bfloat16", "bfloat16", True) for h in (256, 2048, 2560, 4096)),
        *((h, "bfloat16", "bfloat16", False) for h in (256, 2048))]))
    x, idx, w = routing((3,), 4, 2, seed=14)
    with pytest.raises(errors.VariantNotFoundError, match=r"hidden_states: moe_routing is not built for hidden size "
                       r"2560 \(built: 256, 2048, 4096: .*variants share\); add it"):
        route.moe_routing(torch.zeros((3, 2560), dtype=torch.bfloat16), idx, w, num_experts=4)
    assert runtime.LAUNCHES == []
    route.moe_routing(x, idx, w, num_experts=4)


def test_variants_for_any_hidden_serve_the_other_sizes(moe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, route, runtime = moe
    errors = importlib.import_module("moe_conv_pkg.errors")
    monkeypatch.setattr(route, "_expand_kernel", ReferenceKernel(route._expand_kernel, _expand, [
        (h, "bfloat16", False, "row_major") for h in (0, 2048)]))
    monkeypatch.setattr(route, "_reduce_kernel", ReferenceKernel(route._reduce_kernel, _reduce, [
        (h, "bfloat16", "bfloat16", True) for h in (0, 2048)]))
    _, idx, w = routing((3,), 4, 2, seed=15)
    for hidden in (768, 2048, 2560):
        x = torch.randn((3, hidden)).bfloat16()
        out = route.moe_routing(x, idx, w, lambda e, rows: rows, num_experts=4)
        assert out.shape == x.shape
    # Neither the expand nor the reduce of any hidden takes 640 (not a multiple of 256): named with the sizes.
    with pytest.raises(errors.VariantNotFoundError, match=r"hidden_states: moe_routing is not built for hidden size "
                       r"640 \(built: 2048: .*, and any multiple of 256\)"):
        route.moe_routing(torch.zeros((3, 640), dtype=torch.bfloat16), idx, w, num_experts=4)
    runtime.LAUNCHES.clear()


X2 = torch.zeros((4, HIDDEN), dtype=torch.bfloat16)
IDX = torch.zeros((4, 2), dtype=torch.int64)
W = torch.ones((4, 2))
ROUTING_ERRORS = [  # call, error, message start
    (lambda r: r(X2.tolist(), IDX, W), TypeError, "hidden_states: expected a torch.Tensor"),
    (lambda r: r(X2[0], IDX, W), ValueError, "hidden_states: expected a 2-D"),
    (lambda r: r(X2.float(), IDX, W), TypeError, "hidden_states: expected dtype torch.bfloat16"),
    (lambda r: r(X2, IDX.int(), W), TypeError, "expert_idx: expected dtype torch.int64"),
    (lambda r: r(X2, IDX[:3], W), ValueError, r"expert_idx: expected shape \(num_tokens, k\) with leading dimensions"),
    (lambda r: r(X2.view(2, 2, HIDDEN), IDX, W), ValueError, r"expert_idx: expected shape \(batch, seq, k\)"),
    (lambda r: r(X2, IDX[:, :0], W), ValueError, "expert_idx: k"),
    (lambda r: r(X2, IDX, W.double()), TypeError, "expert_weights: expected dtype torch.float32"),
    (lambda r: r(X2, IDX, W[:, :1]), ValueError, r"expert_weights: expected shape \(4, 2\) \(that of expert_idx\)"),
    (lambda r: r(X2, IDX, W, "relu"), TypeError, "experts: expected None, a callable"),
    (lambda r: r(X2, IDX, W, num_experts=0), ValueError, "num_experts: expected a positive int"),
    (lambda r: r(X2, IDX, W, [lambda t: t] * 3, num_experts=4), ValueError, "num_experts: 4 does not match experts"),
    (lambda r: r(X2, IDX, W, alignment=0), ValueError, "alignment: expected a positive int"),
]


@pytest.mark.parametrize("index", range(len(ROUTING_ERRORS)))
def test_moe_routing_names_a_bad_argument_before_any_launch(moe: Any, index: int) -> None:
    _, route, runtime = moe
    call, error, message = ROUTING_ERRORS[index]
    with pytest.raises(error, match=message):
        call(route.moe_routing)
    assert runtime.LAUNCHES == []


@pytest.mark.parametrize(("returns", "message"), [(lambda rows: rows[:, :8], r"\(2, 8\)"),
                                                   (lambda rows: None, "NoneType")])
def test_an_expert_returning_the_wrong_shape_is_named(moe: Any, returns: Callable[..., Any], message: str) -> None:
    _, route, _ = moe
    with pytest.raises(ValueError, match=rf"experts: expert 0 must return a tensor of its segment's shape \(2, "
                                         rf"{HIDDEN}\), got {message}"):
        route.moe_routing(X2[:1], IDX[:1], W[:1], lambda e, rows: returns(rows), num_experts=4)


# --- the reference itself ----------------------------------------------------------------------


def test_reference_by_hand() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16)
    idx = torch.tensor([[1, 0], [-1, 1]])
    w = torch.tensor([[0.5, 0.25], [1.0, 2.0]])
    experts = [lambda t: t * 10, lambda t: t + 1]
    # token 0: 0.5 * (x + 1) + 0.25 * 10 x; token 1: slot 0 masked, 2 * (x + 1).
    want = torch.tensor([[0.5 * 2 + 0.25 * 10, 0.5 * 3 + 0.25 * 20], [2 * 4, 2 * 5]], dtype=torch.bfloat16)
    assert torch.equal(moe_routing_ref(x, idx, w, experts), want)
    assert torch.equal(moe_routing_ref(x, idx, w), torch.tensor([[0.75, 1.5], [6.0, 8.0]], dtype=torch.bfloat16))
    ids, weights = topk_gating_ref(torch.tensor([[0.0, 2.0, 1.0, 2.0]]), 2)
    assert ids.tolist() == [[1, 3]] and torch.allclose(weights, torch.tensor([[0.5, 0.5]]))


# --- packaging and types -----------------------------------------------------------------------


def test_the_packager_installs_both_modules_and_the_moe_module_exports_their_all() -> None:
    from tkc.package import support_modules
    from tkc.spec import load_specs

    specs = load_specs([REPO / "kernel_specs"], REPO / "kernels")
    named = {(specs.ops / k.op).resolve() for k in specs.kernels}
    public = {p.stem: p for p in support_modules(REPO / "ops" / "moe", named)}
    assert {"gating", "routing"} <= set(public)
    for stem, names in (("gating", {"topk_gating", "NormalizeWeight"}), ("routing", {"moe_routing"})):
        tree = ast.parse(public[stem].read_text())
        declared = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
        assert set(declared) == names


def test_the_public_modules_type_check(tmp_path: Path) -> None:
    from tests.test_lint import _tree

    package = _tree(tmp_path)
    for name in PUBLIC:
        shutil.copy(REPO / "ops" / "moe" / f"{name}.py", package / "moe" / f"{name}.py")
    done = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "--no-incremental",
                           "--python-version", "3.10", "-p", "lint_pkg.moe.gating", "-p", "lint_pkg.moe.routing"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_references_fused_add_has_the_fma_bits_and_the_plain_gradient() -> None:
    """moe_routing_ref adds each weighted row by one rounding, as reduce_fused does, and autograd still runs through
    it (the end-to-end GPU test differentiates the reference)."""
    from tests.reference.moe_conveniences import _fma
    from tests.reference.numeric import fma_f32

    gen = torch.Generator().manual_seed(3)
    a, b, c = (torch.randn(4096, generator=gen) * 10.0 ** torch.randint(-6, 6, (4096,), generator=gen)
               for _ in range(3))
    c[:64] = -(a[:64] * b[:64])  # exact cancellation: the plain sum's rounding error is all that is left
    leaves = [t.clone().requires_grad_() for t in (a, b, c)]
    got = _fma(*leaves)
    assert torch.equal(got.detach().view(torch.int32), fma_f32(a, b, c).view(torch.int32))
    assert not torch.equal(got.detach(), a * b + c)  # the two roundings differ somewhere: the test can fail
    got.sum().backward()
    assert torch.equal(leaves[0].grad, b) and torch.equal(leaves[1].grad, a) and torch.equal(leaves[2].grad,
                                                                                             torch.ones_like(c))
