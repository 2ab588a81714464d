"""GPU tests of ``tile_kernels_aot.mhc.mhc_multilayer_recompute`` (and its ``modeling.mhc.ops`` re-export)
against tests/reference/mhc_recompute.py.

Tolerance is TileKernels 1.0.0's (tests/mhc/test_multilayer_recompute.py): bit-exact (``torch.equal``) with
the forward ops the recompute stands for, here this package's ``mhc_pre_apply_mix`` and ``mhc_post_fwd``
chained, and with the kernels' formulas in torch. Cases are TileKernels' (num_layers, num_post, hidden) over
8192 tokens, plus token counts 0, 1 and 13, leading shapes (2, 13), a hidden that is not a multiple of 8 and a
misaligned layer output (the vec-1 variant), torch.compile(fullgraph=True), and a captured-and-replayed
CUDA graph. Written tensors come from a poisoned caching allocator (tests/gpu/poison.py).
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.gpu.poison import poison_allocator
from tests.reference import mhc_recompute as ref

tile_kernels_aot, _, errors, runtime = installed_package()
mhc = importlib.import_module("tile_kernels_aot.mhc")
modeling_ops = importlib.import_module("tile_kernels_aot.modeling.mhc.ops")

pytestmark = pytest.mark.gpu

# TileKernels' _CORRECTNESS_CASES: (num_layers, num_post, hidden)
TILEKERNELS_CASES = [(1, 1, 2560), (3, 2, 2560), (3, 3, 2560), (10, 9, 2560), (10, 10, 2560), (10, 9, 4096),
                     (10, 10, 4096), (10, 9, 7168), (10, 10, 7168), (10, 9, 8192), (10, 10, 8192)]


def _data(lead: tuple[int, ...], hidden: int, num_layers: int, num_post: int) -> tuple[Any, ...]:
    """TileKernels' generate_multilayer_recompute_test_data: randn inputs, empty (here poisoned) outputs."""
    m = 4
    kw: dict[str, Any] = {"device": "cuda"}
    initial = torch.randn(*lead, m, hidden, dtype=torch.bfloat16, **kw)
    pre = [torch.randn(*lead, m, 1, **kw) for _ in range(num_layers)]
    outputs = [torch.randn(*lead, hidden, dtype=torch.bfloat16, **kw) for _ in range(num_post)]
    posts = [torch.randn(*lead, m, 1, **kw) for _ in range(num_post)]
    combs = [torch.randn(*lead, m, m, **kw) for _ in range(num_post)]
    poison_allocator()
    inputs = [torch.empty(*lead, hidden, dtype=torch.bfloat16, **kw) for _ in range(num_layers)]
    residuals = [torch.empty(*lead, m, hidden, dtype=torch.bfloat16, **kw) for _ in range(num_post)]
    return initial, pre, outputs, posts, combs, inputs, residuals


def _ops_chain(initial: torch.Tensor, pre: list[torch.Tensor], outputs: list[torch.Tensor],
               posts: list[torch.Tensor], combs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """TileKernels' _mhc_multilayer_recompute_ref: the forward ops, layer by layer."""
    inputs, residuals, residual = [], [], initial
    for i, mix in enumerate(pre):
        inputs.append(mhc.mhc_pre_apply_mix(residual, mix))
        if i < len(outputs):
            residual = mhc.mhc_post_fwd(outputs[i], residual, posts[i], combs[i])
            residuals.append(residual)
    return inputs, residuals


def _assert_exact(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        diff = (a.float() - b.float()).abs().nan_to_num(float("inf")).max().item() if a.numel() else 0.0
        assert torch.equal(a, b), f"{what}[{i}] differs, max diff {diff}"


def _check(data: tuple[Any, ...], ops: bool = True) -> None:
    """The written tensors against the ops' chain (``ops``: the forward ops take the inputs) and the formulas."""
    initial, pre, outputs, posts, combs, inputs, residuals = data
    if ops:
        want_inputs, want_residuals = _ops_chain(initial, pre, outputs, posts, combs)
        _assert_exact(inputs, want_inputs, "layer_input")
        _assert_exact(residuals, want_residuals, "residual")
    formula_inputs, formula_residuals = ref.multilayer_recompute_formula(initial, pre, outputs, posts, combs)
    _assert_exact(inputs, formula_inputs, "layer_input (formula)")
    _assert_exact(residuals, formula_residuals, "residual (formula)")


@pytest.mark.parametrize(("num_layers", "num_post", "hidden"), TILEKERNELS_CASES)
def test_tilekernels_cases(num_layers: int, num_post: int, hidden: int) -> None:
    torch.manual_seed(0)
    data = _data((1, 8192), hidden, num_layers, num_post)
    assert modeling_ops.mhc_multilayer_recompute(*data) is None
    _check(data)


@pytest.mark.parametrize("hidden", [1280, 1283])
@pytest.mark.parametrize("lead", [(1, 0), (1, 1), (1, 13), (2, 13)])
@pytest.mark.parametrize(("num_layers", "num_post"), [(1, 0), (4, 3), (4, 4)])
def test_odd_token_counts_and_hidden(lead: tuple[int, ...], hidden: int, num_layers: int, num_post: int) -> None:
    torch.manual_seed(1)
    data = _data(lead, hidden, num_layers, num_post)
    mhc.mhc_multilayer_recompute(*data)
    _check(data)


def test_misaligned_tensor_runs_the_scalar_variant() -> None:
    torch.manual_seed(2)
    data = _data((1, 13), 2560, 3, 3)
    shifted = torch.empty(13 * 2560 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(1, 13, 2560)
    shifted.copy_(data[2][1])
    data[2][1] = shifted  # starts 2 bytes past a 16-byte boundary
    mhc.mhc_multilayer_recompute(*data)
    _check(data, ops=False)  # mhc_post_fwd refuses the misaligned layer output: the formulas only


def test_torch_compile_fullgraph() -> None:
    torch.manual_seed(3)
    data = _data((1, 77), 2560, 4, 3)
    compiled = torch.compile(mhc.mhc_multilayer_recompute, fullgraph=True)
    compiled(*data)
    _check(data)


def test_cuda_graph_replay_keeps_its_address_table() -> None:
    """A replay reads the table of the capture, even after an eager call has made (and freed) tables since."""
    torch.manual_seed(4)
    data = _data((1, 64), 1280, 3, 3)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        mhc.mhc_multilayer_recompute(*data)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mhc.mhc_multilayer_recompute(*data)
    torch.cuda.synchronize()
    other = _data((1, 64), 1280, 3, 3)  # the same table size: a freed pinned table would be reused here
    mhc.mhc_multilayer_recompute(*other)
    torch.cuda.synchronize()
    for t in (data[0], *data[1], *data[2], *data[3], *data[4]):
        t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    _check(data)
    _check(other)  # the replay wrote the capture's tensors, not the eager call's
