"""GPU tests of the fused re-quantization: ``per_token_cast`` of a quantized (codes, scales) pair in one launch.

The definition of correct is the two launches the fused kernel replaces: ``cast_back(pair, 'fp32', x_block_size)``
then ``per_token_cast`` of that fp32 tensor (whose GPU tests pass, and through which TileKernels' own suite
passes). Every case compares the fused result with that path, run by hand on the same inputs, and with the plain
torch reference of tests/reference (``requant_ref``: the same definition, written independently), bit for bit
(tolerance: none): codes as bytes, fp32 scales and UE8M0 words as int32, on the logical (T, G) view; the padding
tokens behind a column-major view are unspecified and not compared.

Cases: every variant of per_token_cast_requant the wheel holds (TileKernels' tests' combinations), T in
{0, 1, 13, 4001}, hidden in {576, 1536, 3584, 7168} (576 and 3584: partial 128-column blocks and groups), inputs
of two kinds: codes of Gaussian rows cast per block (what TileKernels' tests pass), and random code bytes (no
NaN) with random scales, fp32 ones not powers of two. Outputs are allocated from memory poisoned with 0x7F bytes,
so an element the kernel skips shows. A separate test plants the format's specials: signed zeros, e4m3 NaN codes
(0x7F, 0xFF; e2m1 has no NaN or Inf), all-zero groups, scales whose products overflow to Inf or reach fp32
subnormals, and UE8M0 bytes 0 (+0.0) and 255 (+Inf).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.gpu.poison import poison_allocator
from tests.reference.quant import per_token_cast_ref, tma_aligned_col_major, ue8m0_pack
from tests.reference.quant_cast_back import requant_ref
from tests.reference.quant_per_block import per_block_cast_ref

tile_kernels_aot, quant, errors, runtime = installed_package()

pytestmark = pytest.mark.gpu

try:
    _KERNEL = runtime.get_kernel("per_token_cast_requant")
except errors.VariantNotFoundError:
    pytest.skip("the wheel has no per_token_cast_requant (re-quantization takes two launches)", allow_module_level=True)

# The wheel's variants as dicts of their grid values (x_fmt, x_block_m, x_block_k, x_sf_layout, fmt, npc, round_sf,
# sf_layout).
VARIANTS = [dict(zip(_KERNEL.keys, values)) for values in sorted(_KERNEL.modules, key=str)]
TOKENS = (0, 1, 13, 4001)
HIDDEN = (576, 1536, 3584, 7168)


def variant_id(v: dict) -> str:
    return (f"{v['x_fmt']}{v['x_block_m']}x{v['x_block_k']}-{v['x_sf_layout']}-to-{v['fmt']}-npc{v['npc']}-"
            f"{v['sf_layout']}")


def flags(v: dict) -> dict[str, bool]:
    """per_token_cast's layout flags for the variant's output scales."""
    ue8m0 = v["sf_layout"] == "ue8m0"
    return {"use_tma_aligned_col_major_sf": v["sf_layout"] != "row_major", "round_sf": v["round_sf"],
            "use_packed_ue8m0": ue8m0}


def block_scales(fp32: torch.Tensor, layout: str) -> torch.Tensor:
    """fp32 block scales in the variant's input layout (UE8M0: TileKernels' column-major words; powers of two)."""
    return fp32.contiguous() if layout == "row_major" else tma_aligned_col_major(ue8m0_pack(fp32))


def cast_pair(v: dict, num_tokens: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian rows (magnitudes over six decades, no zeros) cast per x_block_size block, as TileKernels' tests
    make their pairs (round_sf where the scales are UE8M0)."""
    magnitude = torch.pow(10.0, torch.empty(num_tokens, 1, device="cuda").uniform_(-3, 3))
    x = torch.randn(num_tokens, hidden, device="cuda") * magnitude
    x = torch.where(x == 0, torch.ones_like(x), x)
    block = (v["x_block_m"], v["x_block_k"])
    round_sf = v["x_sf_layout"] == "ue8m0"
    q, sf = per_block_cast_ref(x, v["x_fmt"], block, round_sf) if block[0] > 1 else \
        per_token_cast_ref(x, v["x_fmt"], block[1], round_sf)
    return q, block_scales(sf, v["x_sf_layout"])


def random_codes(x_fmt: str, num_tokens: int, hidden: int, nan: bool = False) -> torch.Tensor:
    """Random code bytes: every e2m1 pair; every e4m3 code, the NaNs 0x7F and 0xFF only with ``nan``."""
    width = hidden if x_fmt == "e4m3" else hidden // 2
    codes = torch.randint(0, 256, (num_tokens, width), device="cuda", dtype=torch.int32)
    if x_fmt == "e4m3" and not nan:
        codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)
    codes = codes.to(torch.uint8)
    return codes.view(torch.float8_e4m3fn) if x_fmt == "e4m3" else codes.view(torch.int8)


def random_scales(v: dict, num_tokens: int, hidden: int) -> torch.Tensor:
    """Positive scales of the pair's block grid: fp32 2^-20 .. 2^20 with random mantissas (row_major), or powers of
    two as UE8M0 words."""
    shape = (-(-num_tokens // v["x_block_m"]), -(-hidden // v["x_block_k"]))
    exponents = torch.randint(-20, 21, shape, device="cuda").float()
    if v["x_sf_layout"] == "row_major":
        return torch.pow(2.0, exponents) * torch.empty(shape, device="cuda").uniform_(1.0, 2.0)
    return block_scales(torch.pow(2.0, exponents), "ue8m0")


def fused(v: dict, pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    poison_allocator()  # the outputs come out of 0x7F bytes
    return quant.per_token_cast(pair, v["fmt"], v["npc"], x_block_size=(v["x_block_m"], v["x_block_k"]), **flags(v))


def two_step(v: dict, pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition: the cast back to fp32, then the fp32 cast."""
    values = quant.cast_back(pair, "fp32", (v["x_block_m"], v["x_block_k"]))
    return quant.per_token_cast(values, v["fmt"], v["npc"], **flags(v))


def assert_same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor], what: str) -> None:
    for g, w, name in zip(got, want, ("q", "sf"), strict=True):
        assert (g.shape, g.dtype) == (w.shape, w.dtype), f"{what}: {name} {g.dtype} {tuple(g.shape)}"
        if g.numel():
            assert g.stride() == w.stride(), f"{what}: {name} strides {g.stride()} != {w.stride()}"
        bits = {1: torch.uint8, 4: torch.int32}[g.element_size()]
        wrong = int((g.view(bits) != w.view(bits)).sum())
        assert wrong == 0, f"{what}: {wrong} of {g.numel()} {name} differ"


def check(v: dict, pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert _KERNEL.has(*(v[k] for k in _KERNEL.keys))
    got = fused(v, pair)
    assert_same(got, two_step(v, pair), "fused vs cast_back + per_token_cast")
    block = (v["x_block_m"], v["x_block_k"])
    assert_same(got, requant_ref(pair, block, v["fmt"], v["npc"], v["round_sf"], v["sf_layout"]), "fused vs reference")


MAKERS: dict[str, Callable[[dict, int, int], tuple[torch.Tensor, torch.Tensor]]] = {
    "cast": cast_pair,
    "random": lambda v, t, h: (random_codes(v["x_fmt"], t, h), random_scales(v, t, h)),
}


@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("v", VARIANTS, ids=variant_id)
def test_fused_equals_two_launches(v: dict, num_tokens: int, hidden: int, kind: str) -> None:
    torch.manual_seed(num_tokens * 7919 + hidden)
    check(v, MAKERS[kind](v, num_tokens, hidden))


@pytest.mark.parametrize("v", VARIANTS, ids=variant_id)
def test_specials(v: dict) -> None:
    """Signed zeros, NaN codes, all-zero groups, products that overflow or are subnormal, UE8M0 bytes 0 and 255."""
    torch.manual_seed(1)
    num_tokens, hidden = 300, 1536
    e4m3 = v["x_fmt"] == "e4m3"
    codes = random_codes(v["x_fmt"], num_tokens, hidden, nan=e4m3).view(torch.uint8)
    codes[5] = 0x80 if e4m3 else 0x88  # a row of -0.0
    codes[6, : hidden // 4] = 0  # +0.0: all-zero groups (their amax is the floor)
    codes[7, 1::2] = 0x80 if e4m3 else 0x08  # +0 and -0 interleaved
    if e4m3:
        codes[8] = torch.where(codes[8] == 0x7F, codes[8] - 1, codes[8])
        codes[8, 3], codes[9, 700] = 0x7F, 0xFF  # the two e4m3 NaNs, alone in their rows
    pair_codes = codes.view(torch.float8_e4m3fn) if e4m3 else codes.view(torch.int8)
    shape = (-(-num_tokens // v["x_block_m"]), -(-hidden // v["x_block_k"]))
    if v["x_sf_layout"] == "row_major":
        sf = torch.pow(2.0, torch.randint(-20, 21, shape, device="cuda").float()) * \
            torch.empty(shape, device="cuda").uniform_(1.0, 2.0)
        sf[0, 0], sf[-1, -1] = 2.0**120, 2.0**-140  # products overflow to Inf / reach fp32 subnormals
        sf[shape[0] // 2, 1] = 0.0
        pair = (pair_codes, sf)
    else:
        exponents = torch.randint(100, 150, shape, device="cuda", dtype=torch.int32)
        exponents[0, 0], exponents[-1, -1] = 255, 0  # +Inf and +0.0 scales
        words = torch.zeros((shape[0], -(-shape[1] // 4) * 4), dtype=torch.int64, device="cuda")
        words[:, : shape[1]] = exponents
        packed = (words.view(shape[0], -1, 4) << (torch.arange(4, device="cuda") * 8)).sum(-1)
        packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
        pair = (pair_codes, tma_aligned_col_major(packed))
    check(v, pair)
