"""GPU tests of ``per_token_cast_e5m6`` and ``cast_back_e5m6`` against tests/reference/quant_e5m6.py.

E5M6 codes and fp32 scales are exact formats: codes are compared as bytes and scales as int32
bits (tolerance: none). Cast back is compared bit for bit too (fp32 and bf16 outputs are one
fp32 multiply and a round-to-nearest-even cast away from exact values), except that NaN
outputs are compared by position only (NaN payloads are not specified). The round trip is held
to KERNELS.md's E5M6 tolerance: 1 - 2 sum(xy) / sum(x^2 + y^2) < 1e-4. The reference runs on
the same GPU. Launchers are also called directly on outputs poisoned with 0xFF bytes (NaN codes)
and NaN scales, which catches any element a kernel fails to write.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.gpu.compare import assert_same_codes_and_scales
from tests.gpu.installed import installed_package
from tests.reference.quant import cast_error
from tests.reference.quant_e5m6 import (
    NAN_CODE,
    cast_back_e5m6_ref,
    e5m6_pack,
    e5m6_unpack,
    per_token_cast_e5m6_ref,
)

tile_kernels_aot, quant, errors, runtime = installed_package()

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
HIDDEN = (576, 2048, 2560, 3072, 4096, 6144, 7168)  # kernel_specs/quant_e5m6.yaml
CAST = list(itertools.product(DTYPES, HIDDEN, (False, True)))  # (in_dtype, hidden, round_sf)
BACK = list(itertools.product(DTYPES, HIDDEN))  # (out_dtype, hidden)
POISON_BYTE = 0xFF  # codes 0xFFF (NaN) everywhere; no finite input produces them


def cast_id(v: tuple[str, int, bool]) -> str:
    return f"{v[0]}-H{v[1]}" + ("-round_sf" if v[2] else "")


def back_id(v: tuple[str, int]) -> str:
    return f"{v[0]}-H{v[1]}"


def random_rows(num_tokens: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """Gaussian rows times a random magnitude in [1e-3, 1e3] per row; no exact zeros."""
    magnitude = torch.pow(10.0, torch.empty(num_tokens, 1, device="cuda").uniform_(-3, 3))
    x = torch.randn(num_tokens, hidden, device="cuda") * magnitude
    return torch.where(x == 0, torch.ones_like(x), x).to(dtype)


def assert_cast_matches_reference(x: torch.Tensor, q: torch.Tensor, sf: torch.Tensor, round_sf: bool) -> None:
    ref_q, ref_sf = per_token_cast_e5m6_ref(x, round_sf=round_sf)
    assert sf.shape == (x.shape[0], 1)
    assert_same_codes_and_scales(q, sf.contiguous(), ref_q, ref_sf)


def assert_same_output(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Bitwise equal, NaN positions equal (payloads aside); counts of differences in the message."""
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.is_contiguous()
    nan_out, nan_ref = torch.isnan(out), torch.isnan(ref)
    assert torch.equal(nan_out, nan_ref), f"NaN at {int((nan_out != nan_ref).sum())} positions differs"
    bits = torch.int16 if out.element_size() == 2 else torch.int32
    wrong = int(((out.view(bits) != ref.view(bits)) & ~nan_ref).sum())
    assert wrong == 0, f"{wrong} of {out.numel()} outputs differ from the reference"


def launch_cast_poisoned(x: torch.Tensor, v: tuple[str, int, bool]) -> tuple[torch.Tensor, torch.Tensor]:
    in_dtype, hidden, round_sf = v
    num_tokens = x.shape[0]
    q = torch.full((num_tokens, hidden // 8 * 12), POISON_BYTE, dtype=torch.uint8, device="cuda")
    sf = torch.full((num_tokens, 1), float("nan"), device="cuda")
    launch = runtime.get_kernel("per_token_cast_e5m6").select(in_dtype=in_dtype, hidden=hidden, round_sf=round_sf,
                                                             sf_layout="float")
    launch(x, q.view(torch.int32), sf.view(-1))
    torch.cuda.synchronize()
    return q, sf


def random_codes(num_tokens: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random bytes (every 12-bit code, NaN and inf included) and positive scales over 2^+-20."""
    q = torch.randint(0, 256, (num_tokens, hidden // 8 * 12), dtype=torch.uint8, device="cuda")
    sf = torch.pow(2.0, torch.empty(num_tokens, 1, device="cuda").uniform_(-20, 20))
    return q, sf


# --- per_token_cast_e5m6 ------------------------------------------------------------------


@pytest.mark.parametrize("num_tokens", [0, 1, 4001])
@pytest.mark.parametrize("v", CAST, ids=cast_id)
def test_per_token_cast_e5m6(v: tuple[str, int, bool], num_tokens: int) -> None:
    in_dtype, hidden, round_sf = v
    x = random_rows(num_tokens, hidden, DTYPES[in_dtype])
    q, sf = quant.per_token_cast_e5m6(x, hidden, round_sf=round_sf)
    assert q.dtype == torch.uint8 and q.shape == (num_tokens, hidden * 3 // 2)
    assert_cast_matches_reference(x, q, sf, round_sf)


@pytest.mark.parametrize("col_major", [False, True])
@pytest.mark.parametrize("v", [v for v in CAST if v[1] == 2048], ids=cast_id)
def test_tilekernels_spelling_per_token_cast_to_e5m6(v: tuple[str, int, bool], col_major: bool) -> None:
    """TileKernels' name and positional order: (x, num_per_channels, use_tma_aligned_col_major_sf, round_sf)."""
    in_dtype, hidden, round_sf = v
    x = random_rows(4001, hidden, DTYPES[in_dtype])
    q, sf = quant.per_token_cast_to_e5m6(x, hidden, col_major, round_sf)
    ref_q, ref_sf = quant.per_token_cast_e5m6(x, hidden, round_sf=round_sf, use_tma_aligned_col_major_sf=col_major)
    assert torch.equal(q, ref_q) and sf.stride() == ref_sf.stride()
    assert torch.equal(sf.view(torch.int32), ref_sf.view(torch.int32))


@pytest.mark.parametrize("v", [v for v in CAST if v[1] == 7168], ids=cast_id)
def test_per_token_cast_e5m6_8192_tokens(v: tuple[str, int, bool]) -> None:
    x = random_rows(8192, v[1], DTYPES[v[0]])
    q, sf = quant.per_token_cast_e5m6(x, round_sf=v[2])
    assert_cast_matches_reference(x, q, sf, v[2])


@pytest.mark.parametrize("num_tokens", [1, 3, 4001])
@pytest.mark.parametrize("v", CAST, ids=cast_id)
def test_cast_launcher_overwrites_poisoned_outputs(v: tuple[str, int, bool], num_tokens: int) -> None:
    x = random_rows(num_tokens, v[1], DTYPES[v[0]])
    q, sf = launch_cast_poisoned(x, v)
    assert not torch.isnan(sf).any(), "some scale factors were never written"
    assert not (e5m6_unpack(q) == 0xFFF).any(), "some codes were never written"
    assert_cast_matches_reference(x, q, sf, v[2])


@pytest.mark.parametrize("v", [v for v in CAST if v[1] in (2048, 2560)], ids=cast_id)
def test_format_maximum_tiny_values_and_specials(v: tuple[str, int, bool]) -> None:
    """Rows at the maximum, tiny rows (amax floor, fp16-subnormal codes), signed zeros, ties."""
    in_dtype, hidden, round_sf = v
    dtype = DTYPES[in_dtype]
    base = torch.randn(6, hidden, device="cuda")
    base[0, ::7] = 65024.0  # amax = 65024: scale 1, codes hit 0x7BF exactly
    base[0, 1::7] = -65024.0
    base[1] *= 1e-8  # under the 1e-4 amax floor
    base[2] *= 1e-30
    base[3, ::2] = -0.0
    base[3, 1::2] = 0.0
    base[4] *= 2.0 ** torch.randint(-30, 1, (hidden,), device="cuda").float()  # wide in-row range
    base[5, 0] = 65024.0  # scale 1: ties of the E5M6 grid (1 + (2k + 1) 2^-7)
    base[5, 1:] = 1 + (2 * torch.arange(hidden - 1, device="cuda") % 128 + 1) * 2.0**-7
    x = base.to(dtype)
    q, sf = launch_cast_poisoned(x, v)
    assert_cast_matches_reference(x, q, sf, round_sf)
    if not round_sf:
        codes = e5m6_unpack(q[0:1])
        assert (codes[0, ::7] == 0x7BF).all() and (codes[0, 1::7] == 0xFBF).all()


@pytest.mark.parametrize("v", [v for v in CAST if v[1] == 2048], ids=cast_id)
def test_nan_input_is_never_silent(v: tuple[str, int, bool]) -> None:
    """A NaN input gives a NaN code (TileKernels' rounding would make it -0.0) and a finite scale."""
    x = random_rows(3, v[1], DTYPES[v[0]])
    x[1, 5] = float("nan")
    x[2, :] = float("nan")
    q, sf = quant.per_token_cast_e5m6(x, round_sf=v[2])
    codes = e5m6_unpack(q)
    assert codes[1, 5] == NAN_CODE and (codes[2] == NAN_CODE).all()
    assert torch.isfinite(sf).all()
    assert_cast_matches_reference(x, q, sf, v[2])
    out = quant.cast_back_e5m6((q, sf), "fp32")
    assert torch.isnan(out[1, 5]) and torch.isnan(out[2]).all() and not torch.isnan(out[0]).any()


@pytest.mark.parametrize("v", [v for v in CAST if v[1] == 2048], ids=cast_id)
def test_inf_input_is_never_silent(v: tuple[str, int, bool]) -> None:
    """An Inf gives sf = Inf and the factor +0, with or without round_sf (the exponent negation of
    round_sf would give -Inf, and codes of flipped sign): the row's codes are +-0 and a NaN for the
    Inf itself, and the row dequantizes to NaN."""
    in_dtype, hidden, round_sf = v
    x = random_rows(3, hidden, DTYPES[in_dtype])
    x[1, 7] = float("inf")
    x[2, 3] = -float("inf")
    q, sf = quant.per_token_cast_e5m6(x, round_sf=round_sf)
    assert_cast_matches_reference(x, q, sf, round_sf)
    assert torch.isinf(sf[1:]).all() and torch.isfinite(sf[0]).all()
    codes = e5m6_unpack(q)
    assert (codes[1:] & 0x7FF == 0).sum() == 2 * hidden - 2, "finite values of an Inf row must code +-0"
    assert codes[1, 7] == NAN_CODE and codes[2, 3] == NAN_CODE
    out = quant.cast_back_e5m6((q, sf), "fp32")
    assert torch.isnan(out[1:]).all() and not torch.isnan(out[0]).any()


@pytest.mark.parametrize("num_tokens", [0, 1, 5, 4001])
def test_col_major_scales(num_tokens: int) -> None:
    x = random_rows(num_tokens, 4096, torch.bfloat16)
    q, sf = quant.per_token_cast_e5m6(x, use_tma_aligned_col_major_sf=True)
    padded = (num_tokens + 3) // 4 * 4
    assert sf.shape == (num_tokens, 1) and sf.stride() == (1, padded)
    assert sf.untyped_storage().nbytes() >= padded * 4
    assert_cast_matches_reference(x, q, sf, False)
    out = quant.cast_back_e5m6((q, sf), "bf16")
    assert_same_output(out, cast_back_e5m6_ref(q, sf, torch.bfloat16))


def test_runs_on_the_current_stream() -> None:
    x = random_rows(4001, 7168, torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        q, sf = quant.per_token_cast_e5m6(x)
        out = quant.cast_back_e5m6((q, sf), "bf16")
    stream.synchronize()
    assert_cast_matches_reference(x, q, sf, False)
    assert_same_output(out, cast_back_e5m6_ref(q, sf, torch.bfloat16))


# --- cast_back_e5m6 -----------------------------------------------------------------------


@pytest.mark.parametrize("num_tokens", [0, 1, 4001, 8192])
@pytest.mark.parametrize("v", BACK, ids=back_id)
def test_cast_back_e5m6(v: tuple[str, int], num_tokens: int) -> None:
    out_dtype, hidden = v
    q, sf = random_codes(num_tokens, hidden)
    fmt = "bf16" if out_dtype == "bfloat16" else "fp32"
    out = quant.cast_back_e5m6((q, sf), fmt)
    assert_same_output(out, cast_back_e5m6_ref(q, sf, DTYPES[out_dtype]))


@pytest.mark.parametrize("num_tokens", [1, 3, 4001])
@pytest.mark.parametrize("v", BACK, ids=back_id)
def test_cast_back_launcher_overwrites_poisoned_outputs(v: tuple[str, int], num_tokens: int) -> None:
    out_dtype, hidden = v
    # Finite codes only (exponent field < 31), so a NaN in out means "never written".
    codes = torch.randint(0, 4096, (num_tokens, hidden), device="cuda")
    codes = torch.where((codes >> 6) & 0x1F == 0x1F, codes & ~0x40, codes)
    q, sf = e5m6_pack(codes), random_codes(num_tokens, hidden)[1]
    out = torch.full((num_tokens, hidden), float("nan"), dtype=DTYPES[out_dtype], device="cuda")
    runtime.get_kernel("cast_back_e5m6").select(out_dtype=out_dtype, hidden=hidden, sf_layout="float")(q.view(torch.int32), sf.view(-1), out)
    torch.cuda.synchronize()
    ref = cast_back_e5m6_ref(q, sf, DTYPES[out_dtype])
    assert not torch.isnan(ref).any()
    assert_same_output(out, ref)


@pytest.mark.parametrize("num_tokens", [1, 3, 5])
@pytest.mark.parametrize("v", BACK, ids=back_id)
def test_cast_back_leaves_rows_past_the_end_alone(v: tuple[str, int], num_tokens: int) -> None:
    # From H 4096 up an fp32 block decodes two rows of a piece; with an odd num_tokens the last block's second row
    # lies past the end. out is the first num_tokens rows of a NaN-poisoned buffer one row longer: that row must
    # stay NaN, and the rows before it must be the reference's.
    out_dtype, hidden = v
    q, sf = random_codes(num_tokens, hidden)
    buffer = torch.full((num_tokens + 1, hidden), float("nan"), dtype=DTYPES[out_dtype], device="cuda")
    runtime.get_kernel("cast_back_e5m6").select(out_dtype=out_dtype, hidden=hidden, sf_layout="float")(
        q.view(torch.int32), sf.view(-1), buffer[:num_tokens])
    torch.cuda.synchronize()
    assert torch.isnan(buffer[num_tokens]).all()
    assert_same_output(buffer[:num_tokens], cast_back_e5m6_ref(q, sf, DTYPES[out_dtype]))


@pytest.mark.parametrize("out_dtype", ["bf16", "fp32", torch.bfloat16, torch.float32])
@pytest.mark.parametrize("v", [v for v in CAST if not v[2]] + [("bfloat16", 7168, True)], ids=cast_id)
def test_round_trip(v: tuple[str, int, bool], out_dtype: str | torch.dtype) -> None:
    x = random_rows(4001, v[1], DTYPES[v[0]])
    pair = quant.per_token_cast_e5m6(x, round_sf=v[2])
    out = quant.cast_back_e5m6(pair, out_dtype)
    assert out.dtype == {"bf16": torch.bfloat16, "fp32": torch.float32}.get(out_dtype, out_dtype)  # type: ignore[call-overload]
    error = cast_error(x.float(), out.float())
    assert error < 1e-4, f"round-trip error {error:.3g} >= 1e-4 (KERNELS.md, E5M6)"


def test_cast_back_strided_scales() -> None:
    """A (T, 1) column of a wider tensor is gathered, not read at the wrong stride."""
    q, _ = random_codes(33, 2048)
    wide = torch.rand(33, 4, device="cuda") + 0.5
    sf = wide[:, 2:3]
    out = quant.cast_back_e5m6((q, sf), "fp32")
    assert_same_output(out, cast_back_e5m6_ref(q, sf.contiguous(), torch.float32))


# --- errors -------------------------------------------------------------------------------


def test_cast_other_dtype_is_refused() -> None:
    x = torch.ones(4, 2048, dtype=torch.float16, device="cuda")
    with pytest.raises((errors.VariantNotFoundError, errors.KernelArgumentError), match=r"\bx\b|float16"):
        quant.per_token_cast_e5m6(x)


def test_cast_uncovered_hidden_names_the_built_variants() -> None:
    x = torch.ones(4, 1536, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(errors.VariantNotFoundError) as info:
        quant.per_token_cast_e5m6(x)
    for hidden in HIDDEN:
        assert f"hidden={hidden}" in str(info.value)


def test_cast_bad_arguments_name_the_argument() -> None:
    x = torch.ones(4, 2048, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="num_per_channels"):
        quant.per_token_cast_e5m6(x, 128)
    with pytest.raises(ValueError, match="use_packed_ue8m0"):
        quant.per_token_cast_e5m6(x, use_packed_ue8m0=True)
    with pytest.raises(ValueError, match=r"\bx\b"):
        quant.per_token_cast_e5m6(torch.ones(2048, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(errors.KernelError, match=r"\bx\b"):
        quant.per_token_cast_e5m6(x.cpu())
    with pytest.raises(errors.KernelError, match=r"\bx\b"):
        quant.per_token_cast_e5m6(torch.ones(4, 4096, dtype=torch.bfloat16, device="cuda")[:, :2048])


def test_cast_back_bad_arguments_name_the_argument() -> None:
    q, sf = random_codes(4, 2048)
    with pytest.raises(ValueError, match="fmt"):
        quant.cast_back_e5m6((q, sf), "fp16")
    with pytest.raises(TypeError, match=r"\bx\b"):
        quant.cast_back_e5m6(q, "bf16")
    with pytest.raises(errors.KernelArgumentError, match=r"x\[0\]"):
        quant.cast_back_e5m6((q.view(torch.int8), sf), "bf16")
    with pytest.raises(errors.KernelArgumentError, match=r"x\[0\]"):
        quant.cast_back_e5m6((q[:, :3066], sf), "bf16")
    with pytest.raises(errors.KernelArgumentError, match=r"x\[0\]"):
        quant.cast_back_e5m6((q[:, 12:], sf), "bf16")
    with pytest.raises(errors.KernelArgumentError, match=r"x\[1\]"):
        quant.cast_back_e5m6((q, sf[:3]), "bf16")
    with pytest.raises(errors.KernelArgumentError, match=r"x\[1\]"):
        quant.cast_back_e5m6((q, sf.expand(4, 2)), "bf16")
    with pytest.raises((errors.VariantNotFoundError, errors.KernelArgumentError)):
        quant.cast_back_e5m6((q, sf.double()), "bf16")
    with pytest.raises(errors.VariantNotFoundError, match="hidden"):
        quant.cast_back_e5m6((q[:, :1152].contiguous(), sf), "bf16")  # hidden 768


# --- CUDA graphs and torch.compile --------------------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _graph_cases() -> dict[str, tuple]:
    x = torch.randn(257, 2560, device="cuda", dtype=torch.bfloat16)
    return {
        "per_token_cast_e5m6": (lambda t: quant.per_token_cast_e5m6(t), x),
        "per_token_cast_e5m6 round_sf col_major": (
            lambda t: quant.per_token_cast_e5m6(t, round_sf=True, use_tma_aligned_col_major_sf=True), x),
        "cast_back_e5m6 bf16": (lambda t: (quant.cast_back_e5m6(quant.per_token_cast_e5m6(t), "bf16"),), x),
        "cast_back_e5m6 fp32": (lambda t: (quant.cast_back_e5m6(quant.per_token_cast_e5m6(t), "fp32"),), x),
    }


@pytest.mark.parametrize("name", list(_graph_cases()))
def test_cuda_graph_capture_and_replay(name: str) -> None:
    fn, x = _graph_cases()[name]
    static_x = x.clone()
    fn(static_x)  # warm-up: cubin loads stay out of the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(static_x)
    for _ in range(2):
        static_x.copy_(torch.randn_like(static_x))
        expected = fn(static_x)
        for o in static_out:  # poison: replay must rewrite every element
            o.fill_(0xFF if o.dtype == torch.uint8 else float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(static_out, expected, strict=True):
            assert got.stride() == want.stride()
            assert torch.equal(_bits(got.contiguous()), _bits(want.contiguous()))


@pytest.mark.parametrize("name", list(_graph_cases()))
def test_torch_compile_fullgraph_matches_eager(name: str) -> None:
    fn, x = _graph_cases()[name]
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: fn(t), fullgraph=True)
    for _ in range(2):
        x = torch.randn_like(x)
        for got, want in zip(compiled(x), fn(x), strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
            assert torch.equal(_bits(got.contiguous()), _bits(want.contiguous()))


def test_custom_ops_are_registered() -> None:
    namespace = getattr(torch.ops, tile_kernels_aot._build_info.PACKAGE)
    for op in ("per_token_cast_e5m6", "cast_back_e5m6"):
        assert hasattr(namespace, op), op


def test_cast_back_of_a_token_slice() -> None:
    """(q[1:], sf[1:]): the codes stay word-aligned, the scales start 4 bytes in (copied, not refused)."""
    x = random_rows(9, 2560, torch.bfloat16)
    q, sf = quant.per_token_cast_e5m6(x)
    out = quant.cast_back_e5m6((q[1:], sf[1:]), "bf16")
    assert_same_output(out, cast_back_e5m6_ref(q[1:], sf[1:], torch.bfloat16))


# --- packed UE8M0 scales (use_packed_ue8m0) --------------------------------------------------------------------


def ue8m0_exponents(words: torch.Tensor) -> torch.Tensor:
    """Byte 0 of each int32 word (the biased exponent); the other three bytes must be zero."""
    assert bool(((words >> 8) == 0).all()), "UE8M0 bytes past the first are not zero"
    return words & 0xFF


@pytest.mark.parametrize("num_tokens", [0, 1, 5, 4001])
@pytest.mark.parametrize("v", [v for v in CAST if v[2]], ids=cast_id)
def test_packed_ue8m0_scales(v: tuple[str, int, bool], num_tokens: int) -> None:
    """The codes of the round_sf cast, and per token one int32 word holding its scale's exponent, column-major over
    a (1, align(T, 4)) storage as TileKernels returns it; the cast back of the pair reads the words."""
    in_dtype, hidden, _ = v
    x = random_rows(num_tokens, hidden, DTYPES[in_dtype])
    q, words = quant.per_token_cast_to_e5m6(x, hidden, True, True, True)
    ref_q, ref_sf = per_token_cast_e5m6_ref(x, round_sf=True)
    assert words.dtype == torch.int32 and words.shape == (num_tokens, 1)
    assert words.stride() == (1, -(-num_tokens // 4) * 4) or num_tokens == 0
    assert torch.equal(q, ref_q)
    assert torch.equal(ue8m0_exponents(words), (ref_sf.view(torch.int32) >> 23) & 0xFF)
    for out_dtype in (torch.bfloat16, torch.float32):
        back = quant.cast_back_e5m6((q, words), out_dtype)
        want = cast_back_e5m6_ref(ref_q, ref_sf, out_dtype)
        view = torch.int16 if out_dtype == torch.bfloat16 else torch.int32
        assert torch.equal(back.view(view), want.view(view))
