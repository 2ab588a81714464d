"""CPU checks of tests/reference/mhc_recompute.py: the kernels' chain agrees with TileKernels' reference chain
within the bf16 tolerance of TileKernels' mhc tests (the recompute test itself compares with TileKernels'
own kernels bit for bit, which the GPU test does with this package's mhc_pre_apply_mix and mhc_post), has
one layer input per pre mix and one residual per layer output, and sums the streams in stream order."""

from __future__ import annotations

import pytest
import torch

from tests.reference import mhc_recompute as ref


def _data(num_layers: int, num_post: int, n: int, h: int, seed: int) -> tuple[object, ...]:
    g = torch.Generator().manual_seed(seed)
    m = 4
    initial = torch.randn(1, n, m, h, generator=g).bfloat16()
    pre = [torch.randn(1, n, m, 1, generator=g) for _ in range(num_layers)]
    outputs = [torch.randn(1, n, h, generator=g).bfloat16() for _ in range(num_post)]
    posts = [torch.randn(1, n, m, 1, generator=g) for _ in range(num_post)]
    combs = [torch.randn(1, n, m, m, generator=g) for _ in range(num_post)]
    return initial, pre, outputs, posts, combs


@pytest.mark.parametrize(("num_layers", "num_post", "h"), [(1, 1, 256), (1, 0, 256), (3, 2, 1280), (4, 4, 1283)])
def test_formula_chain_is_the_reference_chain(num_layers: int, num_post: int, h: int) -> None:
    data = _data(num_layers, num_post, 13, h, num_layers * 7 + num_post + h)
    inputs, residuals = ref.multilayer_recompute_formula(*data)  # type: ignore[arg-type]
    want_inputs, want_residuals = ref.multilayer_recompute_ref(*data)  # type: ignore[arg-type]
    assert (len(inputs), len(residuals)) == (num_layers, num_post)
    for got, want in zip([*inputs, *residuals], [*want_inputs, *want_residuals], strict=True):
        assert got.dtype == torch.bfloat16
        # Layers compound bf16 roundings: each one may move a value by one bf16 step of its own.
        torch.testing.assert_close(got, want, rtol=2e-2 * num_layers, atol=2e-2 * num_layers)


def test_each_layer_starts_from_the_previous_residual() -> None:
    initial, pre, outputs, posts, combs = _data(3, 3, 5, 64, 1)
    inputs, residuals = ref.multilayer_recompute_formula(initial, pre, outputs, posts, combs)  # type: ignore[arg-type]
    for i in range(1, 3):
        assert torch.equal(inputs[i], ref.pre_apply_mix_formula(residuals[i - 1], pre[i]))  # type: ignore[index]


def test_apply_formula_adds_streams_in_order() -> None:
    # 2^24 + 1 + 1 - 2^24: in stream order the ones are lost to rounding (0), in any order that adds
    # the ones first they survive (2).
    x = torch.tensor([2.0**24, 1.0, 1.0, -(2.0**24)]).view(1, 4, 1)
    mix = torch.ones(1, 4, 1)
    assert ref.pre_apply_mix_formula(x, mix).item() == 0.0
