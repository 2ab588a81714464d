"""The moe routing op modules on a machine without a GPU: every argument error fires, naming the
argument, before any launch (CPU tensors would otherwise end in NoGpuError at the launcher).

Builds tests/data/specs/moe_route_small.yaml (sm90, 7 variants) once for the module.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
import torch

from tests.conftest import REPO, TEMPLATES

pytestmark = pytest.mark.slow

SPEC = REPO / "tests" / "data" / "specs" / "moe_route_small.yaml"


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    from tkc.arch import ARCHS
    from tkc.build import BuildOptions, build
    from tkc.spec import load_specs

    root = tmp_path_factory.mktemp("moe_small")
    options = BuildOptions(specs=load_specs([SPEC], TEMPLATES), templates=TEMPLATES, build_dir=root / "build",
                           dist_dir=root / "dist", archs=(ARCHS["sm90"],), jobs=2)
    build(options)
    path = str(options.build_dir / "pkg" / "tkc_moe_small" / "sm90")
    sys.path.insert(0, path)
    try:
        yield importlib.import_module("tkc_moe_small.moe")
    finally:
        sys.path.remove(path)
        for name in [m for m in sys.modules if m.startswith("tkc_moe_small")]:
            del sys.modules[name]


IDX = torch.tensor([[0, 3], [-1, 2]])
POS = torch.tensor([[0, 1], [-1, 2]], dtype=torch.int32)
P2E = torch.tensor([0, 3, 2, -1], dtype=torch.int32)
X = torch.zeros((2, 2048), dtype=torch.bfloat16)
XE = torch.zeros((4, 2048), dtype=torch.bfloat16)
W = torch.ones((2, 2))
BUF = torch.zeros((6, 2048), dtype=torch.bfloat16)  # x and an out in one buffer, apart


def _bad_calls(moe: ModuleType) -> dict[str, tuple[Callable[[], object], type[Exception], str]]:
    return {
        "ids not a tensor": (lambda: moe.get_fused_mapping([[0]], 4, 8, 1), TypeError, "topk_idx"),
        "int32 ids": (lambda: moe.get_fused_mapping(IDX.int(), 4, 8, 1), TypeError, "topk_idx"),
        "1-D ids": (lambda: moe.get_fused_mapping(IDX[0], 4, 8, 1), ValueError, "topk_idx"),
        "zero experts": (lambda: moe.get_fused_mapping(IDX, 0, 8, 1), ValueError, "num_experts"),
        "alignment 0": (lambda: moe.get_fused_mapping(IDX, 4, 8, 0), ValueError, "alignment"),
        "float N": (lambda: moe.get_fused_mapping(IDX, 4, 8.0, 1), TypeError, "num_expanded_tokens"),
        "negative N": (lambda: moe.get_fused_mapping(IDX, 4, -1, 1), ValueError, "num_expanded_tokens"),
        "expand rows": (lambda: moe.expand_to_fused(X[:1], POS, P2E), ValueError, "token_topk_to_pos"),
        "expand 2-D pos_to_expert": (lambda: moe.expand_to_fused(X, POS, P2E[None]), ValueError, "pos_to_expert"),
        "expand 1-D x": (lambda: moe.expand_to_fused(X[0], POS, P2E), ValueError, "x"),
        "with_sf not a pair": (lambda: moe.expand_to_fused_with_sf(X, 128, POS, P2E), TypeError, "x"),
        "with_sf npc": (lambda: moe.expand_to_fused_with_sf((X, torch.ones(2, 64)), 32, POS, P2E),
                        NotImplementedError, "num_per_channels"),
        "with_sf ue8m0": (lambda: moe.expand_to_fused_with_sf((X, torch.ones(2, 16, dtype=torch.int32)), 128, POS,
                                                              P2E), NotImplementedError, "x"),
        "with_sf sf shape": (lambda: moe.expand_to_fused_with_sf((X, torch.ones(2, 3)), 128, POS, P2E), ValueError,
                             "x_sf"),
        "reduce hidden": (lambda: moe.reduce_fused(XE[:, :300], W, POS), ValueError, "x"),
        "reduce format": (lambda: moe.reduce_fused(XE, W, POS, fp8_format="e5m2"), ValueError, "fp8_format"),
        "reduce sf without fp8": (lambda: moe.reduce_fused(XE, W, POS, sf=torch.ones(1)), ValueError, "sf"),
        "reduce sf shape": (lambda: moe.reduce_fused(XE, W, POS, fp8_format="e4m3", sf=torch.ones(2)), ValueError,
                            "sf"),
        "reduce weights shape": (lambda: moe.reduce_fused(XE, W[:, :1], POS), ValueError, "topk_weights"),
        "reduce fp8 without scales": (lambda: moe.reduce_fused(XE.to(torch.float8_e4m3fn), W, POS), ValueError, "x"),
        "reduce x_sf length": (lambda: moe.reduce_fused((XE.to(torch.float8_e4m3fn), torch.ones(3)), W, POS),
                               ValueError, "x_sf"),
        "reduce bf16 with x_sf": (lambda: moe.reduce_fused((XE, torch.ones(4)), W, POS), NotImplementedError, "x"),
        "reduce out list": (lambda: moe.reduce_fused(XE, W, POS, out=[X]), TypeError, "out"),
        "expand out tuple": (lambda: moe.expand_to_fused(X, POS, P2E, out=(XE,)), TypeError, "out"),
        "group_count ids": (lambda: moe.group_count(IDX.float(), 4), TypeError, "group_idx"),
        "group_count groups": (lambda: moe.group_count(IDX, 2000), ValueError, "num_groups"),
        "aux_fi experts": (lambda: moe.aux_fi(IDX, 0, 2), ValueError, "num_experts"),
        "aux_fi topk": (lambda: moe.aux_fi(IDX, 4, 0), ValueError, "num_aux_topk"),
    }


NAMES = [
    "ids not a tensor", "int32 ids", "1-D ids", "zero experts", "alignment 0", "float N", "negative N",
    "expand rows", "expand 2-D pos_to_expert", "expand 1-D x", "with_sf not a pair", "with_sf npc", "with_sf ue8m0",
    "with_sf sf shape", "reduce hidden", "reduce format", "reduce sf without fp8", "reduce sf shape",
    "reduce weights shape", "reduce fp8 without scales", "reduce x_sf length", "reduce bf16 with x_sf", "reduce out list",
    "expand out tuple",
    "group_count ids", "group_count groups", "aux_fi experts", "aux_fi topk",
]


@pytest.mark.parametrize("name", NAMES)
def test_argument_errors_fire_before_any_launch(moe: ModuleType, name: str) -> None:
    call, exc, argument = _bad_calls(moe)[name]
    with pytest.raises(exc, match=rf"^{argument}: "):
        call()


def test_good_arguments_reach_the_launcher(moe: ModuleType) -> None:
    # Valid calls pass every op check and stop at the launcher's first tensor (no GPU here).
    errors = importlib.import_module("tkc_moe_small.errors")
    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU path")
    for call, first in [(lambda: moe.get_fused_mapping(IDX, 4, 8, 1), "topk_idx"),
                        (lambda: moe.expand_to_fused(X, POS, P2E), "x"),
                        (lambda: moe.reduce_fused(XE, W, POS), "x"),
                        (lambda: moe.expand_to_fused(BUF[:2], POS, P2E, out=BUF[2:6]), "x"),
                        (lambda: moe.reduce_fused(XE, W, POS, out=BUF[:2]), "x"),
                        (lambda: moe.aux_fi(IDX, 4, 2), "topk_idx")]:
        with pytest.raises(errors.NoGpuError, match=rf"^{first}: "):
            call()


def test_fused_mapping_outputs_are_aligned_disjoint_views_of_one_buffer(moe: ModuleType,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The direct path carves the outputs and the kernel's block-count table out of one
    # allocation and launches one kernel: every view must start on the kernel's alignment and
    # none may overlap another. The kernel writes the -1 of pos_to_* itself.
    module = importlib.import_module("tkc_moe_small.moe._fused_mapping")
    launches: list[tuple[object, ...]] = []
    monkeypatch.setattr(module, "_launcher_of", lambda num_experts: lambda *args: launches.append(args))
    for idx, size in ((IDX, 8), (IDX, 7), (torch.zeros((0, 3), dtype=torch.int64), 0)):
        launches.clear()
        out = moe.get_fused_mapping(idx, 4, size, 1, force_no_sync=True)
        assert out[7] == [] and len(launches) == 1
        (topk_idx, block_counts, tk2p, p2e, p2t, p2tk, start, end, count, alignment) = launches[0]
        assert topk_idx is idx and alignment == 1
        assert all(a is b for a, b in zip((p2e, p2t, p2tk, tk2p, start, end, count), out[:7], strict=True))
        assert all(pos.shape == (size,) and pos.dtype == torch.int32 for pos in out[:3])
        assert out[3].shape == idx.shape and all(t.shape == (4,) for t in out[4:7])
        assert isinstance(block_counts, torch.Tensor) and block_counts.shape == (1, 4)  # a CPU tensor: one block
        views = [*out[:7], block_counts]
        assert all(v.data_ptr() % 16 == 0 for v in views)
        spans = sorted((v.data_ptr(), v.data_ptr() + v.numel() * 4) for v in views if v.numel())
        assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans))
        assert len({v.untyped_storage().data_ptr() for v in views}) == 1  # one allocation


def test_fused_mapping_custom_op_body_allocates_every_output(moe: ModuleType,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The torch.compile path: a custom op's outputs may not alias each other or share storage.
    module = importlib.import_module("tkc_moe_small.moe._fused_mapping")
    launches: list[tuple[object, ...]] = []
    monkeypatch.setattr(module, "_launcher_of", lambda num_experts: lambda *args: launches.append(args))
    out = module._mapping(IDX, 4, 8, 1)
    assert len(launches) == 1 and len(out) == 7
    assert len({t.untyped_storage().data_ptr() for t in out}) == 7
    assert launches[0][1].shape == (1, 4)


def test_fused_mapping_grid_fits_the_device(moe: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every block must be resident for the grid barrier: never more blocks than SMs, never an
    # idle one, always one (T = 0 still writes the segments and the -1 fill).
    module = importlib.import_module("tkc_moe_small.moe._fused_mapping")
    monkeypatch.setattr(module, "sm_count", lambda device: 132)
    chunk = module.CHUNK
    assert module.num_blocks(0, 0) == 1 and module.num_blocks(10**6, -1) == 1
    for entries in (1, chunk, chunk + 1, 64 * chunk, 132 * chunk, 132 * chunk + 1, 133 * chunk, 10**7):
        blocks = module.num_blocks(entries, 0)
        chunks = (entries + chunk - 1) // chunk
        per_block = (chunks + blocks - 1) // blocks  # what the kernel derives from the grid
        assert 1 <= blocks <= 132 and blocks * per_block >= chunks and (blocks - 1) * per_block < chunks
