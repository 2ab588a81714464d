"""GPU tests of ``tile_kernels_aot.quant.per_token_cast_back`` against tests/reference/quant_cast_back.py.

decode(q) is exact and out = decode(q) * sf is one fp32 multiply (then round to nearest even for
bf16), so every output element is compared bit for bit (tolerance: none), as int16 / int32.
The reference runs on the same GPU. Codes are either random bytes (every e2m1 pair, every
non-NaN e4m3 code) with scales over a wide range, including products that are fp32 subnormals
or overflow, or the per-token cast of Gaussian rows. Scales come in the three layouts of
per_token_cast: fp32 row-major, fp32 column-major with the token dimension padded to a
multiple of 4 (padding poisoned with NaN, never read into an output), and int32 words of packed
UE8M0 exponents (random words: every exponent byte but 255, an infinite scale). Launchers are also
called directly on outputs poisoned with NaN, which catches any element the kernel fails to write.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.reference.quant import cast_error, dequant, per_token_cast_ref
from tests.reference.quant_cast_back import per_block_cast_back_ref, per_token_cast_back_ref

tile_kernels_aot, quant, errors, runtime = installed_package()

pytestmark = pytest.mark.gpu

OUT = {"bfloat16": (torch.bfloat16, "bf16"), "float32": (torch.float32, "fp32")}
HIDDEN = (2048, 2560, 4096, 6144, 7168)
NPC = {"e4m3": (32, 64, 128), "e2m1": (16, 32)}
ERROR_BOUND = {"e4m3": 1e-3, "e2m1": 2e-2}  # 1 - 2 sum(xy) / sum(x^2 + y^2), KERNELS.md

LAYOUTS = ("row_major", "col_major", "ue8m0")
COLUMN_GROUPS = (("e4m3", 128), ("e2m1", 32))  # the (fmt, npc) built with the column-major layouts

Variant = tuple[str, int, str, int, str]  # (fmt, npc, out_dtype, hidden, sf_layout): the spec's grid keys


def grid() -> Iterator[Variant]:
    """Every (fmt, npc, out_dtype, hidden, sf_layout) of kernel_specs/quant_cast_back.yaml."""
    for fmt, out_dtype, hidden, sf_layout in itertools.product(NPC, OUT, HIDDEN, LAYOUTS):
        for npc in NPC[fmt]:
            if sf_layout == "row_major" or (fmt, npc) in COLUMN_GROUPS:
                yield fmt, npc, out_dtype, hidden, sf_layout


def variant_id(v: Variant) -> str:
    fmt, npc, out_dtype, hidden, sf_layout = v
    return f"{fmt}-npc{npc}-{out_dtype}-H{hidden}-{sf_layout}"


FULL = list(grid())
# The variants for any hidden (grid value 0) at hiddens built for none: TileKernels' 576 and 3072 (576 / 128 and
# 576 / 64 leave a partial last group), 192 and 3584; every npc, one scale per row (npc = hidden) too, every layout.
GENERIC = [(fmt, npc or hidden, out_dtype, hidden, sf_layout)
           for fmt, out_dtype, hidden, sf_layout in itertools.product(NPC, OUT, (192, 576, 3072, 3584), LAYOUTS)
           for npc in (16, 32, 64, 128, 0)]


def built(v: Variant) -> dict[str, object]:
    """The grid values of the variant a call with v's sizes takes (hidden 0 for a hidden built for none)."""
    fmt, npc, out_dtype, hidden, sf_layout = v
    generic = hidden not in HIDDEN
    return {"fmt": fmt, "npc": 0 if npc == hidden else npc, "out_dtype": out_dtype, "hidden": 0 if generic else hidden,
            "sf_layout": sf_layout, "block_m": 1}


def random_codes(num_tokens: int, hidden: int, fmt: str) -> torch.Tensor:
    """Random code bytes: every e2m1 pair, or every e4m3 code but the two NaNs (0x7F, 0xFF)."""
    if fmt == "e2m1":
        return torch.randint(-128, 128, (num_tokens, hidden // 2), dtype=torch.int8, device="cuda")
    codes = torch.randint(0, 256, (num_tokens, hidden), dtype=torch.int32, device="cuda")
    codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)
    return codes.to(torch.uint8).view(torch.float8_e4m3fn)


def random_scales(num_tokens: int, groups: int) -> torch.Tensor:
    """Positive fp32 scales 2^-140 .. 2^120: products reach fp32 subnormals and overflow to inf."""
    return torch.pow(2.0, torch.empty(num_tokens, groups, device="cuda").uniform_(-140, 120))


def random_words(rows: int, cols: int) -> torch.Tensor:
    """int32 UE8M0 words of random exponent bytes 0..254 (scales 0 and 2^-126 .. 2^127, all finite)."""
    return torch.randint(0, 255, (rows, cols, 4), dtype=torch.uint8, device="cuda").view(torch.int32).view(rows, cols)


def random_layout_scales(num_tokens: int, groups: int, sf_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf, sf_arg): the scales the op takes (as per_token_cast returns them) and what the kernel reads.

    col_major: storage float32 (G, align(T, 4)), sf = storage.T[:T]; ue8m0: storage int32
    (ceil(G/4), align(T, 4)) of random words, sf = storage.T[:T], the kernel reads its bytes.
    """
    if sf_layout == "row_major":
        sf = random_scales(num_tokens, groups)
        return sf, sf
    padded = (num_tokens + 3) // 4 * 4
    if sf_layout == "col_major":
        storage = torch.full((groups, padded), float("nan"), device="cuda")
        storage[:, :num_tokens] = random_scales(num_tokens, groups).T
        return storage.T[:num_tokens], storage
    words = (groups + 3) // 4
    storage = random_words(words, padded)
    return storage.T[:num_tokens], storage.view(torch.uint8).view(words, padded, 4)


def random_rows(num_tokens: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """Gaussian rows times a random magnitude in [1e-3, 1e3] per row; no exact zeros."""
    magnitude = torch.pow(10.0, torch.empty(num_tokens, 1, device="cuda").uniform_(-3, 3))
    x = torch.randn(num_tokens, hidden, device="cuda") * magnitude
    return torch.where(x == 0, torch.ones_like(x), x).to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def assert_matches_reference(q: torch.Tensor, sf: torch.Tensor, out: torch.Tensor, npc: int) -> None:
    ref = per_token_cast_back_ref(q, sf, out.dtype, npc)
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.is_contiguous()
    wrong = int((bits(out) != bits(ref)).sum())
    assert wrong == 0, f"{wrong} of {out.numel()} outputs differ from the reference"


def launch_poisoned(q: torch.Tensor, sf_arg: torch.Tensor, v: Variant) -> torch.Tensor:
    _, _, out_dtype, hidden, _ = v
    out = torch.full((q.shape[0], hidden), float("nan"), dtype=OUT[out_dtype][0], device="cuda")
    launch = runtime.get_kernel("per_token_cast_back").select(**built(v))
    launch(q, sf_arg, out)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("num_tokens", [0, 1, 127, 4001])
@pytest.mark.parametrize("v", FULL + GENERIC, ids=variant_id)
def test_per_token_cast_back(v: Variant, num_tokens: int) -> None:
    fmt, npc, out_dtype, hidden, sf_layout = v
    q = random_codes(num_tokens, hidden, fmt)
    sf, _ = random_layout_scales(num_tokens, -(-hidden // npc), sf_layout)
    out = quant.per_token_cast_back((q, sf), OUT[out_dtype][1], npc)
    assert_matches_reference(q, sf, out, npc)
    # cast_back with per-token blocks and a torch dtype as fmt take the same path.
    again = quant.cast_back((q, sf), OUT[out_dtype][0], (1, npc))
    assert torch.equal(bits(again), bits(out))


@pytest.mark.parametrize("num_tokens", [1, 3, 127, 4001])
@pytest.mark.parametrize("v", FULL + GENERIC, ids=variant_id)
def test_launcher_overwrites_poisoned_outputs(v: Variant, num_tokens: int) -> None:
    """Every output is written, also in the last, partial row tile (and the last, partial column tile)."""
    fmt, npc, _, hidden, sf_layout = v
    q = random_codes(num_tokens, hidden, fmt)
    sf, sf_arg = random_layout_scales(num_tokens, -(-hidden // npc), sf_layout)
    out = launch_poisoned(q, sf_arg, v)
    assert not torch.isnan(out).any(), "some outputs were never written"
    assert_matches_reference(q, sf, out, npc)


# The variant for any hidden runs its row tiles down gridDim.y and z (kernels/quant/grid.py): past 65535 tiles (of up to
# 16 rows) the blocks of the last z slab start past num_tokens and must store nothing.
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_more_row_tiles_than_one_grid_dimension_holds(fmt: str) -> None:
    num_tokens, v = 65535 * 16 + 19, (fmt, 32, "bfloat16", 64, "row_major")
    q = random_codes(num_tokens, 64, fmt)
    sf, sf_arg = random_layout_scales(num_tokens, 2, "row_major")
    out = launch_poisoned(q, sf_arg, v)
    assert not torch.isnan(out).any(), "some outputs were never written"
    assert_matches_reference(q, sf, out, 32)


def cast(x: torch.Tensor, fmt: str, npc: int, round_sf: bool, sf_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_cast of x into sf_layout: the kernel where the package builds it, else the reference."""
    flags = {
        "row_major": {},
        "col_major": {"use_tma_aligned_col_major_sf": True},
        "ue8m0": {"use_tma_aligned_col_major_sf": True, "use_packed_ue8m0": True},
    }[sf_layout]
    if hasattr(quant, "per_token_cast"):
        try:
            return quant.per_token_cast(x, fmt, npc, round_sf=round_sf, **flags)
        except (NotImplementedError, errors.VariantNotFoundError):
            pass  # the package's per_token_cast does not build this layout
    return per_token_cast_ref(x, fmt, npc, round_sf, sf_layout=sf_layout)


@pytest.mark.parametrize(
    ("v", "round_sf"),
    [(v, r) for v in FULL for r in (False, True) if r or v[4] != "ue8m0"],  # UE8M0 needs round_sf
    ids=lambda p: variant_id(p) if isinstance(p, tuple) else f"round_sf={p}",
)
def test_round_trip(v: Variant, round_sf: bool) -> None:
    """per_token_cast then per_token_cast_back recovers x within the format's error bound."""
    fmt, npc, out_dtype, hidden, sf_layout = v
    dtype, out_fmt = OUT[out_dtype]
    x = random_rows(4001, hidden, dtype)
    q, sf = cast(x, fmt, npc, round_sf, sf_layout)
    out = quant.per_token_cast_back((q, sf), out_fmt, npc)
    assert_matches_reference(q, sf, out, npc)
    assert cast_error(x.float(), out.float()) < ERROR_BOUND[fmt]


def test_runs_on_the_current_stream() -> None:
    q, sf = random_codes(4001, 7168, "e4m3"), random_scales(4001, 7168 // 128)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = quant.per_token_cast_back((q, sf), "bf16", 128)
    stream.synchronize()
    assert_matches_reference(q, sf, out, 128)


@pytest.mark.parametrize("sf_layout", LAYOUTS)
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_cuda_graph_and_torch_compile(fmt: str, sf_layout: str) -> None:
    npc = 128 if fmt == "e4m3" else 32
    q = random_codes(257, 2048, fmt)
    sf, _ = random_layout_scales(257, 2048 // npc, sf_layout)
    expected = quant.per_token_cast_back((q, sf), "bf16", npc)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = quant.per_token_cast_back((q, sf), "bf16", npc)
    static_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(static_out), bits(expected))

    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: quant.per_token_cast_back((a, b), "fp32", npc), fullgraph=True)
    assert torch.equal(bits(compiled(q, sf)), bits(quant.per_token_cast_back((q, sf), "fp32", npc)))


# --- errors -------------------------------------------------------------------------------


def test_wrong_code_dtype_is_refused() -> None:
    q = torch.zeros(4, 2048, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(errors.KernelArgumentError, match=r"x\[0\] \(q\).*bfloat16"):
        quant.per_token_cast_back((q, torch.ones(4, 16, device="cuda")), "bf16", 128)


def test_scale_shape_mismatch_is_refused() -> None:
    q = random_codes(4, 2048, "e4m3")
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        quant.per_token_cast_back((q, torch.ones(4, 32, device="cuda")), "bf16", 128)  # npc 64 scales
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        quant.per_token_cast_back((q, torch.ones(5, 16, device="cuda")), "bf16", 128)  # 5 tokens


def test_launcher_checks_every_tensor() -> None:
    q, sf = random_codes(16, 2048, "e2m1"), random_scales(16, 2048 // 16)
    out = torch.empty(16, 2048, dtype=torch.bfloat16, device="cuda")
    launch = runtime.get_kernel("per_token_cast_back").select(
        fmt="e2m1", npc=16, out_dtype="bfloat16", hidden=2048, sf_layout="row_major", block_m=1
    )
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        launch(q, sf[:, :64], out)
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):
        launch(q, sf.double(), out)
    with pytest.raises(errors.KernelArgumentError, match=r"\bq\b"):
        launch(q.view(torch.uint8), sf, out)
    with pytest.raises(errors.KernelArgumentError, match=r"\bout\b"):
        launch(q, sf, out.float())


def test_hidden_off_the_64_grid_is_refused_naming_q() -> None:
    q = random_codes(4, 1000, "e4m3")  # the variants for any hidden take multiples of 64
    with pytest.raises(ValueError, match=r"\bq\b"):
        quant.per_token_cast_back((q, torch.ones(4, 8, device="cuda")), "bf16", 128)


def test_uncovered_npc_is_refused() -> None:
    q = random_codes(4, 2048, "e2m1")
    with pytest.raises(errors.VariantNotFoundError, match="npc"):
        quant.per_token_cast_back((q, torch.ones(4, 11, device="cuda")), "bf16", 192)  # 16 .. 128 or hidden


def test_cpu_tensors_are_refused() -> None:
    q = torch.zeros(4, 2048, dtype=torch.float8_e4m3fn)
    with pytest.raises(errors.KernelError, match=r"\bq\b"):
        quant.per_token_cast_back((q, torch.ones(4, 16)), "bf16", 128)


@pytest.mark.parametrize("fmt", ["bf16x", "fp16", torch.float16, "e4m3", ""])
def test_bad_output_fmt_is_refused(fmt: object) -> None:
    q = random_codes(4, 2048, "e4m3")
    with pytest.raises(ValueError, match=r"\bfmt\b"):
        quant.per_token_cast_back((q, torch.ones(4, 16, device="cuda")), fmt, 128)


def test_bad_pair_is_refused() -> None:
    q = random_codes(4, 2048, "e4m3")
    with pytest.raises(TypeError, match=r"\bx\b"):
        quant.per_token_cast_back(q, "bf16", 128)
    with pytest.raises(ValueError, match=r"x\[1\]"):
        quant.per_token_cast_back((q, torch.ones(64, device="cuda")), "bf16", 128)


@pytest.mark.parametrize("num_tokens", [1, 5, 64])
@pytest.mark.parametrize("words", [True, False], ids=["ue8m0", "col_major"])
def test_other_column_strides_are_copied(num_tokens: int, words: bool) -> None:
    """Column-major scales without padding, or whose storage is not the whole padded buffer."""
    q = random_codes(num_tokens, 2048, "e4m3")
    sf = random_words(num_tokens, 4) if words else random_scales(num_tokens, 16)
    for view in (sf, sf.t().contiguous().t(), torch.cat([sf.t(), sf.t()])[: sf.shape[1]].t()):
        out = quant.per_token_cast_back((q, view), "bf16", 128)
        assert_matches_reference(q, view, out, 128)


def test_other_scale_strides_are_refused() -> None:
    q = random_codes(8, 2048, "e4m3")
    strided = torch.ones(8, 32, device="cuda")[:, ::2]  # strides (32, 2)
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b.*contiguous"):
        quant.per_token_cast_back((q, strided), "bf16", 128)
    with pytest.raises(errors.KernelArgumentError, match=r"\bsf\b"):  # UE8M0 words: 16 / 4 per token
        quant.per_token_cast_back((q, torch.zeros(8, 16, dtype=torch.int32, device="cuda")), "bf16", 128)


def test_uncovered_group_size_in_a_layout_is_refused() -> None:
    q = random_codes(8, 2048, "e4m3")
    col_major = random_scales(8, 43).t().contiguous().t()  # npc 48: built for no layout
    with pytest.raises(errors.VariantNotFoundError, match="npc=48"):
        quant.per_token_cast_back((q, col_major), "bf16", 48)


def test_per_block_scales_of_the_wrong_shape_are_refused() -> None:
    q = random_codes(4, 2048, "e4m3")  # (128, 128) blocks: sf must be (ceil(4 / 128), 2048 / 128) = (1, 16)
    with pytest.raises(errors.KernelArgumentError, match=r"^x\[1\] \(sf\).*\(1, 16\)"):
        quant.cast_back((q, torch.ones(4, 16, device="cuda")), "bf16", (128, 128))


# --- per-block scales, one scale per row, NaN ------------------------------------------------

BLOCKS = [(32, 32), (32, 128), (128, 32), (128, 128)]


@pytest.mark.parametrize("num_tokens", [0, 1, 4001, 8192])
@pytest.mark.parametrize("block", BLOCKS, ids=str)
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
def test_cast_back_per_block_scales(out: str, fmt: str, block: tuple[int, int], num_tokens: int) -> None:
    """decode(q) * sf[t // bm, c // bk], bit for bit; scales row-major and column-major."""
    bm, bk = block
    hidden = 7168 if num_tokens == 8192 else 2560
    q = random_codes(num_tokens, hidden, fmt)
    sf = random_scales(-(-num_tokens // bm), hidden // bk)
    dtype, name = OUT[out]
    for scales in (sf, sf.t().contiguous().t()):
        got = quant.cast_back((q, scales), name, block)
        assert got.dtype == dtype and got.shape == (num_tokens, hidden)
        want = per_block_cast_back_ref(q, sf, name, block)
        assert torch.equal(got.view(torch.int16 if out == "bfloat16" else torch.int32),
                           want.view(torch.int16 if out == "bfloat16" else torch.int32))


@pytest.mark.parametrize("num_tokens", [0, 1, 129, 4001])
@pytest.mark.parametrize("hidden", [64, 576, 1088, 3072, 7168])
@pytest.mark.parametrize(("fmt", "block"), [("e4m3", b) for b in [*BLOCKS, (128, 1), (32, 1)]]
                         + [("e2m1", b) for b in BLOCKS])
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
def test_cast_back_block_scales_at_any_hidden(out: str, fmt: str, block: tuple[int, int], hidden: int,
                                               num_tokens: int) -> None:
    """Row-major per-block and per-channel ((bm, 1), per_channel_cast's) scales, read in place by the variants of
    their block_m, at hidden sizes whose last block is partial (576, 1088 with 128-wide blocks), into a poisoned
    out; the column-major form of the same scales (spread to per-token ones) gives the same bits."""
    bm, bk = block
    q = random_codes(num_tokens, hidden, fmt)
    sf = random_scales(-(-num_tokens // bm), -(-hidden // bk))
    dtype, name = OUT[out]
    view = torch.int16 if out == "bfloat16" else torch.int32
    poisoned = torch.full((num_tokens, hidden), -1, dtype=view, device="cuda").view(dtype)
    got = quant.cast_back((q, sf), name, block, out=poisoned)
    assert got is poisoned
    want = per_block_cast_back_ref(q, sf, name, block)
    assert torch.equal(got.view(view), want.view(view))
    if bk != 1:
        spread = quant.cast_back((q, sf.t().contiguous().t()), name, block)
        assert torch.equal(spread.view(view), want.view(view))


@pytest.mark.parametrize(("fmt", "block"), [("e4m3", (128, 128)), ("e2m1", (32, 32))])
def test_per_block_cast_round_trip(fmt: str, block: tuple[int, int]) -> None:
    if not hasattr(quant, "per_block_cast"):
        pytest.skip("the package has no per_block_cast")
    x = torch.randn(4001, 7168, device="cuda", dtype=torch.bfloat16)
    q, sf = quant.per_block_cast(x, fmt, block)
    y = quant.cast_back((q, sf), "fp32", block)
    assert cast_error(x.float(), y) < (1e-3 if fmt == "e4m3" else 2e-2)


def test_per_block_scale_errors_name_the_argument() -> None:
    q = random_codes(40, 2048, "e4m3")
    with pytest.raises(errors.KernelArgumentError, match=r"x\[1\] \(sf\)"):
        quant.cast_back((q, torch.ones(1, 16, device="cuda")), "bf16", (32, 128))  # needs 2 token blocks
    with pytest.raises(NotImplementedError, match=r"x_block_size"):
        quant.cast_back((q, torch.ones(1, 16, device="cuda")), "bf16", (64, 128))
    with pytest.raises(errors.KernelArgumentError, match=r"x\[1\] \(sf\)"):  # (128, 1): one scale per channel
        quant.cast_back((q, torch.ones(1, 16, device="cuda")), "bf16", (128, 1))


@pytest.mark.parametrize("num_tokens", [0, 1, 4001, 8192])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
def test_one_scale_per_row(out: str, fmt: str, hidden: int, num_tokens: int) -> None:
    """num_per_channels == hidden (grid npc 0): scales (T, 1)."""
    q = random_codes(num_tokens, hidden, fmt)
    sf = random_scales(num_tokens, 1)
    _, name = OUT[out]
    got = quant.per_token_cast_back((q, sf), name, hidden)
    want = per_token_cast_back_ref(q, sf, name, hidden)
    bits = torch.int16 if out == "bfloat16" else torch.int32
    assert torch.equal(got.view(bits), want.view(bits))


def test_nan_codes_and_scales_decode_to_nan() -> None:
    """What per_token_cast writes for a NaN group (codes 0x7F / 0, scale NaN or UE8M0 0xFF) decodes to NaN."""
    x = torch.randn(3, 2048, device="cuda", dtype=torch.bfloat16)
    x[1, 7] = float("nan")
    for fmt, npc, flags in (("e4m3", 128, {}), ("e2m1", 32, {}), ("e4m3", 128, {
            "round_sf": True, "use_tma_aligned_col_major_sf": True, "use_packed_ue8m0": True})):
        q, sf = quant.per_token_cast(x, fmt, npc, **flags)
        y = quant.per_token_cast_back((q, sf), "fp32", npc)
        assert bool(torch.isnan(y[1, :npc]).all()) and not bool(torch.isnan(y[[0, 2]]).any())
        assert not bool(torch.isnan(y[1, npc:]).any())
        assert torch.equal(y.isnan(), dequant(q, sf, fmt, npc).isnan())


def test_e5m6_routes_to_its_module_or_names_x_special_fmt() -> None:
    """x_special_fmt='e5m6' goes to cast_back_e5m6 when the package holds it (quant/_e5m6.py)."""
    import importlib

    x = torch.randn(5, 2048, device="cuda", dtype=torch.bfloat16)
    try:
        importlib.import_module(f"{tile_kernels_aot.__name__}.quant._e5m6")
    except ImportError:
        q = random_codes(5, 2048, "e4m3")
        for call in (lambda: quant.per_token_cast_back((q, torch.ones(5, 1, device="cuda")), "bf16", 2048, "e5m6"),
                     lambda: quant.cast_back((q, torch.ones(5, 1, device="cuda")), "bf16", (1, 2048), "e5m6")):
            with pytest.raises(NotImplementedError, match=r"^x_special_fmt"):
                call()
        return
    pair = quant.per_token_cast(x, "e5m6", 2048)
    y = quant.cast_back(pair, "fp32", (1, 2048), x_special_fmt="e5m6")
    assert torch.equal(y, quant.per_token_cast_back(pair, "fp32", 2048, x_special_fmt="e5m6"))
    assert cast_error(x.float(), y) < 1e-4  # KERNELS.md's E5M6 bound
