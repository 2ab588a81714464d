"""GPU tests of ``tile_kernels_aot.quant.per_block_cast`` against tests/reference/quant_per_block.py.

FP8/FP4 codes and fp32 scale factors are exact formats, so every element is compared bit for
bit (tolerance: none): codes as uint8, scales as int32. The reference runs on the same GPU in
fp32. Launchers are also called directly on outputs poisoned with NaN / 0x7F bytes, which
catches any element the kernel fails to write, including in the last, partial row of blocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

from tests.gpu.compare import assert_same_codes_and_scales
from tests.gpu.installed import installed_package
from tests.reference.quant import cast_error
from tests.reference.quant_per_block import (
    per_block_cast_ref,
    per_block_cast_with_precomputed_sf_ref,
    per_block_dequant,
)

tile_kernels_aot, quant, errors, runtime = installed_package()

pytestmark = pytest.mark.gpu

HIDDEN = (2048, 4096, 7168)
FORMATS = ("e4m3", "e2m1")
BLOCKS = ((32, 32), (32, 128), (128, 32), (128, 128))
POISON_BYTE = 0x7F  # an FP8 NaN, and an FP4 pair (7, 15) no all-zero input produces

Variant = tuple[int, str, tuple[int, int], bool]


def variant_id(v: Variant) -> str:
    hidden, fmt, (block_m, block_k), round_sf = v
    return f"H{hidden}-{fmt}-{block_m}x{block_k}" + ("-round_sf" if round_sf else "")


# Every (hidden, fmt, block_size, round_sf) of the bf16 casts, through the variant each dispatches to.
FULL: list[Variant] = list(itertools.product(HIDDEN, FORMATS, BLOCKS, (False, True)))
ERROR_BOUND = {"e4m3": 1e-3, "e2m1": 2e-2}


def random_rows(num_tokens: int, hidden: int, spread: float = 3.0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Gaussian rows times a random magnitude in [10^-spread, 10^spread] per row; no exact zeros."""
    magnitude = torch.pow(10.0, torch.empty(num_tokens, 1, device="cuda").uniform_(-spread, spread))
    x = torch.randn(num_tokens, hidden, device="cuda") * magnitude
    return torch.where(x == 0, torch.ones_like(x), x).to(dtype)


def poisoned_outputs(
    num_tokens: int, hidden: int, fmt: str, block_size: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    block_m, block_k = block_size
    width = hidden if fmt == "e4m3" else hidden // 2
    q_dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.int8
    q = torch.full((num_tokens, width), POISON_BYTE, dtype=torch.uint8, device="cuda").view(q_dtype)
    sf = torch.full((-(-num_tokens // block_m), -(-hidden // block_k)), float("nan"), device="cuda")
    return q, sf


def poisoned_column_major_outputs(num_tokens: int, hidden: int, fmt: str, block_size: tuple[int, int], layout: str
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Poisoned (q, sf) in the storage TileKernels returns: fp32 column-major (G, align(ceil(T / block_m), 4)) or its
    UE8M0 words, int32 (ceil(G / 4), same), G = ceil(hidden / block_k); sf the (rows, G or words) view."""
    rows, groups = -(-num_tokens // block_size[0]), -(-hidden // block_size[1])
    padded = -(-rows // 4) * 4
    q_out, _ = poisoned_outputs(num_tokens, hidden, fmt, block_size)
    if layout == "col_major":
        return q_out, torch.full((groups, padded), float("nan"), device="cuda").T[:rows]
    return q_out, torch.full((-(-groups // 4), padded), 0x7F7F7F7F, dtype=torch.int32, device="cuda").T[:rows]


def word_bytes(sf: torch.Tensor) -> torch.Tensor:
    """The four exponent bytes of each UE8M0 word of sf (rows, words), as int32 (rows, 4 * words)."""
    shifts = torch.arange(0, 32, 8, dtype=torch.int32, device="cuda")
    return ((sf.unsqueeze(-1) >> shifts) & 0xFF).reshape(sf.shape[0], 4 * sf.shape[1])


def assert_matches_reference(
    x: torch.Tensor, q: torch.Tensor, sf: torch.Tensor, fmt: str, block_size: tuple[int, int], round_sf: bool
) -> None:
    ref_q, ref_sf = per_block_cast_ref(x, fmt, block_size, round_sf)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)


def dispatched(hidden: int, **values: object) -> Callable[..., None]:
    """The launcher the op runs for ``hidden``: the variant built for it where the build has one (bf16 -> e2m1),
    else the one for any hidden (hidden 0 in the grid, bf16 -> e4m3)."""
    kernel = runtime.get_kernel("per_block_cast")
    try:
        return kernel.select(hidden=hidden, **values)
    except errors.VariantNotFoundError:
        return kernel.select(hidden=0, **values)


def launch_poisoned(x: torch.Tensor, v: Variant) -> tuple[torch.Tensor, torch.Tensor]:
    hidden, fmt, (block_m, block_k), round_sf = v
    q, sf = poisoned_outputs(x.shape[0], hidden, fmt, (block_m, block_k))
    launch = dispatched(
        in_dtype="bfloat16",
        hidden=hidden,
        fmt=fmt,
        block_m=block_m,
        block_k=block_k,
        round_sf=round_sf,
        precomputed_sf=False,
        sf_layout="row_major",
    )
    launch(x, q, sf)
    torch.cuda.synchronize()
    return q, sf


@pytest.mark.parametrize("num_tokens", [0, 1, 127, 4001])
@pytest.mark.parametrize("v", FULL, ids=variant_id)
def test_per_block_cast(v: Variant, num_tokens: int) -> None:
    hidden, fmt, block_size, round_sf = v
    x = random_rows(num_tokens, hidden)
    q, sf = quant.per_block_cast(x, fmt, block_size, round_sf=round_sf)
    assert_matches_reference(x, q, sf, fmt, block_size, round_sf)


@pytest.mark.parametrize("num_tokens", [1, 33, 127, 129, 4001])
@pytest.mark.parametrize("v", FULL, ids=variant_id)
def test_launcher_overwrites_poisoned_outputs(v: Variant, num_tokens: int) -> None:
    """Every code and scale is written, also in the last, partial row of blocks."""
    x = random_rows(num_tokens, v[0])
    q, sf = launch_poisoned(x, v)
    assert not torch.isnan(sf).any(), "some scale factors were never written"
    assert_matches_reference(x, q, sf, v[1], v[2], v[3])


# --- the column-major layouts (TileKernels' GEMM blocks, 128 x 128 and 32 x 32) ----------------------------------

LAYOUT_CASES = [(h, f, b, r, layout) for h, f, b, r in FULL if b in ((128, 128), (32, 32))
                for layout in ("col_major", "ue8m0") if r or layout == "col_major"]


def assert_column_major_layout(x: torch.Tensor, fmt: str, block_size: tuple[int, int], round_sf: bool,
                               layout: str) -> None:
    """The codes and scale values of the row-major cast, in the storage TileKernels returns (poisoned first): fp32
    column-major (G, align(ceil(T / block_m), 4)), or its UE8M0 exponents four to an int32 word (a NaN scale's
    byte 0xFF, the bytes after the last block's in its word zeros); the allocating call gives the same bits."""
    num_tokens, hidden = x.shape
    groups = -(-hidden // block_size[1])
    q_out, sf_out = poisoned_column_major_outputs(num_tokens, hidden, fmt, block_size, layout)
    flags = {"use_tma_aligned_col_major_sf": True, "round_sf": round_sf, "use_packed_ue8m0": layout == "ue8m0"}
    q, sf = quant.per_block_cast(x, fmt, block_size, **flags, out=(q_out, sf_out))
    assert q is q_out and sf is sf_out
    ref_q, ref_sf = per_block_cast_ref(x, fmt, block_size, round_sf)
    if layout == "col_major":
        assert_same_codes_and_scales(q, sf.contiguous(), ref_q, ref_sf)
    else:
        assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
        got = word_bytes(sf)
        want = (ref_sf.view(torch.int32) >> 23) & 0xFF
        want = torch.where(ref_sf.isnan(), torch.full_like(want, 0xFF), want)
        assert torch.equal(got[:, :groups], want) and bool((got[:, groups:] == 0).all())
    q2, sf2 = quant.per_block_cast(x, fmt, block_size, **flags)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(sf2.view(torch.int32), sf.view(torch.int32))
    assert num_tokens == 0 or sf2.stride() == sf.stride()


@pytest.mark.parametrize("num_tokens", [0, 1, 129, 4001])
@pytest.mark.parametrize("v", LAYOUT_CASES, ids=lambda v: variant_id(v[:4]) + f"-{v[4]}")
def test_column_major_layouts(v: tuple[int, str, tuple[int, int], bool, str], num_tokens: int) -> None:
    hidden, fmt, block_size, round_sf, layout = v
    x = random_rows(num_tokens, hidden)
    x[num_tokens // 2:num_tokens // 2 + 1, 3] = float("nan")  # a NaN block: sf NaN, its UE8M0 byte 0xFF
    assert_column_major_layout(x, fmt, block_size, round_sf, layout)


@pytest.mark.parametrize("v", [v for v in FULL if v[0] == 2048], ids=variant_id)
def test_nan_and_inf_give_their_block_a_nan_scale(v: Variant) -> None:
    """A block holding a NaN or an Inf gets sf = NaN, as per_token_cast: its e4m3 codes are NaN, its e2m1 codes
    0 under the NaN scale (never a finite scale over a NaN); the other blocks are untouched."""
    hidden, fmt, (block_m, block_k), round_sf = v
    x = random_rows(256, hidden)
    marked = ((3, 5), (130, 700), (200, 2047))
    for (t, c), value in zip(marked, (float("nan"), float("inf"), -float("inf"))):
        x[t, c] = value
    q, sf = quant.per_block_cast(x, fmt, (block_m, block_k), round_sf=round_sf)
    assert_matches_reference(x, q, sf, fmt, (block_m, block_k), round_sf)
    assert all(bool(sf[t // block_m, c // block_k].isnan()) for t, c in marked)
    assert int(sf.isnan().sum()) == len({(t // block_m, c // block_k) for t, c in marked})


@pytest.mark.parametrize("v", [v for v in FULL if v[0] == 7168], ids=variant_id)
def test_partial_block_ignores_absent_rows(v: Variant) -> None:
    """The last row of blocks has tiny rows only: its scales come from them, not from other data."""
    hidden, fmt, block_size, round_sf = v
    x = random_rows(block_size[0] + 3, hidden, spread=0.5)
    x[block_size[0] :] *= 1e-3
    q, sf = launch_poisoned(x, v)
    assert_matches_reference(x, q, sf, fmt, block_size, round_sf)


@pytest.mark.parametrize("v", [v for v in FULL if v[0] == 2048], ids=variant_id)
def test_extreme_magnitudes(v: Variant) -> None:
    """amax floors (tiny and subnormal blocks), -0.0 inputs, block maxima of exactly +-qmax."""
    hidden, fmt, block_size, round_sf = v
    qmax = 448.0 if fmt == "e4m3" else 6.0
    tiny = torch.randn(block_size[0], hidden, device="cuda")
    rows = [tiny * 1e-8, tiny * 1e-36, random_rows(block_size[0], hidden, spread=0.5).float() * 0.1]
    x = torch.cat(rows)
    x[-block_size[0] :, ::3] = -0.0
    x[-1, :: block_size[1]] = -qmax  # the last row of blocks: every block scaled by exactly 1
    x = x.to(torch.bfloat16)
    q, sf = launch_poisoned(x, v)
    assert_matches_reference(x, q, sf, fmt, block_size, round_sf)


@pytest.mark.parametrize("v", [v for v in FULL if v[0] == 7168 and not v[3]], ids=variant_id)
def test_dequantization_error(v: Variant) -> None:
    hidden, fmt, block_size, _ = v
    x = torch.randn(4001, hidden, device="cuda").to(torch.bfloat16)
    q, sf = quant.per_block_cast(x, fmt, block_size)
    assert cast_error(x.float(), per_block_dequant(q, sf, fmt, block_size)) < ERROR_BOUND[fmt]


@pytest.mark.parametrize("round_sf", [False, True])
def test_sf_only_matches_the_full_cast(round_sf: bool) -> None:
    x = random_rows(4001, 4096)
    _, sf = quant.per_block_cast(x, "e4m3", (128, 128), round_sf=round_sf)
    only = quant.per_block_cast_with_sf_only(x, "e4m3", (128, 128), round_sf=round_sf)
    assert torch.equal(only.view(torch.int32), sf.view(torch.int32))


def test_runs_on_the_current_stream() -> None:
    x = random_rows(4001, 7168)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        q, sf = quant.per_block_cast(x, "e4m3", (128, 128))
    stream.synchronize()
    assert_matches_reference(x, q, sf, "e4m3", (128, 128), False)


def test_torch_compile_fullgraph_matches_eager() -> None:
    torch._dynamo.reset()
    fn = lambda t: quant.per_block_cast(t, "e2m1", (32, 32), round_sf=True)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True)
    for num_tokens in (257, 300):
        x = random_rows(num_tokens, 2048)
        for got, want in zip(compiled(x), fn(x), strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


# --- any hidden (the variants of grid hidden 0) and fp32 x ----------------------------------------------------

# Hidden sizes without variants of their own: 576 and 1088 leave a partial last block of 128 channels (64), 4032 a
# partial tile of 32-wide blocks; 2048 in fp32 takes the generic variant too (fp32 is built that way only).
GENERIC_HIDDEN = (64, 576, 1088, 1536, 3072, 3584, 4032)
GENERIC: list[tuple[torch.dtype, int, str, tuple[int, int], bool]] = [
    (dtype, hidden, fmt, block, round_sf)
    for dtype in (torch.bfloat16, torch.float32) for hidden in (*GENERIC_HIDDEN, 2048) for fmt in FORMATS
    for block in BLOCKS for round_sf in (False, True) if dtype == torch.float32 or hidden != 2048]


def generic_id(v: tuple[torch.dtype, int, str, tuple[int, int], bool]) -> str:
    return f"{str(v[0]).removeprefix('torch.')}-" + variant_id(v[1:])


def assert_uses_the_generic_variant(x: torch.Tensor, **options: object) -> None:
    kernel = runtime.get_kernel("per_block_cast")
    assert kernel.find(str(x.dtype).removeprefix("torch."), int(x.shape[1]), *options.values()) is None
    assert kernel.find(str(x.dtype).removeprefix("torch."), 0, *options.values()) is not None


@pytest.mark.parametrize("num_tokens", [0, 1, 129, 4001])
@pytest.mark.parametrize("v", GENERIC, ids=generic_id)
def test_any_hidden_and_fp32(v: tuple[torch.dtype, int, str, tuple[int, int], bool], num_tokens: int) -> None:
    """Bit for bit like the reference, into poisoned outputs, with signed zeros, a NaN and an Inf in the input."""
    dtype, hidden, fmt, block_size, round_sf = v
    assert_uses_the_generic_variant(torch.empty(0, hidden, dtype=dtype), fmt=fmt, block_m=block_size[0],
                                    block_k=block_size[1], round_sf=round_sf, precomputed_sf=False,
                                    sf_layout="row_major")
    x = random_rows(num_tokens, hidden, dtype=dtype)
    if num_tokens > 1:
        x[0, ::5] = -0.0
        x[-1, 1::7] = 0.0
        x[num_tokens // 2, hidden - 1] = float("nan")  # the last channel: the last (maybe partial) block
        x[num_tokens // 3, 0] = float("inf")
    out = poisoned_outputs(num_tokens, hidden, fmt, block_size)
    q, sf = quant.per_block_cast(x, fmt, block_size, round_sf=round_sf, out=out)
    assert q is out[0] and sf is out[1]
    assert_matches_reference(x, q, sf, fmt, block_size, round_sf)


@pytest.mark.parametrize("v", [v for v in GENERIC if v[1] in (576, 3584) and v[3] in ((128, 128), (32, 32))
                               and v[4]], ids=generic_id)
@pytest.mark.parametrize("layout", ["col_major", "ue8m0"])
def test_any_hidden_column_major_layouts(v: tuple[torch.dtype, int, str, tuple[int, int], bool], layout: str) -> None:
    """At sizes whose G is not a multiple of 4 (576 / 32 = 18, 576 / 128 = 5, 3584 / 128 = 28)."""
    dtype, hidden, fmt, block_size, _ = v
    assert_column_major_layout(random_rows(1001, hidden, dtype=dtype), fmt, block_size, True, layout)


@pytest.mark.parametrize("v", [v for v in GENERIC if not v[4] and v[1] in (576, 1088, 3584)], ids=generic_id)
def test_any_hidden_precomputed_sf(v: tuple[torch.dtype, int, str, tuple[int, int], bool]) -> None:
    dtype, hidden, fmt, block_size, _ = v
    x = random_rows(1001, hidden, spread=1.0, dtype=dtype)
    sf = random_scales(1001, hidden, block_size)
    q = quant.per_block_cast_with_precomputed_sf(x, fmt, block_size, sf)
    ref_q = per_block_cast_with_precomputed_sf_ref(x, fmt, block_size, sf)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))


# --- per_block_cast_with_precomputed_sf --------------------------------------------------

# Every (hidden, fmt, block_size) of the precomputed_sf variants (round_sf does not apply).
PRECOMPUTED = [(h, f, b) for h, f, b, r in FULL if not r]


def random_scales(num_tokens: int, hidden: int, block_size: tuple[int, int]) -> torch.Tensor:
    """Positive fp32 scales with random mantissas (not powers of two), spread over four decades."""
    shape = (-(-num_tokens // block_size[0]), -(-hidden // block_size[1]))
    return torch.pow(10.0, torch.empty(shape, device="cuda").uniform_(-4, 0))


@pytest.mark.parametrize("num_tokens", [0, 1, 129, 4001])
@pytest.mark.parametrize("v", PRECOMPUTED, ids=lambda v: variant_id((*v, False)))
def test_precomputed_sf(v: tuple[int, str, tuple[int, int]], num_tokens: int) -> None:
    hidden, fmt, block_size = v
    x = random_rows(num_tokens, hidden, spread=1.0)
    sf = random_scales(num_tokens, hidden, block_size)
    sf_before = sf.clone()
    width = hidden if fmt == "e4m3" else hidden // 2
    q_dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.int8
    q = torch.full((num_tokens, width), POISON_BYTE, dtype=torch.uint8, device="cuda").view(q_dtype)
    launch = dispatched(
        in_dtype="bfloat16",
        hidden=hidden,
        fmt=fmt,
        block_m=block_size[0],
        block_k=block_size[1],
        round_sf=False,
        precomputed_sf=True,
        sf_layout="row_major",
    )
    launch(x, q, sf)
    torch.cuda.synchronize()
    ref_q = per_block_cast_with_precomputed_sf_ref(x, fmt, block_size, sf)
    assert torch.equal(sf.view(torch.int32), sf_before.view(torch.int32)), "the kernel wrote its input sf"
    wrong_q = int((q.view(torch.uint8) != ref_q.view(torch.uint8)).sum())
    assert wrong_q == 0, f"{wrong_q} of {q.numel()} code bytes differ from the reference"
    q2 = quant.per_block_cast_with_precomputed_sf(x, fmt, block_size, sf)
    assert q2.dtype == ref_q.dtype and torch.equal(q2.view(torch.uint8), ref_q.view(torch.uint8))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block_size", BLOCKS, ids=str)
def test_sf_only_then_precomputed_is_the_full_cast(block_size: tuple[int, int], fmt: str) -> None:
    """With round_sf the scales are powers of two, so 1 / sf is exact and the two-step cast is the cast."""
    x = random_rows(4001, 7168)
    q, sf = quant.per_block_cast(x, fmt, block_size, round_sf=True)
    sf_only = quant.per_block_cast_with_sf_only(x, fmt, block_size, round_sf=True)
    q2 = quant.per_block_cast_with_precomputed_sf(x, fmt, block_size, sf_only, round_sf=True)
    assert torch.equal(sf_only.view(torch.int32), sf.view(torch.int32))
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8))


def test_precomputed_sf_checks_sf() -> None:
    x = random_rows(33, 2048)
    sf = random_scales(33, 2048, (32, 32))
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        quant.per_block_cast_with_precomputed_sf(x, "e4m3", (32, 32), sf[:1])  # 33 tokens need 2 rows
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        quant.per_block_cast_with_precomputed_sf(x, "e4m3", (32, 32), sf.double())
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        quant.per_block_cast_with_precomputed_sf(x, "e4m3", (32, 32), sf.t().contiguous().t())
    with pytest.raises(TypeError, match=r"\bsf\b"):
        quant.per_block_cast_with_precomputed_sf(x, "e4m3", (32, 32), None)


def test_precomputed_sf_under_torch_compile() -> None:
    torch._dynamo.reset()
    fn = lambda t, s: quant.per_block_cast_with_precomputed_sf(t, "e4m3", (128, 128), s)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True)
    x = random_rows(300, 4096)
    sf = random_scales(300, 4096, (128, 128))
    assert torch.equal(compiled(x, sf).view(torch.uint8), fn(x, sf).view(torch.uint8))


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_other_dtype_is_refused(dtype: torch.dtype) -> None:
    x = torch.ones(4, 2048, dtype=dtype, device="cuda")
    with pytest.raises((errors.VariantNotFoundError, errors.KernelArgumentError), match=r"\bx\b|in_dtype"):
        quant.per_block_cast(x, "e4m3", (128, 128))


@pytest.mark.parametrize("block_size", [(1, 128), (64, 128), (128, 64), (32, 256)], ids=str)
def test_uncovered_block_size_names_the_built_variants(block_size: tuple[int, int]) -> None:
    x = torch.ones(4, 2048, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(errors.VariantNotFoundError) as info:
        quant.per_block_cast(x, "e4m3", block_size)
    message = str(info.value)
    assert f"block_m={block_size[0]!r}" in message and f"block_k={block_size[1]!r}" in message
    assert "block_m=32" in message and "block_k=128" in message


def test_hidden_not_a_multiple_of_64_is_refused() -> None:
    x = torch.ones(4, 2080, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"\bx\b.*64"):
        quant.per_block_cast(x, "e4m3", (32, 32))


@pytest.mark.parametrize("block_size", [128, (128,), (128, 128, 1), ("a", 128), (128.0, 128), (True, 128)], ids=str)
def test_malformed_block_size_is_refused(block_size: object) -> None:
    x = torch.ones(4, 2048, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(TypeError, match="block_size"):
        quant.per_block_cast(x, "e4m3", block_size)


def test_cpu_tensor_is_refused_naming_x() -> None:
    x = torch.ones(4, 2048, dtype=torch.bfloat16)
    with pytest.raises(errors.KernelError, match=r"\bx\b"):
        quant.per_block_cast(x, "e4m3", (128, 128))


@pytest.mark.parametrize("shape", [(2048,), (2, 4, 2048)], ids=str)
def test_wrong_rank_is_refused(shape: tuple[int, ...]) -> None:
    x = torch.ones(shape, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"\bx\b.*2-D"):
        quant.per_block_cast(x, "e4m3", (128, 128))


def test_non_contiguous_x_is_refused() -> None:
    x = torch.ones(8, 4096, dtype=torch.bfloat16, device="cuda")[:, :2048]
    with pytest.raises(errors.KernelArgumentError, match=r"\bx\b"):
        quant.per_block_cast(x, "e4m3", (32, 32))


@pytest.mark.parametrize("fmt", ["e5m2", "E4M3", "e5m6", ""])
def test_bad_fmt_is_refused(fmt: str) -> None:
    x = torch.ones(4, 2048, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"\bfmt\b"):
        quant.per_block_cast(x, fmt, (128, 128))


@pytest.mark.parametrize(
    ("flag", "kwargs"),
    [
        ("use_tma_aligned_col_major_sf", {"use_tma_aligned_col_major_sf": True}),
        ("use_packed_ue8m0", {"use_packed_ue8m0": True, "round_sf": True}),
    ],
)
def test_unbuilt_layouts_are_refused(flag: str, kwargs: dict[str, object]) -> None:
    """Given scales are read row-major only (the cast itself writes every layout)."""
    x = torch.ones(4, 2048, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(NotImplementedError, match=rf"{flag}.*spec"):
        quant.per_block_cast_with_precomputed_sf(x, "e4m3", (128, 128), torch.ones(1, 16, device="cuda"), **kwargs)


def test_launcher_checks_output_shapes() -> None:
    x = random_rows(33, 2048)
    q, sf = poisoned_outputs(33, 2048, "e2m1", (32, 32))
    launch = runtime.get_kernel("per_block_cast").select(
        in_dtype="bfloat16", hidden=2048, fmt="e2m1", block_m=32, block_k=32, round_sf=False, precomputed_sf=False,
        sf_layout="row_major")
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        launch(x, q, sf[:1])  # one row of blocks short: 33 tokens need 2
    with pytest.raises(errors.KernelArgumentError, match=r"\bq\b"):
        launch(x, torch.empty(33, 2048, dtype=torch.int8, device="cuda"), sf)
