"""The ops' calls by signature on the CPU, across op modules.

These tests alternate call signatures and check, through the stub's launch log
(tests/op_stub.py: each launch records the grid values its launcher was selected with), that
every call ran the variant of its own signature, and that a signature seen before still
refuses bad tensors and bad option types by name (a replay by dispatch skips the plan, so what
it must still refuse is in the contract or the plan's rules; tests/test_op_dispatch.py checks
the recipes, tests/test_op.py the op layer itself).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import stub_package


@pytest.fixture(scope="module")
def quant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], Any]]:
    ops = ("per_token_cast", "per_token_cast_back", "e5m6")
    with stub_package(tmp_path_factory.mktemp("cache_quant"), "cache_quant_pkg", "quant", ops) as (modules, rt):
        modules["per_token_cast"]._HAS_LAYOUTS = True  # the stub has no grid keys; the shipped spec has layouts
        yield modules, rt


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], Any]]:
    ops = ("topk_gate", "normalize_weight", "expand", "reduce", "fused_mapping", "top2_sum_gate")
    with stub_package(tmp_path_factory.mktemp("cache_moe"), "cache_moe_pkg", "moe", ops) as stubbed:
        yield stubbed


@pytest.fixture(scope="module")
def transpose(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], Any]]:
    with stub_package(tmp_path_factory.mktemp("cache_tr"), "cache_tr_pkg", "transpose",
                      ("batched_transpose",)) as stubbed:
        yield stubbed


def _last(runtime: Any) -> dict[str, Any]:
    values: dict[str, Any] = runtime.LAUNCHES[-1][1]
    return values


CAST_CALLS = [  # (dtype, hidden, fmt, npc, flags) -> the grid values its launcher must have
    (torch.bfloat16, 2048, "e4m3", 128, {}, dict(in_dtype="bfloat16", npc=128, round_sf=False, sf_layout="row_major")),
    (torch.float32, 2048, "e4m3", 128, {}, dict(in_dtype="float32", npc=128, round_sf=False, sf_layout="row_major")),
    (torch.bfloat16, 2048, "e2m1", 32, {}, dict(fmt="e2m1", npc=32)),
    (torch.bfloat16, 2048, "e4m3", 2048, {}, dict(npc=0, hidden=2048)),
    (torch.bfloat16, 4096, "e4m3", 128, {}, dict(hidden=4096, npc=128)),
    (torch.bfloat16, 2048, "e4m3", 128, {"round_sf": True}, dict(round_sf=True, sf_layout="row_major")),
    (torch.bfloat16, 2048, "e4m3", 128, {"use_tma_aligned_col_major_sf": True}, dict(sf_layout="col_major")),
    (torch.bfloat16, 2048, "e4m3", 128, {"use_tma_aligned_col_major_sf": True, "round_sf": True,
                                         "use_packed_ue8m0": True}, dict(sf_layout="ue8m0", round_sf=True)),
]


def test_cast_runs_the_variant_of_each_signature(quant: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = quant
    cast = modules["per_token_cast"]
    for _ in range(2):  # the second round is served from the cache
        for dtype, hidden, fmt, npc, flags, expected in CAST_CALLS:
            x = torch.zeros(3, hidden, dtype=dtype)
            q, sf = cast.per_token_cast(x, fmt, npc, **flags)
            assert expected.items() <= _last(runtime).items(), (fmt, npc, flags)
            assert runtime.LAUNCHES[-1][2][3] == 0  # mode: cast
            assert q.shape[1] == (hidden if fmt == "e4m3" else hidden // 2)
            sf_only = cast.per_token_cast_with_sf_only(x, fmt, npc, **flags)
            assert expected.items() <= _last(runtime).items() and runtime.LAUNCHES[-1][2][3] == 1
            assert sf_only.shape == sf.shape and sf_only.stride() == sf.stride()


def test_precomputed_sf_has_its_own_variants(quant: tuple[dict[str, ModuleType], Any]) -> None:
    # With fp32 scales the given-scales variant is the round_sf=False one, whatever round_sf says:
    # a cache shared with per_token_cast would hand it the round_sf=True launcher.
    modules, runtime = quant
    cast = modules["per_token_cast"]
    x = torch.zeros(3, 2048, dtype=torch.bfloat16)
    for _ in range(2):
        _, sf = cast.per_token_cast(x, "e4m3", 128, round_sf=True)
        assert _last(runtime)["round_sf"] is True
        cast.per_token_cast_with_precomputed_sf(x, "e4m3", 128, sf, round_sf=True)
        assert _last(runtime)["round_sf"] is False and runtime.LAUNCHES[-1][2][3] == 2


def test_cached_signatures_still_check_what_varies(quant: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = quant
    cast = modules["per_token_cast"]
    errors = __import__("cache_quant_pkg.errors", fromlist=["KernelArgumentError"])
    x = torch.zeros(4, 2048, dtype=torch.bfloat16)
    sf = cast.per_token_cast(x, "e4m3", 128)[1]  # the signature is cached from here on
    cast.per_token_cast_with_precomputed_sf(x, "e4m3", 128, sf)
    runtime.LAUNCHES.clear()
    strided = torch.zeros(4, 2049, dtype=torch.bfloat16)[:, :2048]  # same dtype and width, rows off 16 bytes
    for call in (cast.per_token_cast, cast.per_token_cast_with_sf_only):
        with pytest.raises(errors.KernelArgumentError, match=r"^x: the row stride \(2049 elements\)"):
            call(strided, "e4m3", 128)
    with pytest.raises(errors.KernelArgumentError, match=r"^x: the row stride"):
        cast.per_token_cast_with_precomputed_sf(strided, "e4m3", 128, sf)
    with pytest.raises(errors.KernelArgumentError, match=r"^sf: "):  # the given scales are checked per call
        cast.per_token_cast_with_precomputed_sf(x, "e4m3", 128, sf[:, :15])
    with pytest.raises(TypeError, match=r"^num_per_channels: expected an int"):
        cast.per_token_cast(x, "e4m3", 128.0)  # equal to and hashed as 128, refused by type
    with pytest.raises(ValueError, match=r"^x: expected a 2-D tensor"):
        cast.per_token_cast(x[0], "e4m3", 128)
    with pytest.raises(ValueError, match=r"^fmt: "):
        cast.per_token_cast(x, ["e4m3"], 128)  # unhashable: refused by the full checks
    with pytest.raises(ValueError, match=r"^x_block_size: "):
        cast.per_token_cast(x, "e4m3", 128, x_block_size=(1, 128))
    assert runtime.LAUNCHES == []


def test_cast_is_not_cached_while_compiling(quant: tuple[dict[str, ModuleType], Any],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # While torch.compile traces, the op takes the full checks and the custom op (the stub's
    # launch_op runs the plan itself), and stores nothing a traced call could depend on.
    modules, runtime = quant
    cast = modules["per_token_cast"]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    runtime.REMEMBERED.clear()
    cast.per_token_cast(torch.zeros(2, 6144, dtype=torch.bfloat16), "e4m3", 128)
    assert _last(runtime)["hidden"] == 6144
    assert runtime.REMEMBERED == []  # nothing a traced call could depend on


def test_cast_back_runs_the_variant_of_each_signature(quant: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = quant
    back = modules["per_token_cast_back"]
    q8, q4 = torch.zeros(3, 2048, dtype=torch.float8_e4m3fn), torch.zeros(3, 1024, dtype=torch.int8)
    for _ in range(2):
        for q, npc, out, expected in [(q8, 128, "bf16", dict(fmt="e4m3", npc=128, out_dtype="bfloat16")),
                                      (q4, 32, "fp32", dict(fmt="e2m1", npc=32, out_dtype="float32")),
                                      (q8, 2048, "bf16", dict(fmt="e4m3", npc=0)),
                                      (q8, 128, "fp32", dict(fmt="e4m3", out_dtype="float32"))]:
            back.per_token_cast_back((q, torch.ones(3, 2048 // npc)), out, npc)
            assert expected.items() <= _last(runtime).items()


def test_cast_back_cached_signatures_still_check_what_varies(quant: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = quant
    back, cast = modules["per_token_cast_back"], modules["per_token_cast"]
    errors = __import__("cache_quant_pkg.errors", fromlist=["KernelArgumentError"])
    q = torch.zeros(4, 2048, dtype=torch.float8_e4m3fn)
    col = cast.per_token_cast(torch.zeros(4, 2048, dtype=torch.bfloat16), "e4m3", 128,
                              use_tma_aligned_col_major_sf=True)[1]
    row = torch.ones(4, 16)
    for sf in (row, col):
        back.per_token_cast_back((q, sf), "bf16", 128)  # the signatures are cached from here on
    short = cast.per_token_cast(torch.zeros(3, 2048, dtype=torch.bfloat16), "e4m3", 128,
                                use_tma_aligned_col_major_sf=True)[1]
    runtime.LAUNCHES.clear()
    # The column-major storage is padded, so its rows are the op's to check, on every call.
    with pytest.raises(errors.KernelArgumentError, match=r"^x\[1\] \(sf\): expected shape \(4, 16\)"):
        back.per_token_cast_back((q, short), "bf16", 128)
    with pytest.raises(TypeError, match=r"^num_per_channels: expected an int"):
        back.per_token_cast_back((q, row), "bf16", 128.0)  # equal to and hashed as 128, refused by type
    with pytest.raises(TypeError, match=r"^out: "):
        back.per_token_cast_back((q, row), "bf16", 128, out=[torch.empty(4, 2048)])
    with pytest.raises(ValueError, match=r"^fmt: "):
        back.per_token_cast_back((q, row), "bf16x", 128)
    assert runtime.LAUNCHES == []
    back.per_token_cast_back([q, row], torch.bfloat16, 128)  # a list and a dtype: the full path, same variant
    assert _last(runtime)["out_dtype"] == "bfloat16"


def test_moe_launchers_follow_the_signature(moe: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = moe
    for _ in range(2):
        for experts, k, grid in ((256, 8, 256), (72, 6, 72), (256, 6, 256), (32, 6, 0)):
            modules["topk_gate"].topk_gate(torch.zeros(2, experts), k)
            assert _last(runtime) == {"num_experts": grid, "num_topk": k, "capacity": 128 if grid == 0 else 256}
        for k in (8, 2):
            modules["normalize_weight"].normalize_weight(torch.ones(2, k))
            assert _last(runtime) == {"num_topk": k}
        pos = torch.tensor([[0, 1]], dtype=torch.int32)
        p2e = torch.tensor([0, 1], dtype=torch.int32)
        for hidden in (2048, 4096):
            modules["expand"].expand_to_fused(torch.zeros(1, hidden, dtype=torch.bfloat16), pos, p2e)
            assert _last(runtime) == dict(hidden=hidden, dtype="bfloat16", with_sf=False, sf_layout="row_major")
            for col_major in (False, True):
                data = (torch.zeros(1, hidden, dtype=torch.float8_e4m3fn), torch.ones(1, hidden // 128))
                modules["expand"].expand_to_fused_with_sf(data, 128, pos, p2e, col_major)
                assert _last(runtime) == dict(hidden=hidden, dtype="float8_e4m3fn", with_sf=True,
                                              sf_layout="col_major" if col_major else "row_major")
            xe = torch.zeros(2, hidden, dtype=torch.bfloat16)
            for weights in (torch.ones(1, 2), None):
                modules["reduce"].reduce_fused(xe, weights, pos)
                assert _last(runtime) == dict(hidden=hidden, in_dtype="bfloat16", out_dtype="bfloat16",
                                              with_weights=weights is not None)
            modules["reduce"].reduce_fused((xe.to(torch.float8_e4m3fn), torch.ones(2)), torch.ones(1, 2), pos,
                                           fp8_format="e4m3")
            assert _last(runtime)["out_dtype"] == "float8_e4m3fn" and _last(runtime)["hidden"] == hidden
            # The shared no-element tensor stands for every parameter this variant does not read.
            unread = [a for a in runtime.LAUNCHES[-2][2] if isinstance(a, torch.Tensor) and a.numel() == 0]
            assert len(unread) == 3 and all(a.dtype == torch.float32 for a in unread)
        for experts in (32, 9):
            runtime.LAUNCHES.clear()
            modules["fused_mapping"].get_fused_mapping(torch.zeros(2, 2, dtype=torch.int64), experts, 16, 4)
            assert [(name, values) for name, values, _ in runtime.LAUNCHES] == [
                ("moe_fused_mapping", {"num_experts": experts})]


def test_transpose_launcher_follows_the_dtype(transpose: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = transpose
    op = modules["batched_transpose"]
    for _ in range(2):
        for dtype in (torch.bfloat16, torch.float32):
            y = op.batched_transpose(torch.zeros(2, 64, 128, dtype=dtype))
            assert _last(runtime) == {"dtype": str(dtype).removeprefix("torch.")}
            assert y.shape == (2, 128, 64) and y.dtype == dtype and y.is_contiguous()
    with pytest.raises(ValueError, match="contiguous"):  # still checked for a cached dtype
        op.batched_transpose(torch.zeros(2, 128, 64).transpose(1, 2))


def _launched_with(runtime: Any, *tensors: torch.Tensor) -> bool:
    """Whether the last launch was handed each of these very tensors (or, for a view made by the op,
    a tensor over the same memory)."""
    args = [a for a in runtime.LAUNCHES[-1][2] if isinstance(a, torch.Tensor)]
    return all(any(a is t or (a.data_ptr() == t.data_ptr() and a.numel() == t.numel()) for a in args) for t in tensors)


def test_out_tensors_are_launched_into_and_returned(moe: tuple[dict[str, ModuleType], Any],
                                                    transpose: tuple[dict[str, ModuleType], Any],
                                                    quant: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = moe
    idx = torch.empty(3, 8, dtype=torch.int64)
    assert modules["topk_gate"].topk_gate(torch.zeros(3, 256), 8, out=idx) is idx
    assert _launched_with(runtime, idx)
    denominator, normalized = torch.empty(3), torch.empty(3, 8)
    result = modules["normalize_weight"].normalize_weight(torch.ones(3, 8), out=(denominator, normalized))
    assert result[0] is denominator and result[1] is normalized and _launched_with(runtime, denominator, normalized)
    pos = torch.tensor([[0, 1]], dtype=torch.int32)
    fused = torch.empty(2, 2048, dtype=torch.bfloat16)
    assert modules["expand"].expand_to_fused(torch.zeros(1, 2048, dtype=torch.bfloat16), pos,
                                             torch.tensor([0, 1], dtype=torch.int32), out=fused) is fused
    assert _launched_with(runtime, fused)
    reduced = torch.empty(1, 2048, dtype=torch.bfloat16)
    assert modules["reduce"].reduce_fused(fused, torch.ones(1, 2), pos, out=reduced) is reduced
    assert _launched_with(runtime, reduced)
    gate_out = (torch.empty(3, 8, dtype=torch.int64), torch.empty(3, 8))
    for _ in range(2):
        result = modules["top2_sum_gate"].top2_sum_gate(torch.rand(3, 256), torch.zeros(256), 8, 4, 8, False, 0, 2.5,
                                                         0, 1, 0, 1, "sigmoid", out=gate_out)
        assert result[0] is gate_out[0] and result[1] is gate_out[1] and _launched_with(runtime, *gate_out)
        assert runtime.LAUNCHES[-1][1]["num_experts"] == 256 and runtime.LAUNCHES[-1][2][-5] == 2.5
    with pytest.raises(TypeError, match=r"^out: expected \(topk_idx, topk_weights\)"):
        modules["top2_sum_gate"].top2_sum_gate(torch.rand(3, 256), torch.zeros(256), 8, 4, 8, False, 0, 2.5, 0, 1, 0, 1,
                                               "sigmoid", out=gate_out[0])

    modules, runtime = transpose
    y = torch.empty(2, 128, 64)
    assert modules["batched_transpose"].batched_transpose(torch.zeros(2, 64, 128), out=y) is y
    assert _launched_with(runtime, y)
    y = torch.empty(128, 64)
    assert modules["batched_transpose"].transpose(torch.zeros(64, 128), out=y) is y
    assert _launched_with(runtime, y)

    modules, runtime = quant
    x = torch.zeros(3, 2048, dtype=torch.bfloat16)
    q, sf = torch.empty(3, 2048, dtype=torch.float8_e4m3fn), torch.empty(3, 16)
    for _ in range(2):  # uncached, then cached
        result = modules["per_token_cast"].per_token_cast(x, "e4m3", 128, out=(q, sf))
        assert result[0] is q and result[1] is sf and _launched_with(runtime, q, sf)
        y = torch.empty(3, 2048, dtype=torch.bfloat16)
        assert modules["per_token_cast_back"].per_token_cast_back((q, sf), "bf16", 128, out=y) is y
        assert _launched_with(runtime, y)
        assert modules["per_token_cast_back"].cast_back((q, sf), "bf16", (1, 128), out=y) is y
    # fmt 'e5m6' and E5M6 codes go to the E5M6 op module, out included
    codes, scales = torch.empty(3, 3072, dtype=torch.uint8), torch.empty(3, 1)
    result = modules["per_token_cast"].per_token_cast(x, "e5m6", 2048, out=(codes, scales))
    assert result[0] is codes and result[1] is scales and runtime.LAUNCHES[-1][0] == "per_token_cast_e5m6"
    assert [a.data_ptr() for a in runtime.LAUNCHES[-1][2][1:]] == [codes.data_ptr(), scales.data_ptr()]  # views
    assert modules["per_token_cast_back"].per_token_cast_back((codes, scales), "bf16", 2048, x_special_fmt="e5m6",
                                                              out=y) is y
    assert modules["per_token_cast_back"].cast_back((codes, scales), "bf16", (1, 2048), x_special_fmt="e5m6",
                                                    out=y) is y
    assert runtime.LAUNCHES[-1][0] == "cast_back_e5m6" and _launched_with(runtime, y)


def test_gate_cache_keys_every_scalar_by_value_and_type(moe: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = moe
    gate = modules["top2_sum_gate"]
    errors = __import__("cache_moe_pkg.errors", fromlist=["KernelArgumentError"])
    args = [torch.rand(3, 256), torch.zeros(256), 8, 4, 8, False, 0, 2.5, 0, 2, 0, 1, "sigmoid"]
    for _ in range(2):  # the second round runs from the cache: the same launches
        for index, value, expected in [(12, "softmax", dict(scoring="softmax")), (2, 6, dict(num_topk=6)),
                                       (3, 8, dict(num_groups=0, num_topk_groups=0)), (8, 1, {})]:
            call = list(args)
            call[index] = value
            idx, _ = gate.top2_sum_gate(*call)
            assert expected.items() <= _last(runtime).items() and idx.shape == (3, call[2])
            # ep_rank 1 of 2: experts_per_rank 128 is what the launcher got (ep, experts_per_rank, tp, tp ranks).
            assert runtime.LAUNCHES[-1][2][-4:] == (call[8], 128, 0, 1)
    runtime.LAUNCHES.clear()
    for index, value, error in [(2, 8.0, TypeError), (9, True, ValueError), (8, 2, ValueError),
                                (12, "tanh", ValueError), (10, 0.0, TypeError)]:
        call = list(args)
        call[index] = value  # equal to (or hashed as) a cached value, or out of range: the full checks refuse
        with pytest.raises(error):
            gate.top2_sum_gate(*call)
    with pytest.raises(ValueError, match=r"^logits: expected a 2-D tensor"):
        gate.top2_sum_gate(torch.rand(256), *args[1:])
    with pytest.raises(errors.KernelArgumentError, match=r"^to_physical_map: "):  # the mapped form: full checks
        gate.top2_sum_gate(*args, to_physical_map=torch.zeros(3, 1, dtype=torch.int32),
                           logical_count=torch.ones(3, dtype=torch.int32))
    assert runtime.LAUNCHES == []


def test_sizes_the_contract_leaves_free_are_checked_on_every_call(moe: tuple[dict[str, ModuleType], Any]) -> None:
    # reduce's x_sf, sf and weights, and top2_sum_gate's output width, are sizes of their own in the
    # kernels' contracts (the stub launcher checks nothing, as the real one checks none of these).
    modules, runtime = moe
    reduce, gate = modules["reduce"], modules["top2_sum_gate"]
    errors = __import__("cache_moe_pkg.errors", fromlist=["KernelArgumentError"])
    pos = torch.tensor([[0, 1]], dtype=torch.int32)
    data, weights = torch.zeros(2, 2048, dtype=torch.float8_e4m3fn), torch.ones(1, 2)
    reduce.reduce_fused((data, torch.ones(2)), weights, pos, fp8_format="e4m3", sf=torch.ones(1))  # cached form
    gate_args = (torch.rand(3, 256), torch.zeros(256), 8, 4, 8, False, 0, 2.5, 0, 1, 0, 1, "sigmoid")
    gate.top2_sum_gate(*gate_args)
    runtime.LAUNCHES.clear()
    with pytest.raises(ValueError, match=r"^x_sf: expected a float32 tensor of shape \(2,\)"):
        reduce.reduce_fused((data, torch.ones(3)), weights, pos, fp8_format="e4m3", sf=torch.ones(1))
    with pytest.raises(ValueError, match=r"^sf: expected a float32 tensor of shape \(1,\)"):
        reduce.reduce_fused((data, torch.ones(2)), weights, pos, fp8_format="e4m3", sf=torch.ones(0))
    with pytest.raises(ValueError, match=r"^topk_weights: expected shape \(1, 2\)"):
        reduce.reduce_fused((data, torch.ones(2)), torch.ones(1, 1), pos, fp8_format="e4m3", sf=torch.ones(1))
    for _ in range(2):  # narrower than num_topk, the kernel's lanes would write past the rows
        with pytest.raises(errors.KernelArgumentError, match=r"^topk_idx: expected shape \(num_tokens, 8\)"):
            gate.top2_sum_gate(*gate_args, out=(torch.empty(3, 4, dtype=torch.int64), torch.empty(3, 4)))
    assert runtime.LAUNCHES == []


# --- the casts' fast paths ------------------------------------------------------------------

CAST_OPS = ("per_block_cast", "per_channel_cast", "per_channel_cast_and_transpose", "swiglu_forward_and_per_token_cast",
            "swiglu_forward_and_per_channel_cast_and_transpose", "swiglu_backward_and_per_token_cast")


@pytest.fixture(scope="module")
def casts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], Any]]:
    with stub_package(tmp_path_factory.mktemp("cache_casts"), "cache_casts_pkg", "quant", CAST_OPS) as stubbed:
        yield stubbed


def _bf16(rows: int, width: int) -> torch.Tensor:
    return torch.zeros(rows, width, dtype=torch.bfloat16)


def _backward(op: ModuleType, npc: int = 128, rows: int = 4, **kwargs: Any) -> Any:
    x = (torch.zeros(rows, 4096, dtype=torch.float8_e4m3fn), torch.ones(rows, 4096 // int(npc)))
    return op.swiglu_backward_and_per_token_cast(x, _bf16(rows, 2048), torch.rand(2, 2),
                                                 torch.arange(rows, dtype=torch.int32),
                                                 torch.arange(4, dtype=torch.int32).view(2, 2), npc, **kwargs)


_POS = torch.tensor([0, 1, -1, 3], dtype=torch.int32)
# (op module, call(op, **out), the grid values its launch must have): each call's signature differs
# from the others of its op in one option, dtype or width, so a cache keyed on too little would
# hand it another's launcher.
FAST_CALLS: list[tuple[str, Any, dict[str, Any]]] = [
    ("per_block_cast", lambda op, **o: op.per_block_cast(_bf16(3, 2048), "e4m3", (128, 128), **o),
     dict(in_dtype="bfloat16", hidden=0, fmt="e4m3", block_m=128, round_sf=False, precomputed_sf=False)),
    ("per_block_cast", lambda op, **o: op.per_block_cast(_bf16(3, 2048), "e4m3", (128, 128), round_sf=True, **o),
     dict(round_sf=True, precomputed_sf=False)),
    ("per_block_cast", lambda op, **o: op.per_block_cast(_bf16(3, 2048), "e2m1", (32, 128), **o),
     dict(fmt="e2m1", block_m=32)),
    ("per_block_cast", lambda op, **o: op.per_block_cast(_bf16(3, 4096), "e2m1", (32, 128), **o), dict(hidden=4096)),
    ("per_block_cast", lambda op, **o: op.per_block_cast(torch.zeros(3, 2048), "e4m3", (128, 128), **o),
     dict(in_dtype="float32")),
    ("per_block_cast", lambda op, **o: op.per_block_cast_with_precomputed_sf(
        _bf16(3, 2048), "e4m3", (128, 128), torch.ones(1, 16), round_sf=True, **o),
     dict(round_sf=False, precomputed_sf=True)),
    ("per_channel_cast", lambda op, **o: op.per_channel_cast(_bf16(128, 256), "e4m3", 128, **o),
     dict(in_dtype="bfloat16", hidden=0, expand=False, round_sf=False)),
    ("per_channel_cast", lambda op, **o: op.per_channel_cast(torch.zeros(128, 256), "e4m3", 128, True, **o),
     dict(in_dtype="float32", round_sf=True)),
    ("per_channel_cast_and_transpose", lambda op, **o: op.per_channel_cast_and_transpose(
        _bf16(128, 256), "e4m3", 32, **o), dict(hidden=0, npt=32, round_sf=False)),
    ("per_channel_cast_and_transpose", lambda op, **o: op.per_channel_cast_and_transpose(
        _bf16(128, 512), "e4m3", 128, True, **o), dict(hidden=0, npt=128, round_sf=True)),
    ("swiglu_forward_and_per_token_cast", lambda op, **o: op.swiglu_forward_and_per_token_cast(
        _bf16(4, 4096), "e4m3", 128, **o), dict(hidden=2048, npc=128, with_weights=False, with_pos_to_expert=False)),
    ("swiglu_forward_and_per_token_cast", lambda op, **o: op.swiglu_forward_and_per_token_cast(
        _bf16(4, 4096), "e4m3", 2048, _POS, torch.rand(2, 2), _POS, **o),
     dict(npc=0, with_weights=True, with_pos_to_expert=True)),
    ("swiglu_forward_and_per_token_cast", lambda op, **o: op.swiglu_forward_and_per_token_cast(
        _bf16(4, 4096), "e4m3", 128, pos_to_expert=_POS, round_sf=True, swiglu_clamp_value=7.0, **o),
     dict(npc=128, with_weights=False, with_pos_to_expert=True)),
    ("swiglu_forward_and_per_channel_cast_and_transpose", lambda op, **o: (
        op.swiglu_forward_and_per_channel_cast_and_transpose(_bf16(128, 512), "e4m3", 32, **o)),
     dict(hidden=0, npt=32, without_transpose=False)),
    ("swiglu_forward_and_per_channel_cast_and_transpose", lambda op, **o: (
        op.swiglu_forward_and_per_channel_cast_and_transpose(_bf16(128, 512), "e4m3", 128, False, True, 3.0, **o)),
     dict(hidden=0, npt=128, without_transpose=True)),
    ("swiglu_backward_and_per_token_cast", lambda op, **o: _backward(op, **o), dict(hidden=2048, npc=128)),
    ("swiglu_backward_and_per_token_cast", lambda op, **o: _backward(op, 32, round_sf=True, **o),
     dict(hidden=2048, npc=32)),
]


def _flat(result: Any) -> list[torch.Tensor]:
    """The tensors of an op's result (a tensor, or tuples of them, nested) in order."""
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for part in result for t in _flat(part)]


def _nest(tensors: list[torch.Tensor], like: Any) -> Any:
    """tensors nested as the result ``like`` is: what out= takes."""
    if isinstance(like, torch.Tensor):
        return tensors.pop(0)
    return tuple(_nest(tensors, part) for part in like)


def test_casts_second_call_of_a_signature_skips_select(casts: tuple[dict[str, ModuleType], Any],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    modules, runtime = casts
    for op, call, _ in FAST_CALLS:  # the first call of each signature: the full checks, then select
        call(modules[op])
    for module in modules.values():
        monkeypatch.setattr(module._kernel, "select", lambda **values: pytest.fail(f"select({values})"))
    for op, call, expected in FAST_CALLS:  # the cached launcher of the call's own signature
        result = call(modules[op])
        assert expected.items() <= _last(runtime).items(), (op, expected)
        tensors = _flat(result)
        out = _nest(list(tensors), result)
        runtime.LAUNCHES.clear()
        again = call(modules[op], out=out)
        assert all(a is b for a, b in zip(_flat(again), tensors, strict=True)) and _launched_with(runtime, *tensors)
        assert expected.items() <= _last(runtime).items()
    # with_sf_only shares per_block_cast's signatures (and drops q)
    sf = modules["per_block_cast"].per_block_cast_with_sf_only(_bf16(3, 2048), "e2m1", (32, 128))
    assert sf.shape == (1, 16) and _last(runtime)["fmt"] == "e2m1"


# (op module, call(op, option) with a value of the wrong type, the error the full checks raise)
WRONG_TYPES: list[tuple[str, Any, Any, type[Exception], str]] = [
    ("per_block_cast", lambda op, b: op.per_block_cast(_bf16(3, 2048), "e4m3", b), (128.0, 128), TypeError,
     "block_size"),
    ("per_block_cast", lambda op, b: op.per_block_cast(_bf16(3, 2048), "e4m3", b), (True, 128), TypeError,
     "block_size"),
    ("per_channel_cast", lambda op, n: op.per_channel_cast(_bf16(128, 256), "e4m3", n), 128.0, TypeError,
     "num_per_tokens"),
    ("per_channel_cast_and_transpose", lambda op, n: op.per_channel_cast_and_transpose(_bf16(128, 256), "e4m3", n),
     32.0, TypeError, "num_per_tokens"),
    ("swiglu_forward_and_per_token_cast", lambda op, n: op.swiglu_forward_and_per_token_cast(_bf16(4, 4096), "e4m3",
                                                                                            n), 128.0, TypeError,
     "num_per_channels"),
    ("swiglu_forward_and_per_token_cast", lambda op, c: op.swiglu_forward_and_per_token_cast(
        _bf16(4, 4096), "e4m3", 128, swiglu_clamp_value=c), -7.0, ValueError, "swiglu_clamp_value"),
    ("swiglu_forward_and_per_channel_cast_and_transpose", lambda op, n: (
        op.swiglu_forward_and_per_channel_cast_and_transpose(_bf16(128, 512), "e4m3", n)), 32.0, TypeError,
     "num_per_tokens"),
    ("swiglu_backward_and_per_token_cast", lambda op, n: _backward(op, n), 128.0, TypeError, "num_per_channels"),
    ("swiglu_backward_and_per_token_cast", lambda op, n: _backward(op, n), True, ValueError, "num_per_channels"),
    ("swiglu_forward_and_per_token_cast", lambda op, r: op.swiglu_forward_and_per_token_cast(
        _bf16(4, 4096), "e4m3", 128, use_packed_ue8m0=r), 1, ValueError, "use_packed_ue8m0"),
]


def test_casts_cached_signatures_still_refuse_options_by_type(casts: tuple[dict[str, ModuleType], Any]) -> None:
    # Each call equals (and hashes as) a cached signature but for a type the full checks refuse.
    modules, runtime = casts
    for op, call, _ in FAST_CALLS:
        call(modules[op])
    runtime.LAUNCHES.clear()
    for op, call, value, error, name in WRONG_TYPES:
        with pytest.raises(error, match=rf"^{name}: "):
            call(modules[op], value)
    assert runtime.LAUNCHES == []
    # round_sf=1 is round_sf=True to the full checks: the same variant, by the full path
    modules["per_block_cast"].per_block_cast(_bf16(3, 2048), "e4m3", (128, 128), round_sf=1)
    assert _last(runtime)["round_sf"] is True


def test_casts_check_the_sizes_the_launcher_cannot_see(casts: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = casts
    for op, call, _ in FAST_CALLS:
        call(modules[op])
    runtime.LAUNCHES.clear()
    forward = modules["swiglu_forward_and_per_token_cast"].swiglu_forward_and_per_token_cast
    with pytest.raises(ValueError, match=r"^pos_to_expert: expected shape \(4,\)"):  # its own size in the contract
        forward(_bf16(4, 4096), "e4m3", 2048, _POS, torch.rand(2, 2), _POS[:3])
    with pytest.raises(ValueError, match=r"^pos_to_token_topk: expected shape \(4,\)"):
        forward(_bf16(4, 4096), "e4m3", 2048, _POS[:2], torch.rand(2, 2), _POS)
    with pytest.raises(ValueError, match=r"^x: num_tokens \(64\) must be a multiple of 128"):
        modules["per_channel_cast"].per_channel_cast(_bf16(64, 256), "e4m3", 128)
    with pytest.raises(ValueError, match=r"^x: num_tokens \(64\) must be a multiple of 128"):
        modules["per_channel_cast_and_transpose"].per_channel_cast_and_transpose(_bf16(64, 256), "e4m3", 32)
    channel = modules["swiglu_forward_and_per_channel_cast_and_transpose"]
    with pytest.raises(ValueError, match=r"^x: num_tokens \(64\) must be a multiple of 128"):
        channel.swiglu_forward_and_per_channel_cast_and_transpose(_bf16(64, 512), "e4m3", 32)
    q, sf = channel.swiglu_forward_and_per_channel_cast_and_transpose(_bf16(256, 512), "e4m3", 32)
    runtime.LAUNCHES.clear()
    for _ in range(2):  # the grid has one row of blocks per row of sf: its rows are checked on both paths
        with pytest.raises(errors_of(channel).KernelArgumentError, match=r"^sf: expected 8 rows"):
            channel.swiglu_forward_and_per_channel_cast_and_transpose(_bf16(256, 512), "e4m3", 32, out=(q, sf[:4]))
    assert runtime.LAUNCHES == []


def errors_of(module: ModuleType) -> Any:
    """The errors module of the stub package holding module."""
    return __import__(module.__name__.split(".")[0] + ".errors", fromlist=["KernelArgumentError"])


# (op module, the kernel's parameters, a call(op, x) whose x (the first parameter) may be strided)
STRICT_CALLS: list[tuple[str, tuple[str, ...], Any]] = [
    ("per_block_cast", ("x", "q", "sf"), lambda op, x: op.per_block_cast(x, "e4m3", (128, 128))),
    ("per_channel_cast", ("x", "q", "sf"), lambda op, x: op.per_channel_cast(x, "e4m3", 128)),
    ("per_channel_cast_and_transpose", ("x", "q", "sf"),
     lambda op, x: op.per_channel_cast_and_transpose(x, "e4m3", 128)),
    ("swiglu_forward_and_per_token_cast", ("x", "q", "sf"),
     lambda op, x: op.swiglu_forward_and_per_token_cast(x, "e4m3", 128)),
    ("swiglu_forward_and_per_channel_cast_and_transpose", ("x", "q", "sf"),
     lambda op, x: op.swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", 128)),
]


def test_casts_cache_nothing_while_compiling(casts: tuple[dict[str, ModuleType], Any],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # While torch.compile traces, the ops take the full checks and their torch op (the stub's
    # launch_op runs the plan itself), and remember nothing a traced call could depend on.
    modules, runtime = casts
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    runtime.REMEMBERED.clear()
    for op, call, expected in FAST_CALLS:
        call(modules[op])
        assert expected.items() <= _last(runtime).items()
    assert runtime.REMEMBERED == []
