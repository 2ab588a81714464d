"""GPU tests of the mHC functional pipeline ``tile_kernels_aot.modeling.mhc`` (expand_from_embedding, mhc_pre,
mhc_post, mhc_head) against the same pipeline over TileKernels' torch references (tests/reference/mhc_pipeline.py)
and torch autograd.

A toy model: the embedding's output expanded into 4 streams, two blocks (mhc_pre -> a bf16 linear sublayer ->
mhc_post) and the head's mix, with a loss on the head's output. Tolerances: the first block's layer input at
torch's bf16 defaults and its mixes at 1e-3 (TileKernels' test_post.py and test_norm_fn.py); the pipeline's bf16
outputs and the loss within a few bf16 steps (1e-2) of their own scale (blocks and head compound their roundings;
TileKernels states no tolerance for the chain); every gradient within the loosest gradient tolerance of
TileKernels' op tests (test_norm_fn.py's fn gradient: rtol 1e-3, atol 3e-2), the atol relative to the gradient's
largest magnitude (the toy's gradients are not of the size of TileKernels' test data). Three SGD steps, compared
at each. Also: torch.compile(fullgraph=True) of the inference and the training pipeline, inference (gradients
off: the fused mhc_pre_big_fuse) against the training path, and inference for random token counts in 1..4096 (no
VariantNotFoundError).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.reference import mhc_pipeline as ref

tile_kernels_aot, _, errors, runtime = installed_package()
pipe = importlib.import_module("tile_kernels_aot.modeling.mhc")

pytestmark = pytest.mark.gpu

M, HIDDEN, BLOCKS = 4, 1280, 2
OUT_ULPS = 1e-2  # composite bf16 outputs and the loss: ~2.5 bf16 steps (2^-8) at the tensor's own scale
GRAD_RTOL, GRAD_ATOL = 1e-3, 3e-2  # TileKernels' test_norm_fn.py fn gradient
MIXES = {"rtol": 1e-3, "atol": 1e-3}  # TileKernels' test_norm_fn.py forward


def _parameters(seed: int) -> dict[str, torch.Tensor]:
    """The toy's weights, with TileKernels' test data scales (test_norm_fn.py, test_pre_big_fuse.py)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    kw: dict[str, Any] = {"device": "cuda", "generator": g}
    m3, k = M * (M + 2), M * HIDDEN
    p: dict[str, torch.Tensor] = {}
    for b in range(BLOCKS):
        p[f"fn{b}"] = torch.randn(m3, k, **kw) * 1e-4
        p[f"scale{b}"] = torch.randn(3, **kw) * 0.1
        p[f"base{b}"] = torch.randn(m3, **kw) * 0.1
        p[f"norm{b}"] = torch.randn(k, **kw) * 0.1 + 1.0
        p[f"w{b}"] = (torch.randn(HIDDEN, HIDDEN, **kw) * HIDDEN**-0.5).bfloat16()
    p["head_fn"] = torch.randn(M, k, **kw) * 1e-4
    p["head_scale"] = torch.randn(1, **kw) * 0.1
    p["head_base"] = torch.randn(M, **kw) * 0.1
    return p


def _kernels(x: torch.Tensor, p: dict[str, torch.Tensor], keep: list[torch.Tensor] | None = None) -> torch.Tensor:
    residual = pipe.expand_from_embedding(x, mhc_mult=M)
    for b in range(BLOCKS):
        layer_input, (post_mix, comb_mix) = pipe.mhc_pre(residual, p[f"fn{b}"], p[f"scale{b}"], p[f"base{b}"],
                                                         norm_weight=p[f"norm{b}"], mhc_mult=M)
        if keep is not None:
            keep += [layer_input, post_mix, comb_mix]
        residual = pipe.mhc_post(layer_input @ p[f"w{b}"], residual, post_mix, comb_mix)
    return pipe.mhc_head(residual, p["head_fn"], p["head_scale"], p["head_base"], mhc_mult=M)  # type: ignore[no-any-return]


def _reference(x: torch.Tensor, p: dict[str, torch.Tensor], keep: list[torch.Tensor] | None = None) -> torch.Tensor:
    residual = ref.expand_from_embedding_ref(x, M)
    for b in range(BLOCKS):
        layer_input, (post_mix, comb_mix) = ref.mhc_pre_ref(residual, p[f"fn{b}"], p[f"scale{b}"], p[f"base{b}"],
                                                            norm_weight=p[f"norm{b}"], mhc_mult=M)
        if keep is not None:
            keep += [layer_input, post_mix, comb_mix]
        residual = ref.mhc_post_ref(layer_input @ p[f"w{b}"], residual, post_mix, comb_mix)
    return ref.mhc_head_ref(residual, p["head_fn"], p["head_scale"], p["head_base"], mhc_mult=M)


def _loss(model: Callable[..., torch.Tensor], x: torch.Tensor, p: dict[str, torch.Tensor], target: torch.Tensor,
          keep: list[torch.Tensor] | None = None) -> torch.Tensor:
    return (model(x, p, keep).float() * target).mean()


def _out_close(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """A bf16 output of the whole pipeline: torch's bf16 rtol, and an atol of a few bf16 steps of the tensor's
    largest value (blocks and head compound their roundings; cancellation leaves values near zero whose
    relative error means nothing)."""
    torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=OUT_ULPS * float(want.float().abs().max()),
                               msg=lambda m: f"{what}{m}")


def _grad_close(got: torch.Tensor | None, want: torch.Tensor | None, name: str) -> None:
    assert got is not None and want is not None, f"{name}: no gradient"
    scale = float(want.float().abs().max())
    torch.testing.assert_close(got.float(), want.float(), rtol=GRAD_RTOL, atol=GRAD_ATOL * scale,
                               msg=lambda m: f"{name}: {m}")


def _leaves(p: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().requires_grad_() for k, v in p.items()}


@pytest.mark.parametrize("tokens", [1, 13, 1024])
def test_training_steps_match_torch_autograd(tokens: int) -> None:
    torch.manual_seed(0)
    x0 = torch.randn(1, tokens, HIDDEN, device="cuda").bfloat16()
    target = torch.randn(1, tokens, HIDDEN, device="cuda")
    params = _parameters(tokens)
    mine, theirs = _leaves(params), _leaves(params)
    x_mine, x_theirs = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    for step in range(3):
        got_keep: list[torch.Tensor] = []
        want_keep: list[torch.Tensor] = []
        got = _loss(_kernels, x_mine, mine, target, got_keep)
        want = _loss(_reference, x_theirs, theirs, target, want_keep)
        if step == 0:  # the first block's forward, before the blocks' differences compound
            torch.testing.assert_close(got_keep[0], want_keep[0])
            torch.testing.assert_close(got_keep[1], want_keep[1], **MIXES)
            torch.testing.assert_close(got_keep[2], want_keep[2], **MIXES)
        # The loss is a mean of output * target: within OUT_ULPS of the mean of |output * target|.
        with torch.no_grad():
            out_scale = float((_reference(x_theirs, theirs).float() * target).abs().mean())
        torch.testing.assert_close(got, want, rtol=0, atol=OUT_ULPS * out_scale)
        got.backward()
        want.backward()
        _grad_close(x_mine.grad, x_theirs.grad, f"step {step} x")
        for name in params:
            _grad_close(mine[name].grad, theirs[name].grad, f"step {step} {name}")
        with torch.no_grad():  # the same normalized SGD step on both (1% of each weight's scale), own gradients
            for leaves in (mine, theirs):
                for t in leaves.values():
                    g = t.grad.float()  # type: ignore[union-attr]
                    t += (-0.01 * t.float().abs().max() * g / (g.abs().max() + 1e-30)).to(t.dtype)
                    t.grad = None
            x_mine.grad = x_theirs.grad = None


def test_inference_is_the_training_forward() -> None:
    """Gradients off: mhc_pre takes the fused kernel (the RMSNorm weight merged into fn), same results."""
    torch.manual_seed(1)
    x = torch.randn(1, 77, HIDDEN, device="cuda").bfloat16()
    p = _parameters(1)
    with torch.no_grad():
        inference = _kernels(x, p)
    training = _kernels(x, p).detach()
    _out_close(inference, training)
    with torch.no_grad():
        _out_close(inference, _reference(x, p))


def test_inference_for_random_token_counts() -> None:
    rng = random.Random(7)
    p = _parameters(2)
    for tokens in [1, 4096, *rng.sample(range(2, 4096), 14)]:
        x = torch.randn(1, tokens, HIDDEN, device="cuda").bfloat16()
        with torch.no_grad():
            got = _kernels(x, p)
            assert got.shape == (1, tokens, HIDDEN)
            _out_close(got, _reference(x, p), f"{tokens} tokens: ")


def test_torch_compile_fullgraph_inference() -> None:
    # mhc_post_fwd and mhc_pre_apply_mix size their outputs from the caller's (..., m, hidden) tensor and launch on
    # its flattened view: the traced custom op takes that tensor too (tkc/runtime/_op.py, _traced_tensors).
    torch.manual_seed(3)
    p = _parameters(3)
    # Static shapes: the fused mhc_pre_big_fuse op cannot be traced with a symbolic token count yet (its plan
    # puts the size into the traced launch's constants).
    compiled = torch.compile(_kernels, fullgraph=True, dynamic=False)
    for tokens in (13, 500, 2049):
        x = torch.randn(1, tokens, HIDDEN, device="cuda").bfloat16()
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, p), _kernels(x, p), rtol=0, atol=0)


def test_torch_compile_fullgraph_training() -> None:
    # TileKernels' fuse_grad_acc passes the residual's gradient through an attribute of its storage, which dynamo
    # cannot trace: traced, each backward returns its own gradient and autograd adds them (_args.storage_gradients).
    torch.manual_seed(4)
    tokens = 129
    x0 = torch.randn(1, tokens, HIDDEN, device="cuda").bfloat16()
    target = torch.randn(1, tokens, HIDDEN, device="cuda")
    params = _parameters(4)
    eager, traced = _leaves(params), _leaves(params)
    x_eager, x_traced = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    compiled = torch.compile(lambda x, p, t: _loss(_kernels, x, p, t), fullgraph=True)
    got, want = compiled(x_traced, traced, target), _loss(_kernels, x_eager, eager, target)
    torch.testing.assert_close(got, want)  # the loss's mean may sum in another order when compiled
    got.backward()
    want.backward()
    _grad_close(x_traced.grad, x_eager.grad, "x")
    for name in params:
        _grad_close(traced[name].grad, eager[name].grad, name)
