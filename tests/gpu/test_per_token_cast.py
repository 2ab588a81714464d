"""GPU tests of ``tile_kernels_aot.quant.per_token_cast`` against tests/reference/quant.py.

FP8/FP4 codes and fp32 scale factors are exact formats, so every element is compared bit for
bit (tolerance: none): codes as uint8, scales as int32. The reference runs on the same GPU in
fp32. Inputs are fresh Gaussian rows whose magnitudes span six decades, with no exact zero,
so every scale group has its own scale. Launchers are also called directly on outputs
poisoned with NaN / 0x7F bytes, which catches any element the kernel fails to write.

The scale layouts (b) use_tma_aligned_col_major_sf and (c) use_packed_ue8m0 are built for
(e4m3, npc 128) and (e2m1, npc 32) only (sf_layout in kernel_specs/quant.yaml). Their views
must have TileKernels' strides (1, align(T, 4)); the padding tokens T .. align(T, 4) - 1 of
the backing storage are unspecified (torch.empty, as in TileKernels), so the op's results are
compared on the logical view only. The kernel never writes the padding: the launcher tests
pin that on poisoned storage, which also catches a store at a wrong stride.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest
import torch

from tests.gpu.compare import assert_same_codes_and_scales
from tests.gpu.installed import installed_package
from tests.reference.quant import align, cast_error, dequant, per_token_cast_ref, ue8m0_unpack

tile_kernels_aot, quant, errors, runtime = installed_package()

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
# Groups of npc channels take any hidden that is a multiple of 64 (one variant, hidden a runtime size), the
# last group partial where npc does not divide hidden (576 with npc 128, as in TileKernels' tests).
HIDDEN = (64, 576, 1536, 2048, 2560, 3072, 3584, 4096, 6144, 7168)
NPC = {"e4m3": (16, 32, 64, 128), "e2m1": (16, 32, 64, 128)}
POISON_BYTE = 0x7F  # an FP8 NaN, and an FP4 pair (7, 15) no all-zero input produces


def grid() -> Iterator[tuple[str, int, str, int, bool]]:
    """Every (in_dtype, hidden, fmt, npc, round_sf) of kernel_specs/quant.yaml."""
    for in_dtype, hidden, fmt, round_sf in itertools.product(DTYPES, HIDDEN, NPC, (False, True)):
        for npc in NPC[fmt]:
            yield in_dtype, hidden, fmt, npc, round_sf


def variant_id(v: tuple[str, int, str, int, bool]) -> str:
    in_dtype, hidden, fmt, npc, round_sf = v
    return f"{in_dtype}-H{hidden}-{fmt}-npc{npc}" + ("-round_sf" if round_sf else "")


FULL = list(grid())
# T = 8192 on a subset that still covers every dtype, format, npc and the largest hidden.
LARGE = [v for v in FULL if v[1] == 7168 or (v[2] == "e4m3" and v[3] == 128)]


def random_rows(num_tokens: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """Gaussian rows times a random magnitude in [1e-3, 1e3] per row; no exact zeros."""
    magnitude = torch.pow(10.0, torch.empty(num_tokens, 1, device="cuda").uniform_(-3, 3))
    x = torch.randn(num_tokens, hidden, device="cuda") * magnitude
    # bf16 keeps fp32's exponent range, so no non-zero value here rounds to 0 in the cast.
    return torch.where(x == 0, torch.ones_like(x), x).to(dtype)


def tie_rows(hidden: int, dtype: torch.dtype, fmt: str) -> torch.Tensor:
    """Rows whose groups have amax == qmax, so q_scale == 1 and the format's ties are hit exactly."""
    qmax = 448.0 if fmt == "e4m3" else 6.0
    if fmt == "e2m1":
        values = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 3.0, 4.0, 0.1, 5.5, 0.3, 2.9]
    else:  # midpoints between e4m3 neighbours, subnormal ties and values just below 448
        values = [
            1.0625,
            1.1875,
            272.0,
            304.0,
            432.0,
            440.0,
            2.0**-10,
            3 * 2.0**-10,
            1e-3,
            17.0,
            13.0,
            2.0**-9 * 1.5,
            100.0,
            240.0,
            232.0,
            447.0,
        ]
    row = torch.tensor(values * (hidden // len(values)), device="cuda")
    row[0::16] = qmax  # every group (npc >= 16) holds its amax
    return torch.stack([row, -row, row.flip(0)]).to(dtype)


def poisoned_outputs(num_tokens: int, hidden: int, fmt: str, npc: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = hidden if fmt == "e4m3" else hidden // 2
    q_dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.int8
    q = torch.full((num_tokens, width), POISON_BYTE, dtype=torch.uint8, device="cuda").view(q_dtype)
    sf = torch.full((num_tokens, -(-hidden // npc)), float("nan"), device="cuda")
    return q, sf


def assert_matches_reference(
    x: torch.Tensor, q: torch.Tensor, sf: torch.Tensor, fmt: str, npc: int, round_sf: bool
) -> None:
    ref_q, ref_sf = per_token_cast_ref(x, fmt, npc, round_sf)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)


def launch_poisoned(x: torch.Tensor, v: tuple[str, int, str, int, bool]) -> tuple[torch.Tensor, torch.Tensor]:
    in_dtype, hidden, fmt, npc, round_sf = v
    q, sf = poisoned_outputs(x.shape[0], hidden, fmt, npc)
    launch = runtime.get_kernel("per_token_cast").select(
        in_dtype=in_dtype, hidden=0, fmt=fmt, npc=npc, round_sf=round_sf, sf_layout="row_major"
    )
    launch(x, q, sf, 0)  # mode 0: cast (write q and sf)
    torch.cuda.synchronize()
    return q, sf


@pytest.mark.parametrize("num_tokens", [0, 1, 127, 4001])
@pytest.mark.parametrize("v", FULL, ids=variant_id)
def test_per_token_cast(v: tuple[str, int, str, int, bool], num_tokens: int) -> None:
    in_dtype, hidden, fmt, npc, round_sf = v
    x = random_rows(num_tokens, hidden, DTYPES[in_dtype])
    q, sf = quant.per_token_cast(x, fmt, npc, round_sf=round_sf)
    assert_matches_reference(x, q, sf, fmt, npc, round_sf)


@pytest.mark.parametrize("v", LARGE, ids=variant_id)
def test_per_token_cast_8192_tokens(v: tuple[str, int, str, int, bool]) -> None:
    in_dtype, hidden, fmt, npc, round_sf = v
    x = random_rows(8192, hidden, DTYPES[in_dtype])
    q, sf = quant.per_token_cast(x, fmt, npc, round_sf=round_sf)
    assert_matches_reference(x, q, sf, fmt, npc, round_sf)


# The variant for any hidden runs its row tiles down gridDim.y and z (kernels/quant/grid.py): past 65535 tiles (of up to
# 16 rows) the blocks of the last z slab start past num_tokens and must store nothing.
@pytest.mark.parametrize(("fmt", "npc"), [("e4m3", 64), ("e2m1", 32)])
def test_more_row_tiles_than_one_grid_dimension_holds(fmt: str, npc: int) -> None:
    num_tokens = 65535 * 16 + 19
    x = random_rows(num_tokens, 64, torch.bfloat16)
    q, sf = launch_poisoned(x, ("bfloat16", 64, fmt, npc, False))
    assert not torch.isnan(sf).any(), "some scale factors were never written"
    assert_matches_reference(x, q, sf, fmt, npc, False)


@pytest.mark.parametrize("num_tokens", [1, 3, 127, 4001])
@pytest.mark.parametrize("v", FULL, ids=variant_id)
def test_launcher_overwrites_poisoned_outputs(v: tuple[str, int, str, int, bool], num_tokens: int) -> None:
    """Every code and scale is written, also in the last, partial row tile."""
    x = random_rows(num_tokens, v[1], DTYPES[v[0]])
    q, sf = launch_poisoned(x, v)
    assert not torch.isnan(sf).any(), "some scale factors were never written"
    assert_matches_reference(x, q, sf, v[2], v[3], v[4])


@pytest.mark.parametrize("v", FULL, ids=variant_id)
def test_ties_and_boundaries(v: tuple[str, int, str, int, bool]) -> None:
    """Groups scaled by exactly 1: FP4/FP8 round-to-even ties, +-448, saturation at 6."""
    x = tie_rows(v[1], DTYPES[v[0]], v[2])
    q, sf = launch_poisoned(x, v)
    assert_matches_reference(x, q, sf, v[2], v[3], v[4])


@pytest.mark.parametrize("v", [v for v in FULL if v[1] == 2048], ids=variant_id)
def test_extreme_magnitudes(v: tuple[str, int, str, int, bool]) -> None:
    """amax floors (tiny and subnormal rows), -0.0 inputs, and products that underflow to -0.0."""
    dtype = DTYPES[v[0]]
    tiny = torch.randn(4, v[1], device="cuda")
    rows = [tiny * 1e-8, tiny * 1e-36, random_rows(2, v[1], torch.float32)]
    x = torch.cat(rows).to(dtype)
    x[-2:, ::3] = -0.0
    x[-1, 4] = 3e38 if dtype == torch.float32 else 1e38  # one huge value and a tiny negative in its group
    x[-1, 5] = -1e-44 if dtype == torch.float32 else -1e-39
    q, sf = launch_poisoned(x, v)
    assert_matches_reference(x, q, sf, v[2], v[3], v[4])


def test_runs_on_the_current_stream() -> None:
    x = random_rows(4001, 7168, torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        q, sf = quant.per_token_cast(x, "e4m3", 128)
    stream.synchronize()
    assert_matches_reference(x, q, sf, "e4m3", 128, False)


# --- errors -------------------------------------------------------------------------------


def test_other_dtype_is_refused() -> None:
    x = torch.ones(4, 2048, dtype=torch.float16, device="cuda")
    with pytest.raises((errors.VariantNotFoundError, errors.KernelArgumentError), match=r"\bx\b|float16"):
        quant.per_token_cast(x, "e4m3", 128)


def test_hidden_off_the_64_grid_is_refused_naming_x() -> None:
    x = torch.ones(4, 1000, dtype=torch.bfloat16, device="cuda")
    # A multi-arch package checks row strides against its widest arch's alignment (32 bytes) first.
    with pytest.raises(errors.KernelArgumentError,
                       match=r"x: (the kernel requires hidden % 64 == 0|the row stride \(1000 elements\))"):
        quant.per_token_cast(x, "e4m3", 128)


@pytest.mark.parametrize("npc", [16, 32, 64, 128])
@pytest.mark.parametrize("in_dtype", list(DTYPES))
def test_e2m1_keeps_the_sign_of_zero(in_dtype: str, npc: int) -> None:
    """-0.0 and negatives that round to zero encode as 0x8, +0.0 as 0x0 (KERNELS.md, TileKernels)."""
    x = random_rows(5, 576, DTYPES[in_dtype])
    x[:, 0::7] = -0.0
    x[:, 1::7] = 0.0
    x[:, 2::7] = -1e-6 * x[:, 2::7].abs().float().amax().to(x.dtype)
    q, sf = quant.per_token_cast(x, "e2m1", npc)
    assert_matches_reference(x, q, sf, "e2m1", npc, False)
    codes = torch.stack([q.view(torch.uint8) & 0xF, q.view(torch.uint8) >> 4], dim=-1).reshape(5, 576)
    assert bool((codes[:, 0::7] == 8).all()) and bool((codes[:, 1::7] == 0).all())


def test_cpu_tensor_is_refused_naming_x() -> None:
    x = torch.ones(4, 2048, dtype=torch.bfloat16)
    with pytest.raises(errors.KernelError, match=r"\bx\b"):
        quant.per_token_cast(x, "e4m3", 128)


@pytest.mark.parametrize("shape", [(2048,), (2, 4, 2048)], ids=str)
def test_wrong_rank_is_refused(shape: tuple[int, ...]) -> None:
    x = torch.ones(shape, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"\bx\b.*2-D"):
        quant.per_token_cast(x, "e4m3", 128)


def test_non_tensor_is_refused() -> None:
    with pytest.raises(TypeError, match=r"\bx\b"):
        quant.per_token_cast([[1.0] * 2048], "e4m3", 128)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.ones(8, 2 * 2048, dtype=torch.bfloat16, device="cuda")[:, ::2],  # column stride 2
        lambda: torch.ones(2048, 8, dtype=torch.bfloat16, device="cuda").t(),  # transposed view
        lambda: torch.ones(8, 2049, dtype=torch.bfloat16, device="cuda")[:, :2048],  # rows off the 16-byte grid
    ],
    ids=["strided-columns", "transposed", "misaligned-rows"],
)
def test_non_contiguous_x_is_refused(make: Callable[[], torch.Tensor]) -> None:
    x = make()
    assert x.shape == (8, 2048) and not x.is_contiguous()
    with pytest.raises(errors.KernelArgumentError, match=r"\bx\b"):
        quant.per_token_cast(x, "e4m3", 128)


@pytest.mark.parametrize("fmt", ["e5m2", "E4M3", ""])
def test_bad_fmt_is_refused(fmt: str) -> None:
    x = torch.ones(4, 2048, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"\bfmt\b"):
        quant.per_token_cast(x, fmt, 128)


def test_uncovered_npc_is_refused() -> None:
    x = torch.ones(4, 2048, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="num_per_channels: groups of 16, 32, 64, 128 channels.*got 48"):
        quant.per_token_cast(x, "e2m1", 48)  # TileKernels' domain


def test_block_size_of_a_plain_tensor_is_refused() -> None:
    """x_block_size describes a quantized (data, sf) input (tests/gpu/test_per_token_cast_forms.py)."""
    x = torch.ones(4, 2048, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"x_block_size"):
        quant.per_token_cast(x, "e4m3", 128, x_block_size=(1, 128))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"use_packed_ue8m0": True},
        {"use_packed_ue8m0": True, "round_sf": True},
        {"use_packed_ue8m0": True, "use_tma_aligned_col_major_sf": True},
    ],
    ids=["alone", "without-col-major", "without-round_sf"],
)
def test_ue8m0_needs_col_major_and_round_sf(kwargs: dict[str, object]) -> None:
    """KERNELS.md: UE8M0 needs layout (b) and round_sf; the error names use_packed_ue8m0."""
    x = torch.ones(4, 2048, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"use_packed_ue8m0"):
        quant.per_token_cast(x, "e4m3", 128, **kwargs)


def test_launcher_checks_output_shapes() -> None:
    x = random_rows(16, 2048, torch.bfloat16)
    q, sf = poisoned_outputs(16, 2048, "e2m1", 16)
    launch = runtime.get_kernel("per_token_cast").select(
        in_dtype="bfloat16", hidden=0, fmt="e2m1", npc=16, round_sf=False, sf_layout="row_major"
    )
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        launch(x, q, sf[:, :64], 0)
    with pytest.raises(errors.KernelArgumentError, match=r"\bq\b"):
        launch(x, torch.empty(16, 2048, dtype=torch.int8, device="cuda"), sf, 0)


# --- scale-factor layouts (b) col_major and (c) ue8m0 ----------------------------------------

LAYOUT_GROUPS = tuple((fmt, npc) for fmt in NPC for npc in NPC[fmt])  # every layout for every group


def layout_grid() -> Iterator[tuple[str, int, str, int, bool, str]]:
    """Every (in_dtype, hidden, fmt, npc, round_sf, sf_layout) of the spec with sf_layout != row_major."""
    for in_dtype, hidden, (fmt, npc) in itertools.product(DTYPES, HIDDEN, LAYOUT_GROUPS):
        for round_sf, sf_layout in ((False, "col_major"), (True, "col_major"), (True, "ue8m0")):
            yield in_dtype, hidden, fmt, npc, round_sf, sf_layout


def layout_id(v: tuple[str, int, str, int, bool, str]) -> str:
    return variant_id(v[:5]) + "-" + v[5]


LAYOUTS = list(layout_grid())
POISON_SF_BYTE = 0xFF  # fp32 NaN; as a UE8M0 byte, exponent 255, which no finite scale has


def layout_flags(sf_layout: str) -> dict[str, bool]:
    return {"use_tma_aligned_col_major_sf": True, "use_packed_ue8m0": sf_layout == "ue8m0"}


def assert_layout_matches_reference(
    x: torch.Tensor, q: torch.Tensor, sf: torch.Tensor, v: tuple[str, int, str, int, bool, str]
) -> None:
    """q and the logical (T, ...) sf view bit for bit, and TileKernels' strides (1, align(T, 4))."""
    _, hidden, fmt, npc, round_sf, sf_layout = v
    num_tokens = x.shape[0]
    ref_q, ref_sf = per_token_cast_ref(x, fmt, npc, round_sf, sf_layout)
    assert q.shape == ref_q.shape and q.dtype == ref_q.dtype and q.is_contiguous()
    width = -(-hidden // npc) if sf_layout == "col_major" else (-(-hidden // npc) + 3) // 4
    assert sf.shape == (num_tokens, width) == ref_sf.shape
    assert sf.dtype == (torch.float32 if sf_layout == "col_major" else torch.int32)
    if num_tokens > 0:
        assert sf.stride() == (1, align(num_tokens, 4))
    wrong_sf = int((sf.view(torch.int32) != ref_sf.view(torch.int32)).sum())
    assert wrong_sf == 0, f"{wrong_sf} of {sf.numel()} scale words differ from the reference"
    wrong_q = int((q.view(torch.uint8) != ref_q.view(torch.uint8)).sum())
    assert wrong_q == 0, f"{wrong_q} of {q.numel()} code bytes differ from the reference"


@pytest.mark.parametrize("num_tokens", [0, 1, 3, 127, 4001])
@pytest.mark.parametrize("v", LAYOUTS, ids=layout_id)
def test_sf_layouts(v: tuple[str, int, str, int, bool, str], num_tokens: int) -> None:
    in_dtype, hidden, fmt, npc, round_sf, sf_layout = v
    x = random_rows(num_tokens, hidden, DTYPES[in_dtype])
    q, sf = quant.per_token_cast(x, fmt, npc, round_sf=round_sf, **layout_flags(sf_layout))
    assert_layout_matches_reference(x, q, sf, v)
    # The view sits on TMA-aligned storage: align(T, 4) tokens per group (per word for ue8m0).
    assert sf.untyped_storage().nbytes() == sf.shape[1] * align(num_tokens, 4) * 4


@pytest.mark.parametrize("v", [v for v in LAYOUTS if v[1] == 7168], ids=layout_id)
def test_sf_layouts_8192_tokens(v: tuple[str, int, str, int, bool, str]) -> None:
    in_dtype, hidden, fmt, npc, round_sf, sf_layout = v
    x = random_rows(8192, hidden, DTYPES[in_dtype])
    q, sf = quant.per_token_cast(x, fmt, npc, round_sf=round_sf, **layout_flags(sf_layout))
    assert_layout_matches_reference(x, q, sf, v)


def launch_layout_poisoned(x: torch.Tensor, v: tuple[str, int, str, int, bool, str]) -> tuple[torch.Tensor, ...]:
    """Launch on poisoned q and poisoned backing storage, padding tokens included.

    Returns (q, sf view, storage bytes (rows, align(T, 4) * 4)).
    """
    in_dtype, hidden, fmt, npc, round_sf, sf_layout = v
    num_tokens = x.shape[0]
    padded = align(num_tokens, 4)
    q, _ = poisoned_outputs(num_tokens, hidden, fmt, npc)
    rows = -(-hidden // npc) if sf_layout == "col_major" else (-(-hidden // npc) + 3) // 4
    raw = torch.full((rows, padded * 4), POISON_SF_BYTE, dtype=torch.uint8, device="cuda")
    if sf_layout == "col_major":
        storage = raw.view(torch.float32)  # (G, align(T, 4))
        arg = storage
    else:
        storage = raw.view(torch.int32)  # (ceil(G/4), align(T, 4))
        arg = raw.view(rows, padded, 4)
    launch = runtime.get_kernel("per_token_cast").select(
        in_dtype=in_dtype, hidden=0, fmt=fmt, npc=npc, round_sf=round_sf, sf_layout=sf_layout
    )
    launch(x, q, arg, 0)
    torch.cuda.synchronize()
    return q, storage.T[:num_tokens], raw


@pytest.mark.parametrize("num_tokens", [1, 3, 127, 4001])
@pytest.mark.parametrize("v", LAYOUTS, ids=layout_id)
def test_layout_launcher_overwrites_poisoned_storage(v: tuple[str, int, str, int, bool, str], num_tokens: int) -> None:
    """Every logical scale is written, also in the last partial row tile; the padding is not touched."""
    x = random_rows(num_tokens, v[1], DTYPES[v[0]])
    q, sf, raw = launch_layout_poisoned(x, v)
    assert_layout_matches_reference(x, q, sf, v)
    # Every scale of the logical tokens is written (each byte of a UE8M0 word), none of the padding.
    if v[5] == "ue8m0":
        assert not bool((raw[:, : num_tokens * 4] == POISON_SF_BYTE).any()), "some UE8M0 bytes were never written"
    else:
        assert not bool(torch.isnan(sf).any()), "some scale factors were never written"
    padding = raw[:, num_tokens * 4 :]
    assert bool((padding == POISON_SF_BYTE).all()), "the kernel wrote into the padding tokens"


@pytest.mark.parametrize("v", [v for v in LAYOUTS if v[1] == 2048], ids=layout_id)
def test_layout_extreme_magnitudes(v: tuple[str, int, str, int, bool, str]) -> None:
    """amax floors (UE8M0 byte 1 for e2m1) and huge rows (bytes >= 128: negative int32 words)."""
    dtype = DTYPES[v[0]]
    tiny = torch.randn(4, v[1], device="cuda")
    rows = [tiny * 1e-8, tiny * 1e-36, random_rows(2, v[1], torch.float32), tiny[:1] * 1e36]
    x = torch.cat(rows).to(dtype)
    x[-3:-1, ::3] = -0.0
    q, sf, _ = launch_layout_poisoned(x, v)
    assert_layout_matches_reference(x, q, sf, v)


@pytest.mark.parametrize("v", [v for v in LAYOUTS if v[0] == "bfloat16" and v[1] == 4096], ids=layout_id)
def test_layout_dequantizes_close_to_x(v: tuple[str, int, str, int, bool, str]) -> None:
    """Decoding the UE8M0 words (byte << 23) or the column-major scales recovers x."""
    _, hidden, fmt, npc, round_sf, sf_layout = v
    x = random_rows(257, hidden, torch.bfloat16)
    q, sf = quant.per_token_cast(x, fmt, npc, round_sf=round_sf, **layout_flags(sf_layout))
    if sf_layout == "ue8m0":
        sf = ue8m0_unpack(sf, -(-hidden // npc))
    assert cast_error(x.float(), dequant(q, sf, fmt, npc)) < (1e-3 if fmt == "e4m3" else 2e-2)


@pytest.mark.parametrize("sf_layout", ["col_major", "ue8m0"])
def test_layout_torch_compile_keeps_strides(sf_layout: str) -> None:
    """The custom op's fake kernel gives torch.compile the same (1, align(T, 4)) strided views."""
    x = random_rows(257, 2048, torch.bfloat16)
    flags = layout_flags(sf_layout)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: quant.per_token_cast(t, "e4m3", 128, round_sf=True, **flags), fullgraph=True)
    q, sf = compiled(x)
    q_eager, sf_eager = quant.per_token_cast(x, "e4m3", 128, round_sf=True, **flags)
    assert sf.shape == sf_eager.shape and sf.stride() == sf_eager.stride() == (1, 260)
    assert torch.equal(sf.view(torch.int32), sf_eager.view(torch.int32))
    assert torch.equal(q.view(torch.uint8), q_eager.view(torch.uint8))


def test_layout_launcher_checks_storage() -> None:
    """The launcher names sf for storage of the wrong dtype, group count or a transposed view."""
    x = random_rows(5, 2048, torch.bfloat16)
    q = torch.empty(5, 2048, dtype=torch.float8_e4m3fn, device="cuda")
    col = runtime.get_kernel("per_token_cast").select(
        in_dtype="bfloat16", hidden=0, fmt="e4m3", npc=128, round_sf=False, sf_layout="col_major"
    )
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        col(x, q, torch.empty(16, 8, dtype=torch.int32, device="cuda"), 0)  # wrong dtype
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        col(x, q, torch.empty(8, 8, device="cuda"), 0)  # 8 groups instead of 16
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        col(x, q, torch.empty(8, 16, device="cuda").T, 0)  # the (T, G) view instead of the storage
    packed = runtime.get_kernel("per_token_cast").select(
        in_dtype="bfloat16", hidden=0, fmt="e4m3", npc=128, round_sf=True, sf_layout="ue8m0"
    )
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        packed(x, q, torch.empty(4, 8, dtype=torch.int32, device="cuda"), 0)  # words, not their bytes
