"""GPU tests of the MoE routing ops against tests/reference/moe_route.py.

Exactness: mappings, counts and expanded rows are compared bit for bit (including the -1
padding). reduce_fused is compared bit for bit too: the kernel and the reference both add
fp32 products in k order with one rounding per operation (no FMA). aux_fi is one IEEE division
per expert on both sides: exact. Outputs are allocated by the ops, so the tests poison the
caching allocator first (a freed block full of 0x7F bytes that the next allocations reuse): an
element the kernel fails to write then shows up as a mismatch.

Hidden sizes with no variant built for them (64, 576, 13 * 64, 1536, 3584, ...) run on the variants
for any hidden (grid value 0); ``generic_only`` also forces the hot sizes onto those, so that they are
checked where their chunks divide the row and where the last chunk is partial.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable, Iterator

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.gpu.poison import poison_allocator
from tests.reference.moe_route import (
    aux_fi_ref,
    expand_to_fused_ref,
    expand_to_fused_with_sf_ref,
    get_fused_mapping_ref,
    group_count_ref,
    reduce_fused_ref,
)

tk, _, errors, runtime = installed_package()
moe = tk.moe
# upper_bound (the worst-case fused size) is a helper of the op module, not a public name.
upper_bound = importlib.import_module(f"{tk.__name__}.moe._fused_mapping").upper_bound

pytestmark = pytest.mark.gpu

EXPERTS = [4, 9, 32]
TOPK = [1, 2, 6, 8]
HIDDEN = [2048, 4096, 7168]
TOKENS = [0, 1, 4001, 16384]
FP8 = torch.float8_e4m3fn


def routing(num_tokens: int, num_topk: int, num_experts: int, seed: int, masked: float = 0.1) -> torch.Tensor:
    """int64 (T, K) ids: distinct experts per token (as a top-k gives), about ``masked`` of them -1."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand((num_tokens, num_experts), generator=gen, device="cuda")
    k = min(num_topk, num_experts)
    idx = scores.topk(k, dim=1).indices
    if k < num_topk:  # more slots than experts: the rest masked
        idx = torch.cat([idx, idx.new_full((num_tokens, num_topk - k), -1)], dim=1)
    drop = torch.rand(idx.shape, generator=gen, device="cuda") < masked
    return torch.where(drop, -1, idx).contiguous()


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of t, so that NaN patterns and -0.0 compare exactly."""
    size = t.element_size()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


def assert_equal(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    bad = _bits(got) != _bits(want)
    if bad.any():
        first = tuple(torch.nonzero(bad)[0].tolist())
        raise AssertionError(f"{name}: {int(bad.sum())} of {got.numel()} elements differ; first at {first}: "
                             f"got {got[first].float().item()}, want {want[first].float().item()}")


MAPPING_NAMES = ("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start",
                 "expert_end", "num_tokens_per_expert")


def check_mapping(topk_idx: torch.Tensor, num_experts: int, size: int, alignment: int,
                  got: tuple[torch.Tensor, ...]) -> None:
    want = get_fused_mapping_ref(topk_idx, num_experts, size, alignment)
    for name, g, w in zip(MAPPING_NAMES, got, want, strict=True):
        assert_equal(name, g, w)


# ---------------------------------------------------------------------------------------------
# get_fused_mapping


@pytest.mark.parametrize("num_experts,num_topk,alignment", list(itertools.product(EXPERTS, TOPK, [1, 128])))
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_fused_mapping_no_sync(num_experts: int, num_topk: int, alignment: int, num_tokens: int) -> None:
    topk_idx = routing(num_tokens, num_topk, num_experts, seed=num_tokens + 7 * num_topk)
    size = upper_bound(num_tokens, num_topk, num_experts, alignment)
    poison_allocator()
    # force_no_sync: size is 0 when T = 0 and alignment = 1, which alone would ask for the sync path.
    *mapping, counts = moe.get_fused_mapping(topk_idx, num_experts, size, alignment, force_no_sync=True)
    assert counts == []
    check_mapping(topk_idx, num_experts, size, alignment, tuple(mapping))


@pytest.mark.parametrize("num_experts", EXPERTS)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_fused_mapping_sync_trims_to_the_segments(num_experts: int, num_tokens: int) -> None:
    topk_idx = routing(num_tokens, 8, num_experts, seed=3 + num_tokens)
    *mapping, counts = moe.get_fused_mapping(topk_idx, num_experts, 0, 128)
    want = get_fused_mapping_ref(topk_idx, num_experts, sum(counts), 128)
    assert counts == want[6].tolist()
    for name, g, w in zip(MAPPING_NAMES, mapping, want, strict=True):
        assert_equal(name, g, w)
    *forced, forced_counts = moe.get_fused_mapping(topk_idx, num_experts, 0, 128, force_no_sync=True)
    assert forced_counts == [] and forced[0].shape[0] == upper_bound(num_tokens, 8, num_experts, 128)
    assert_equal("pos_to_expert prefix", forced[0][: sum(counts)], mapping[0])


def test_fused_mapping_odd_alignment_and_out_of_range_ids() -> None:
    topk_idx = routing(4001, 6, 9, seed=11)
    topk_idx[::7, 0] = 9  # out of range: dropped like -1
    topk_idx[::5, 1] = -3
    size = upper_bound(4001, 6, 9, 7)
    check_mapping(topk_idx, 9, size, 7, tuple(moe.get_fused_mapping(topk_idx, 9, size, 7)[:7]))


def test_fused_mapping_too_small_buffer_drops_entries_without_faulting() -> None:
    topk_idx = routing(4001, 8, 32, seed=5)
    got = moe.get_fused_mapping(topk_idx, 32, 1000, 128)
    torch.cuda.synchronize()
    check_mapping(topk_idx, 32, 1000, 128, tuple(got[:7]))


@pytest.mark.parametrize("num_experts,size", [(32, None), (9, None), (32, 150000)])
def test_fused_mapping_blocks_of_several_chunks(num_experts: int, size: int | None) -> None:
    # 400008 entries are 196 chunks of 2048: with at most 148 SMs (one block each) every block
    # of the cooperative grid walks two chunks, carrying its running positions from one to the
    # next (the shapes above give one chunk per block on an H200). 150000 drops entries mid-run.
    topk_idx = routing(50001, 8, num_experts, seed=13)
    n = upper_bound(50001, 8, num_experts, 128) if size is None else size
    poison_allocator()
    check_mapping(topk_idx, num_experts, n, 128, tuple(moe.get_fused_mapping(topk_idx, num_experts, n, 128)[:7]))


def test_fused_mapping_strided_ids_and_repeated_calls() -> None:
    # A non-contiguous topk_idx is copied by the op; twenty calls give the same bits (a missing
    # barrier in the one-launch kernel would show as a run-to-run difference).
    topk_idx = routing(8192, 8, 32, seed=17).t().contiguous().t()
    assert not topk_idx.is_contiguous()
    size = upper_bound(8192, 8, 32, 128)
    first = moe.get_fused_mapping(topk_idx, 32, size, 128)[:7]
    check_mapping(topk_idx, 32, size, 128, tuple(first))
    for _ in range(20):
        for name, g, w in zip(MAPPING_NAMES, moe.get_fused_mapping(topk_idx, 32, size, 128)[:7], first, strict=True):
            assert_equal(name, g, w)


def test_fused_mapping_all_masked() -> None:
    topk_idx = torch.full((4001, 8), -1, dtype=torch.int64, device="cuda")
    got = moe.get_fused_mapping(topk_idx, 9, 256, 128)
    check_mapping(topk_idx, 9, 256, 128, tuple(got[:7]))


# ---------------------------------------------------------------------------------------------
# expand_to_fused(_with_sf)


def mapping_for(num_tokens: int, num_topk: int, num_experts: int = 9, alignment: int = 128,
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    topk_idx = routing(num_tokens, num_topk, num_experts, seed=seed)
    size = upper_bound(num_tokens, num_topk, num_experts, alignment)
    p2e, _, _, tk2p, *_ = moe.get_fused_mapping(topk_idx, num_experts, size, alignment)
    return tk2p, p2e


def random_fp8(shape: tuple[int, ...]) -> torch.Tensor:
    """Finite e4m3 values (clamped: torch casts |x| > 448 to NaN, whose payload bits could differ)."""
    return (torch.randn(shape, device="cuda") * 64).clamp(-448, 448).to(FP8)


EXPAND_HIDDEN = [2048, 2560, 3072, 4096, 6144, 7168]
EXPAND_CASES = [(h, t, k) for h in EXPAND_HIDDEN for t, k in [(0, 8), (1, 1), (4001, 6), (1000, 2)]] + [(7168, 16384, 8)]


@pytest.mark.parametrize("hidden,num_tokens,num_topk", EXPAND_CASES)
def test_expand_to_fused(hidden: int, num_tokens: int, num_topk: int) -> None:
    tk2p, p2e = mapping_for(num_tokens, num_topk, seed=hidden + num_tokens)
    x = torch.randn((num_tokens, hidden), device="cuda", dtype=torch.bfloat16)
    poison_allocator()
    assert_equal("out", moe.expand_to_fused(x, tk2p, p2e), expand_to_fused_ref(x, tk2p, p2e))


@pytest.mark.parametrize("with_sf", [False, True])
def test_expand_to_fused_expert_parallel(with_sf: bool) -> None:
    # Expert parallelism as bench.py's chain deploys it: ids of 72 experts, of which this rank keeps 0 .. 8 (the
    # mapping drops the rest), in the worst-case buffer of 9 local experts: most rows are padding for the kernel to
    # zero, where the cases above are mostly copies (tuning sweep 49: the two ends favour different grid layouts).
    num_tokens, num_topk, local = 4001, 6, 9
    topk_idx = routing(num_tokens, num_topk, 72, seed=29)
    size = upper_bound(num_tokens, num_topk, local, 128)
    p2e, _, _, tk2p, *_ = moe.get_fused_mapping(topk_idx, local, size, 128)
    assert (p2e < 0).float().mean().item() > 0.5, "expected a mostly-padding buffer"
    x = random_fp8((num_tokens, 7168)) if with_sf else torch.randn((num_tokens, 7168), device="cuda",
                                                                   dtype=torch.bfloat16)
    poison_allocator()
    if not with_sf:
        assert_equal("out", moe.expand_to_fused(x, tk2p, p2e), expand_to_fused_ref(x, tk2p, p2e))
        return
    x_sf = torch.rand((num_tokens, 7168 // 128), device="cuda") + 0.5
    out, out_sf = moe.expand_to_fused_with_sf((x, x_sf), 128, tk2p, p2e)
    want, want_sf = expand_to_fused_with_sf_ref(x, x_sf, tk2p, p2e)
    assert_equal("out", out, want)
    assert_equal("out_sf", out_sf, want_sf)


@pytest.mark.parametrize("col_major", [False, True])
@pytest.mark.parametrize("hidden,num_tokens,num_topk", EXPAND_CASES)
def test_expand_to_fused_with_sf(hidden: int, num_tokens: int, num_topk: int, col_major: bool) -> None:
    tk2p, p2e = mapping_for(num_tokens, num_topk, seed=hidden + num_tokens + 1)
    x = random_fp8((num_tokens, hidden))
    x_sf = torch.rand((num_tokens, hidden // 128), device="cuda") + 0.5
    poison_allocator()
    out, out_sf = moe.expand_to_fused_with_sf((x, x_sf), 128, tk2p, p2e, use_tma_aligned_col_major_sf=col_major)
    want, want_sf = expand_to_fused_with_sf_ref(x, x_sf, tk2p, p2e)
    assert_equal("out", out, want)
    assert_equal("out_sf", out_sf, want_sf)
    if col_major:
        n = p2e.shape[0]
        assert out_sf.stride() == (1, (n + 3) // 4 * 4) or n <= 1, out_sf.stride()


# --- hidden sizes without a variant of their own, and other dtypes -----------------------------


@pytest.fixture
def generic_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The expand and reduce ops as a build with only the variants for any hidden would run them.

    The ops' remembered calls (their dispatch tables, ``op.fast``) are cleared before and after: a call
    remembered with a hot-size variant would otherwise replay it without asking find()."""
    tables = _dispatch_tables()
    for name in ("_expand", "_reduce"):
        kernel = importlib.import_module(f"{tk.__name__}.moe.{name}")._kernel
        find = kernel.find
        monkeypatch.setattr(kernel, "find", lambda *values, find=find: find(*values) if values[0] == 0 else None)
    for table in tables:
        table.clear()
    yield
    for table in tables:
        table.clear()


def _dispatch_tables() -> list[dict[bytes, object]]:
    expand_op = importlib.import_module(f"{tk.__name__}.moe._expand").expand_to_fused
    reduce_op = importlib.import_module(f"{tk.__name__}.moe._reduce").reduce_fused
    return [f.op.fast[1] for f in (expand_op, reduce_op) if f.op.fast is not None]


# No variant is built for these hidden sizes (832 = 13 * 64); 2064 is not even a multiple of 64.
GENERIC_EXPAND_HIDDEN = [64, 576, 832, 1536, 2064, 3584]
GENERIC_EXPAND_CASES = [(h, t, k) for h in GENERIC_EXPAND_HIDDEN for t, k in [(0, 8), (1, 1), (4001, 6)]] + [
    (576, 16384, 8)]


@pytest.mark.parametrize("hidden,num_tokens,num_topk", GENERIC_EXPAND_CASES)
def test_expand_to_fused_any_hidden(hidden: int, num_tokens: int, num_topk: int) -> None:
    tk2p, p2e = mapping_for(num_tokens, num_topk, seed=hidden + num_tokens + 2)
    x = torch.randn((num_tokens, hidden), device="cuda", dtype=torch.bfloat16)
    poison_allocator()
    assert_equal("out", moe.expand_to_fused(x, tk2p, p2e), expand_to_fused_ref(x, tk2p, p2e))


@pytest.mark.parametrize("hidden", [2048, 2560, 7168])
def test_expand_to_fused_hot_sizes_on_the_variant_for_any_hidden(generic_only: None, hidden: int) -> None:
    # 2048 is one whole chunk of the bf16 row, 2560 one and a quarter, 7168 three and a half.
    tk2p, p2e = mapping_for(4001, 8, seed=hidden + 9)
    x = torch.randn((4001, hidden), device="cuda", dtype=torch.bfloat16)
    poison_allocator()
    assert_equal("out", moe.expand_to_fused(x, tk2p, p2e), expand_to_fused_ref(x, tk2p, p2e))
    q, q_sf = random_fp8((4001, hidden)), torch.rand((4001, hidden // 128), device="cuda")
    for col_major in (False, True):
        out, out_sf = moe.expand_to_fused_with_sf((q, q_sf), 128, tk2p, p2e, use_tma_aligned_col_major_sf=col_major)
        want, want_sf = expand_to_fused_with_sf_ref(q, q_sf, tk2p, p2e)
        assert_equal("out", out, want)
        assert_equal("out_sf", out_sf, want_sf)


@pytest.mark.parametrize("dtype,hidden", [(torch.float32, 576), (torch.float32, 2048), (torch.float8_e4m3fn, 4096),
                                          (torch.float8_e4m3fn, 576), (torch.float16, 7168), (torch.int32, 1536)])
def test_expand_to_fused_any_dtype_moves_the_bits(dtype: torch.dtype, hidden: int) -> None:
    # Rows move as bf16 units of the same bytes: NaN payloads and -0.0 included (random bit patterns).
    tk2p, p2e = mapping_for(4001, 6, seed=hidden + 31)
    bits = torch.randint(-(2**31), 2**31 - 1, (4001, hidden * dtype.itemsize // 4), device="cuda", dtype=torch.int32)
    x = bits.view(dtype)
    poison_allocator()
    got = moe.expand_to_fused(x, tk2p, p2e)
    assert got.dtype == dtype
    assert_equal("out", got.view(torch.uint8), expand_to_fused_ref(x.view(torch.uint8), tk2p, p2e))


def _ue8m0_words(num_tokens: int, groups: int) -> torch.Tensor:
    """int32 (T, ceil(G / 4)) words of four random biased exponents (the last word's spare bytes zero)."""
    words = -(-groups // 4)
    # Exponents below 128: the top byte's shift stays inside int32.
    exponents = torch.randint(100, 128, (num_tokens, words * 4), device="cuda", dtype=torch.int32)
    exponents[:, groups:] = 0
    e = exponents.view(num_tokens, words, 4)
    return (e[..., 0] | e[..., 1] << 8 | e[..., 2] << 16 | e[..., 3] << 24).contiguous()


@pytest.mark.parametrize("sf_form", ["fp32", "ue8m0"])
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("col_major", [False, True])
@pytest.mark.parametrize("hidden,num_tokens", [(576, 4001), (832, 1), (1536, 4001), (7168, 4001), (3584, 0)])
def test_expand_to_fused_with_sf_any_hidden_group_size_and_scales(hidden: int, num_tokens: int, col_major: bool,
                                                                  npc: int, sf_form: str) -> None:
    tk2p, p2e = mapping_for(num_tokens, 6, seed=hidden + npc)
    x = random_fp8((num_tokens, hidden))
    groups = -(-hidden // npc)
    x_sf = _ue8m0_words(num_tokens, groups) if sf_form == "ue8m0" else torch.rand((num_tokens, groups),
                                                                                  device="cuda") + 0.5
    poison_allocator()
    out, out_sf = moe.expand_to_fused_with_sf((x, x_sf), npc, tk2p, p2e, use_tma_aligned_col_major_sf=col_major)
    want, want_sf = expand_to_fused_with_sf_ref(x, x_sf, tk2p, p2e)
    assert_equal("out", out, want)
    assert_equal("out_sf", out_sf, want_sf)
    n = p2e.shape[0]
    if col_major and n > 1:
        assert out_sf.stride() == (1, (n + 3) // 4 * 4), out_sf.stride()


# ---------------------------------------------------------------------------------------------
# reduce_fused


REDUCE_CASES = [(h, t, k) for h in HIDDEN for t, k in [(0, 8), (1, 1), (4001, 6), (1000, 2)]] + [(7168, 16384, 8)]


def reduce_inputs(hidden: int, num_tokens: int, num_topk: int, seed: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                                   torch.Tensor]:
    tk2p, p2e = mapping_for(num_tokens, num_topk, seed=seed)
    x = torch.randn((p2e.shape[0], hidden), device="cuda", dtype=torch.bfloat16)
    w = torch.rand((num_tokens, num_topk), device="cuda")
    return x, w, tk2p


@pytest.mark.parametrize("hidden,num_tokens,num_topk", REDUCE_CASES)
def test_reduce_fused_bf16(hidden: int, num_tokens: int, num_topk: int) -> None:
    x, w, tk2p = reduce_inputs(hidden, num_tokens, num_topk, seed=hidden + 3)
    poison_allocator()
    assert_equal("out (weighted)", moe.reduce_fused(x, w, tk2p), reduce_fused_ref(x, w, tk2p))
    assert_equal("out (unweighted)", moe.reduce_fused(x, None, tk2p), reduce_fused_ref(x, None, tk2p))


@pytest.mark.parametrize("hidden,num_tokens,num_topk", REDUCE_CASES)
def test_reduce_fused_fp8_input(hidden: int, num_tokens: int, num_topk: int) -> None:
    _, w, tk2p = reduce_inputs(hidden, num_tokens, num_topk, seed=hidden + 4)
    n = int(tk2p.max().item()) + 1 if tk2p.numel() else 0
    x = random_fp8((max(n, 1), hidden))
    x_sf = torch.rand((x.shape[0],), device="cuda") + 0.25
    poison_allocator()
    assert_equal("out", moe.reduce_fused((x, x_sf), w, tk2p), reduce_fused_ref(x, w, tk2p, x_sf=x_sf))


@pytest.mark.parametrize("with_sf", [False, True])
@pytest.mark.parametrize("hidden,num_tokens,num_topk", REDUCE_CASES)
def test_reduce_fused_fp8_output(hidden: int, num_tokens: int, num_topk: int, with_sf: bool) -> None:
    x, w, tk2p = reduce_inputs(hidden, num_tokens, num_topk, seed=hidden + 5)
    x = x * 200  # some sums pass 448: the clamp is exercised
    sf = torch.tensor([0.75], device="cuda") if with_sf else None
    poison_allocator()
    got = moe.reduce_fused(x, w, tk2p, fp8_format="e4m3", sf=sf)
    assert_equal("out", got, reduce_fused_ref(x, w, tk2p, fp8_format="e4m3", sf=sf))


def test_reduce_fused_sums_in_k_order() -> None:
    # 2^24 + 1 - 2^24 in fp32 is 0 in this order, 1 in another: a reordered sum shows. (An FMA-fused
    # acc + x * w would show in the random-weight tests above: it changes low bits of many sums.)
    x = torch.zeros((3, 2048), dtype=torch.bfloat16, device="cuda")
    x[0], x[1], x[2] = 2.0**24, 1.0, -(2.0**24)
    w = torch.ones((2, 3), device="cuda")
    tk2p = torch.tensor([[0, 1, 2], [0, 2, 1]], dtype=torch.int32, device="cuda")
    out = moe.reduce_fused(x, w, tk2p)
    assert out[0, 0].item() == 0.0 and out[1, 0].item() == 1.0


# No variant is built for these hidden sizes (multiples of 256, as reduce_fused needs).
GENERIC_REDUCE_HIDDEN = [256, 768, 1536, 3584, 5120]
REDUCE_FORMS = [  # (x dtype, with x_sf, weighted, fp8_format, with sf)
    (torch.bfloat16, False, True, "", False), (torch.bfloat16, False, False, "", False),
    (torch.bfloat16, True, True, "", False), (torch.bfloat16, False, True, "e4m3", True),
    (torch.bfloat16, False, False, "e4m3", False), (FP8, True, True, "", False), (FP8, True, False, "", False),
    (torch.float32, False, True, "", False), (torch.float32, True, False, "", False),
    (torch.float32, True, True, "e4m3", True),
]


def _reduce_case(form: tuple[torch.dtype, bool, bool, str, bool], hidden: int, num_tokens: int, num_topk: int,
                 seed: int) -> None:
    dtype, with_x_sf, weighted, fmt, with_sf = form
    x, w, tk2p = reduce_inputs(hidden, num_tokens, num_topk, seed=seed)
    x = random_fp8(tuple(x.shape)) if dtype == FP8 else (x.float() * (64 if fmt else 1)).to(dtype)
    x_sf = torch.rand((x.shape[0],), device="cuda") + 0.25 if with_x_sf else None
    weights = w if weighted else None
    sf = torch.tensor([0.75], device="cuda") if with_sf else None
    poison_allocator()
    got = moe.reduce_fused(x if x_sf is None else (x, x_sf), weights, tk2p, fp8_format=fmt, sf=sf)
    want = reduce_fused_ref(x, weights, tk2p, x_sf=x_sf, fp8_format=fmt, sf=sf)
    if dtype == FP8 and not fmt:
        assert got.dtype == torch.bfloat16
    assert_equal("out", got, want)


@pytest.mark.parametrize("form", REDUCE_FORMS, ids=str)
@pytest.mark.parametrize("hidden,num_tokens,num_topk", [(h, 4001, 6) for h in GENERIC_REDUCE_HIDDEN] + [
    (768, 0, 8), (1536, 1, 1), (3584, 16384, 8)])
def test_reduce_fused_any_hidden_every_form(form: tuple[torch.dtype, bool, bool, str, bool], hidden: int,
                                            num_tokens: int, num_topk: int) -> None:
    _reduce_case(form, hidden, num_tokens, num_topk, seed=hidden + num_topk)


@pytest.mark.parametrize("form", REDUCE_FORMS, ids=str)
@pytest.mark.parametrize("hidden", [2048, 7168])
def test_reduce_fused_hot_sizes_every_form(form: tuple[torch.dtype, bool, bool, str, bool], hidden: int) -> None:
    # Forms without a variant of their own at a hot size (fp32 rows, bf16 rows with scales, unweighted e4m3) run on
    # the variants for any hidden or on the weighted variant: the same bits either way.
    _reduce_case(form, hidden, 4001, 8, seed=hidden + 1)


@pytest.mark.parametrize("form", REDUCE_FORMS[:6], ids=str)
@pytest.mark.parametrize("hidden", [2048, 4096, 7168])
def test_reduce_fused_hot_sizes_on_the_variant_for_any_hidden(generic_only: None, hidden: int,
                                                              form: tuple[torch.dtype, bool, bool, str, bool]) -> None:
    # A bf16 chunk is 4096 columns: 2048 is half of one, 4096 one, 7168 one and three quarters.
    _reduce_case(form, hidden, 4001, 8, seed=hidden + 2)


def test_reduce_fused_refuses_a_hidden_not_a_multiple_of_256() -> None:
    x, w, tk2p = reduce_inputs(2048, 16, 2, seed=0)
    with pytest.raises(ValueError, match="x: hidden"):
        moe.reduce_fused(x[:, :576].contiguous(), w, tk2p)


# ---------------------------------------------------------------------------------------------
# group_count, aux_fi


@pytest.mark.parametrize("num_experts", [4, 9, 32, 72, 256])
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_group_count_and_aux_fi(num_experts: int, num_tokens: int) -> None:
    topk_idx = routing(num_tokens, 8, num_experts, seed=num_experts + num_tokens)
    poison_allocator()
    assert_equal("group_count", moe.group_count(topk_idx, num_experts), group_count_ref(topk_idx, num_experts))
    assert_equal("aux_fi", moe.aux_fi(topk_idx, num_experts, 6), aux_fi_ref(topk_idx, num_experts, 6))


# ---------------------------------------------------------------------------------------------
# autograd


@pytest.mark.parametrize("num_topk", [2, 6])
def test_autograd_matches_torch_on_the_reference(num_topk: int) -> None:
    num_tokens, hidden = 257, 2048
    tk2p, p2e = mapping_for(num_tokens, num_topk, seed=21)
    x = torch.randn((num_tokens, hidden), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.rand((num_tokens, num_topk), device="cuda", requires_grad=True)
    y = moe.reduce_fused_autograd(moe.expand_to_fused_autograd(x, tk2p, p2e) * 2, w, tk2p, p2e)
    grad = torch.randn_like(y)
    y.backward(grad)

    xr = x.detach().float().requires_grad_()
    wr = w.detach().clone().requires_grad_()
    pos = tk2p.long()
    routed = (pos >= 0).float()
    rows = xr[:, None, :] * 2 * routed[..., None]  # expanded rows, gathered back per (t, k)
    yr = (rows * wr[..., None]).sum(1)
    yr.backward(grad.float())
    # bf16 forward values: a few ulps of bf16 (2^-8 relative) on the grads.
    torch.testing.assert_close(x.grad.float(), xr.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(w.grad, wr.grad, rtol=2e-2, atol=5e-1)


# ---------------------------------------------------------------------------------------------
# CUDA graphs and torch.compile


# Names only: building the cases launches kernels, which belongs in the tests, not in collection.
GRAPH_OPS = ["get_fused_mapping", "expand_to_fused", "expand_to_fused_with_sf", "reduce_fused", "reduce_fused e4m3",
             "group_count", "aux_fi", "expand_to_fused fp32 H=576", "expand_to_fused_with_sf ue8m0 H=576",
             "reduce_fused fp32 H=768"]


def _graph_ops() -> dict[str, Callable[[], tuple[torch.Tensor, ...]]]:
    topk_idx = routing(1000, 8, 32, seed=1)
    size = upper_bound(1000, 8, 32, 128)
    tk2p, p2e = mapping_for(1000, 8, num_experts=32, seed=1)
    x = torch.randn((1000, 4096), device="cuda", dtype=torch.bfloat16)
    xe = torch.randn((p2e.shape[0], 4096), device="cuda", dtype=torch.bfloat16)
    w = torch.rand((1000, 8), device="cuda")
    q = random_fp8((1000, 4096))
    q_sf = torch.rand((1000, 32), device="cuda")
    x576 = torch.randn((1000, 576), device="cuda")
    q576, q576_sf = random_fp8((1000, 576)), _ue8m0_words(1000, 576 // 128 + 1)
    xe768 = torch.randn((p2e.shape[0], 768), device="cuda")
    return {
        "get_fused_mapping": lambda: tuple(moe.get_fused_mapping(topk_idx, 32, size, 128)[:7]),
        "expand_to_fused": lambda: (moe.expand_to_fused(x, tk2p, p2e),),
        "expand_to_fused_with_sf": lambda: moe.expand_to_fused_with_sf((q, q_sf), 128, tk2p, p2e),
        "reduce_fused": lambda: (moe.reduce_fused(xe, w, tk2p),),
        "reduce_fused e4m3": lambda: (moe.reduce_fused(xe, w, tk2p, fp8_format="e4m3"),),
        "group_count": lambda: (moe.group_count(topk_idx, 32),),
        "aux_fi": lambda: (moe.aux_fi(topk_idx, 32, 8),),
        # Variants for any hidden, rows of another dtype (kernel views of the outputs), UE8M0 words.
        "expand_to_fused fp32 H=576": lambda: (moe.expand_to_fused(x576, tk2p, p2e),),
        "expand_to_fused_with_sf ue8m0 H=576": lambda: moe.expand_to_fused_with_sf(
            (q576, q576_sf), 128, tk2p, p2e, use_tma_aligned_col_major_sf=True),
        "reduce_fused fp32 H=768": lambda: (moe.reduce_fused(xe768, w, tk2p),),
    }


@pytest.mark.parametrize("name", GRAPH_OPS)
def test_cuda_graph_capture_and_replay(name: str) -> None:
    fn = _graph_ops()[name]
    expected = fn()  # warm-up: cubin loads stay out of the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn()
    for o in static_out:  # the whole storage (a column-major out_sf is a strided view of it)
        torch.empty(0, dtype=torch.uint8, device=o.device).set_(o.untyped_storage()).fill_(0x7F)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(static_out, expected, strict=True):
        assert torch.equal(_bits(got), _bits(want)), name


@pytest.mark.parametrize("name", GRAPH_OPS)
def test_torch_compile_fullgraph_matches_eager(name: str) -> None:
    fn = _graph_ops()[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    for got, want in zip(compiled(), fn(), strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype, name
        assert torch.equal(_bits(got), _bits(want)), name


# ---------------------------------------------------------------------------------------------
# bad inputs: exceptions naming the argument, never a CUDA fault


BAD_CALLS = [
    "mapping int32 ids",
    "mapping 1-D ids",
    "mapping unbuilt E",
    "mapping alignment 0",
    "mapping negative N",
    "mapping cpu ids",
    "expand rows mismatch",
    "expand hidden % 16",
    "expand strided fp32 x",
    "expand int64 positions",
    "expand 2-D pos_to_expert",
    "with_sf npc 64",
    "with_sf sf shape",
    "with_sf not a pair",
    "reduce hidden % 256",
    "reduce weights shape",
    "reduce bad format",
    "reduce sf without fp8",
    "reduce fp8 without x_sf",
    "reduce x_sf length",
    "reduce out dtype",
    "reduce out overlaps x",
    "reduce fp64 weights",
    "group_count too many",
    "group_count int32",
    "aux_fi aux_topk 0",
]


def _bad_calls() -> dict[str, tuple[Callable[[], object], type[Exception], str]]:
    idx = routing(16, 2, 9, seed=0)
    tk2p, p2e = mapping_for(16, 2, seed=0)
    x = torch.randn((16, 2048), device="cuda", dtype=torch.bfloat16)
    xe = torch.randn((p2e.shape[0], 2048), device="cuda", dtype=torch.bfloat16)
    w = torch.rand((16, 2), device="cuda")
    return {
        "mapping int32 ids": (lambda: moe.get_fused_mapping(idx.int(), 9, 0, 128), TypeError, "topk_idx"),
        "mapping 1-D ids": (lambda: moe.get_fused_mapping(idx[0], 9, 0, 128), ValueError, "topk_idx"),
        "mapping unbuilt E": (lambda: moe.get_fused_mapping(idx, 10, 0, 128), errors.VariantNotFoundError,
                              "num_experts=10"),
        "mapping alignment 0": (lambda: moe.get_fused_mapping(idx, 9, 0, 0), ValueError, "alignment"),
        "mapping negative N": (lambda: moe.get_fused_mapping(idx, 9, -5, 128), ValueError, "num_expanded_tokens"),
        "mapping cpu ids": (lambda: moe.get_fused_mapping(idx.cpu(), 9, 64, 128), Exception, "topk_idx"),
        "expand rows mismatch": (lambda: moe.expand_to_fused(x[:3], tk2p, p2e), ValueError, "token_topk_to_pos"),
        "expand hidden % 16": (lambda: moe.expand_to_fused(x[:, :1000].contiguous(), tk2p, p2e), ValueError,
                               "x: hidden"),
        "expand strided fp32 x": (lambda: moe.expand_to_fused(x.float()[:, :1024], tk2p, p2e), ValueError, "x"),
        "expand int64 positions": (lambda: moe.expand_to_fused(x, tk2p.long(), p2e), Exception, "token_topk_to_pos"),
        "expand 2-D pos_to_expert": (lambda: moe.expand_to_fused(x, tk2p, p2e[None]), ValueError, "pos_to_expert"),
        "with_sf npc 64": (lambda: moe.expand_to_fused_with_sf((x.to(FP8), torch.ones(16, 32, device="cuda")), 64,
                                                               tk2p, p2e), ValueError, "num_per_channels"),
        "with_sf sf shape": (lambda: moe.expand_to_fused_with_sf((x.to(FP8), torch.ones(16, 3, device="cuda")), 128,
                                                                 tk2p, p2e), ValueError, "x_sf"),
        "with_sf not a pair": (lambda: moe.expand_to_fused_with_sf(x, 128, tk2p, p2e), TypeError, "x"),
        "reduce hidden % 256": (lambda: moe.reduce_fused(xe[:, :2000].contiguous(), w, tk2p), ValueError, "hidden"),
        "reduce weights shape": (lambda: moe.reduce_fused(xe, w[:, :1], tk2p), ValueError, "topk_weights"),
        "reduce bad format": (lambda: moe.reduce_fused(xe, w, tk2p, fp8_format="e5m2"), ValueError, "fp8_format"),
        "reduce sf without fp8": (lambda: moe.reduce_fused(xe, w, tk2p, sf=torch.ones(1, device="cuda")),
                                  ValueError, "sf"),
        "reduce fp8 without x_sf": (lambda: moe.reduce_fused(xe.to(FP8), w, tk2p), ValueError, "x"),
        "reduce x_sf length": (lambda: moe.reduce_fused((xe.to(FP8), torch.ones(3, device="cuda")), w, tk2p),
                               ValueError, "x_sf"),
        "reduce out dtype": (lambda: moe.reduce_fused(xe, w, tk2p, out=torch.empty_like(x, dtype=torch.float32)),
                             errors.KernelArgumentError, "out"),
        "reduce out overlaps x": (lambda: moe.reduce_fused(xe, w, tk2p, out=xe[: x.shape[0]]), errors.KernelArgumentError,
                                  "out"),
        "reduce fp64 weights": (lambda: moe.reduce_fused(xe, w.double(), tk2p), Exception, "topk_weights"),
        "group_count too many": (lambda: moe.group_count(idx, 5000), ValueError, "num_groups"),
        "group_count int32": (lambda: moe.group_count(idx.int(), 9), TypeError, "group_idx"),
        "aux_fi aux_topk 0": (lambda: moe.aux_fi(idx, 9, 0), ValueError, "num_aux_topk"),
    }


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_inputs_name_the_argument(name: str) -> None:
    call, exc, word = _bad_calls()[name]
    with pytest.raises(exc, match=word):
        call()
    torch.cuda.synchronize()  # no launch went wrong behind the exception


def test_case_lists_match_their_builders() -> None:
    assert list(_graph_ops()) == GRAPH_OPS
    assert list(_bad_calls()) == BAD_CALLS
