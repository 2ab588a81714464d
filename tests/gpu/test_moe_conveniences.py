"""GPU tests of the MoE conveniences moe.topk_gating and moe.moe_routing against
tests/reference/moe_conveniences.py, forward and autograd.

Tolerances, stated next to each check:
- topk_gating: ids and weights bit for bit (the op and the reference run the same torch
  softmax on the same tensor, topk_gate and normalize_weight are bit-exact against the gating
  references); gradients of the logits to rtol 1e-4 / atol 1e-6 (NormalizeWeight's closed-form
  backward against torch's autograd of w / (1e-20 + sum w), both fp32).
- moe_routing with identity experts: bit for bit (expand moves rows, reduce_fused adds fp32
  products in k order as the reference does).
- moe_routing with per-expert linear layers: the experts see the reference's rows (alignment
  1: the same rows in the same order), so the forward is expected bit for bit, checked to a
  relative (Frobenius) error of 5e-3 (cuBLAS may pick another algorithm for a view at an
  offset); gradients to a relative error of 2e-2: bf16 rows on both sides, the two backward
  passes accumulating the token gradients in different precisions (the op's unweighted reduce in
  fp32, the reference's index backward in bf16) and the weight gradients in different orders.
Outputs of the ops are poisoned first (a freed block of 0x7F bytes the allocations reuse).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.gpu.poison import poison_allocator
from tests.reference.moe_conveniences import moe_routing_ref, topk_gating_ref

tk, _, errors, _ = installed_package()
moe = tk.moe
# Loaded now (the family module imports them on first use), so the compiled functions below trace
# the functions themselves, not the lazy module's import.
topk_gating, moe_routing = moe.topk_gating, moe.moe_routing

pytestmark = pytest.mark.gpu

BATCH, SEQ = 2, 512  # the announcement's (2, 512, H) input


def assert_rel(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    """||got - want|| / ||want|| <= tol (Frobenius, in fp32), with shapes and dtypes equal."""
    assert got.shape == want.shape and got.dtype == want.dtype, f"{name}: {got.shape} {got.dtype} vs " \
                                                                f"{want.shape} {want.dtype}"
    err = float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))
    assert err <= tol, f"{name}: relative error {err:.3e} > {tol}"


def logits(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=gen, device="cuda").to(dtype)


def random_routing(shape: tuple[int, ...], num_experts: int, k: int, seed: int,
                   masked: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ids (distinct per token, about ``masked`` of them -1) and float32 weights of shape + (k,)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    idx = torch.rand((*shape, num_experts), generator=gen, device="cuda").topk(k, dim=-1).indices
    idx = torch.where(torch.rand(idx.shape, generator=gen, device="cuda") < masked, -1, idx)
    return idx.contiguous(), torch.rand(idx.shape, generator=gen, device="cuda")


def hidden_states(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)


def linears(num_experts: int, hidden: int, seed: int) -> torch.nn.ModuleList:
    """Per-expert bf16 linear layers (nn.Linear's default init): an actual expert MLP's first layer."""
    torch.manual_seed(seed)
    return torch.nn.ModuleList(torch.nn.Linear(hidden, hidden, bias=True, device="cuda", dtype=torch.bfloat16)
                               for _ in range(num_experts))


# --- topk_gating -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4001,), (BATCH, SEQ), (0,)])
# 32 and 200: E built for none, through topk_gate's variants for any E (up to 128 and up to 256).
@pytest.mark.parametrize(("num_experts", "k"), [(16, 2), (64, 6), (256, 8), (72, 1), (32, 6), (200, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("normalize", [True, False])
def test_topk_gating_matches_the_reference(shape: tuple[int, ...], num_experts: int, k: int, dtype: torch.dtype,
                                           normalize: bool) -> None:
    x = logits((*shape, num_experts), dtype, seed=num_experts + k)
    poison_allocator()
    idx, w = moe.topk_gating(x, k, normalize=normalize)
    want_idx, want_w = topk_gating_ref(x, k, normalize)
    assert idx.shape == w.shape == (*shape, k) and idx.dtype == torch.int64 and w.dtype == torch.float32
    assert idx.is_contiguous() and w.is_contiguous()
    assert torch.equal(idx, want_idx)  # exact
    assert torch.equal(w.view(torch.int32), want_w.view(torch.int32))  # exact, bits


def test_topk_gating_gradient_matches_the_reference_autograd() -> None:
    x = logits((BATCH, SEQ, 64), torch.float32, seed=1).requires_grad_()
    grad = logits((BATCH, SEQ, 6), torch.float32, seed=2)
    idx, w = moe.topk_gating(x, 6)
    (w * grad).sum().backward()
    ref = x.detach().clone().requires_grad_()
    want_idx, want_w = topk_gating_ref(ref, 6)
    (want_w * grad).sum().backward()
    assert torch.equal(idx, want_idx)
    torch.testing.assert_close(x.grad, ref.grad, rtol=1e-4, atol=1e-6)  # both fp32, different formulas


# --- moe_routing -------------------------------------------------------------------------------


@pytest.mark.parametrize("hidden", [768, 2048, 3072, 4096, 7168])  # 768 and 3072: the variants for any hidden
@pytest.mark.parametrize(("num_experts", "k"), [(4, 2), (9, 6), (32, 8)])
def test_identity_routing_matches_the_reference_bit_for_bit(hidden: int, num_experts: int, k: int) -> None:
    x = hidden_states((BATCH, SEQ, hidden), seed=hidden)
    idx, w = random_routing((BATCH, SEQ), num_experts, k, seed=num_experts)
    poison_allocator()
    out = moe.moe_routing(x, idx, w, num_experts=num_experts)
    want = moe_routing_ref(x, idx, w, num_experts=num_experts)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))  # exact, bits
    # 2-D tokens, every slot of some tokens masked (zero rows), num_experts from the largest id.
    idx2 = idx.view(-1, k).clone()
    idx2[::7] = -1
    out2 = moe.moe_routing(x.view(-1, hidden), idx2, w.view(-1, k), lambda e, rows: rows)
    assert torch.equal(out2, moe_routing_ref(x.view(-1, hidden), idx2, w.view(-1, k)))
    assert not out2[::7].any()


@pytest.mark.parametrize("hidden", [2048, 4096])
def test_gating_and_per_expert_linears_end_to_end_forward_and_backward(hidden: int) -> None:
    """The announcement's layer: a router, topk_gating, moe_routing over 16 linear experts (run on the
    mapping built for 32), with some slots masked as EP/TP masking does; gradients of the input,
    the router and every expert against torch's autograd of the references."""
    num_experts, k = 16, 2
    torch.manual_seed(3)
    router = torch.nn.Linear(hidden, num_experts, bias=False, device="cuda", dtype=torch.float32)
    experts = linears(num_experts, hidden, seed=4)
    x = hidden_states((BATCH, SEQ, hidden), seed=5).requires_grad_()
    gen = torch.Generator(device="cuda").manual_seed(6)
    mask = torch.rand((BATCH, SEQ, k), generator=gen, device="cuda") < 0.1
    grad = torch.randn((BATCH, SEQ, hidden), generator=gen, device="cuda").to(torch.bfloat16)
    params = [x, *router.parameters(), *experts.parameters()]

    def step(gating: Callable[..., tuple[torch.Tensor, torch.Tensor]], routing: Callable[..., torch.Tensor]) -> tuple[
            torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        for p in params:
            p.grad = None
        idx, w = gating(router(x.float()), k)
        idx = torch.where(mask, -1, idx)
        out = routing(x, idx, w, experts)
        out.backward(grad)
        return out.detach(), idx, [p.grad.clone() for p in params]  # type: ignore[union-attr]

    poison_allocator()
    out, idx, grads = step(moe.topk_gating, moe.moe_routing)
    want, want_idx, want_grads = step(topk_gating_ref, moe_routing_ref)
    assert torch.equal(idx, want_idx)
    assert_rel("out", out, want, 5e-3)  # expected bit for bit (see the module docstring)
    names = ["x", "router.weight", *(f"experts.{n}" for n, _ in experts.named_parameters())]
    for name, g, r in zip(names, grads, want_grads, strict=True):
        assert_rel(f"grad of {name}", g, r, 2e-2)


def test_a_module_list_with_aligned_segments_in_2d() -> None:
    hidden, num_experts, k = 4096, 9, 6
    x = hidden_states((BATCH * SEQ, hidden), seed=7)
    idx, w = random_routing((BATCH * SEQ,), num_experts, k, seed=8)
    experts = linears(num_experts, hidden, seed=9)
    with torch.no_grad():
        out = moe.moe_routing(x, idx, w, experts, alignment=128)  # num_experts = len(experts)
        want = moe_routing_ref(x, idx, w, experts)
    # Padding rows change the GEMMs' row counts, which may change cuBLAS's algorithm: bf16 rounding.
    assert_rel("out", out, want, 1e-2)


# --- torch.compile -----------------------------------------------------------------------------


def test_topk_gating_compiles_fullgraph() -> None:
    # Logits 0.05 apart in every row: a last-bit difference of inductor's softmax cannot reorder them.
    gen = torch.Generator(device="cuda").manual_seed(10)
    x = torch.rand((BATCH, SEQ, 64), generator=gen, device="cuda").argsort(dim=-1).float() * 0.05  # permutations
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: topk_gating(t, 6), fullgraph=True)
    with torch.no_grad():
        idx, w = compiled(x)
        want_idx, want_w = moe.topk_gating(x, 6)
    assert torch.equal(idx, want_idx)
    torch.testing.assert_close(w, want_w, rtol=1e-6, atol=1e-7)  # inductor's softmax against eager's


def test_identity_routing_compiles_fullgraph() -> None:
    x = hidden_states((BATCH, SEQ, 2048), seed=11)
    idx, w = random_routing((BATCH, SEQ), 16, 2, seed=12)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: moe_routing(t, idx, w, num_experts=16), fullgraph=True)
    with torch.no_grad():
        out = compiled(x)
        want = moe.moe_routing(x, idx, w, num_experts=16)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


# --- bad inputs: exceptions naming the argument, never a CUDA fault ------------------------------


def _bad_calls() -> dict[str, tuple[Callable[[], object], type[Exception], str]]:
    x = hidden_states((4, 2048), seed=0)
    idx, w = random_routing((4,), 4, 2, seed=0)
    return {
        # Not a multiple of 256: no variant for any hidden of reduce_fused takes it.
        "hidden not built": (lambda: moe.moe_routing(hidden_states((4, 1000), 0), idx, w, num_experts=4),
                             errors.VariantNotFoundError, "hidden_states: moe_routing is not built for hidden size 1000"),
        "hidden fp32": (lambda: moe.moe_routing(x.float(), idx, w, num_experts=4), TypeError, "hidden_states"),
        "experts not built": (lambda: moe.moe_routing(x, idx, w, num_experts=64), errors.VariantNotFoundError,
                              "num_experts: moe_routing is not built for 64 experts"),
        "int32 ids": (lambda: moe.moe_routing(x, idx.int(), w, num_experts=4), TypeError, "expert_idx"),
        "bf16 weights": (lambda: moe.moe_routing(x, idx, w.bfloat16(), num_experts=4), TypeError, "expert_weights"),
        "gating E not built": (lambda: moe.topk_gating(logits((4, 34), torch.float32, 0), 2),  # not a multiple of 4
                               errors.VariantNotFoundError, "gate_logits: topk_gating is not built"),
        "gating k": (lambda: moe.topk_gating(logits((4, 16), torch.float32, 0), 17), ValueError, "k:"),
        "gating 4-D": (lambda: moe.topk_gating(logits((1, 2, 4, 16), torch.float32, 0), 2), ValueError,
                       "gate_logits"),
    }


@pytest.mark.parametrize("name", ["hidden not built", "hidden fp32", "experts not built", "int32 ids", "bf16 weights",
                                  "gating E not built", "gating k", "gating 4-D"])
def test_bad_inputs_name_the_argument(name: str) -> None:
    call, error, message = _bad_calls()[name]
    with pytest.raises(error, match=message):
        call()
    torch.cuda.synchronize()  # no fault left behind
