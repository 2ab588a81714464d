"""CPU tests of the E5M6 op module (ops/quant/e5m6.py) on a stub runtime, no GPU, no build.

The module is imported inside a throwaway package (tests/op_stub.py) next to the real ``_args`` and ``errors``
modules and a ``_runtime`` whose kernels record what they are asked for instead of launching.
That pins what the GPU never shows directly: argument errors fire before any launch,
the kernels receive q as int32 words and sf as the (num_tokens,) view of the right storage,
and the outputs have TileKernels' shapes and strides.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import WritingKernel, marked, poisoned, stub_package

ROOT = Path(__file__).resolve().parents[1]

@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType, list[Any]]]:
    """(the op module, the package's errors module, the recorded launches)."""
    with stub_package(tmp_path_factory.mktemp("stubpkg"), "e5m6_stub_pkg", "quant", ["e5m6"]) as (modules, runtime):
        yield modules["e5m6"], importlib.import_module("e5m6_stub_pkg.errors"), runtime.LAUNCHES


def test_exports(ops: tuple[ModuleType, ModuleType, list[Any]]) -> None:
    module, _, _ = ops
    assert sorted(module.__all__) == ["cast_back_e5m6", "per_token_cast_e5m6", "per_token_cast_to_e5m6"]


@pytest.mark.parametrize("col_major", [False, True])
def test_cast_passes_word_and_token_views(ops: tuple[ModuleType, ModuleType, list[Any]], col_major: bool) -> None:
    module, _, calls = ops
    calls.clear()
    x = torch.randn(5, 2048, dtype=torch.bfloat16)
    q, sf = module.per_token_cast_e5m6(x, 2048, round_sf=True, use_tma_aligned_col_major_sf=col_major)
    assert q.dtype == torch.uint8 and q.shape == (5, 3072)
    assert sf.dtype == torch.float32 and sf.shape == (5, 1)
    assert sf.stride() == ((1, 8) if col_major else (1, 1))
    ((_, values, (x_arg, q_arg, sf_arg)),) = calls
    assert values == {"in_dtype": "bfloat16", "hidden": 2048, "round_sf": True, "sf_layout": "float"}
    assert x_arg is x
    assert q_arg.dtype == torch.int32 and q_arg.shape == (5, 768) and q_arg.data_ptr() == q.data_ptr()
    assert sf_arg.shape == (5,) and sf_arg.stride() == (1,) and sf_arg.data_ptr() == sf.data_ptr()


@pytest.mark.parametrize("col_major", [False, True])
def test_tilekernels_spelling_takes_the_flags_positionally(ops: tuple[ModuleType, ModuleType, list[Any]],
                                                           col_major: bool) -> None:
    """per_token_cast_to_e5m6(x, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)."""
    module, _, calls = ops
    calls.clear()
    x = torch.randn(5, 2048, dtype=torch.bfloat16)
    q, sf = module.per_token_cast_to_e5m6(x, 2048, col_major, True)
    assert q.shape == (5, 3072) and sf.stride() == ((1, 8) if col_major else (1, 1))
    ((_, values, _),) = calls
    assert values == {"in_dtype": "bfloat16", "hidden": 2048, "round_sf": True, "sf_layout": "float"}
    q, words = module.per_token_cast_to_e5m6(x, 2048, True, True, True)  # packed UE8M0: int32 words, column-major
    assert words.dtype == torch.int32 and words.shape == (5, 1) and words.stride() == (1, 8)
    assert calls[-1][1] == {"in_dtype": "bfloat16", "hidden": 2048, "round_sf": True, "sf_layout": "ue8m0"}
    assert calls[-1][2][2].dtype == torch.int32 and calls[-1][2][2].data_ptr() == words.data_ptr()


def test_cast_argument_errors_fire_before_any_launch(ops: tuple[ModuleType, ModuleType, list[Any]]) -> None:
    module, _, calls = ops
    calls.clear()
    x = torch.randn(4, 2048)
    with pytest.raises(ValueError, match="num_per_channels.*2048"):
        module.per_token_cast_e5m6(x, 128)
    with pytest.raises(TypeError, match="num_per_channels"):
        module.per_token_cast_e5m6(x, "2048")
    with pytest.raises(ValueError, match="use_packed_ue8m0"):  # packed UE8M0 words are column-major
        module.per_token_cast_e5m6(x, use_packed_ue8m0=True, round_sf=True)
    with pytest.raises(ValueError, match="use_packed_ue8m0"):  # and powers of two
        module.per_token_cast_e5m6(x, use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True)
    with pytest.raises(ValueError, match=r"^x: .*2-D"):
        module.per_token_cast_e5m6(torch.randn(2048))
    with pytest.raises(TypeError, match=r"^x: "):
        module.per_token_cast_e5m6([[1.0] * 8])
    with pytest.raises(ValueError, match=r"^x: hidden \(2044\)"):
        module.per_token_cast_e5m6(torch.randn(4, 2044))
    assert calls == []


def test_cast_back_passes_word_and_token_views(ops: tuple[ModuleType, ModuleType, list[Any]]) -> None:
    module, _, calls = ops
    calls.clear()
    q = torch.zeros(6, 3840, dtype=torch.uint8)
    storage = torch.ones(1, 8)
    sf = storage.as_strided((6, 1), (1, 8))  # column-major, as use_tma_aligned_col_major_sf returns it
    out = module.cast_back_e5m6((q, sf), torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.shape == (6, 2560)
    ((_, values, (q_arg, sf_arg, out_arg)),) = calls
    assert values == {"out_dtype": "bfloat16", "hidden": 2560, "sf_layout": "float"}
    assert q_arg.dtype == torch.int32 and q_arg.shape == (6, 960)
    assert sf_arg.shape == (6,) and sf_arg.stride() == (1,) and sf_arg.data_ptr() == storage.data_ptr()
    assert out_arg is out


def test_cast_back_gathers_strided_scales(ops: tuple[ModuleType, ModuleType, list[Any]]) -> None:
    module, _, calls = ops
    calls.clear()
    wide = torch.arange(12.0).reshape(6, 2)
    module.cast_back_e5m6((torch.zeros(6, 3072, dtype=torch.uint8), wide[:, 1:]), "fp32")
    sf_arg = calls[-1][2][1]
    assert sf_arg.tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]


def test_cast_back_argument_errors_fire_before_any_launch(ops: tuple[ModuleType, ModuleType, list[Any]]) -> None:
    module, errors, calls = ops
    calls.clear()
    q, sf = torch.zeros(4, 3072, dtype=torch.uint8), torch.ones(4, 1)
    with pytest.raises(ValueError, match="^fmt: "):
        module.cast_back_e5m6((q, sf), "fp16")
    with pytest.raises(TypeError, match="^x: "):
        module.cast_back_e5m6(q, "bf16")
    with pytest.raises(errors.KernelArgumentError, match=r"^x\[0\] \(q\): expected uint8"):
        module.cast_back_e5m6((q.view(torch.int8), sf), "bf16")
    with pytest.raises(errors.KernelArgumentError, match=r"^x\[0\] \(q\): .*multiple of 12"):
        module.cast_back_e5m6((q[:, :3070], sf), "bf16")
    with pytest.raises(errors.KernelArgumentError, match=r"^x\[0\] \(q\): expected a contiguous"):
        module.cast_back_e5m6((q[:, 12:], sf), "bf16")
    with pytest.raises(errors.KernelArgumentError, match=r"^x\[1\] \(sf\): expected shape \(4, 1\)"):
        module.cast_back_e5m6((q, torch.ones(4, 2)), "bf16")
    with pytest.raises(errors.KernelArgumentError, match=r"^x\[1\] \(sf\): expected float32 scales or int32"):
        module.cast_back_e5m6((q, sf.double()), "bf16")
    with pytest.raises(ValueError, match=r"^x\[1\] \(sf\): expected a 2-D"):
        module.cast_back_e5m6((q, torch.ones(4)), "bf16")
    assert calls == []
    module.cast_back_e5m6((q, sf.view(torch.int32)), "bf16")  # UE8M0 words: the variant that reads them
    assert calls[-1][1]["sf_layout"] == "ue8m0"


def test_cast_back_refuses_codes_off_a_word(ops: tuple[ModuleType, ModuleType, list[Any]]) -> None:
    module, errors, calls = ops
    calls.clear()
    flat = torch.zeros(2 * 3072 + 2, dtype=torch.uint8)
    q = flat[2:].view(2, 3072)  # contiguous, but 2 bytes into its storage
    with pytest.raises(errors.KernelArgumentError, match=r"^x\[0\] \(q\): expected to start on a 4-byte word"):
        module.cast_back_e5m6((q, torch.ones(2, 1)), "bf16")
    assert calls == []


def test_cast_back_block_size(ops: tuple[ModuleType, ModuleType, list[Any]]) -> None:
    module, _, calls = ops
    q, sf = torch.zeros(2, 3072, dtype=torch.uint8), torch.ones(2, 1)
    calls.clear()
    module.cast_back_e5m6((q, sf), "fp32", (1, 2048))
    assert calls[0][1] == {"out_dtype": "float32", "hidden": 2048, "sf_layout": "float"}
    calls.clear()
    with pytest.raises(NotImplementedError, match=r"^x_block_size: .*\(1, 2048\)"):
        module.cast_back_e5m6((q, sf), "fp32", (1, 128))
    with pytest.raises(NotImplementedError, match=r"^x_block_size"):
        module.cast_back_e5m6((q, sf), "fp32", (1, 2048, 1))
    with pytest.raises(TypeError, match=r"^x_block_size"):
        module.cast_back_e5m6((q, sf), "fp32", 2048)
    assert calls == []


def test_cast_back_copies_scales_that_start_off_alignment(ops: tuple[ModuleType, ModuleType, list[Any]]) -> None:
    module, _, calls = ops
    calls.clear()
    q, sf = torch.zeros(3, 3072, dtype=torch.uint8), torch.arange(3.0).reshape(3, 1)
    module.cast_back_e5m6((q[1:], sf[1:]), "bf16")
    sf_arg = calls[-1][2][1]
    assert sf_arg.data_ptr() % 32 == 0 and sf_arg.tolist() == [1.0, 2.0]


# --- out= ------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_tokens", [0, 1, 5])
@pytest.mark.parametrize("col_major", [False, True])
def test_cast_out_is_launched_into_through_the_kernel_views(ops: tuple[ModuleType, ModuleType, list[Any]],
                                                            col_major: bool, num_tokens: int) -> None:
    module, _, calls = ops
    x = torch.randn(num_tokens, 2048, dtype=torch.bfloat16)
    out = module.per_token_cast_e5m6(x, use_tma_aligned_col_major_sf=col_major)  # an earlier call's pair
    calls.clear()
    result = module.per_token_cast_e5m6(x, 2048, use_tma_aligned_col_major_sf=col_major, out=list(out))
    assert result[0] is out[0] and result[1] is out[1]
    ((_, values, (x_arg, q_arg, sf_arg)),) = calls
    assert values == {"in_dtype": "bfloat16", "hidden": 2048, "round_sf": False, "sf_layout": "float"} and x_arg is x
    assert q_arg.dtype == torch.int32 and q_arg.shape == (num_tokens, 768) and q_arg.data_ptr() == out[0].data_ptr()
    assert sf_arg.shape == (num_tokens,) and sf_arg.stride() == (1,) and sf_arg.data_ptr() == out[1].data_ptr()
    # Either layout serves either flag: one scale per token puts token t at element t in both.
    other = module.per_token_cast_e5m6(x, use_tma_aligned_col_major_sf=not col_major)[1]
    assert module.per_token_cast_e5m6(x, use_tma_aligned_col_major_sf=col_major, out=(out[0], other))[1] is other


def test_cast_back_out_is_launched_into(ops: tuple[ModuleType, ModuleType, list[Any]]) -> None:
    module, _, calls = ops
    q, sf = torch.zeros(6, 3840, dtype=torch.uint8), torch.ones(6, 1)
    out = torch.empty(6, 2560)
    calls.clear()
    assert module.cast_back_e5m6((q, sf), "fp32", out=out) is out
    ((_, values, (_, _, out_arg)),) = calls
    assert values == {"out_dtype": "float32", "hidden": 2560, "sf_layout": "float"} and out_arg is out
    # The variant is the one fmt names, whatever out's dtype: the launcher refuses the mismatch.
    module.cast_back_e5m6((q, sf), "bf16", out=out)
    assert calls[-1][1] == {"out_dtype": "bfloat16", "hidden": 2560, "sf_layout": "float"} and calls[-1][2][2] is out


def test_out_errors_name_the_argument_before_any_launch(ops: tuple[ModuleType, ModuleType, list[Any]]) -> None:
    module, errors, calls = ops
    x = torch.randn(5, 2048, dtype=torch.bfloat16)
    q, sf = module.per_token_cast_e5m6(x)
    calls.clear()
    with pytest.raises(TypeError, match=r"^out: expected \(q, sf\)"):
        module.per_token_cast_e5m6(x, out=q)
    with pytest.raises(errors.KernelArgumentError, match=r"^q: expected uint8"):  # its int32 words would pass
        module.per_token_cast_e5m6(x, out=(q.view(torch.int8), sf))
    with pytest.raises(errors.KernelArgumentError, match=r"^q: expected rows of whole 4-byte words"):
        module.per_token_cast_e5m6(x, out=(torch.empty(5, 3074, dtype=torch.uint8)[:, 1:3073], sf))
    with pytest.raises(errors.KernelArgumentError, match=r"^sf: expected shape \(5, 1\) with token stride 1"):
        module.per_token_cast_e5m6(x, out=(q, torch.ones(5, 2)))
    with pytest.raises(errors.KernelArgumentError, match=r"^sf: expected shape \(5, 1\)"):
        module.per_token_cast_e5m6(x, out=(q, torch.ones(10, 1)[::2]))  # token stride 2
    with pytest.raises(TypeError, match=r"^out: expected out"):
        module.cast_back_e5m6((q, sf), "bf16", out=(torch.empty(5, 2048),))
    assert calls == []


def test_compiling_copies_the_result_into_out(ops: tuple[ModuleType, ModuleType, list[Any]],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # While torch.compile traces, the custom ops (the stub's are the functions themselves) compute
    # into fresh tensors and the op copies them into out: the graph holds no in-place launch.
    module, _, calls = ops
    x = torch.randn(5, 2048, dtype=torch.bfloat16)
    out = tuple(poisoned(t) for t in module.per_token_cast_e5m6(x, use_tma_aligned_col_major_sf=True))
    monkeypatch.setattr(module, "_cast_kernel", WritingKernel(module._cast_kernel, (1, 2)))
    monkeypatch.setattr(module, "_cast_back_kernel", WritingKernel(module._cast_back_kernel, (2,)))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    result = module.per_token_cast_e5m6(x, use_tma_aligned_col_major_sf=True, out=out)
    assert result[0] is out[0] and result[1] is out[1] and marked(out[0]) and marked(out[1])
    assert all(a is not t for a in calls[-1][2] for t in out)
    y = poisoned(torch.empty(5, 2048))
    assert module.cast_back_e5m6(out, "fp32", out=y) is y and marked(y) and calls[-1][2][2] is not y


# --- the op layer ----------------------------------------------------------------------------


def test_word_and_token_views_keep_the_calls_off_dispatch(ops: tuple[ModuleType, ModuleType, list[Any]]) -> None:
    """The kernels take views of the tensors the ops take and return (q's words, sf's tokens), which
    dispatch() cannot replay: every call runs its plan, so its checks, and nothing is remembered."""
    module, _, _ = ops
    runtime = importlib.import_module("e5m6_stub_pkg._runtime")
    runtime.REMEMBERED.clear()
    runtime.DISPATCHED.clear()
    x = torch.randn(5, 2048, dtype=torch.bfloat16)
    for _ in range(2):
        for col_major in (False, True):
            out = module.per_token_cast_e5m6(x, use_tma_aligned_col_major_sf=col_major)
            assert module.per_token_cast_e5m6(x, use_tma_aligned_col_major_sf=col_major, out=out)[0] is out[0]
            module.cast_back_e5m6(out, "bf16", out=module.cast_back_e5m6(out, "bf16"))
    assert runtime.REMEMBERED == [] and runtime.DISPATCHED == []
    with pytest.raises(ValueError, match=r"^x: hidden \(2044\)"):  # a third call is checked as the first
        module.per_token_cast_e5m6(torch.randn(5, 2044))


def test_compiling_reuses_one_template_per_variant(ops: tuple[ModuleType, ModuleType, list[Any]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """While torch.compile traces, the outputs come from the same recipes as eagerly (sf column-major
    over padded storage), a repeated call is the same template, and the checks that read addresses
    run at launch, on the real tensors (dynamo cannot trace them)."""
    module, errors, calls = ops
    templates = importlib.import_module("e5m6_stub_pkg._op")._templates
    x = torch.randn(6, 2048, dtype=torch.bfloat16)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for _ in range(2):
        before = len(templates)
        q, sf = module.per_token_cast_e5m6(x, use_tma_aligned_col_major_sf=True)
        assert q.shape == (6, 3072) and sf.shape == (6, 1) and sf.stride() == (1, 8)
        assert module.cast_back_e5m6((q[1:], sf[1:]), "fp32").shape == (5, 2048)
        sf_arg = calls[-1][2][1]  # scales one token into their storage: copied to an aligned start
        assert sf_arg.data_ptr() % 32 == 0 and sf_arg.data_ptr() != sf[1:].data_ptr()
    assert len(templates) == before
    flat = torch.zeros(2 * 3072 + 2, dtype=torch.uint8)
    calls.clear()
    with pytest.raises(errors.KernelArgumentError, match=r"^x\[0\] \(q\): expected to start on a 4-byte word"):
        module.cast_back_e5m6((flat[2:].view(2, 3072), torch.ones(2, 1)), "bf16")
    assert calls == []
