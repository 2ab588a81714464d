"""GPU tests of the per_token_cast forms added to the base cast (tests/gpu/test_per_token_cast.py).

Covered here, each against tests/reference/quant.py and bit for bit (codes as bytes, scales as
int32 bits; tolerance: none): ``per_token_cast_with_sf_only``, ``per_token_cast_with_precomputed_sf``
(q = cast(x_f32 * fl(1 / sf))), one scale per row (num_per_channels == hidden, grid npc 0),
strided rows (x[:, :hidden] of a wider tensor), NaN / Inf inputs (the group's scale is the NaN
0x7FC00000, UE8M0 byte 0xFF, its codes 0x7F for e4m3 and 0 for e2m1), values at the amax floor
and at the format maximum, round trips through per_token_cast_back (error measure
1 - 2 sum(xy) / sum(x^2 + y^2) < 1e-3 e4m3, < 2e-2 e2m1, KERNELS.md), a CUDA graph replay and
torch.compile(fullgraph=True) of each form, and the argument errors.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.gpu.compare import assert_same_codes_and_scales
from tests.gpu.installed import installed_package
from tests.reference.quant import (
    cast_error,
    dequant,
    per_token_cast_ref,
    precomputed_sf_cast_ref,
    ue8m0_unpack,
)

tile_kernels_aot, quant, errors, runtime = installed_package()

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
HIDDEN = (576, 2048, 3584, 7168)  # groups: any multiple of 64 (576 with npc 128: a partial last group)
ROW_HIDDEN = (576, 2048, 2560, 3072, 4096, 6144, 7168)  # one scale per row: built per hidden (576: one warp a row)
NPC = {"e4m3": (16, 32, 64, 128), "e2m1": (16, 32, 64, 128)}
TOKENS = (0, 1, 4001)
ERROR_BOUND = {"e4m3": 1e-3, "e2m1": 2e-2}
NAN_BITS = 0x7FC00000
POISON_BYTE = 0x7F


def random_rows(num_tokens: int, hidden: int, dtype: torch.dtype, width: int | None = None) -> torch.Tensor:
    """Gaussian rows times 10^U(-3, 3) per row, no exact zeros; x[:, :hidden] of a (T, width) tensor."""
    width = width or hidden
    magnitude = torch.pow(10.0, torch.empty(num_tokens, 1, device="cuda").uniform_(-3, 3))
    x = torch.randn(num_tokens, width, device="cuda") * magnitude
    return torch.where(x == 0, torch.ones_like(x), x).to(dtype)[:, :hidden]


def grouped() -> list[tuple[str, int, str, int]]:
    return [(d, h, f, n) for d, h, f in itertools.product(DTYPES, HIDDEN, NPC) for n in NPC[f]]


def vid(v: tuple[object, ...]) -> str:
    return "-".join(str(p) for p in v)


def layout_flags(sf_layout: str) -> dict[str, bool]:
    if sf_layout == "row_major":
        return {}
    return {"use_tma_aligned_col_major_sf": True, "use_packed_ue8m0": sf_layout == "ue8m0"}


def assert_same_sf(sf: torch.Tensor, ref_sf: torch.Tensor) -> None:
    """Scale factors (any layout: fp32 values or int32 words) bit for bit on the logical view."""
    assert sf.shape == ref_sf.shape and sf.dtype == ref_sf.dtype
    wrong = int((sf.view(torch.int32) != ref_sf.view(torch.int32)).sum())
    assert wrong == 0, f"{wrong} of {sf.numel()} scale words differ from the reference"


def assert_same_codes(q: torch.Tensor, ref_q: torch.Tensor) -> None:
    assert q.shape == ref_q.shape and q.dtype == ref_q.dtype and q.is_contiguous()
    wrong = int((q.view(torch.uint8) != ref_q.view(torch.uint8)).sum())
    assert wrong == 0, f"{wrong} of {q.numel()} code bytes differ from the reference"


# --- new hidden sizes and one scale per row ----------------------------------------------------

PER_ROW = list(itertools.product(DTYPES, ROW_HIDDEN, NPC, (False, True)))


@pytest.mark.parametrize("num_tokens", [*TOKENS, 8192])
@pytest.mark.parametrize("v", PER_ROW, ids=vid)
def test_one_scale_per_row(v: tuple[str, int, str, bool], num_tokens: int) -> None:
    in_dtype, hidden, fmt, round_sf = v
    x = random_rows(num_tokens, hidden, DTYPES[in_dtype])
    q, sf = quant.per_token_cast(x, fmt, hidden, round_sf=round_sf)
    assert sf.shape == (num_tokens, 1)
    ref_q, ref_sf = per_token_cast_ref(x, fmt, hidden, round_sf)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)


@pytest.mark.parametrize("num_tokens", [1, 5, 4001])
@pytest.mark.parametrize("sf_layout", ["col_major", "ue8m0"])
@pytest.mark.parametrize("v", [v for v in PER_ROW if v[1] in (576, 2560, 7168) and v[3]], ids=vid)
def test_one_scale_per_row_in_the_column_major_layouts(v: tuple[str, int, str, bool], sf_layout: str,
                                                       num_tokens: int) -> None:
    """G = 1: a UE8M0 word holds the row's byte and three zero bytes (TileKernels' packing of G % 4 != 0)."""
    in_dtype, hidden, fmt, round_sf = v
    x = random_rows(num_tokens, hidden, DTYPES[in_dtype])
    q, sf = quant.per_token_cast(x, fmt, hidden, round_sf=round_sf, **layout_flags(sf_layout))
    ref_q, ref_sf = per_token_cast_ref(x, fmt, hidden, round_sf, sf_layout)
    assert_same_codes(q, ref_q)
    assert_same_sf(sf, ref_sf)


@pytest.mark.parametrize("v", [v for v in grouped() if v[1] in (2560, 6144)], ids=vid)
def test_new_hidden_sizes_8192_tokens(v: tuple[str, int, str, int]) -> None:
    in_dtype, hidden, fmt, npc = v
    x = random_rows(8192, hidden, DTYPES[in_dtype])
    q, sf = quant.per_token_cast(x, fmt, npc)
    assert_same_codes_and_scales(q, sf, *per_token_cast_ref(x, fmt, npc))


# --- sf only and precomputed sf --------------------------------------------------------------

FORM_LAYOUTS = [("row_major", False), ("row_major", True), ("col_major", False), ("ue8m0", True)]
LAYOUT_GROUPS = {"e4m3": 128, "e2m1": 32}


def form_grid() -> list[tuple[str, int, str, int, str, bool]]:
    """Every grouped variant row-major, plus the column-major layouts for their group sizes."""
    out = [(d, h, f, n, "row_major", r) for d, h, f, n in grouped() for r in (False, True)]
    for d, h, f in itertools.product(DTYPES, HIDDEN, NPC):
        out += [(d, h, f, LAYOUT_GROUPS[f], layout, r) for layout, r in FORM_LAYOUTS[2:]]
    return out


FORMS = form_grid()


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("v", FORMS, ids=vid)
def test_sf_only_equals_the_cast_scales(v: tuple[str, int, str, int, str, bool], num_tokens: int) -> None:
    in_dtype, hidden, fmt, npc, sf_layout, round_sf = v
    x = random_rows(num_tokens, hidden, DTYPES[in_dtype])
    sf = quant.per_token_cast_with_sf_only(x, fmt, npc, round_sf=round_sf, **layout_flags(sf_layout))
    _, ref_sf = per_token_cast_ref(x, fmt, npc, round_sf, sf_layout)
    assert_same_sf(sf, ref_sf)
    if num_tokens > 1 and sf_layout != "row_major":
        assert sf.stride() == ref_sf.stride()


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("v", FORMS, ids=vid)
def test_precomputed_sf(v: tuple[str, int, str, int, str, bool], num_tokens: int) -> None:
    """Scales of another tensor (so many codes saturate or vanish), in the layout the flags name."""
    in_dtype, hidden, fmt, npc, sf_layout, round_sf = v
    x = random_rows(num_tokens, hidden, DTYPES[in_dtype])
    other = random_rows(num_tokens, hidden, DTYPES[in_dtype])
    flags = layout_flags(sf_layout)
    _, sf = quant.per_token_cast(other, fmt, npc, round_sf=round_sf, **flags)
    q = quant.per_token_cast_with_precomputed_sf(x, fmt, npc, sf, round_sf=round_sf, **flags)
    values = ue8m0_unpack(sf, -(-hidden // npc)) if sf_layout == "ue8m0" else sf
    assert_same_codes(q, precomputed_sf_cast_ref(x, fmt, npc, values.float()))
    if round_sf:  # power-of-two scales: 1 / sf is exact, so the own scales reproduce the cast
        q_own, sf_own = quant.per_token_cast(x, fmt, npc, round_sf=True, **flags)
        assert_same_codes(quant.per_token_cast_with_precomputed_sf(x, fmt, npc, sf_own, round_sf=True, **flags),
                          q_own)


def test_precomputed_sf_uses_the_reciprocal() -> None:
    """2800 / 7 = 400 is an e4m3 tie (to 384); 2800 * fl(1/7) is just above it (416)."""
    x = torch.zeros(1, 2048, device="cuda")
    x[0, 0] = 2800.0
    sf = torch.full((1, 16), 7.0, device="cuda")
    q = quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, sf)
    assert q[0, 0].float().item() == 416.0


def test_precomputed_sf_reads_a_copied_column_major_view() -> None:
    """A column-major (T, G) view that is not per_token_cast's own storage is copied, not misread."""
    x = random_rows(9, 2048, torch.bfloat16)
    _, sf = quant.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True)
    fresh = sf.t().contiguous().t()  # strides (1, 9): tokens not padded to 4
    q = quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, fresh, use_tma_aligned_col_major_sf=True)
    assert_same_codes(q, precomputed_sf_cast_ref(x, "e4m3", 128, sf))


# --- strided rows ------------------------------------------------------------------------------


@pytest.mark.parametrize("num_tokens", [1, 4001])
@pytest.mark.parametrize("v", [v for v in grouped() if v[3] in (16, 128)], ids=vid)
def test_strided_rows(v: tuple[str, int, str, int], num_tokens: int) -> None:
    """x[:, :hidden] of a tensor 64 elements wider (128 or 256 bytes: vector-aligned rows)."""
    in_dtype, hidden, fmt, npc = v
    x = random_rows(num_tokens, hidden, DTYPES[in_dtype], width=hidden + 64)
    assert not x.is_contiguous() or num_tokens == 1
    q, sf = quant.per_token_cast(x, fmt, npc)
    assert_same_codes_and_scales(q, sf, *per_token_cast_ref(x.contiguous(), fmt, npc))
    sf_only = quant.per_token_cast_with_sf_only(x, fmt, npc)
    assert_same_sf(sf_only, sf)
    assert_same_codes(quant.per_token_cast_with_precomputed_sf(x, fmt, npc, sf), precomputed_sf_cast_ref(x, fmt, npc, sf))


@pytest.mark.parametrize("in_dtype", list(DTYPES))
def test_strided_rows_one_scale_per_row(in_dtype: str) -> None:
    x = random_rows(4001, 7168, DTYPES[in_dtype], width=7168 * 2)
    q, sf = quant.per_token_cast(x, "e4m3", 7168)
    assert_same_codes_and_scales(q, sf, *per_token_cast_ref(x, "e4m3", 7168))


def test_strided_rows_leave_the_rest_of_the_row_alone() -> None:
    """Launched on poisoned outputs: every code written; the input's extra columns are only read."""
    wide = random_rows(127, 2048 + 64, torch.bfloat16)
    before = wide.clone()
    x = wide[:, :2048]
    launch = runtime.get_kernel("per_token_cast").select(
        in_dtype="bfloat16", hidden=0, fmt="e4m3", npc=128, round_sf=False, sf_layout="row_major")
    q = torch.full((127, 2048), POISON_BYTE, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    sf = torch.full((127, 16), float("nan"), device="cuda")
    launch(x, q, sf, 0)
    torch.cuda.synchronize()
    assert_same_codes_and_scales(q, sf, *per_token_cast_ref(x, "e4m3", 128))
    assert torch.equal(wide, before)


# --- NaN / Inf, floors, format maximum -------------------------------------------------------

NAN_CASES = [("e4m3", 128, False, "row_major"), ("e4m3", 128, True, "row_major"), ("e2m1", 16, False, "row_major"),
             ("e2m1", 32, True, "row_major"), ("e4m3", 128, True, "ue8m0"), ("e2m1", 32, False, "col_major"),
             ("e4m3", 0, False, "row_major"), ("e2m1", 0, True, "row_major")]


@pytest.mark.parametrize("in_dtype", list(DTYPES))
@pytest.mark.parametrize("case", NAN_CASES, ids=vid)
def test_nan_and_inf_never_pass_silently(case: tuple[str, int, bool, str], in_dtype: str) -> None:
    """Row 1 holds a NaN in group 0, row 2 a +Inf in group 1, row 3 a -Inf in the last group.

    Documented output: those groups' scales are exactly NaN (bits 0x7FC00000; UE8M0 byte 0xFF),
    their codes exactly 0x7F (e4m3 NaN) or 0 (e2m1); every other group as if clean.
    """
    fmt, npc, round_sf, sf_layout = case
    hidden = 2048
    npc = npc or hidden
    x = random_rows(5, hidden, DTYPES[in_dtype])
    x[1, 5] = float("nan")
    x[2, npc + 3 if npc < hidden else 3] = float("inf")
    x[3, hidden - 1] = float("-inf")
    q, sf = quant.per_token_cast(x, fmt, npc, round_sf=round_sf, **layout_flags(sf_layout))
    ref_q, ref_sf = per_token_cast_ref(x, fmt, npc, round_sf, sf_layout)
    assert_same_codes(q, ref_q)
    assert_same_sf(sf, ref_sf)
    values = ue8m0_unpack(sf, -(-hidden // npc)) if sf_layout == "ue8m0" else sf
    bad = [(1, 0), (2, 1 if npc < hidden else 0), (3, -(-hidden // npc) - 1)]
    for row, group in bad:
        if sf_layout == "ue8m0":
            assert (int(sf[row, group // 4]) >> (8 * (group % 4))) & 0xFF == 0xFF
        else:
            assert int(values[row, group].view(torch.int32)) == NAN_BITS
        width = npc if fmt == "e4m3" else npc // 2
        codes = q[row, group * width:(group + 1) * width].view(torch.uint8)
        assert codes.tolist() == [0x7F if fmt == "e4m3" else 0] * width
    assert bool(torch.isnan(dequant(q, values, fmt, npc)[1, :npc]).all())
    assert int(torch.isnan(values.float()).sum()) == (0 if sf_layout == "ue8m0" else 3)
    sf_only = quant.per_token_cast_with_sf_only(x, fmt, npc, round_sf=round_sf, **layout_flags(sf_layout))
    assert_same_sf(sf_only, ref_sf)


@pytest.mark.parametrize("in_dtype", list(DTYPES))
@pytest.mark.parametrize(("fmt", "npc"), [("e4m3", 32), ("e4m3", 128), ("e2m1", 16), ("e4m3", 0), ("e2m1", 0)])
def test_floor_and_format_maximum(fmt: str, npc: int, in_dtype: str) -> None:
    """Groups whose amax sits just below, at and above the floor, and groups at exactly qmax."""
    hidden = 2560
    npc = npc or hidden
    floor = 1e-4 if fmt == "e4m3" else 6.0 * 2.0**-126
    qmax = 448.0 if fmt == "e4m3" else 6.0
    rows = []
    for peak in (floor * 0.999, floor, floor * 1.001, qmax, -qmax):
        row = torch.rand(hidden, device="cuda") * abs(peak) * torch.sign(torch.randn(hidden, device="cuda"))
        row[::npc] = peak
        rows.append(row)
    x = torch.stack(rows).to(DTYPES[in_dtype])
    for round_sf in (False, True):
        q, sf = quant.per_token_cast(x, fmt, npc, round_sf=round_sf)
        assert_same_codes_and_scales(q, sf, *per_token_cast_ref(x, fmt, npc, round_sf))


# --- round trips -------------------------------------------------------------------------------

CAST_BACK_NPC = {"e4m3": (32, 64, 128), "e2m1": (16, 32)}  # the groups per_token_cast_back is built for
ROUND_TRIPS = [(d, h, f, n) for d, h, f, n in grouped() if h in (2560, 7168) and n in CAST_BACK_NPC[f]]
ROUND_TRIPS += [(d, h, f, 0) for d, h, f in itertools.product(DTYPES, (2560, 7168), NPC)]


@pytest.mark.parametrize("v", ROUND_TRIPS, ids=vid)
def test_round_trip_through_cast_back(v: tuple[str, int, str, int]) -> None:
    in_dtype, hidden, fmt, npc = v
    npc = npc or hidden
    x = random_rows(4001, hidden, DTYPES[in_dtype], width=hidden + 64)  # strided rows on the way in
    q, sf = quant.per_token_cast(x, fmt, npc)
    y = quant.per_token_cast_back((q, sf), "fp32", npc)
    assert cast_error(x.float(), y) < ERROR_BOUND[fmt]
    assert torch.equal(y, dequant(q, sf, fmt, npc))  # fp32 out: the exact product


# --- CUDA graphs and torch.compile ----------------------------------------------------------


def _forms(x: torch.Tensor) -> dict[str, object]:
    """Each form on x (T, 2560); the strided one casts x[:, :2048] (rows 5120 bytes apart)."""
    _, sf = quant.per_token_cast(x, "e4m3", 128, round_sf=True)
    return {
        "sf_only": lambda t: (quant.per_token_cast_with_sf_only(t, "e4m3", 128),),
        "sf_only ue8m0": lambda t: (quant.per_token_cast_with_sf_only(
            t, "e2m1", 32, round_sf=True, use_tma_aligned_col_major_sf=True, use_packed_ue8m0=True),),
        "precomputed": lambda t: (quant.per_token_cast_with_precomputed_sf(t, "e4m3", 128, sf),),
        "per_row": lambda t: quant.per_token_cast(t, "e2m1", t.shape[1]),
        "strided": lambda t: quant.per_token_cast(t[:, :2048], "e4m3", 128),
    }


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The same elements as integers of the same size (a dtype view that keeps any strides)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


FORM_NAMES = ["sf_only", "sf_only ue8m0", "precomputed", "per_row", "strided"]


@pytest.mark.parametrize("name", FORM_NAMES)
def test_cuda_graph_replay(name: str) -> None:
    static_x = random_rows(257, 2560, torch.bfloat16)
    fn = _forms(static_x)[name]
    fn(static_x)  # warm-up: cubin loads stay out of the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(static_x)
    for _ in range(2):
        static_x.copy_(random_rows(257, 2560, torch.bfloat16))
        expected = fn(static_x)
        for o in static_out:
            _bits(o).fill_(0x7F)  # poison: replay must rewrite every element
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(static_out, expected, strict=True):
            assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("name", FORM_NAMES)
def test_torch_compile_fullgraph(name: str) -> None:
    x = random_rows(257, 2560, torch.bfloat16)
    fn = _forms(x)[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    for _ in range(2):
        x = random_rows(257, 2560, torch.bfloat16)
        for got, want in zip(compiled(x), fn(x), strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
            assert torch.equal(_bits(got), _bits(want))


# --- argument errors -------------------------------------------------------------------------


def test_precomputed_sf_errors_name_sf() -> None:
    x = random_rows(4, 2048, torch.bfloat16)
    with pytest.raises(TypeError, match=r"\bsf\b"):
        quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, [1.0] * 16)
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, torch.ones(4, 8, device="cuda"))
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, torch.ones(4, 16, device="cuda", dtype=torch.int32))
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):  # fp32 scales for the UE8M0 layout
        quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, torch.ones(4, 16, device="cuda"), round_sf=True,
                                                 use_tma_aligned_col_major_sf=True, use_packed_ue8m0=True)


def test_forms_check_their_options() -> None:
    x = random_rows(4, 2048, torch.bfloat16)
    with pytest.raises(ValueError, match=r"\bfmt\b"):
        quant.per_token_cast_with_sf_only(x, "e5m6", 128)
    with pytest.raises(ValueError, match=r"num_per_channels"):
        quant.per_token_cast_with_sf_only(x, "e4m3", 96)
    with pytest.raises(ValueError, match=r"use_packed_ue8m0"):
        quant.per_token_cast_with_sf_only(x, "e4m3", 128, use_packed_ue8m0=True)
    with pytest.raises(ValueError, match=r"x_block_size"):  # a plain tensor has no scale block
        quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, torch.ones(4, 16, device="cuda"), x_block_size=(1, 128))
    q, sf = quant.per_token_cast(x, "e4m3", 128)
    with pytest.raises(ValueError, match=r"x_block_size"):  # a quantized pair needs its scale block
        quant.per_token_cast((q, sf), "e2m1", 32)


def test_misaligned_row_stride_names_x() -> None:
    x = random_rows(8, 2048, torch.bfloat16, width=2049)  # 4098-byte rows: off the 16-byte grid
    for call in (lambda: quant.per_token_cast(x, "e4m3", 128), lambda: quant.per_token_cast_with_sf_only(x, "e4m3", 128)):
        with pytest.raises(errors.KernelArgumentError, match=r"\bx\b.*row stride"):
            call()


def test_per_row_of_an_unbuilt_hidden_is_refused() -> None:
    x = random_rows(4, 2112, torch.bfloat16)  # 2112 = 33 * 64: not in the grid
    with pytest.raises(errors.VariantNotFoundError, match="2112"):
        quant.per_token_cast(x, "e4m3", 2112)


def test_e5m6_routes_to_its_module_or_names_fmt() -> None:
    x = random_rows(4, 2048, torch.bfloat16)
    try:
        import importlib

        importlib.import_module(f"{tile_kernels_aot.__name__}.quant._e5m6")
    except ImportError:
        with pytest.raises(NotImplementedError, match=r"\bfmt\b"):
            quant.per_token_cast(x, "e5m6", 2048)
    else:
        q, _ = quant.per_token_cast(x, "e5m6", 2048)
        assert q.dtype == torch.uint8 and q.shape == (4, 2048 * 3 // 2)


# --- re-quantization of a (data, sf) pair ------------------------------------------------------

REQUANT = [("e4m3", 128, "e2m1", 32), ("e4m3", 128, "e4m3", 32), ("e2m1", 32, "e4m3", 128), ("e2m1", 16, "e2m1", 16),
           ("e4m3", 32, "e4m3", 0)]


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("hidden", [2560, 7168])
@pytest.mark.parametrize("case", REQUANT, ids=vid)
def test_requantization(case: tuple[str, int, str, int], hidden: int, num_tokens: int) -> None:
    """(data, sf) with x_block_size (1, npc_in): dequantized to fp32 first, then cast (KERNELS.md)."""
    fmt_in, npc_in, fmt, npc = case
    npc = npc or hidden
    x = random_rows(num_tokens, hidden, torch.bfloat16)
    pair = quant.per_token_cast(x, fmt_in, npc_in)
    q, sf = quant.per_token_cast(pair, fmt, npc, x_block_size=(1, npc_in))
    values = dequant(*pair, fmt_in, npc_in)
    assert_same_codes_and_scales(q, sf, *per_token_cast_ref(values, fmt, npc))
    assert_same_sf(quant.per_token_cast_with_sf_only(pair, fmt, npc, x_block_size=(1, npc_in)), sf)


def test_requantization_from_ue8m0_scales() -> None:
    x = random_rows(4001, 7168, torch.bfloat16)
    pair = quant.per_token_cast(x, "e4m3", 128, round_sf=True, use_tma_aligned_col_major_sf=True,
                                use_packed_ue8m0=True)
    q, sf = quant.per_token_cast(pair, "e2m1", 32, x_block_size=(1, 128))
    values = dequant(pair[0], pair[1], "e4m3", 128)
    assert_same_codes_and_scales(q, sf, *per_token_cast_ref(values, "e2m1", 32))
