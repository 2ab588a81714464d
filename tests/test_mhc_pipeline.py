"""CPU tests of the mHC functional pipeline (ops/modeling/mhc/functional.py): TileKernels' signatures, and
that each function composes the modeling ops as TileKernels' functional.py does (the ops they call, in order,
with which arguments), here with every op standing in as its torch reference (tests/reference/mhc_pipeline.py),
so that the pipeline must equal the reference pipeline exactly. No GPU needed."""

from __future__ import annotations

import importlib
import inspect
import shutil
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.conftest import REPO
from tests.reference import mhc_pipeline as ref

PACKAGE = "mhc_pipeline_pkg"

# Each modeling op as its reference, recording its call: (op, what the pipeline passed it).
FAKE_OPS = {
    "expand": '''
def expand_to_mhc(hidden, mhc_mult, out=None):
    CALLS.append(("expand_to_mhc", {"mhc_mult": mhc_mult}))
    return ref.expand_to_mhc_ref(hidden, mhc_mult)
''',
    "norm_fn": '''
def mhc_pre_norm_fn(residual, mhc_fn, mhc_norm_weight, mhc_norm_eps, fuse_grad_acc=True, n_splits=16):
    CALLS.append(("mhc_pre_norm_fn", {"rows": mhc_fn.shape[0], "weight": mhc_norm_weight is not None,
                                      "eps": mhc_norm_eps, "n_splits": n_splits}))
    return ref.norm_fn_ref(residual, mhc_fn, mhc_norm_weight, mhc_norm_eps)
''',
    "pre_split_mixes": '''
def mhc_pre_split_mixes(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps):
    CALLS.append(("mhc_pre_split_mixes", {"post_mult": mhc_post_mult_value, "pre_eps": mhc_pre_eps}))
    return ref.pre_split_mixes_ref(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)
''',
    "sinkhorn": '''
def sinkhorn_normalize(x, repeat=10, eps=1e-6):
    CALLS.append(("sinkhorn_normalize", {"repeat": repeat, "eps": eps}))
    return ref.sinkhorn_ref(x, repeat, eps)
''',
    "pre_apply_mix": '''
def mhc_pre_apply_mix(x, mix, out=None):
    CALLS.append(("mhc_pre_apply_mix", {"mix": tuple(mix.shape)}))
    return ref.pre_apply_mix_ref(x, mix)
''',
    "post": '''
def mhc_post(x, residual, post_layer_mix, comb_res_mix, out=None):
    CALLS.append(("mhc_post", {}))
    return ref.post_ref(x, residual, post_layer_mix, comb_res_mix)
''',
    "head_compute_mix": '''
def mhc_head_compute_mix(input_mix, mhc_scale, mhc_base, mhc_pre_eps):
    CALLS.append(("mhc_head_compute_mix", {"mix": tuple(input_mix.shape), "contiguous": input_mix.is_contiguous(),
                                           "scale": tuple(mhc_scale.shape), "pre_eps": mhc_pre_eps}))
    return ref.head_compute_mix_ref(input_mix, mhc_scale, mhc_base, mhc_pre_eps)
''',
    "pre_big_fuse": '''
def mhc_pre_big_fuse(residual, fn, mhc_scale, mhc_base, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value,
                     sinkhorn_repeat, n_splits=16):
    CALLS.append(("mhc_pre_big_fuse", {"rms_eps": rms_eps, "pre_eps": mhc_pre_eps, "sinkhorn_eps": mhc_sinkhorn_eps,
                                       "post_mult": mhc_post_mult_value, "repeat": sinkhorn_repeat,
                                       "n_splits": n_splits}))
    layer_input, (post_mix, comb_mix) = ref.mhc_pre_ref(
        residual, fn, mhc_scale, mhc_base, norm_eps=rms_eps, mhc_mult=residual.shape[-2],
        post_mult_value=mhc_post_mult_value, pre_eps=mhc_pre_eps, sinkhorn_eps=mhc_sinkhorn_eps,
        sinkhorn_repeat=sinkhorn_repeat)
    return post_mix, comb_mix, layer_input
''',
}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, list[Any]]]:
    """(the functional module over the reference ops, the calls list the ops append to)."""
    root = tmp_path_factory.mktemp("mhc_pipeline")
    folder = root / PACKAGE / "modeling" / "mhc" / "ops"
    folder.mkdir(parents=True)
    for level in (root / PACKAGE, folder.parent.parent, folder.parent):
        (level / "__init__.py").write_text("")
    (folder / "__init__.py").write_text("CALLS = []\n")
    for name, source in FAKE_OPS.items():
        (folder / f"{name}.py").write_text("from tests.reference import mhc_pipeline as ref\n\nfrom . import CALLS\n"
                                           + source)
    shutil.copy(REPO / "ops" / "modeling" / "mhc" / "functional.py", folder.parent / "functional.py")
    sys.path.insert(0, str(root))
    try:
        calls = importlib.import_module(f"{PACKAGE}.modeling.mhc.ops").CALLS
        yield importlib.import_module(f"{PACKAGE}.modeling.mhc.functional"), calls
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def _spelled(fn: Any) -> str:
    signature = inspect.signature(fn)
    return str(signature.replace(parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                                 return_annotation=signature.empty))


def test_signatures_are_tilekernels(pipeline: tuple[ModuleType, list[Any]]) -> None:
    functional, _ = pipeline
    assert functional.__all__ == ["expand_from_embedding", "mhc_head", "mhc_post", "mhc_pre"]
    assert _spelled(functional.expand_from_embedding) == "(x, mhc_mult=4)"
    assert _spelled(functional.mhc_pre) == (
        "(residual, fn, scale, base, *, norm_weight=None, norm_eps=1e-06, mhc_mult=4, post_mult_value=1.0, "
        "pre_eps=1e-06, sinkhorn_eps=1e-06, sinkhorn_repeat=10, n_splits=16)")
    assert _spelled(functional.mhc_head) == (
        "(residual, fn, scale, base, *, norm_weight=None, norm_eps=1e-06, mhc_mult=4, pre_eps=1e-06, n_splits=16)")
    assert _spelled(functional.mhc_post) == "(x, residual, post_layer_mix, comb_res_mix, out=None)"


def _block(h: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    m = 4
    return {"residual": torch.randn(2, 5, m, h, generator=g).bfloat16(),
            "fn": torch.randn(m * (m + 2), m * h, generator=g) * 1e-2,
            "scale": torch.randn(3, generator=g) * 0.1, "base": torch.randn(m * (m + 2), generator=g) * 0.1,
            "norm_weight": torch.randn(m * h, generator=g) * 0.1 + 1}


OPTIONS = {"norm_eps": 1e-5, "post_mult_value": 2.0, "pre_eps": 1e-3, "sinkhorn_eps": 1e-4, "sinkhorn_repeat": 7}


@pytest.mark.parametrize("weighted", [False, True])
def test_mhc_pre_with_gradients_chains_the_four_ops(pipeline: tuple[ModuleType, list[Any]], weighted: bool) -> None:
    functional, calls = pipeline
    b = _block(64, 1)
    weight = b["norm_weight"] if weighted else None
    calls.clear()
    got = functional.mhc_pre(b["residual"], b["fn"], b["scale"], b["base"], norm_weight=weight, n_splits=4,
                             **OPTIONS)
    assert [name for name, _ in calls] == ["mhc_pre_norm_fn", "mhc_pre_split_mixes", "sinkhorn_normalize",
                                           "mhc_pre_apply_mix"]
    assert calls[0][1] == {"rows": 24, "weight": weighted, "eps": 1e-5, "n_splits": 4}
    assert calls[1][1] == {"post_mult": 2.0, "pre_eps": 1e-3} and calls[2][1] == {"repeat": 7, "eps": 1e-4}
    want = ref.mhc_pre_ref(b["residual"], b["fn"], b["scale"], b["base"], norm_weight=weight, **OPTIONS)
    layer_input, (post_mix, comb_mix) = got
    assert torch.equal(layer_input, want[0]) and torch.equal(post_mix, want[1][0])
    assert torch.equal(comb_mix, want[1][1])


@pytest.mark.parametrize("weighted", [False, True])
def test_mhc_pre_without_gradients_is_the_fused_op(pipeline: tuple[ModuleType, list[Any]], weighted: bool) -> None:
    functional, calls = pipeline
    b = _block(64, 2)
    weight = b["norm_weight"] if weighted else None
    calls.clear()
    with torch.no_grad():
        layer_input, (post_mix, comb_mix) = functional.mhc_pre(b["residual"], b["fn"], b["scale"], b["base"],
                                                               norm_weight=weight, n_splits=8, **OPTIONS)
    assert calls == [("mhc_pre_big_fuse", {"rms_eps": 1e-5, "pre_eps": 1e-3, "sinkhorn_eps": 1e-4, "post_mult": 2.0,
                                           "repeat": 7, "n_splits": 8})]
    # The RMSNorm weight is merged into fn first: the same mixes as the path with gradients (the intended
    # difference from TileKernels, whose fused path drops the weight).
    want = ref.mhc_pre_ref(b["residual"], b["fn"], b["scale"], b["base"], norm_weight=weight, **OPTIONS)
    torch.testing.assert_close(layer_input, want[0], rtol=0, atol=0)
    torch.testing.assert_close(post_mix, want[1][0], rtol=0, atol=0)
    torch.testing.assert_close(comb_mix, want[1][1], rtol=0, atol=0)


@pytest.mark.parametrize("scale_shape", [(), (1,)])
def test_mhc_head_pads_fn_and_takes_the_first_mixes(pipeline: tuple[ModuleType, list[Any]],
                                                    scale_shape: tuple[int, ...]) -> None:
    functional, calls = pipeline
    b = _block(64, 3)
    fn, base, scale = b["fn"][:4], b["base"][:4], torch.full(scale_shape, 0.5)
    calls.clear()
    got = functional.mhc_head(b["residual"], fn, scale, base, norm_weight=b["norm_weight"], norm_eps=1e-5,
                              pre_eps=1e-3, n_splits=2)
    assert [name for name, _ in calls] == ["mhc_pre_norm_fn", "mhc_head_compute_mix", "mhc_pre_apply_mix"]
    assert calls[0][1] == {"rows": 24, "weight": True, "eps": 1e-5, "n_splits": 2}
    assert calls[1][1] == {"mix": (2, 5, 4), "contiguous": True, "scale": (1,), "pre_eps": 1e-3}
    assert calls[2][1] == {"mix": (2, 5, 4, 1)}
    want = ref.mhc_head_ref(b["residual"], fn, scale, base, norm_weight=b["norm_weight"], norm_eps=1e-5, pre_eps=1e-3)
    assert torch.equal(got, want)


def test_expand_and_post(pipeline: tuple[ModuleType, list[Any]]) -> None:
    functional, calls = pipeline
    x = torch.randn(2, 5, 64).bfloat16()
    calls.clear()
    residual = functional.expand_from_embedding(x)
    assert calls == [("expand_to_mhc", {"mhc_mult": 4})] and residual.shape == (2, 5, 4, 64)
    b = _block(64, 4)
    _, (post_mix, comb_mix) = functional.mhc_pre(b["residual"], b["fn"], b["scale"], b["base"])
    out = functional.mhc_post(x, b["residual"], post_mix, comb_mix)
    assert torch.equal(out, ref.mhc_post_ref(x, b["residual"], post_mix, comb_mix))
