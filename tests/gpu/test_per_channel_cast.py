"""GPU tests of ``per_channel_cast``, ``per_channel_cast_fused`` and ``per_channel_cast_and_transpose``.

Reference: tests/reference/quant_per_channel.py, run on the same GPU in fp32. FP8 codes and fp32
scales are exact formats: codes are compared as bytes and scales as int32 bits (tolerance:
none), except NaN codes, compared as "some NaN" (0x7F or 0xFF) because the hardware conversion's
NaN sign is not torch's. The caching allocator is filled with 0x7F bytes (an e4m3 NaN, and a NaN
pattern of fp32 scales) before each op call, and launchers are also called directly on poisoned
outputs, so an element the kernel fails to write shows up as a difference.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.gpu.compare import assert_same_codes_and_scales
from tests.gpu.installed import installed_package
from tests.gpu.poison import poison_allocator
from tests.reference.quant import cast_error, per_token_cast_ref
from tests.reference.quant_per_channel import (
    per_channel_cast_and_transpose_ref,
    per_channel_cast_ref,
    per_channel_dequant,
)

tile_kernels_aot, quant, errors, runtime = installed_package()

pytestmark = pytest.mark.gpu

# Every hidden takes the variants for any hidden (a multiple of 64): the common ones, and 64, 576, 1088 (a partial last
# 128-channel tile), 1536, 3072 and 3584 (TileKernels' and odd ones). An e4m3 pair needs whole 1 x 128 input blocks.
HIDDEN = (64, 576, 1088, 1536, 2048, 2560, 3072, 3584, 4096, 6144, 7168)
BUILT_HIDDEN: tuple[int, ...] = ()  # hiddens with variants of their own


def built(hidden: int) -> int:
    """The grid's hidden of the variant a call of this hidden takes."""
    return hidden if hidden in BUILT_HIDDEN else 0
PLAIN_DTYPES = (torch.bfloat16, torch.float32)
POISON_BYTE = 0x7F
PRODUCTION_TOKENS = 8192

# Every variant of kernel_specs/quant_per_channel.yaml's per_channel_cast_fused: (in_dtype, hidden, expand, round_sf).
FUSED = [
    (dtype, hidden, expand, round_sf)
    for dtype, hidden, expand, round_sf in itertools.product(
        ("bfloat16", "float32", "float8_e4m3fn"), HIDDEN, (False, True), (False, True)
    )
    if not (dtype == "float32" and expand) and not (dtype == "float8_e4m3fn" and hidden % 128)
]
TRANSPOSE = list(itertools.product(HIDDEN, (32, 128), (False, True)))


def fused_id(v: tuple[str, int, bool, bool]) -> str:
    return f"{v[0]}-H{v[1]}" + ("-expand" if v[2] else "") + ("-round_sf" if v[3] else "")


def random_columns(num_tokens: int, hidden: int, dtype: torch.dtype = torch.bfloat16, spread: float = 3.0) -> torch.Tensor:
    """Gaussian values with a random magnitude in [10^-spread, 10^spread] per channel; no exact zeros."""
    magnitude = torch.pow(10.0, torch.empty(1, hidden, device="cuda").uniform_(-spread, spread))
    x = torch.randn(num_tokens, hidden, device="cuda") * magnitude
    return torch.where(x == 0, torch.ones_like(x), x).to(dtype)


def fp8_pair(num_tokens: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An FP8 (q, sf) input with 1 x 128 scales, as per_token_cast makes it."""
    return per_token_cast_ref(random_columns(num_tokens, hidden, torch.float32), "e4m3", 128)


def positions(num_out: int, num_tokens: int) -> torch.Tensor:
    """int32 pos_to_token: random rows, about 1 in 8 entries -1, a few out of range (zero rows too)."""
    pos = torch.randint(0, max(num_tokens, 1), (num_out,), device="cuda", dtype=torch.int32)
    if num_tokens == 0:
        pos.fill_(-1)
    pos[torch.rand(num_out, device="cuda") < 0.125] = -1
    if num_out >= 16:
        pos[5], pos[11] = num_tokens, -7  # outside [0, num_tokens): zero rows, never a fault
    return pos


def input_for(dtype: str, num_tokens: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    if dtype == "float8_e4m3fn":
        return fp8_pair(num_tokens, hidden)
    return random_columns(num_tokens, hidden, getattr(torch, dtype)), None


def assert_codes_match_with_nan(q: torch.Tensor, ref_q: torch.Tensor) -> None:
    """Bytes equal, except that any NaN code (0x7F / 0xFF) matches any NaN code."""
    got, want = q.view(torch.uint8), ref_q.view(torch.uint8)
    got_nan, want_nan = (got & 0x7F) == 0x7F, (want & 0x7F) == 0x7F
    assert torch.equal(got_nan, want_nan), f"{int((got_nan != want_nan).sum())} NaN codes differ"
    wrong = int(((got != want) & ~want_nan).sum())
    assert wrong == 0, f"{wrong} of {q.numel()} code bytes differ from the reference"


# --- per_channel_cast ----------------------------------------------------------------------


@pytest.mark.parametrize("num_tokens", [0, 128, PRODUCTION_TOKENS])
@pytest.mark.parametrize("round_sf", [False, True])
@pytest.mark.parametrize("dtype", PLAIN_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_per_channel_cast(hidden: int, dtype: torch.dtype, round_sf: bool, num_tokens: int) -> None:
    x = random_columns(num_tokens, hidden, dtype)
    poison_allocator(2 * num_tokens * hidden + 4096)
    q, sf = quant.per_channel_cast(x, "e4m3", 128, round_sf=round_sf)
    ref_q, ref_sf = per_channel_cast_ref(x, round_sf)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)


@pytest.mark.parametrize("num_tokens", [1, 4001, 8191])
def test_per_channel_cast_needs_whole_token_groups(num_tokens: int) -> None:
    x = random_columns(num_tokens, 2048)
    with pytest.raises(ValueError, match=r"^x: num_tokens .*multiple of 128"):
        quant.per_channel_cast(x, "e4m3", 128)


@pytest.mark.parametrize("round_sf", [False, True])
def test_per_channel_cast_dequantization_error(round_sf: bool) -> None:
    x = torch.randn(PRODUCTION_TOKENS, 7168, device="cuda").to(torch.bfloat16)
    q, sf = quant.per_channel_cast(x, "e4m3", 128, round_sf=round_sf)
    assert cast_error(x.float(), per_channel_dequant(q, sf)) < 1e-3  # KERNELS.md's e4m3 bound


@pytest.mark.parametrize("round_sf", [False, True])
@pytest.mark.parametrize("dtype", PLAIN_DTYPES, ids=str)
def test_extreme_magnitudes(dtype: torch.dtype, round_sf: bool) -> None:
    """Columns around the amax floor 1e-4, tiny and -0.0 columns, and the format's maximum."""
    x = random_columns(256, 2048, torch.float32, spread=0.5)
    x[:, 0:8] *= 1e-9  # far below the floor: sf = 1e-4 / 448, codes of tiny values
    for c, amax in enumerate((0.99e-4, 1e-4, 1.01e-4)):
        x[:, 8 + c] = x[:, 8 + c].sign() * amax / 2
        x[17, 8 + c] = -amax
    x[:, 16:24] = -0.0
    x[:, 24] = 448.0  # q = 448 exactly (sf = 1)
    x[3, 25] = torch.finfo(torch.bfloat16).max  # the largest bf16: sf near 2^119
    x = x.to(dtype)
    q, sf = quant.per_channel_cast(x, "e4m3", 128, round_sf=round_sf)
    ref_q, ref_sf = per_channel_cast_ref(x, round_sf)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)
    assert set(q[:, 24].view(torch.uint8).tolist()) == {0x7E}


@pytest.mark.parametrize("round_sf", [False, True])
def test_nan_is_left_out_of_the_scale_and_coded_as_nan(round_sf: bool) -> None:
    """As TileKernels (fmaxf amax, no clamp): NaN never hides in a finite code or a scale."""
    x = random_columns(256, 4096, torch.float32)
    x[5, 100], x[130, 100], x[7, 4095] = float("nan"), -float("nan"), float("nan")
    x = x.to(torch.bfloat16)
    q, sf = quant.per_channel_cast(x, "e4m3", 128, round_sf=round_sf)
    ref_q, ref_sf = per_channel_cast_ref(x, round_sf)
    assert torch.equal(sf.view(torch.int32), ref_sf.view(torch.int32)) and not torch.isnan(sf).any()
    for t, c in ((5, 100), (130, 100), (7, 4095)):
        assert q[t, c].view(torch.uint8).item() & 0x7F == 0x7F, f"x[{t}, {c}] = NaN did not give a NaN code"
    assert_codes_match_with_nan(q, ref_q)


# --- per_channel_cast_fused ------------------------------------------------------------------


@pytest.mark.parametrize(("num_tokens", "num_out"), [(0, 16), (1, 16), (4001, 4016), (4001, PRODUCTION_TOKENS), (8192, 0)])
@pytest.mark.parametrize("v", [v for v in FUSED if v[2]], ids=fused_id)
def test_fused_gather(v: tuple[str, int, bool, bool], num_tokens: int, num_out: int) -> None:
    dtype, hidden, _, round_sf = v
    x, x_sf = input_for(dtype, num_tokens, hidden)
    pos = positions(num_out, num_tokens)
    poison_allocator(2 * num_out * hidden + 4096)
    arg = x if x_sf is None else (x, x_sf)
    q, sf = quant.per_channel_cast_fused(arg, "e4m3", 128, round_sf=round_sf,
                                         num_per_channels=None if x_sf is None else 128, pos_to_token=pos)
    ref_q, ref_sf = per_channel_cast_ref(x, round_sf, pos_to_token=pos, x_sf=x_sf)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)


@pytest.mark.parametrize("num_tokens", [0, 128, PRODUCTION_TOKENS])
@pytest.mark.parametrize("v", [v for v in FUSED if not v[2] and v[0] != "float32"], ids=fused_id)
def test_fused_without_gather(v: tuple[str, int, bool, bool], num_tokens: int) -> None:
    dtype, hidden, _, round_sf = v
    x, x_sf = input_for(dtype, num_tokens, hidden)
    arg = x if x_sf is None else (x, x_sf)
    poison_allocator(2 * num_tokens * hidden + 4096)
    q, sf = quant.per_channel_cast_fused(arg, "e4m3", 128, round_sf=round_sf,
                                         num_per_channels=None if x_sf is None else 128)
    ref_q, ref_sf = per_channel_cast_ref(x, round_sf, x_sf=x_sf)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)


@pytest.mark.parametrize("v", FUSED, ids=fused_id)
def test_launcher_overwrites_poisoned_outputs(v: tuple[str, int, bool, bool]) -> None:
    """Every code and scale is written, also in a last, partial group of 16 rows (gather)."""
    dtype, hidden, expand, round_sf = v
    num_out = 144 if expand else 256
    x, x_sf = input_for(dtype, 300, hidden)
    pos = positions(num_out, 300) if expand else None
    if not expand:
        x, x_sf = x[:num_out], None if x_sf is None else x_sf[:num_out]
    q = torch.full((num_out, hidden), POISON_BYTE, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    sf = torch.full((-(-num_out // 128), hidden), float("nan"), device="cuda")
    launch = runtime.get_kernel("per_channel_cast_fused").select(in_dtype=dtype, hidden=built(hidden), expand=expand,
                                                                 round_sf=round_sf)
    launch(*[t for t in (x, x_sf, pos) if t is not None], q, sf)
    torch.cuda.synchronize()
    ref_q, ref_sf = per_channel_cast_ref(x, round_sf, pos_to_token=pos, x_sf=x_sf)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)


def test_fused_nan_in_a_pair_input() -> None:
    x, x_sf = fp8_pair(256, 2048)
    x.view(torch.uint8)[9, 77] = 0xFF  # an e4m3 NaN code
    q, sf = quant.per_channel_cast_fused((x, x_sf), "e4m3", 128, num_per_channels=128)
    ref_q, ref_sf = per_channel_cast_ref(x, x_sf=x_sf)
    assert torch.equal(sf.view(torch.int32), ref_sf.view(torch.int32))
    assert q[9, 77].view(torch.uint8).item() & 0x7F == 0x7F
    assert_codes_match_with_nan(q, ref_q)


# --- per_channel_cast_and_transpose ----------------------------------------------------------


@pytest.mark.parametrize("num_tokens", [0, 128, PRODUCTION_TOKENS])
@pytest.mark.parametrize("v", TRANSPOSE, ids=lambda v: f"H{v[0]}-npt{v[1]}" + ("-round_sf" if v[2] else ""))
def test_per_channel_cast_and_transpose(v: tuple[int, int, bool], num_tokens: int) -> None:
    hidden, npt, round_sf = v
    x = random_columns(num_tokens, hidden)
    poison_allocator(2 * num_tokens * hidden + 4096)
    q, sf = quant.per_channel_cast_and_transpose(x, "e4m3", npt, round_sf=round_sf)
    ref_q, ref_sf = per_channel_cast_and_transpose_ref(x, npt, round_sf)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)


@pytest.mark.parametrize("v", TRANSPOSE, ids=lambda v: f"H{v[0]}-npt{v[1]}" + ("-round_sf" if v[2] else ""))
def test_transpose_launcher_overwrites_poisoned_outputs(v: tuple[int, int, bool]) -> None:
    hidden, npt, round_sf = v
    x = random_columns(384, hidden)
    q = torch.full((hidden, 384), POISON_BYTE, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    sf = torch.full((384 // npt, hidden), float("nan"), device="cuda")
    runtime.get_kernel("per_channel_cast_and_transpose").select(hidden=built(hidden), npt=npt,
                                                                round_sf=round_sf)(x, q, sf)
    torch.cuda.synchronize()
    ref_q, ref_sf = per_channel_cast_and_transpose_ref(x, npt, round_sf)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)


@pytest.mark.parametrize("num_tokens", [1, 4001, 8192 + 32])
def test_transpose_needs_a_multiple_of_128_tokens(num_tokens: int) -> None:
    x = random_columns(num_tokens, 2048)
    with pytest.raises(ValueError, match=r"^x: num_tokens .*multiple of 128"):
        quant.per_channel_cast_and_transpose(x, "e4m3", 32)


@pytest.mark.parametrize("npt", [32, 128])
def test_transpose_extremes_and_nan(npt: int) -> None:
    x = random_columns(256, 2048, torch.float32, spread=0.5)
    x[:, 0:8] *= 1e-9
    x[:, 8] = 448.0
    x[:, 9] = -0.0
    x[40, 10], x[200, 11] = float("nan"), -float("nan")
    x = x.to(torch.bfloat16)
    q, sf = quant.per_channel_cast_and_transpose(x, "e4m3", npt)
    ref_q, ref_sf = per_channel_cast_and_transpose_ref(x, npt)
    assert torch.equal(sf.view(torch.int32), ref_sf.view(torch.int32)) and not torch.isnan(sf).any()
    assert q[10, 40].view(torch.uint8).item() & 0x7F == 0x7F and q[11, 200].view(torch.uint8).item() & 0x7F == 0x7F
    assert_codes_match_with_nan(q, ref_q)


@pytest.mark.parametrize("round_sf", [False, True])
def test_inf_gives_an_inf_scale_a_nan_code_and_zeros(round_sf: bool) -> None:
    """An Inf in a group: sf = Inf and the factor 0 (also with round_sf, whose exponent negation would
    give -Inf), so the Inf's own code is NaN (Inf * 0) and the group's other codes are 0; the other
    groups are untouched. All three per-channel kernels."""
    x = random_columns(256, 2048, torch.float32, spread=0.5)
    x[5, 100], x[130, 101], x[7, 2047] = float("inf"), -float("inf"), float("inf")
    x = x.to(torch.bfloat16)
    inf_at = ((5, 100), (130, 101), (7, 2047))
    for dtype in PLAIN_DTYPES:
        xd = x.to(dtype)
        q, sf = quant.per_channel_cast(xd, "e4m3", 128, round_sf=round_sf)
        ref_q, ref_sf = per_channel_cast_ref(xd, round_sf)
        assert_same_codes_and_scales(q, sf, ref_q, ref_sf)
        for t, c in inf_at:
            assert sf[t // 128, c].item() == float("inf") and q[t, c].view(torch.uint8).item() & 0x7F == 0x7F
        group = q[0:128, 100].view(torch.uint8)
        assert int(((group == 0) | (group == 0x80)).sum()) == 127, "the other codes of an Inf group are +-0"
    for npt in (32, 128):
        q, sf = quant.per_channel_cast_and_transpose(x, "e4m3", npt, round_sf=round_sf)
        ref_q, ref_sf = per_channel_cast_and_transpose_ref(x, npt, round_sf)
        assert torch.equal(sf.view(torch.int32), ref_sf.view(torch.int32))
        assert all(q[c, t].view(torch.uint8).item() & 0x7F == 0x7F for t, c in inf_at)
        assert_codes_match_with_nan(q, ref_q)


# --- bad inputs: Python errors naming the argument, never a launch --------------------------


def test_bad_arguments_name_the_argument() -> None:
    x = random_columns(128, 2048)
    cases = [
        (lambda: quant.per_channel_cast(x, "e5m2", 128), ValueError, r"^fmt:"),
        (lambda: quant.per_channel_cast(x, "e4m3", 64), ValueError, r"^num_per_tokens:"),
        (lambda: quant.per_channel_cast(x.half(), "e4m3", 128), TypeError, r"^x:.*float16"),
        (lambda: quant.per_channel_cast(x[0], "e4m3", 128), ValueError, r"^x:.*2-D"),
        (lambda: quant.per_channel_cast_and_transpose(x.float(), "e4m3", 32), TypeError, r"^x:"),
        (lambda: quant.per_channel_cast_and_transpose(x, "e4m3", 64), ValueError, r"^num_per_tokens:"),
        (lambda: quant.per_channel_cast_fused(x, "e4m3", 128, num_per_channels=128), ValueError,
         r"^num_per_channels:"),
        (lambda: quant.per_channel_cast_fused(x, "e4m3", 128, pos_to_token=torch.zeros(17, dtype=torch.int32,
                                                                                        device="cuda")),
         ValueError, r"^pos_to_token:.*multiple of 16"),
        (lambda: quant.per_channel_cast_fused(x[:100], "e4m3", 128), ValueError, r"^x: num_tokens"),
    ]
    x8, sf8 = fp8_pair(128, 2048)
    cases += [
        (lambda: quant.per_channel_cast_fused((x8, sf8), "e4m3", 128), ValueError, r"^num_per_channels:"),
        (lambda: quant.per_channel_cast_fused((x, sf8), "e4m3", 128, num_per_channels=128), TypeError, r"^x:"),
    ]
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()


def test_tensor_errors_come_from_the_launcher() -> None:
    x = random_columns(128, 2048)
    x8, sf8 = fp8_pair(128, 2048)
    with pytest.raises(errors.KernelArgumentError, match=r"\bx_sf\b"):
        quant.per_channel_cast_fused((x8, sf8[:, :8]), "e4m3", 128, num_per_channels=128)
    with pytest.raises(errors.KernelArgumentError, match=r"\bpos_to_token\b"):
        quant.per_channel_cast_fused(x, "e4m3", 128, pos_to_token=torch.zeros(16, dtype=torch.int64, device="cuda"))
    with pytest.raises(errors.KernelArgumentError, match=r"\bx\b"):
        quant.per_channel_cast(torch.ones(256, 2048, dtype=torch.bfloat16, device="cuda")[::2], "e4m3", 128)
    with pytest.raises(errors.KernelError, match=r"\bx\b"):
        quant.per_channel_cast(x.cpu(), "e4m3", 128)
    with pytest.raises(errors.KernelArgumentError, match=r"^x: .*hidden % 64 == 0"):  # the launcher's requires
        quant.per_channel_cast(random_columns(128, 544), "e4m3", 128)
    x8, sf8 = fp8_pair(128, 640)
    with pytest.raises(ValueError, match=r"^x: the hidden of a \(q, sf\) pair \(576\) must be a multiple of 128"):
        quant.per_channel_cast_fused((x8[:, :576].contiguous(), sf8), "e4m3", 128, num_per_channels=128)


# --- CUDA graphs, torch.compile, streams -----------------------------------------------------


def _ops() -> dict[str, tuple]:
    x = random_columns(256, 2048)
    x8, sf8 = fp8_pair(256, 2048)
    pos = positions(272, 256)
    return {
        "per_channel_cast": (lambda t: quant.per_channel_cast(t, "e4m3", 128, round_sf=True), x),
        "per_channel_cast_fused gather": (lambda t: quant.per_channel_cast_fused(t, "e4m3", 128, pos_to_token=pos), x),
        "per_channel_cast_fused pair": (
            lambda t: quant.per_channel_cast_fused((t.view(torch.float8_e4m3fn), sf8), "e4m3", 128,
                                                   num_per_channels=128, pos_to_token=pos),
            x8.view(torch.uint8) & 0x77),  # codes as bytes, kept off NaN
        "per_channel_cast_and_transpose": (lambda t: quant.per_channel_cast_and_transpose(t, "e4m3", 32), x),
    }


def _refresh(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.uint8:
        return torch.randint(0, 256, x.shape, dtype=torch.uint8, device="cuda") & 0x77
    return torch.randn_like(x.float()).to(x.dtype)


@pytest.mark.parametrize("name", list(_ops()))
def test_cuda_graph_capture_and_replay(name: str) -> None:
    fn, x = _ops()[name]
    static_x = x.clone()
    fn(static_x)  # warm-up: cubin loads stay out of the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(static_x)
    for _ in range(2):
        static_x.copy_(_refresh(static_x))
        expected = fn(static_x)
        for o in static_out:
            o.view(torch.uint8).fill_(POISON_BYTE)  # replay must rewrite every byte
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(static_out, expected, strict=True):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("name", list(_ops()))
def test_torch_compile_fullgraph_matches_eager(name: str) -> None:
    fn, x = _ops()[name]
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: fn(t), fullgraph=True)
    for _ in range(2):
        x = _refresh(x)
        for got, want in zip(compiled(x), fn(x), strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_runs_on_the_current_stream() -> None:
    x = random_columns(PRODUCTION_TOKENS, 7168)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        q, sf = quant.per_channel_cast_and_transpose(x, "e4m3", 128)
    stream.synchronize()
    ref_q, ref_sf = per_channel_cast_and_transpose_ref(x, 128)
    assert_same_codes_and_scales(q, sf, ref_q, ref_sf)


def test_the_transposing_launcher_itself_refuses_partial_token_tiles() -> None:
    """The spec's requires (num_tokens % 128 == 0) are in the launcher's contract: a direct call of the launcher,
    past the op's checks, raises naming x instead of reading and writing past the last whole tile."""
    launch = runtime.get_kernel("per_channel_cast_and_transpose").select(hidden=0, npt=128, round_sf=False)
    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    q = torch.full((2048, 64), 0x7F, device="cuda", dtype=torch.uint8).view(torch.float8_e4m3fn)
    sf = torch.empty(64 // 128, 2048, device="cuda")  # the shape the contract reads from num_tokens
    with pytest.raises(errors.KernelArgumentError, match=r"^x: the kernel requires num_tokens % 128 == 0, got "
                                                         r"num_tokens = 64"):
        launch(x, q, sf)
    torch.cuda.synchronize()
    assert bool((q.view(torch.uint8) == 0x7F).all())  # nothing was launched
