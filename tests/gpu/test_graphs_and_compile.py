"""Every shipped op captures into a CUDA graph and compiles under torch.compile(fullgraph=True)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

tk = pytest.importorskip("tile_kernels_aot")

pytestmark = pytest.mark.gpu


def _ops() -> dict[str, tuple[Callable[[torch.Tensor], tuple[torch.Tensor, ...]], torch.Tensor]]:
    x = torch.randn(257, 2048, device="cuda", dtype=torch.bfloat16)
    xt = torch.randn(3, 128, 192, device="cuda", dtype=torch.bfloat16)
    q, sf = tk.quant.per_token_cast(x, "e4m3", 128)
    return {
        "per_block_cast e4m3 128x128": (lambda t: tk.quant.per_block_cast(t, "e4m3", (128, 128)), x),
        "per_block_cast e2m1 32x32": (lambda t: tk.quant.per_block_cast(t, "e2m1", (32, 32)), x),
        # fp8 codes carried as bytes (the tests refresh inputs with randn_like); & 0x77 keeps them off NaN.
        "per_token_cast_back e4m3 -> bf16": (
            lambda t: (tk.quant.per_token_cast_back((t.view(torch.float8_e4m3fn), sf), "bf16", 128),),
            q.view(torch.uint8) & 0x77),
        "per_token_cast e4m3": (lambda t: tk.quant.per_token_cast(t, "e4m3", 128), x),
        "per_token_cast e2m1 round_sf": (lambda t: tk.quant.per_token_cast(t, "e2m1", 32, round_sf=True), x),
        "batched_transpose": (lambda t: (tk.transpose.batched_transpose(t),), xt),
        "transpose": (lambda t: (tk.transpose.transpose(t[0]),), xt),
    }


def _as_tuple(out: object) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)  # type: ignore[return-value]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("name", list(_ops()))
def test_cuda_graph_capture_and_replay(name: str) -> None:
    fn, x = _ops()[name]
    static_x = x.clone()
    expected = _as_tuple(fn(static_x))  # also the warm-up: cubin loads stay out of the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = _as_tuple(fn(static_x))
    for _ in range(2):
        static_x.copy_(torch.randn_like(static_x.float()).to(static_x.dtype))
        expected = _as_tuple(fn(static_x))
        for o in static_out:
            o.view(torch.uint8).fill_(0x7F)  # poison: replay must rewrite every byte
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(static_out, expected, strict=True):
            assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("name", list(_ops()))
def test_torch_compile_fullgraph_matches_eager(name: str) -> None:
    fn, x = _ops()[name]
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: fn(t), fullgraph=True)
    for _ in range(2):
        x = torch.randn_like(x.float()).to(x.dtype)
        for got, want in zip(_as_tuple(compiled(x)), _as_tuple(fn(x)), strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype
            assert torch.equal(_bits(got), _bits(want))


def test_custom_ops_are_registered() -> None:
    assert tk.quant.per_token_cast and tk.transpose.batched_transpose  # op modules load on first use
    namespace = getattr(torch.ops, tk._build_info.PACKAGE)
    for op in ("per_token_cast", "batched_transpose"):
        assert hasattr(namespace, op), op
