"""GPU tests of ``tile_kernels_aot.quant.per_block_cast_lossless`` against tests/reference/quant_per_channel.py.

The re-cast is exact: codes are compared as bytes and scales as int32 bits (tolerance: none),
and the dequantized output must equal the dequantized FP4 input exactly where the input scales
of an output block span at most 2^14. The caching allocator is filled with 0x7F bytes before
each op call, and launchers are also called directly on poisoned outputs, so an element the
kernel fails to write (e.g. in the last, partial row block) shows up as a difference.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.gpu.compare import assert_same_codes_and_scales
from tests.gpu.installed import installed_package
from tests.gpu.poison import poison_allocator
from tests.reference.quant import per_token_cast_ref
from tests.reference.quant_per_channel import fp4_dequant, lossless_dequant, per_block_cast_lossless_ref

tile_kernels_aot, quant, errors, runtime = installed_package()

pytestmark = pytest.mark.gpu

HIDDEN = (2048, 2560, 4096, 6144, 7168)
OUT_BLOCKS = ((1, 128), (32, 32), (128, 128))
FULL = list(itertools.product(HIDDEN, OUT_BLOCKS))  # every variant of the spec
POISON_BYTE = 0x7F
PRODUCTION_TOKENS = 8192


def variant_id(v: tuple[int, tuple[int, int]]) -> str:
    return f"H{v[0]}-{v[1][0]}x{v[1][1]}"


def fp4_pair(num_tokens: int, hidden: int, max_ratio: float = 2.0**9) -> tuple[torch.Tensor, torch.Tensor]:
    """FP4 codes with 1 x 32 power-of-two scales (per_token_cast e2m1, round_sf), magnitudes >= max / max_ratio."""
    x = torch.randn(num_tokens, hidden, device="cuda")
    if num_tokens > 0:
        floor = x.abs().max() / max_ratio
        x = torch.sign(x) * torch.maximum(x.abs(), floor)
    return per_token_cast_ref(x, "e2m1", 32, round_sf=True)


@pytest.mark.parametrize("num_tokens", [0, 1, 4001, PRODUCTION_TOKENS])
@pytest.mark.parametrize("v", FULL, ids=variant_id)
def test_per_block_cast_lossless(v: tuple[int, tuple[int, int]], num_tokens: int) -> None:
    hidden, out_block = v
    x, x_sf = fp4_pair(num_tokens, hidden)
    poison_allocator(2 * num_tokens * hidden + 4096)
    q, sf = quant.per_block_cast_lossless((x, x_sf), "e4m3", x_block_size=(1, 32), out_block_size=out_block)
    ref_q, ref_sf = per_block_cast_lossless_ref(x, x_sf, out_block)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)
    exact = fp4_dequant(x, x_sf)
    assert torch.equal(lossless_dequant(q, sf, out_block), exact), "the re-cast changed some values"


@pytest.mark.parametrize("v", FULL, ids=variant_id)
def test_launcher_overwrites_poisoned_outputs(v: tuple[int, tuple[int, int]]) -> None:
    hidden, (block_m, block_k) = v
    num_tokens = 161  # partial 32- and 128-row blocks
    x, x_sf = fp4_pair(num_tokens, hidden)
    q = torch.full((num_tokens, hidden), POISON_BYTE, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    sf = torch.full((-(-num_tokens // block_m), hidden // block_k), float("nan"), device="cuda")
    runtime.get_kernel("per_block_cast_lossless").select(hidden=hidden, block_m=block_m, block_k=block_k)(x, x_sf, q, sf)
    torch.cuda.synchronize()
    ref_q, ref_sf = per_block_cast_lossless_ref(x, x_sf, (block_m, block_k))
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)


@pytest.mark.parametrize("out_block", OUT_BLOCKS, ids=str)
def test_wide_scale_ranges(out_block: tuple[int, int]) -> None:
    """Per-block exponents spread over 2^14 (exact), tiny exponents (out exponent floored at 0),
    mantissa bits in the scales (ignored), and a spread beyond 2^14 (rounded, never a fault)."""
    x, _ = fp4_pair(300, 2048)
    exponents = torch.randint(100, 115, (300, 64), device="cuda")  # within 2^14 of each other
    exponents[:40] = torch.randint(1, 6, (40, 64), device="cuda")  # out exponent floors at 0
    x_sf = (exponents << 23).to(torch.int32).view(torch.float32)
    q, sf = quant.per_block_cast_lossless((x, x_sf), "e4m3", (1, 32), out_block)
    ref_q, ref_sf = per_block_cast_lossless_ref(x, x_sf, out_block)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)
    assert torch.equal(lossless_dequant(q, sf, out_block)[40:], fp4_dequant(x, x_sf)[40:])

    with_mantissa = (x_sf.view(torch.int32) | 0x12345).view(torch.float32)
    q2, sf2 = quant.per_block_cast_lossless((x, with_mantissa), "e4m3", (1, 32), out_block)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8)) and torch.equal(sf2, sf)

    wide = x_sf.clone()
    wide[:, ::4] = 2.0**-60  # 2^40 below the rest: rounded to e4m3's smallest steps
    q3, sf3 = quant.per_block_cast_lossless((x, wide), "e4m3", (1, 32), out_block)
    ref_q3, ref_sf3 = per_block_cast_lossless_ref(x, wide, out_block)
    assert_same_codes_and_scales(q3, sf3, ref_q3, ref_sf3)


def test_bad_arguments_name_the_argument() -> None:
    x, x_sf = fp4_pair(64, 2048)
    lossless = quant.per_block_cast_lossless
    cases = [
        (lambda: lossless(x, "e4m3", (1, 32), (1, 128)), TypeError, r"^x:"),
        (lambda: lossless((x, x_sf), "e5m2", (1, 32), (1, 128)), ValueError, r"^fmt:"),
        (lambda: lossless((x, x_sf), "e4m3", (1, 16), (1, 128)), ValueError, r"^x_block_size:"),
        (lambda: lossless((x, x_sf), "e4m3", (1, 32), (64, 64)), ValueError, r"^out_block_size:"),
        (lambda: lossless((x, x_sf), "e4m3", (1, 32), 128), TypeError, r"^out_block_size:"),
        (lambda: lossless((x.view(torch.uint8), x_sf), "e4m3", (1, 32), (1, 128)), TypeError, r"^x:.*int8"),
        (lambda: lossless((x, x_sf[:32]), "e4m3", (1, 32), (1, 128)), ValueError, r"^x_sf:"),
        (lambda: lossless((x, x_sf.view(torch.int32)), "e4m3", (1, 32), (1, 128)), NotImplementedError, r"^x:"),
        (lambda: lossless((x, x_sf), "e4m3", (1, 32), (1, 128), use_packed_ue8m0=True), NotImplementedError,
         r"^use_packed_ue8m0:"),
        (lambda: lossless((x, x_sf), "e4m3", (1, 32), (1, 128), use_tma_aligned_col_major_sf=True),
         NotImplementedError, r"^use_tma_aligned_col_major_sf:"),
    ]
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()
    with pytest.raises(errors.KernelArgumentError, match=r"\bx_sf\b"):
        lossless((x, x_sf[:, :32]), "e4m3", (1, 32), (1, 128))
    with pytest.raises(errors.VariantNotFoundError, match="1536"):
        lossless(fp4_pair(64, 1536), "e4m3", (1, 32), (1, 128))


def _fn(t: torch.Tensor, x_sf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quant.per_block_cast_lossless((t, x_sf), "e4m3", (1, 32), (32, 32))


def test_cuda_graph_capture_and_replay() -> None:
    x, x_sf = fp4_pair(257, 2048)
    static_x = x.clone()
    _fn(static_x, x_sf)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = _fn(static_x, x_sf)
    for _ in range(2):
        static_x.copy_(torch.randint(-128, 128, x.shape, dtype=torch.int8, device="cuda"))
        expected = _fn(static_x, x_sf)
        for o in static_out:
            o.view(torch.uint8).fill_(POISON_BYTE)
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(static_out, expected, strict=True):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_torch_compile_fullgraph_matches_eager() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(_fn, fullgraph=True)
    for num_tokens in (257, 300):
        x, x_sf = fp4_pair(num_tokens, 2048)
        for got, want in zip(compiled(x, x_sf), _fn(x, x_sf), strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
