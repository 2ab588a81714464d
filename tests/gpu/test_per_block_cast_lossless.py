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
    runtime.get_kernel("per_block_cast_lossless").select(hidden=hidden, block_m=block_m, block_k=block_k,
                                                          in_sf_layout="row_major", sf_layout="row_major")(x, x_sf, q, sf)
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
        (lambda: lossless((x, x_sf), "e4m3", (1, 32), (1, 128), use_packed_ue8m0=True), ValueError,
         r"^use_packed_ue8m0:"),
        (lambda: lossless((x[:, :24], x_sf[:, :3]), "e4m3", (1, 32), (1, 128)), ValueError, r"^x: hidden"),
    ]
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()
    with pytest.raises(errors.KernelArgumentError, match=r"\bx_sf\b"):
        lossless((x, x_sf[:, :32]), "e4m3", (1, 32), (1, 128))
    with pytest.raises(errors.KernelArgumentError, match=r"\bx_sf\b"):  # UE8M0 words: 16 for 64 input blocks
        lossless((x, x_sf.view(torch.int32)), "e4m3", (1, 32), (1, 128))


# --- any hidden and every scale layout (the variants of grid hidden 0) -----------------------------------------

GENERIC_HIDDEN = (64, 576, 1088, 1536, 3072, 3584)  # 576 and 1088: a partial last block of 128 channels


def ue8m0_words(x_sf: torch.Tensor) -> torch.Tensor:
    """fp32 power-of-two scales (T, G) as per_token_cast's packed UE8M0 words: int32 (T, ceil(G / 4)), column-major
    over a (ceil(G / 4), align(T, 4)) storage, byte g % 4 of word g / 4 the exponent of scale g."""
    num_tokens, groups = x_sf.shape
    exponents = torch.zeros(num_tokens, -(-groups // 4) * 4, dtype=torch.int32, device=x_sf.device)
    exponents[:, :groups] = (x_sf.view(torch.int32) >> 23) & 0xFF
    shifts = torch.arange(0, 32, 8, device=x_sf.device, dtype=torch.int32)
    words = (exponents.view(num_tokens, -(-groups // 4), 4) << shifts).sum(-1)
    storage = torch.full((words.shape[1], -(-num_tokens // 4) * 4), -1, dtype=torch.int32, device=x_sf.device)
    storage[:, :num_tokens] = words.T.to(torch.int32)
    return storage.T[:num_tokens]


def read_scales(sf: torch.Tensor, groups: int) -> torch.Tensor:
    """fp32 (R, groups) values of an output sf in any layout; UE8M0 bytes past the last group must be zero."""
    if sf.dtype != torch.int32:
        return sf.contiguous()
    exponents = ((sf.unsqueeze(-1) >> torch.arange(0, 32, 8, dtype=torch.int32, device=sf.device)) & 0xFF)
    exponents = exponents.reshape(sf.shape[0], 4 * sf.shape[1])
    assert bool((exponents[:, groups:] == 0).all()), "bytes after the last group's are not zero"
    return (exponents[:, :groups] << 23).to(torch.int32).contiguous().view(torch.float32)


LAYOUTS = {"row_major": {}, "col_major": {"use_tma_aligned_col_major_sf": True},
           "ue8m0": {"use_tma_aligned_col_major_sf": True, "round_sf": True, "use_packed_ue8m0": True}}


@pytest.mark.parametrize("num_tokens", [0, 1, 161, 4001])
@pytest.mark.parametrize("out_layout", list(LAYOUTS))
@pytest.mark.parametrize("packed_in", [False, True], ids=["fp32-in", "ue8m0-in"])
@pytest.mark.parametrize("out_block", OUT_BLOCKS, ids=str)
@pytest.mark.parametrize("hidden", (*GENERIC_HIDDEN, 2048))
def test_any_hidden_and_every_layout(hidden: int, out_block: tuple[int, int], packed_in: bool, out_layout: str,
                                     num_tokens: int) -> None:
    """Every (input, output) scale layout TileKernels takes, at hidden sizes built per size or not, into poisoned
    outputs: the codes and scale values of the reference, and an exact round trip."""
    if hidden == 2048 and not packed_in and out_layout == "row_major":
        pytest.skip("the variant built for 2048: tested above")
    x, x_sf = fp4_pair(num_tokens, hidden)
    given_sf = ue8m0_words(x_sf) if packed_in else x_sf
    poison_allocator(2 * num_tokens * hidden + 4096)
    q, sf = quant.per_block_cast_lossless((x, given_sf), "e4m3", (1, 32), out_block, **LAYOUTS[out_layout])
    ref_q, ref_sf = per_block_cast_lossless_ref(x, x_sf, out_block)
    groups = -(-hidden // out_block[1])
    if out_layout != "row_major":
        assert sf.stride() == (1, -(-sf.shape[0] // 4) * 4) or num_tokens == 0
    assert_same_codes_and_scales(q, read_scales(sf, groups), ref_q, ref_sf)
    assert torch.equal(lossless_dequant(q, read_scales(sf, groups), out_block), fp4_dequant(x, x_sf))


def test_row_major_ue8m0_words_are_read_too() -> None:
    """Packed UE8M0 input words in a row-major tensor (not per_token_cast's column-major view) are copied, not
    refused."""
    x, x_sf = fp4_pair(33, 576)
    words = ue8m0_words(x_sf).contiguous()
    q, sf = quant.per_block_cast_lossless((x, words), "e4m3", (1, 32), (32, 32))
    ref_q, ref_sf = per_block_cast_lossless_ref(x, x_sf, (32, 32))
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)


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
