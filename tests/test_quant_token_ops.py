"""The per_token_cast op module's argument errors fire before any launch (CPU, small test package).

The small spec (tests/data/specs/small.yaml) builds per_token_cast without the sf_layout key;
every call here fails in the op's own checks, on CPU tensors, so no driver call is ever made.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from tkc.build import ArchSummary, BuildOptions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quant(small_build: tuple[BuildOptions, list[ArchSummary]]) -> Iterator[ModuleType]:
    options, _ = small_build
    root = options.build_dir / "pkg" / "tkc_small_kernels" / "sm90"
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("tkc_small_kernels.quant")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith("tkc_small_kernels")]:
            del sys.modules[name]


def test_public_forms_are_exported(quant: ModuleType) -> None:
    for name in ("per_token_cast", "per_token_cast_with_sf_only", "per_token_cast_with_precomputed_sf"):
        assert callable(getattr(quant, name)), name


def test_misaligned_row_stride_names_x(quant: ModuleType) -> None:
    errors = importlib.import_module("tkc_small_kernels.errors")
    x = torch.ones(4, 2049, dtype=torch.bfloat16)[:, :2048]  # 4098-byte rows
    with pytest.raises(errors.KernelArgumentError, match=r"^x: the row stride \(2049 elements\)"):
        quant.per_token_cast(x, "e4m3", 128, round_sf=True)
    with pytest.raises(errors.KernelArgumentError, match=r"^x: the row stride"):
        quant.per_token_cast_with_sf_only(x, "e4m3", 128, round_sf=True)


def test_precomputed_sf_is_checked_by_name(quant: ModuleType) -> None:
    errors = importlib.import_module("tkc_small_kernels.errors")
    x = torch.ones(4, 2048, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"^sf: "):
        quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, None)
    with pytest.raises(errors.KernelArgumentError, match=r"^sf: .*\(4, 16\)"):
        quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, torch.ones(4, 15))
    with pytest.raises(errors.KernelArgumentError, match=r"^sf: .*torch.float32"):
        quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, torch.ones(4, 16, dtype=torch.float64))


@pytest.mark.parametrize(
    ("call", "argument", "error"),
    [
        (lambda q, x: q.per_token_cast_with_sf_only(x, "e5m6", 128), "fmt", ValueError),
        (lambda q, x: q.per_token_cast_with_sf_only(x, "e4m3", 0), "num_per_channels", ValueError),
        (lambda q, x: q.per_token_cast_with_sf_only(x, "e4m3", 96), "num_per_channels", ValueError),
        (lambda q, x: q.per_token_cast_with_sf_only(x, "e4m3", 128, x_block_size=(1, 128)), "x_block_size",
         ValueError),  # a plain tensor has no scale block
        (lambda q, x: q.per_token_cast((x, x), "e4m3", 128), "x_block_size", ValueError),  # a pair needs one
        (lambda q, x: q.per_token_cast((x, x), "e4m3", 128, x_block_size=(1, 128)), "x_block_size",
         NotImplementedError),  # the small package has no per_token_cast_back to dequantize with
        (lambda q, x: q.per_token_cast(x, "e5m6", 2048, x_block_size=(1, 128)), "x_block_size", ValueError),
        (lambda q, x: q.per_token_cast(x, "e5m6", 2048), "fmt", NotImplementedError),  # no _e5m6 module here
        (lambda q, x: q.per_token_cast_with_sf_only(x, "e4m3", 128, use_tma_aligned_col_major_sf=True),
         "use_tma_aligned_col_major_sf", NotImplementedError),  # the small spec builds row_major only
        (lambda q, x: q.per_token_cast_with_precomputed_sf(x[0], "e4m3", 128, x), "x", ValueError),
    ],
    ids=["fmt", "npc-zero", "npc-divides", "x_block_size", "pair-without-block", "pair-unbuilt", "e5m6-block", "e5m6-module", "layout", "x-rank"],
)
def test_option_errors_name_the_argument(quant: ModuleType, call: object, argument: str, error: type) -> None:
    x = torch.ones(4, 2048, dtype=torch.bfloat16)
    with pytest.raises(error, match=rf"^{argument}: "):
        call(quant, x)  # type: ignore[operator]
