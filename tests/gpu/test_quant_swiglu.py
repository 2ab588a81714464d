"""GPU tests of the fused SwiGLU + FP8 cast ops against tests/reference/quant_swiglu.py.

Tolerances. The kernels compute SwiGLU in fp32 in the reference's order with IEEE expf and
IEEE division (no fast-math), and the backward takes 1 + xf * (1 - s) as one FMA, as TileKernels'
kernel and reference do (the reference's fma_f32). Codes and scales are then bit-identical to
the reference on the H200 (CODE_TOLERANCE = 0, checked at 0.1% first): assert_codes_close still
reports how many differ and, under a bit-identical scale, how many code steps apart.
bf16 outputs of the backward (the weighted activation and the gradient): within one bf16 ulp
(rtol 2^-7). weight_grad (a sum over 2H products whose order differs from torch's):
|got - exact| <= 1e-5 * sum |g * act| + 1e-6 against a float64 sum.
Outputs are poisoned (0x7F bytes, NaN) wherever the test calls the launchers directly, so an
element the kernel fails to write fails the comparison.
Non-finite inputs (NaN and +-Inf in either half of x) follow the kernels' rule stated in
tests/reference/quant_swiglu.py: bit-exact codes and scales there too, and a NaN x always gives a
NaN code, with or without a clamp.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.reference.quant import per_token_cast_ref
from tests.reference.quant_swiglu import (
    clamped_counts_ref,
    expert_major_routing,
    swiglu_backward_ref,
    swiglu_forward_and_per_channel_cast_and_transpose_ref,
    swiglu_forward_and_per_token_cast_ref,
)

tile_kernels_aot, quant, errors, runtime = installed_package()

pytestmark = pytest.mark.gpu

HIDDEN = (2048, 2560, 4096, 6144, 7168)
CLAMPS = (None, 0.5)
POISON_BYTE = 0x7F  # an FP8 NaN
CODE_TOLERANCE = 0.0  # fraction of codes (and of scales) that may differ: none, on the H200


# --- inputs ----------------------------------------------------------------------------------


def random_x(rows: int, width: int) -> torch.Tensor:
    """bf16 Gaussian rows times 2 (so a 0.5 clamp bites), no exact zeros."""
    x = torch.randn(rows, width, device="cuda") * 2
    return torch.where(x == 0, torch.full_like(x, 1e-3), x).bfloat16()


# (row, half, channel, value) written into x (N, 2H), half 0 the left (xl) and 1 the right (xr):
# NaN in either half, +Inf on the left (activation +Inf without a clamp), -Inf on the left
# (-Inf / Inf: NaN), +-Inf on the right (the clamp bound, or an Inf activation and an Inf amax).
NONFINITE = ((0, 0, 3, float("nan")), (1, 1, 5, float("nan")), (2, 0, 7, float("inf")), (3, 0, 9, -float("inf")),
             (4, 1, 11, float("inf")), (5, 1, 13, -float("inf")))
NAN_ACTIVATIONS = [(0, 3), (1, 5), (3, 9)]  # (row, channel) whose activation is NaN, clamped or not


def with_nonfinite(x: torch.Tensor) -> torch.Tensor:
    """x (N >= 6, 2H) bf16 with NONFINITE written into it."""
    x = x.clone()
    hidden = x.shape[1] // 2
    for row, half, channel, value in NONFINITE:
        x[row, half * hidden + channel] = value
    return x


def assert_nan_codes_at(q: torch.Tensor, where: list[tuple[int, int]]) -> None:
    """The codes at these (row, column) positions are the e4m3 NaN (NaN never hides in a finite code)."""
    for r, c in where:
        assert int(q[r, c].view(torch.uint8)) & 0x7F == 0x7F, f"q[{r}, {c}] of a NaN input is not a NaN code"


# --- comparisons -----------------------------------------------------------------------------


def _ordinal(q: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes -> signed rank (sign-magnitude): adjacent codes differ by one."""
    b = q.view(torch.uint8).to(torch.int32)
    return torch.where(b >= 0x80, -(b & 0x7F), b)


def assert_codes_close(q: torch.Tensor, sf_per_element: torch.Tensor, ref_q: torch.Tensor,
                       ref_sf_per_element: torch.Tensor, sf: torch.Tensor, ref_sf: torch.Tensor) -> None:
    """The module docstring's tolerance; sf_per_element is each code's scale (q's shape)."""
    assert q.shape == ref_q.shape and q.dtype == torch.float8_e4m3fn
    assert sf.shape == ref_sf.shape and sf.dtype == torch.float32
    wrong_sf = int((sf.view(torch.int32) != ref_sf.view(torch.int32)).sum())
    assert wrong_sf <= CODE_TOLERANCE * sf.numel(), f"{wrong_sf} of {sf.numel()} scale factors differ"
    wrong = q.view(torch.uint8) != ref_q.view(torch.uint8)
    wrong_q = int(wrong.sum())
    assert wrong_q <= CODE_TOLERANCE * q.numel(), f"{wrong_q} of {q.numel()} codes differ from the reference"
    same_scale = sf_per_element.view(torch.int32) == ref_sf_per_element.view(torch.int32)
    steps = (_ordinal(q) - _ordinal(ref_q)).abs()[wrong & same_scale]
    assert steps.numel() == 0 or int(steps.max()) <= 1, f"codes up to {int(steps.max())} steps apart"


def assert_per_token_close(q: torch.Tensor, sf: torch.Tensor, ref_q: torch.Tensor, ref_sf: torch.Tensor,
                           npc: int) -> None:
    assert_codes_close(q, sf.repeat_interleave(npc, dim=1), ref_q, ref_sf.repeat_interleave(npc, dim=1), sf, ref_sf)


def assert_bf16_close(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    assert got.dtype == torch.bfloat16 and got.shape == want.shape, name
    torch.testing.assert_close(got.float(), want.float(), rtol=2.0**-7, atol=1e-30, msg=lambda m: f"{name}: {m}")


# --- swiglu_forward_and_per_token_cast -------------------------------------------------------

FWD = [(h, npc, r, w, p) for h in HIDDEN for npc in (128, h) for r, w, p in itertools.product((False, True), repeat=3)]


def fwd_id(v: tuple[int, int, bool, bool, bool]) -> str:
    hidden, npc, round_sf, with_weights, with_pos_to_expert = v
    return (f"H{hidden}-npc{npc}" + ("-round_sf" if round_sf else "") + ("-weights" if with_weights else "")
            + ("-pos_to_expert" if with_pos_to_expert else ""))


def run_forward(v: tuple[int, int, bool, bool, bool], num_tokens: int, num_topk: int, clamp: float | None,
                poisoned: bool = False) -> None:
    hidden, npc, round_sf, with_weights, with_pos_to_expert = v
    pos_to_expert, pos_to_token_topk, _ = expert_major_routing(num_tokens, num_topk)
    rows = pos_to_expert.shape[0]
    x = random_x(rows, 2 * hidden)
    weights = torch.randn(num_tokens, num_topk, device="cuda")
    p2t = pos_to_token_topk if with_weights else None
    w = weights if with_weights else None
    p2e = pos_to_expert if with_pos_to_expert else None
    if poisoned:
        q = torch.full((rows, hidden), POISON_BYTE, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        sf = torch.full((rows, hidden // npc), float("nan"), device="cuda")
        launch = runtime.get_kernel("swiglu_forward_and_per_token_cast").select(
            hidden=hidden, npc=0 if npc == hidden else npc, with_weights=with_weights,
            with_pos_to_expert=with_pos_to_expert, sf_layout="row_major", count_clamp=False)
        placeholder = torch.zeros(1, dtype=torch.int32, device="cuda")
        launch(x, q, sf, p2t if p2t is not None else placeholder,
               w if w is not None else torch.zeros(1, 1, device="cuda"),
               p2e if p2e is not None else placeholder, float("inf") if clamp is None else clamp, int(round_sf))
    else:
        q, sf = quant.swiglu_forward_and_per_token_cast(
            x, "e4m3", npc, pos_to_token_topk=p2t, topk_weights=w, pos_to_expert=p2e, round_sf=round_sf,
            swiglu_clamp_value=clamp)
    torch.cuda.synchronize()
    ref_q, ref_sf = swiglu_forward_and_per_token_cast_ref(x, npc, p2t, w, round_sf, clamp)
    if p2e is not None:
        keep = pos_to_expert >= 0
        if poisoned:  # skipped rows are never written
            assert bool((q[~keep].view(torch.uint8) == POISON_BYTE).all()) and bool(sf[~keep].isnan().all())
        q, sf, ref_q, ref_sf = q[keep], sf[keep], ref_q[keep], ref_sf[keep]
    assert_per_token_close(q, sf, ref_q, ref_sf, npc)


@pytest.mark.parametrize("clamp", CLAMPS)
@pytest.mark.parametrize("v", FWD, ids=fwd_id)
def test_forward_every_variant(v: tuple[int, int, bool, bool, bool], clamp: float | None) -> None:
    run_forward(v, num_tokens=257, num_topk=2, clamp=clamp, poisoned=True)


@pytest.mark.parametrize(("num_tokens", "num_topk"), [(0, 6), (1, 6), (4001, 6), (8192, 2)])
@pytest.mark.parametrize("v", [(7168, 128, True, True, True), (7168, 7168, False, True, True),
                               (2560, 128, False, True, False), (2560, 2560, True, False, True)], ids=fwd_id)
def test_forward_sizes(v: tuple[int, int, bool, bool, bool], num_tokens: int, num_topk: int) -> None:
    run_forward(v, num_tokens, num_topk, clamp=10.0)
    run_forward(v, num_tokens, num_topk, clamp=None, poisoned=True)


def division_range_x(rows: int, width: int) -> torch.Tensor:
    """bf16 rows around the edges of the kernels' fast division (every |xl| of a thread in [2^-63, 64]):
    whole rows scaled by 2^-72 .. 2^12, and Gaussian rows with one value per 256 columns (so one
    thread of each) set to an edge: 64 and the next bf16 above, 2^-63 and the next below, -87.5 and
    -88.5 (where 1 + exp(-x) nears and passes 2^126), -100 (exp overflows) and +-0. (Inf and NaN, which
    also take the IEEE division, are test_forward_nan_and_inf's.)"""
    x = random_x(rows, width).float()
    index = torch.arange(rows, device="cuda")
    scaled = index[index % 2 == 0]
    x[scaled] *= torch.exp2((scaled // 2 % 29).float() * 3 - 72)[:, None]
    edges = torch.tensor([64.0, 64.5, -64.0, -64.5, 2.0**-63, 2.0**-63 * (1 - 2.0**-8), -(2.0**-63), -87.5, -88.5,
                          -100.0, 0.0, -0.0], device="cuda")
    marked, cols = index[index % 2 == 1], torch.arange(0, width, 256, device="cuda")
    pick = (torch.arange(marked.numel(), device="cuda")[:, None] + torch.arange(cols.numel(), device="cuda")) % edges.numel()
    x[marked[:, None], cols] = edges[pick]
    return x.bfloat16()


@pytest.mark.parametrize("clamp", (None, 0.5, 2.0**-70))
@pytest.mark.parametrize("v", [(7168, 128, True, True, False), (2560, 2560, False, False, False),
                               (2048, 128, False, True, True)], ids=fwd_id)
def test_forward_division_edges(v: tuple[int, int, bool, bool, bool], clamp: float | None) -> None:
    # Rows on both sides of the fast division's range, and threads with one value outside it (those
    # take the IEEE division); a clamp below 2^-63 sends every thread there.
    hidden, npc, round_sf, with_weights, with_pos_to_expert = v
    pos_to_expert, pos_to_token_topk, _ = expert_major_routing(64, 2)
    rows = pos_to_expert.shape[0]
    x = division_range_x(rows, 2 * hidden)
    weights = torch.rand(64, 2, device="cuda") + 0.5
    p2t, w = (pos_to_token_topk, weights) if with_weights else (None, None)
    p2e = pos_to_expert if with_pos_to_expert else None
    q, sf = quant.swiglu_forward_and_per_token_cast(x, "e4m3", npc, pos_to_token_topk=p2t, topk_weights=w,
                                                    pos_to_expert=p2e, round_sf=round_sf, swiglu_clamp_value=clamp)
    ref_q, ref_sf = swiglu_forward_and_per_token_cast_ref(x, npc, p2t, w, round_sf, clamp)
    if p2e is not None:
        keep = pos_to_expert >= 0
        q, sf, ref_q, ref_sf = q[keep], sf[keep], ref_q[keep], ref_sf[keep]
    assert_per_token_close(q, sf, ref_q, ref_sf, npc)


@pytest.mark.parametrize("clamp", (None, 0.5, 10.0))
@pytest.mark.parametrize("v", [(7168, 128, True, False, False), (2560, 2560, False, False, False),
                               (2048, 128, False, False, False)], ids=fwd_id)
def test_forward_nan_and_inf(v: tuple[int, int, bool, bool, bool], clamp: float | None) -> None:
    hidden, npc, round_sf, _, _ = v
    x = with_nonfinite(random_x(8, 2 * hidden))
    q, sf = quant.swiglu_forward_and_per_token_cast(x, "e4m3", npc, round_sf=round_sf, swiglu_clamp_value=clamp)
    ref_q, ref_sf = swiglu_forward_and_per_token_cast_ref(x, npc, None, None, round_sf, clamp)
    assert_per_token_close(q, sf, ref_q, ref_sf, npc)
    assert_nan_codes_at(q, NAN_ACTIVATIONS)


def test_forward_padding_rows_without_pos_to_expert_are_zero() -> None:
    # pos_to_token_topk -1 means weight 0: the row quantizes to zero codes (+0 or -0: y * 0 keeps
    # the sign of y) with the floor scale.
    x = random_x(3, 4096)
    q, sf = quant.swiglu_forward_and_per_token_cast(
        x, "e4m3", 128, pos_to_token_topk=torch.tensor([1, -1, 0], dtype=torch.int32, device="cuda"),
        topk_weights=torch.tensor([[0.5, 2.0]], device="cuda"))
    assert bool((q[1].float() == 0).all())
    assert torch.equal(sf[1], torch.full((16,), 1e-4, device="cuda") / torch.full((16,), 448.0, device="cuda"))



@pytest.mark.parametrize("rows", [1, 3, 5])
@pytest.mark.parametrize("v", [(7168, 128, True, False, False), (2560, 2560, False, False, True)], ids=fwd_id)
def test_forward_last_block_stays_in_its_rows(v: tuple[int, int, bool, bool, bool], rows: int) -> None:
    # A block computes two rows (the second fetched while the first is computed): with an odd row
    # count the last block's second row is past the end. q and sf are the first rows of poisoned buffers
    # one row longer, whose last row must stay poisoned; the rows before it match the reference.
    hidden, npc, round_sf, _, with_pos_to_expert = v
    x = random_x(rows, 2 * hidden)
    q_all = torch.full((rows + 1, hidden), POISON_BYTE, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    sf_all = torch.full((rows + 1, hidden // npc), float("nan"), device="cuda")
    placeholder = torch.zeros(1, dtype=torch.int32, device="cuda")
    p2e = torch.zeros(rows, dtype=torch.int32, device="cuda") if with_pos_to_expert else placeholder
    launch = runtime.get_kernel("swiglu_forward_and_per_token_cast").select(
        hidden=hidden, npc=0 if npc == hidden else npc, with_weights=False, with_pos_to_expert=with_pos_to_expert,
        sf_layout="row_major", count_clamp=False)
    launch(x, q_all[:rows], sf_all[:rows], placeholder, torch.zeros(1, 1, device="cuda"), p2e, 10.0, int(round_sf))
    torch.cuda.synchronize()
    assert bool((q_all[rows].view(torch.uint8) == POISON_BYTE).all()) and bool(sf_all[rows].isnan().all())
    ref_q, ref_sf = swiglu_forward_and_per_token_cast_ref(x, npc, None, None, round_sf, 10.0)
    assert_per_token_close(q_all[:rows], sf_all[:rows], ref_q, ref_sf, npc)


# --- the variant for any hidden (every layout, clamped_count, sf_clamp_min) ----------------------

# Hiddens no variant is built for (TileKernels' 1024 .. 3584 among them, and one above 8192), and 2048, which one is
# built for: its layouts and options other than row-major scales take the generic variant too.
GENERIC_HIDDEN = (128, 1024, 1280, 1536, 2048, 3072, 3584, 12288)
LAYOUTS = ("row_major", "col_major", "ue8m0")


def poisoned_out(rows: int, hidden: int, npc: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, sf) as the op returns them for the layout, every byte poisoned (sf: NaN, or 0x7F bytes)."""
    q = torch.full((rows, hidden), POISON_BYTE, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    groups, padded = hidden // npc, -(-rows // 4) * 4
    if layout == "row_major":
        return q, torch.full((rows, groups), float("nan"), device="cuda")
    if layout == "col_major":
        return q, torch.full((groups, padded), float("nan"), device="cuda").T[:rows]
    words = torch.full(((groups + 3) // 4, padded), 0x7F7F7F7F, dtype=torch.int32, device="cuda")
    return q, words.T[:rows]


def scale_values(sf: torch.Tensor, groups: int, layout: str, written: torch.Tensor) -> torch.Tensor:
    """The fp32 scales (rows, groups) of sf in the layout; for UE8M0 the bytes after the last group's must be 0 in
    the rows the kernel writes (``written``: skipped rows keep what they held)."""
    if layout != "ue8m0":
        return sf
    shifts = torch.arange(0, 32, 8, dtype=torch.int32, device=sf.device)
    exponents = ((sf.unsqueeze(-1) >> shifts) & 0xFF).reshape(sf.shape[0], 4 * sf.shape[1])
    assert bool((exponents[written][:, groups:] == 0).all()), "UE8M0 bytes after the last group are not zero"
    return (exponents[:, :groups] << 23).contiguous().view(torch.float32)


def run_generic(hidden: int, npc: int, layout: str, with_weights: bool, with_pos_to_expert: bool,
                clamp: float | None, count: bool, num_tokens: int = 257, num_topk: int = 2,
                sf_clamp_min: float | None = None, make_x: Callable[[int, int], torch.Tensor] = random_x) -> None:
    pos_to_expert, pos_to_token_topk, _ = expert_major_routing(num_tokens, num_topk)
    rows = pos_to_expert.shape[0]
    x = make_x(rows, 2 * hidden)
    weights = torch.randn(num_tokens, num_topk, device="cuda")
    p2t, w = (pos_to_token_topk, weights) if with_weights else (None, None)
    p2e = pos_to_expert if with_pos_to_expert else None
    round_sf = layout == "ue8m0" or hidden % 3 == 0  # both rounding modes over the hiddens
    start = torch.tensor([5, 7, 11], dtype=torch.int64, device="cuda")  # the op adds to what is there
    counts = start.clone() if count else None
    out = poisoned_out(rows, hidden, npc, layout)
    q, sf = quant.swiglu_forward_and_per_token_cast(
        x, "e4m3", npc, pos_to_token_topk=p2t, topk_weights=w, pos_to_expert=p2e,
        use_tma_aligned_col_major_sf=layout != "row_major", round_sf=round_sf, use_packed_ue8m0=layout == "ue8m0",
        swiglu_clamp_value=clamp, clamped_count=counts, sf_clamp_min=sf_clamp_min, out=out)
    assert q is out[0] and sf is out[1]
    keep = pos_to_expert >= 0 if p2e is not None else torch.ones(rows, dtype=torch.bool, device="cuda")
    if count:
        assert clamp is not None and counts is not None
        assert torch.equal(counts, start + clamped_counts_ref(x, clamp, keep)), (counts, start)
    ref_q, ref_sf = swiglu_forward_and_per_token_cast_ref(x, npc, p2t, w, round_sf, clamp, sf_clamp_min)
    if not bool(keep.all()):  # skipped rows are never written
        assert bool((q[~keep].view(torch.uint8) == POISON_BYTE).all())
    values = scale_values(sf, hidden // npc, layout, keep)
    assert_per_token_close(q[keep], values[keep].contiguous(), ref_q[keep], ref_sf[keep], npc)


@pytest.mark.parametrize("clamp", (None, 0.5, 10.0))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("hidden", GENERIC_HIDDEN)
def test_generic_every_hidden_and_layout(hidden: int, layout: str, clamp: float | None) -> None:
    for with_weights, with_pos_to_expert in itertools.product((False, True), repeat=2):
        run_generic(hidden, 128, layout, with_weights, with_pos_to_expert, clamp, count=clamp is not None)
    if layout == "row_major":  # one scale per row: row-major only
        for with_pos_to_expert in (False, True):
            run_generic(hidden, hidden, layout, True, with_pos_to_expert, clamp, count=clamp is not None)


@pytest.mark.parametrize(("num_tokens", "num_topk"), [(0, 6), (1, 6), (13, 1), (4001, 9)])
@pytest.mark.parametrize(("hidden", "npc", "layout"), [(1536, 128, "ue8m0"), (3584, 3584, "row_major"),
                                                       (1280, 128, "col_major")])
def test_generic_token_counts(hidden: int, npc: int, layout: str, num_tokens: int, num_topk: int) -> None:
    run_generic(hidden, npc, layout, True, True, 0.5, count=True, num_tokens=num_tokens, num_topk=num_topk)


@pytest.mark.parametrize("sf_clamp_min", (1e-6, 0.05))
@pytest.mark.parametrize(("hidden", "npc"), [(2048, 128), (1280, 1280), (7168, 7168)])
def test_generic_amax_floor(hidden: int, npc: int, sf_clamp_min: float) -> None:
    def scaled_rows(rows: int, width: int) -> torch.Tensor:  # the floor bites in some rows and not in others
        return (random_x(rows, width).float() * torch.logspace(-8, 0, rows, device="cuda")[:, None]).bfloat16()

    run_generic(hidden, npc, "row_major", False, False, None, count=False, num_tokens=300, sf_clamp_min=sf_clamp_min,
                make_x=scaled_rows)


@pytest.mark.parametrize("clamp", (None, 0.5, 2.0**-70))
@pytest.mark.parametrize(("hidden", "npc", "layout"), [(1536, 128, "ue8m0"), (3584, 3584, "row_major"),
                                                       (12288, 12288, "row_major"), (2560, 128, "col_major")])
def test_generic_division_edges(hidden: int, npc: int, layout: str, clamp: float | None) -> None:
    # As test_forward_division_edges, for the variant for any hidden: each thread tests its own 8 values per chunk.
    run_generic(hidden, npc, layout, True, True, clamp, count=clamp is not None, num_tokens=64,
                make_x=division_range_x)


@pytest.mark.parametrize("clamp", (None, 0.5))
@pytest.mark.parametrize(("hidden", "npc", "layout"), [(1280, 128, "ue8m0"), (3584, 3584, "row_major"),
                                                       (2048, 128, "col_major")])
def test_generic_nan_inf_and_signed_zeros(hidden: int, npc: int, layout: str, clamp: float | None) -> None:
    def special(rows: int, width: int) -> torch.Tensor:
        x = with_nonfinite(random_x(rows, width))
        x[6, :hidden] = 0.0  # xl +-0: y = +-0
        x[7, :hidden] = -0.0
        x[8] = -0.0  # a row of -0.0: amax 0, the floor's scale
        return x

    run_generic(hidden, npc, layout, False, False, clamp, count=clamp is not None, num_tokens=8, num_topk=2,
                make_x=special)
    x = special(16, 2 * hidden)
    q, _ = quant.swiglu_forward_and_per_token_cast(x, "e4m3", npc, use_tma_aligned_col_major_sf=layout != "row_major",
                                                   round_sf=True, use_packed_ue8m0=layout == "ue8m0",
                                                   swiglu_clamp_value=clamp)
    assert_nan_codes_at(q, NAN_ACTIVATIONS)


def test_generic_matches_the_specialized_variant() -> None:
    # The same call through both: the bits agree (row-major scales at a hidden both are built for).
    x = random_x(1000, 2 * 7168)
    for npc in (128, 7168):
        hot = quant.swiglu_forward_and_per_token_cast(x, "e4m3", npc, round_sf=True, swiglu_clamp_value=0.5)
        generic = quant.swiglu_forward_and_per_token_cast(x, "e4m3", npc, round_sf=True, swiglu_clamp_value=0.5,
                                                          sf_clamp_min=1e-4)
        assert torch.equal(hot[0].view(torch.uint8), generic[0].view(torch.uint8))
        assert torch.equal(hot[1], generic[1])


def test_generic_counts_under_compile_and_graphs() -> None:
    x = random_x(512, 2 * 1280)
    counts = torch.zeros(3, dtype=torch.int64, device="cuda")

    def f(x: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True,
                                                       round_sf=True, use_packed_ue8m0=True,
                                                       swiglu_clamp_value=0.5, clamped_count=counts)

    want_q, want_sf = f(x, counts)
    once = counts.clone()
    got_q, got_sf = torch.compile(f, fullgraph=True)(x, counts)
    assert torch.equal(counts, 2 * once)
    assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(got_sf, want_sf)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        f(x, counts)
    counts.zero_()
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(counts, 2 * clamped_counts_ref(x, 0.5))


# --- swiglu_backward_and_per_token_cast ------------------------------------------------------

# Beside the hiddens built, the variant for any hidden (a multiple of 256) at hiddens built for none.
BWD = [(h, npc, r) for h in (*HIDDEN, 256, 1280, 3072, 3584, 12288) for npc in (32, 128) for r in (False, True)]


def bwd_id(v: tuple[int, int, bool]) -> str:
    return f"H{v[0]}-npc{v[1]}" + ("-round_sf" if v[2] else "")


def run_backward(v: tuple[int, int, bool], num_tokens: int, num_topk: int, clamp: float | None,
                 poisoned: bool = False, generic: bool = False) -> None:
    hidden, npc, round_sf = v
    _, pos_to_token_topk, token_topk_to_pos = expert_major_routing(num_tokens, num_topk, seed=1)
    rows = pos_to_token_topk.shape[0]
    xq, x_sf = per_token_cast_ref(torch.randn(rows, 2 * hidden, device="cuda") * 2, "e4m3", npc)
    grad_out = torch.randn(rows, hidden, device="cuda").bfloat16()
    weight = torch.rand(num_tokens, num_topk, device="cuda")
    if poisoned:
        def poison(shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
            size = torch.empty((), dtype=dtype).element_size()
            raw = torch.full((shape[0], shape[1] * size), POISON_BYTE, dtype=torch.uint8, device="cuda")
            return raw.view(dtype)
        out = poison((rows, hidden), torch.bfloat16)
        q = poison((rows, 2 * hidden), torch.float8_e4m3fn)
        x_grad = poison((rows, 2 * hidden), torch.bfloat16)
        q_sf = torch.full((rows, 2 * hidden // npc), float("nan"), device="cuda")
        weight_grad = torch.full((num_tokens, num_topk), float("nan"), device="cuda")
        launch = runtime.get_kernel("swiglu_backward_and_per_token_cast").select(
            hidden=hidden if hidden in HIDDEN and not generic else 0, npc=npc)
        if rows == 0:
            weight_grad.zero_()
        launch(xq, x_sf, grad_out, weight, pos_to_token_topk, token_topk_to_pos, out, q, q_sf, x_grad,
               weight_grad, float("inf") if clamp is None else clamp, int(round_sf))
    else:
        out, (q, q_sf), x_grad, weight_grad = quant.swiglu_backward_and_per_token_cast(
            (xq, x_sf), grad_out, weight, pos_to_token_topk, token_topk_to_pos, npc, round_sf=round_sf,
            swiglu_clamp_value=clamp)
    torch.cuda.synchronize()
    ref_out, (ref_q, ref_sf), ref_x_grad, _, _ = swiglu_backward_ref(
        xq, x_sf, grad_out, weight, pos_to_token_topk, token_topk_to_pos, npc, round_sf, clamp)
    assert_bf16_close(out, ref_out, "out")
    assert_bf16_close(x_grad, ref_x_grad, "x_grad")
    assert_per_token_close(q, q_sf, ref_q, ref_sf, npc)
    assert_weight_grad(weight_grad, xq, x_sf, grad_out, pos_to_token_topk, npc, clamp)


def assert_weight_grad(weight_grad: torch.Tensor, xq: torch.Tensor, x_sf: torch.Tensor, grad_out: torch.Tensor,
                       pos_to_token_topk: torch.Tensor, npc: int, clamp: float | None) -> None:
    """weight_grad against a float64 sum of the reference's products (module docstring's bound); NaN exactly
    where that sum is NaN."""
    hidden = grad_out.shape[1]
    full = xq.float() * x_sf.repeat_interleave(npc, dim=1)
    left, right = full[:, :hidden], full[:, hidden:]
    if clamp is not None:
        left, right = left.clamp(max=clamp), right.clamp(-clamp, clamp)
    products = (grad_out.float() * (left / (1 + torch.exp(-left)) * right)).double()
    exact = torch.zeros(weight_grad.numel(), dtype=torch.float64, device="cuda")
    bound = torch.full_like(exact, 1e-6)
    valid = pos_to_token_topk >= 0
    exact[pos_to_token_topk[valid].long()] = products.sum(dim=1)[valid]
    bound[pos_to_token_topk[valid].long()] += 1e-5 * products.abs().sum(dim=1)[valid]
    got = weight_grad.reshape(-1).double()
    assert torch.equal(got.isnan(), exact.isnan()), "weight_grad: NaN elsewhere than in the reference"
    error = (got - exact).abs()[~exact.isnan()]
    assert error.numel() == 0 or bool((error <= bound[~exact.isnan()]).all()), \
        f"weight_grad off by up to {float(error.max()):.3g}"


@pytest.mark.parametrize("clamp", CLAMPS)
@pytest.mark.parametrize("v", BWD, ids=bwd_id)
def test_backward_every_variant(v: tuple[int, int, bool], clamp: float | None) -> None:
    run_backward(v, num_tokens=257, num_topk=2, clamp=clamp, poisoned=True)


@pytest.mark.parametrize("clamp", CLAMPS)
@pytest.mark.parametrize("v", [(h, npc, True) for h in (2048, 2560, 7168) for npc in (32, 128)], ids=bwd_id)
def test_backward_generic_at_built_hiddens(v: tuple[int, int, bool], clamp: float | None) -> None:
    # The variant for any hidden where one is built for the hidden too (benchmarks compare the two there).
    run_backward(v, num_tokens=257, num_topk=2, clamp=clamp, poisoned=True, generic=True)


@pytest.mark.parametrize(("num_tokens", "num_topk"), [(0, 6), (1, 6), (4001, 6), (8192, 2)])
@pytest.mark.parametrize("v", [(7168, 128, True), (2560, 32, False), (3072, 128, True), (1280, 32, False)], ids=bwd_id)
def test_backward_sizes(v: tuple[int, int, bool], num_tokens: int, num_topk: int) -> None:
    run_backward(v, num_tokens, num_topk, clamp=10.0)
    run_backward(v, num_tokens, num_topk, clamp=0.5, poisoned=True)


@pytest.mark.parametrize("clamp", (None, 0.5))
@pytest.mark.parametrize("v", [(7168, 128, True), (2560, 32, False), (3072, 128, False), (1280, 32, True)],
                         ids=bwd_id)
def test_backward_nan(v: tuple[int, int, bool], clamp: float | None) -> None:
    """NaN codes in x's left and right halves: NaN in out, x_grad and weight_grad of their rows, NaN codes
    in the gradient's cast, the other rows as the reference."""
    hidden, npc, round_sf = v
    _, pos_to_token_topk, token_topk_to_pos = expert_major_routing(8, 2, seed=2)
    rows = pos_to_token_topk.shape[0]
    xq, x_sf = per_token_cast_ref(torch.randn(rows, 2 * hidden, device="cuda") * 2, "e4m3", npc)
    real = (pos_to_token_topk >= 0).nonzero().flatten().tolist()
    nan_at = [(real[0], 3), (real[1], hidden + 5)]
    for r, c in nan_at:
        xq.view(torch.uint8)[r, c] = 0x7F
    grad_out = torch.randn(rows, hidden, device="cuda").bfloat16()
    weight = torch.rand(8, 2, device="cuda")
    out, (q, q_sf), x_grad, weight_grad = quant.swiglu_backward_and_per_token_cast(
        (xq, x_sf), grad_out, weight, pos_to_token_topk, token_topk_to_pos, npc, round_sf=round_sf,
        swiglu_clamp_value=clamp)
    ref_out, (ref_q, ref_sf), ref_x_grad, _, _ = swiglu_backward_ref(
        xq, x_sf, grad_out, weight, pos_to_token_topk, token_topk_to_pos, npc, round_sf, clamp)
    for got, want, name in ((out, ref_out, "out"), (x_grad, ref_x_grad, "x_grad")):
        assert torch.equal(got.isnan(), want.isnan()), f"{name}: NaN elsewhere than in the reference"
        torch.testing.assert_close(got.float(), want.float(), rtol=2.0**-7, atol=1e-30, equal_nan=True,
                                   msg=lambda m, name=name: f"{name}: {m}")
    # The activation is NaN at both, and so is dx of the NaN xl (NaN > c is false: never clamped). The
    # rest depends on the other half: dy there is 0 where its y is clamped, dx of the NaN y is 0 where
    # its x is clamped (the reference comparisons above cover those).
    first, second = nan_at[0][0], nan_at[1][0]
    assert bool(out[first, 3].isnan()) and bool(out[second, 5].isnan()) and bool(x_grad[first, 3].isnan())
    assert_per_token_close(q, q_sf, ref_q, ref_sf, npc)
    assert_nan_codes_at(q, [(first, 3)])
    assert int(weight_grad.isnan().sum()) == 2
    assert_weight_grad(weight_grad, xq, x_sf, grad_out, pos_to_token_topk, npc, clamp)


# --- swiglu_forward_and_per_channel_cast_and_transpose ---------------------------------------

# Every hidden takes the variants for any hidden (576: TileKernels' odd one).
PER_CHANNEL = [(h, npt, r, nt) for h in (*HIDDEN, 576, 3072) for npt in (32, 128) for r in (False, True)
               for nt in (False, True)]


def pc_id(v: tuple[int, int, bool, bool]) -> str:
    return f"H{v[0]}-npt{v[1]}" + ("-round_sf" if v[2] else "") + ("-without_transpose" if v[3] else "")


def run_per_channel(v: tuple[int, int, bool, bool], num_tokens: int, clamp: float | None,
                    poisoned: bool = False) -> None:
    hidden, npt, round_sf, without_transpose = v
    x = random_x(num_tokens, 2 * hidden)
    if poisoned and num_tokens > 0:
        shape = (num_tokens, hidden) if without_transpose else (hidden, num_tokens)
        q = torch.full(shape, POISON_BYTE, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        sf = torch.full((num_tokens // npt, hidden), float("nan"), device="cuda")
        launch = runtime.get_kernel("swiglu_forward_and_per_channel_cast_and_transpose").select(
            hidden=0, npt=npt, without_transpose=without_transpose)
        launch(x, q, sf, float("inf") if clamp is None else clamp, int(round_sf))
    else:
        q, sf = quant.swiglu_forward_and_per_channel_cast_and_transpose(
            x, "e4m3", npt, round_sf=round_sf, without_transpose=without_transpose, swiglu_clamp_value=clamp)
    torch.cuda.synchronize()
    ref_q, ref_sf = swiglu_forward_and_per_channel_cast_and_transpose_ref(x, npt, round_sf, without_transpose, clamp)
    per_token_layout = sf.repeat_interleave(npt, dim=0)  # (T, H)
    ref_per_token_layout = ref_sf.repeat_interleave(npt, dim=0)
    if not without_transpose:
        per_token_layout, ref_per_token_layout = per_token_layout.t(), ref_per_token_layout.t()
    assert_codes_close(q, per_token_layout, ref_q, ref_per_token_layout, sf, ref_sf)


@pytest.mark.parametrize("clamp", CLAMPS)
@pytest.mark.parametrize("v", PER_CHANNEL, ids=pc_id)
def test_per_channel_every_variant(v: tuple[int, int, bool, bool], clamp: float | None) -> None:
    run_per_channel(v, num_tokens=384, clamp=clamp, poisoned=True)


@pytest.mark.parametrize("num_tokens", [0, 128, 8192])
@pytest.mark.parametrize("v", [(7168, 128, True, False), (2560, 32, False, True), (6144, 32, True, False)],
                         ids=pc_id)
def test_per_channel_sizes(v: tuple[int, int, bool, bool], num_tokens: int) -> None:
    run_per_channel(v, num_tokens, clamp=10.0)
    run_per_channel(v, num_tokens, clamp=None, poisoned=True)


@pytest.mark.parametrize("clamp", (None, 0.5))
@pytest.mark.parametrize("v", [(7168, 128, True, False), (2560, 32, False, True)], ids=pc_id)
def test_per_channel_nan_and_inf(v: tuple[int, int, bool, bool], clamp: float | None) -> None:
    hidden, npt, round_sf, without_transpose = v
    x = with_nonfinite(random_x(128, 2 * hidden))
    q, sf = quant.swiglu_forward_and_per_channel_cast_and_transpose(
        x, "e4m3", npt, round_sf=round_sf, without_transpose=without_transpose, swiglu_clamp_value=clamp)
    ref_q, ref_sf = swiglu_forward_and_per_channel_cast_and_transpose_ref(x, npt, round_sf, without_transpose, clamp)
    per_token_layout, ref_per_token_layout = sf.repeat_interleave(npt, dim=0), ref_sf.repeat_interleave(npt, dim=0)
    if not without_transpose:
        per_token_layout, ref_per_token_layout = per_token_layout.t(), ref_per_token_layout.t()
    assert_codes_close(q, per_token_layout, ref_q, ref_per_token_layout, sf, ref_sf)
    assert_nan_codes_at(q, NAN_ACTIVATIONS if without_transpose else [(c, r) for r, c in NAN_ACTIVATIONS])


@pytest.mark.parametrize("num_tokens", [1, 4001])
def test_per_channel_needs_128_token_multiples(num_tokens: int) -> None:
    with pytest.raises(ValueError, match=r"^x: num_tokens"):
        quant.swiglu_forward_and_per_channel_cast_and_transpose(random_x(num_tokens, 4096), "e4m3", 128)


# --- errors name the argument ----------------------------------------------------------------


def _fwd(**kwargs: object) -> None:
    args: dict[str, object] = {"x": random_x(32, 4096), "fmt": "e4m3", "num_per_channels": 128}
    args.update(kwargs)
    quant.swiglu_forward_and_per_token_cast(**args)


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"fmt": "e5m2"}, ValueError, "fmt"),
    ({"num_per_channels": 64}, ValueError, "num_per_channels"),
    ({"num_per_channels": 0}, ValueError, "num_per_channels"),
    ({"x": torch.ones(32, 4096, device="cuda")}, TypeError, "x"),
    ({"x": torch.ones(32, 4096, dtype=torch.bfloat16)}, Exception, "x"),
    ({"x": torch.ones(32, 200, dtype=torch.bfloat16, device="cuda")}, ValueError, "x"),
    ({"topk_weights": torch.ones(4, 2, device="cuda")}, ValueError, "pos_to_token_topk"),
    ({"pos_to_token_topk": torch.zeros(31, dtype=torch.int32, device="cuda"),
      "topk_weights": torch.ones(4, 2, device="cuda")}, ValueError, "pos_to_token_topk"),
    ({"pos_to_expert": torch.zeros(33, dtype=torch.int32, device="cuda")}, ValueError, "pos_to_expert"),
    ({"pos_to_expert": torch.zeros(32, dtype=torch.int64, device="cuda")}, errors.KernelArgumentError,
     "pos_to_expert"),
    ({"swiglu_clamp_value": -1.0}, ValueError, "swiglu_clamp_value"),
    ({"use_packed_ue8m0": True}, ValueError, "use_packed_ue8m0"),
    ({"use_tma_aligned_col_major_sf": True, "num_per_channels": 2048}, ValueError, "use_tma_aligned_col_major_sf"),
    ({"clamped_count": torch.zeros(3, dtype=torch.int64, device="cuda")}, ValueError, "clamped_count"),
    ({"clamped_count": torch.zeros(3, dtype=torch.int64), "swiglu_clamp_value": 1.0}, Exception, "clamped_count"),
    ({"clamped_count": torch.zeros(3, dtype=torch.int32, device="cuda"), "swiglu_clamp_value": 1.0}, ValueError,
     "clamped_count"),
])
def test_forward_bad_inputs_name_the_argument(kwargs: dict[str, object], error: type[Exception], name: str) -> None:
    with pytest.raises(error, match=rf"\b{name}\b"):
        _fwd(**kwargs)


def test_forward_hidden_off_the_vector_grid_is_refused_naming_x() -> None:
    with pytest.raises(ValueError, match=r"^x: the width"):
        _fwd(x=random_x(4, 2 * 1000))


def _bwd(**kwargs: object) -> None:
    rows, hidden = 16, 2048
    xq, x_sf = per_token_cast_ref(torch.randn(rows, 2 * hidden, device="cuda"), "e4m3", 128)
    args: dict[str, object] = {
        "x": (xq, x_sf), "grad_out": torch.randn(rows, hidden, device="cuda").bfloat16(),
        "weight": torch.rand(8, 2, device="cuda"),
        "pos_to_token_topk": torch.arange(rows, dtype=torch.int32, device="cuda"),
        "token_topk_to_pos": torch.arange(rows, dtype=torch.int32, device="cuda").reshape(8, 2),
        "num_per_channels": 128,
    }
    args.update(kwargs)
    quant.swiglu_backward_and_per_token_cast(**args)


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"x": torch.zeros(16, 4096, device="cuda")}, TypeError, "x"),
    ({"x": (torch.zeros(16, 4096, device="cuda"), torch.zeros(16, 32, device="cuda"))}, TypeError, "x"),
    ({"x": (torch.zeros(16, 4096, device="cuda").to(torch.float8_e4m3fn), torch.zeros(16, 31, device="cuda"))},
     ValueError, "x_sf"),
    ({"num_per_channels": 64}, ValueError, "num_per_channels"),
    ({"grad_out": torch.zeros(16, 4096, device="cuda").bfloat16()}, ValueError, "grad_out"),
    ({"grad_out": torch.zeros(16, 2048, device="cuda")}, errors.KernelArgumentError, "grad_out"),
    ({"pos_to_token_topk": torch.zeros(15, dtype=torch.int32, device="cuda")}, ValueError, "pos_to_token_topk"),
    ({"token_topk_to_pos": torch.zeros(8, 3, dtype=torch.int32, device="cuda")}, ValueError, "token_topk_to_pos"),
    ({"weight": torch.zeros(8, 2, dtype=torch.float64, device="cuda")}, errors.KernelArgumentError, "weight"),
    ({"swiglu_clamp_value": float("nan")}, ValueError, "swiglu_clamp_value"),
])
def test_backward_bad_inputs_name_the_argument(kwargs: dict[str, object], error: type[Exception], name: str) -> None:
    with pytest.raises(error, match=rf"\b{name}\b"):
        _bwd(**kwargs)


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"fmt": "e2m1"}, ValueError, "fmt"),
    ({"num_per_tokens": 64}, ValueError, "num_per_tokens"),
    ({"x": torch.ones(128, 4096, device="cuda")}, TypeError, "x"),
    ({"swiglu_clamp_value": 0.0}, ValueError, "swiglu_clamp_value"),
])
def test_per_channel_bad_inputs_name_the_argument(kwargs: dict[str, object], error: type[Exception],
                                                  name: str) -> None:
    args: dict[str, object] = {"x": random_x(128, 4096), "fmt": "e4m3", "num_per_tokens": 128}
    args.update(kwargs)
    with pytest.raises(error, match=rf"\b{name}\b"):
        quant.swiglu_forward_and_per_channel_cast_and_transpose(**args)


# --- CUDA graphs and torch.compile -----------------------------------------------------------


def _graph_cases() -> dict[str, tuple[object, torch.Tensor]]:
    pos_to_expert, pos_to_token_topk, token_topk_to_pos = expert_major_routing(64, 2)
    rows = pos_to_expert.shape[0]
    weights = torch.rand(64, 2, device="cuda")
    xq, x_sf = per_token_cast_ref(torch.randn(rows, 4096, device="cuda"), "e4m3", 128)
    return {
        "forward per-token": (lambda t: quant.swiglu_forward_and_per_token_cast(
            t, "e4m3", 128, pos_to_token_topk, weights, pos_to_expert, round_sf=True, swiglu_clamp_value=0.5),
            random_x(rows, 4096)),
        "backward": (lambda t: _flatten(quant.swiglu_backward_and_per_token_cast(
            (xq, x_sf), t, weights, pos_to_token_topk, token_topk_to_pos, 128, swiglu_clamp_value=0.5)),
            torch.randn(rows, 2048, device="cuda").bfloat16()),
        "forward per-channel": (lambda t: quant.swiglu_forward_and_per_channel_cast_and_transpose(
            t, "e4m3", 128, round_sf=True), random_x(256, 4096)),
    }


def _flatten(result: tuple) -> tuple[torch.Tensor, ...]:  # type: ignore[type-arg]
    out, (q, sf), x_grad, weight_grad = result
    return out, q, sf, x_grad, weight_grad


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _masked(outputs: tuple[torch.Tensor, ...], name: str, rows_kept: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # The forward per-token op leaves rows with pos_to_expert -1 unwritten.
    return tuple(o[rows_kept] for o in outputs) if name == "forward per-token" else outputs


@pytest.mark.parametrize("name", ["forward per-token", "backward", "forward per-channel"])
def test_cuda_graph_capture_and_replay(name: str) -> None:
    cases = _graph_cases()
    fn, x = cases[name]
    kept = expert_major_routing(64, 2)[0] >= 0
    static_x = x.clone()
    fn(static_x)  # warm-up: cubin loads stay out of the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(static_x)
    for _ in range(2):
        static_x.copy_(torch.randn_like(static_x.float()).to(static_x.dtype))
        expected = fn(static_x)
        for o in static_out:
            o.view(torch.uint8).fill_(POISON_BYTE)
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(_masked(static_out, name, kept), _masked(expected, name, kept), strict=True):
            assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("name", ["forward per-token", "backward", "forward per-channel"])
def test_torch_compile_fullgraph_matches_eager(name: str) -> None:
    fn, x = _graph_cases()[name]
    kept = expert_major_routing(64, 2)[0] >= 0
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: fn(t), fullgraph=True)
    for _ in range(2):
        x = torch.randn_like(x.float()).to(x.dtype)
        got_all, want_all = compiled(x), fn(x)
        for got, want in zip(_masked(got_all, name, kept), _masked(want_all, name, kept), strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype
            assert torch.equal(_bits(got), _bits(want))
