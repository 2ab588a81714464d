"""The per_token_cast op modules on CPU, in the small test package (tests/data/specs/small.yaml).

Argument errors fire in the op's own checks, before any launch. The forms' Python paths (output
allocation, scale layouts handed to the kernel, the mode argument, per-row variant keys,
re-quantization, per-block cast back) run against fake launchers that compute with the
reference, so the GPU tests only have the kernels left to find wrong. On the stub runtime
(tests/op_stub.py): which calls the op layer remembers for dispatch() and how they resolve
to the launch they stand for, and the compile route's outputs.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.conftest import REPO
from tests.op_stub import WritingKernel, built_variants, grid_keys, marked, poisoned, stub_package
from tests.reference.quant import (
    dequant,
    per_token_cast_ref,
    precomputed_sf_cast_ref,
    tma_aligned_col_major,
    ue8m0_pack,
    ue8m0_unpack,
)
from tests.reference.quant_cast_back import per_block_cast_back_ref, per_token_cast_back_ref, requant_ref
from tkc.build import ArchSummary, BuildOptions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quant(small_package: ModuleType) -> ModuleType:
    return importlib.import_module("tkc_small_kernels.quant")


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


# --- the forms' Python paths, on fake launchers ----------------------------------------------


def _fake_cast(v: dict[str, Any], x: torch.Tensor, q: torch.Tensor, sf_arg: torch.Tensor, mode: int) -> None:
    """What the per_token_cast kernel writes, from the reference, through the tensors it is handed."""
    npc, layout, num_tokens = v["npc"] or v["hidden"], v["sf_layout"], x.shape[0]
    words = sf_arg.reshape(sf_arg.shape[0], -1).view(torch.int32) if layout == "ue8m0" else None
    if mode == 2:  # precomputed scales: read them from the storage the op passes
        if words is not None:
            sf = ue8m0_unpack(words.T[:num_tokens].contiguous(), v["hidden"] // npc)
        else:
            sf = sf_arg.T[:num_tokens] if layout == "col_major" else sf_arg
        q.copy_(precomputed_sf_cast_ref(x, v["fmt"], npc, sf))
        return
    ref_q, ref_sf = per_token_cast_ref(x, v["fmt"], npc, v["round_sf"], layout)
    if mode == 0:
        q.copy_(ref_q)
    target = sf_arg if layout == "row_major" else (words if words is not None else sf_arg)[:, :num_tokens].T
    target.copy_(ref_sf)


def _fake_back(v: dict[str, Any], q: torch.Tensor, sf_arg: torch.Tensor, out: torch.Tensor) -> None:
    num_tokens = q.shape[0]
    if v["sf_layout"] == "ue8m0":
        sf = sf_arg.reshape(sf_arg.shape[0], -1).view(torch.int32).T[:num_tokens]
    else:
        sf = sf_arg.T[:num_tokens] if v["sf_layout"] == "col_major" else sf_arg
    if v.get("block_m", 1) > 1:  # per-block (or per-channel, npc 1) scales, one row per block_m tokens
        out.copy_(per_block_cast_back_ref(q, sf, out.dtype, (v["block_m"], v["npc"])))
        return
    out.copy_(per_token_cast_back_ref(q, sf, out.dtype, v["npc"] or v["hidden"]))


def _fake_requant(v: dict[str, Any], codes: torch.Tensor, x_sf_arg: torch.Tensor, q: torch.Tensor,
                  sf_arg: torch.Tensor) -> None:
    """What the fused re-quantization writes, from the reference, reading the tensors it is handed as its contract
    says: the input scales fp32 (R, G_in), or the bytes (W, P, 4) of the UE8M0 words' column storage; the outputs
    as the cast's."""
    rows = -(-codes.shape[0] // v["x_block_m"])
    x_sf = x_sf_arg.reshape(x_sf_arg.shape[0], -1).view(torch.int32).T[:rows] if v["x_sf_layout"] == "ue8m0" \
        else x_sf_arg
    ref_q, ref_sf = requant_ref((codes, x_sf), (v["x_block_m"], v["x_block_k"]), v["fmt"], v["npc"], v["round_sf"],
                                v["sf_layout"])
    q.copy_(ref_q)
    words = sf_arg.reshape(sf_arg.shape[0], -1).view(torch.int32) if v["sf_layout"] == "ue8m0" else None
    target = sf_arg if words is None else words[:, :codes.shape[0]].T
    target.copy_(ref_sf)


class _FakeKernel:
    """Launchers that compute with ``launch``; ``selected`` holds the grid values of each call of
    one, in order (recorded at the call, not at select: the ops keep the launchers they selected).
    ``built``: the variants ``has`` reports (None: every one)."""

    def __init__(self, launch: Callable[..., None], keys: tuple[str, ...],
                 built: set[tuple[Any, ...]] | None = None) -> None:
        self.launch, self.keys, self.selected = launch, keys, []  # type: list[dict[str, Any]]
        self.built = built

    def has(self, *values: Any) -> bool:
        return self.built is None or values in self.built

    def variant(self, *values: Any) -> Callable[..., None]:
        return self.select(**dict(zip(self.keys, values)))

    def find(self, *values: Any) -> Callable[..., None] | None:
        return self.variant(*values)

    def select(self, **values: Any) -> Callable[..., None]:
        def launcher(*args: Any) -> None:
            self.selected.append(values)
            if args[0].shape[0]:  # as the real launchers: an empty grid (no tokens) launches nothing
                self.launch(values, *args)
        return launcher


@pytest.fixture(scope="module")
def ops(small_build: tuple[BuildOptions, list[ArchSummary]], tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[tuple[ModuleType, ModuleType]]:
    """(per_token_cast op module, per_token_cast_back op module) of a copy of the small package
    with the cast-back op added (a stub kernel module) and every launcher faked."""
    options, _ = small_build
    root = tmp_path_factory.mktemp("ops")
    package = root / "tkc_small_kernels"
    shutil.copytree(options.build_dir / "pkg" / "tkc_small_kernels" / "sm90" / "tkc_small_kernels", package)
    (package / "_kernels" / "per_token_cast_back").mkdir()
    (package / "_kernels" / "per_token_cast_back" / "__init__.py").write_text("KERNEL = None\n")
    shutil.copy(REPO / "ops" / "quant" / "per_token_cast_back.py", package / "quant" / "_per_token_cast_back.py")
    # The package under the same name may be imported already (the quant fixture): set it aside.
    saved = {m: sys.modules.pop(m) for m in [m for m in sys.modules if m.startswith("tkc_small_kernels")]}
    sys.path.insert(0, str(root))
    try:
        cast = importlib.import_module("tkc_small_kernels.quant._per_token_cast")
        back = importlib.import_module("tkc_small_kernels.quant._per_token_cast_back")
        keys = grid_keys()
        cast._kernel, cast._HAS_LAYOUTS = _FakeKernel(_fake_cast, keys["per_token_cast"]), True  # type: ignore[attr-defined]
        back._kernel = _FakeKernel(_fake_back, keys["per_token_cast_back"])  # type: ignore[attr-defined]
        # The small package has no fused re-quantization (cast._requant is None there): the shipped spec's variants.
        cast._requant = _FakeKernel(_fake_requant, keys["per_token_cast_requant"],  # type: ignore[attr-defined]
                                    built_variants()["per_token_cast_requant"])
        yield cast, back
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith("tkc_small_kernels")]:
            del sys.modules[name]
        sys.modules.update(saved)


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    assert torch.equal(a.view(bits), b.view(bits))


LAYOUT_CASES = [
    ("e4m3", 128, False, {}),
    ("e2m1", 32, False, {"use_tma_aligned_col_major_sf": True}),
    ("e4m3", 128, True, {"use_tma_aligned_col_major_sf": True, "use_packed_ue8m0": True}),
    ("e2m1", 2560, True, {}),  # one scale per row: grid npc 0
]


@pytest.mark.parametrize("num_tokens", [0, 1, 9])
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=["row_major", "col_major", "ue8m0", "per_row"])
def test_forms_hand_the_kernel_the_right_tensors(ops: tuple[ModuleType, ModuleType], case: tuple[Any, ...],
                                                 num_tokens: int) -> None:
    cast, back = ops
    fmt, npc, round_sf, flags = case
    layout = "ue8m0" if flags.get("use_packed_ue8m0") else "col_major" if flags else "row_major"
    x = torch.randn(num_tokens, 2560 + 64).bfloat16()[:, :2560]  # strided rows
    q, sf = cast.per_token_cast(x, fmt, npc, round_sf=round_sf, **flags)
    ref_q, ref_sf = per_token_cast_ref(x, fmt, npc, round_sf, layout)
    _same(q, ref_q)
    _same(sf, ref_sf)
    assert cast._kernel.selected[-1]["npc"] == (0 if npc == 2560 else npc)
    _same(cast.per_token_cast_with_sf_only(x, fmt, npc, round_sf=round_sf, **flags), ref_sf)
    values = ue8m0_unpack(sf, 2560 // npc) if layout == "ue8m0" else sf
    expected = precomputed_sf_cast_ref(x, fmt, npc, values)
    _same(cast.per_token_cast_with_precomputed_sf(x, fmt, npc, sf, round_sf=round_sf, **flags), expected)
    if layout == "col_major":  # a column-major view that is not the cast's own storage is copied
        fresh = sf.t().contiguous().t()
        _same(cast.per_token_cast_with_precomputed_sf(x, fmt, npc, fresh, **flags), expected)
    _same(back.per_token_cast_back((q, sf), "fp32", npc), dequant(q, sf, fmt, npc))


def test_requantization_dequantizes_first(ops: tuple[ModuleType, ModuleType]) -> None:
    cast, _ = ops
    x = torch.randn(9, 2560).bfloat16()
    for flags in ({}, {"round_sf": True, "use_tma_aligned_col_major_sf": True, "use_packed_ue8m0": True}):
        pair = cast.per_token_cast(x, "e4m3", 128, **flags)
        q, sf = cast.per_token_cast(pair, "e2m1", 32, x_block_size=(1, 128))
        ref_q, ref_sf = per_token_cast_ref(dequant(*pair, "e4m3", 128), "e2m1", 32)
        _same(q, ref_q)
        _same(sf, ref_sf)
        assert cast._kernel.selected[-1]["in_dtype"] == "float32"  # the dequantized fp32 tensor


def _quantized_pair(num_tokens: int, hidden: int, x_fmt: str, block: tuple[int, int], layout: str
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes of random rows with scales per block: arbitrary fp32 ones (row_major), or powers of two as UE8M0
    words in TileKernels' column-major storage (ue8m0)."""
    q, _ = per_token_cast_ref(torch.randn(num_tokens, hidden), x_fmt, 32)
    shape = (-(-num_tokens // block[0]), -(-hidden // block[1]))
    if layout == "row_major":
        return q, torch.rand(shape) * 4 + 2.0**-3
    exponents = torch.randint(100, 140, shape, dtype=torch.int32)
    return q, tma_aligned_col_major(ue8m0_pack((exponents << 23).view(torch.float32)))


# (codes format, x_block_size, scale layout in and out, fmt, npc): the shipped spec's fused variants
REQUANT_CASES = [
    ("e4m3", (128, 128), "row_major", "e2m1", 32),
    ("e2m1", (32, 32), "row_major", "e4m3", 128),
    ("e4m3", (32, 32), "ue8m0", "e4m3", 32),
    ("e2m1", (128, 128), "ue8m0", "e2m1", 128),
    ("e4m3", (1, 128), "row_major", "e2m1", 32),
    ("e4m3", (1, 128), "ue8m0", "e2m1", 32),
]


def _requant_flags(layout: str) -> dict[str, bool]:
    return {"round_sf": True, **({"use_tma_aligned_col_major_sf": True, "use_packed_ue8m0": True}
                                 if layout == "ue8m0" else {})}


@pytest.mark.parametrize("hidden", [2560, 576])
@pytest.mark.parametrize("num_tokens", [0, 1, 300])
@pytest.mark.parametrize("case", REQUANT_CASES, ids=lambda c: f"{c[0]}{c[1][0]}x{c[1][1]}-{c[2]}-{c[3]}-{c[4]}")
def test_requantization_is_one_fused_launch(ops: tuple[ModuleType, ModuleType], case: tuple[Any, ...],
                                            num_tokens: int, hidden: int) -> None:
    """A pair of a built combination takes the fused variant alone (no cast back, no fp32 cast), handed the scales
    as the kernel reads them, and returns what the two-launch path returns."""
    cast, back = ops
    x_fmt, block, layout, fmt, npc = case
    pair = _quantized_pair(num_tokens, hidden, x_fmt, block, layout)
    flags = _requant_flags(layout)
    before = (len(cast._kernel.selected), len(back._kernel.selected))
    q, sf = cast.per_token_cast(pair, fmt, npc, x_block_size=block, **flags)
    assert (len(cast._kernel.selected), len(back._kernel.selected)) == before
    assert cast._requant.selected[-1] == {"x_fmt": x_fmt, "x_block_m": block[0], "x_block_k": block[1],
                                          "x_sf_layout": layout, "fmt": fmt, "npc": npc, "round_sf": True,
                                          "sf_layout": layout}
    ref_q, ref_sf = requant_ref(pair, block, fmt, npc, True, layout)
    _same(q, ref_q)
    _same(sf, ref_sf)
    fused, cast._requant = cast._requant, None  # as a package built without the fused kernel
    try:
        two_step = cast.per_token_cast(pair, fmt, npc, x_block_size=block, **flags)
    finally:
        cast._requant = fused
    assert cast._kernel.selected[-1]["in_dtype"] == "float32"
    _same(two_step[0], q)
    _same(two_step[1], sf)
    # UE8M0 words in another layout than TileKernels' (here row-major) are copied into a column storage first.
    if layout == "ue8m0" and num_tokens:
        q2, sf2 = cast.per_token_cast((pair[0], pair[1].contiguous()), fmt, npc, x_block_size=block, **flags)
        _same(q2, ref_q)
        _same(sf2, ref_sf)


def test_requantization_falls_back_to_two_launches(ops: tuple[ModuleType, ModuleType]) -> None:
    """What no fused variant takes (other flags, layouts, blocks or formats; the sf-only and given-sf forms) is
    dequantized with the cast back and cast as fp32, as before; malformed pairs get the two-launch path's errors."""
    cast, back = ops
    pair = _quantized_pair(300, 2560, "e4m3", (128, 128), "row_major")
    fused_calls = len(cast._requant.selected)
    calls = {
        "round_sf False": lambda: cast.per_token_cast(pair, "e2m1", 32, x_block_size=(128, 128)),
        "col_major out": lambda: cast.per_token_cast(pair, "e2m1", 32, (128, 128), True, True),
        "col_major in": lambda: cast.per_token_cast((pair[0], pair[1].t().contiguous().t()), "e2m1", 32, (128, 128),
                                                    round_sf=True),
        "block not built": lambda: cast.per_token_cast((pair[0], torch.rand(3, 80)), "e2m1", 32, (128, 32),
                                                       round_sf=True),
        "npc 64": lambda: cast.per_token_cast(pair, "e2m1", 64, (128, 128), round_sf=True),
    }
    for name, call in calls.items():
        selected = len(back._kernel.selected)
        call()
        assert len(back._kernel.selected) == selected + 1, name
        assert cast._kernel.selected[-1]["in_dtype"] == "float32", name
    values = per_block_cast_back_ref(*pair, torch.float32, (128, 128))
    sf = cast.per_token_cast_with_sf_only(pair, "e2m1", 32, (128, 128), round_sf=True)
    _same(sf, per_token_cast_ref(values, "e2m1", 32, True)[1])
    q = cast.per_token_cast_with_precomputed_sf(pair, "e2m1", 32, sf, (128, 128), round_sf=True)
    _same(q, precomputed_sf_cast_ref(values, "e2m1", 32, sf))
    assert len(cast._requant.selected) == fused_calls
    errors = importlib.import_module("tkc_small_kernels.errors")
    with pytest.raises(errors.KernelArgumentError, match=r"^x\[1\] \(sf\): expected float32 scales of shape \(3, 20\)"):
        cast.per_token_cast((pair[0], pair[1][:, :-1]), "e2m1", 32, (128, 128), round_sf=True)
    with pytest.raises(ValueError, match=r"^x\[0\] \(q\): hidden \(2528\) must be a multiple of 64"):
        cast.per_token_cast((pair[0][:, :2528], pair[1]), "e2m1", 32, (128, 128), round_sf=True)
    assert len(cast._requant.selected) == fused_calls


@pytest.mark.parametrize("block", [(32, 32), (32, 128), (128, 32), (128, 128)], ids=str)
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_cast_back_per_block_scales(ops: tuple[ModuleType, ModuleType], fmt: str, block: tuple[int, int]) -> None:
    _, back = ops
    q, _ = per_token_cast_ref(torch.randn(300, 2560), fmt, 32)
    sf = torch.rand(-(-300 // block[0]), 2560 // block[1]) + 0.5
    for scales in (sf, sf.t().contiguous().t()):
        _same(back.cast_back((q, scales), "bf16", block), per_block_cast_back_ref(q, sf, "bf16", block))
    # Column-major scales are spread to per-token ones (FP4 128-wide blocks as four 32-channel groups); row-major
    # ones go to the variant of their block_m as they are.
    assert back._kernel.selected[-1]["npc"] == (32 if fmt == "e2m1" else block[1])
    assert back._kernel.selected[-2]["npc"] == block[1] and back._kernel.selected[-2]["block_m"] == block[0]


@pytest.mark.parametrize("block", [(32, 32), (128, 128)], ids=str)
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_cast_back_reads_packed_ue8m0_block_scales(ops: tuple[ModuleType, ModuleType], fmt: str,
                                                   block: tuple[int, int]) -> None:
    """TileKernels' per-block UE8M0 scales: int32 words of four exponents (ceil(T / bm), ceil(G / 4)), any layout;
    G = 2560 / bk is 20 or 80 groups, and 2304 / 128 = 18 leaves two zero bytes in the last word."""
    _, back = ops
    for hidden in (2560, 2304):
        q, _ = per_token_cast_ref(torch.randn(300, hidden), fmt, 32)
        exponents = torch.randint(100, 140, (-(-300 // block[0]), hidden // block[1]), dtype=torch.int32)
        sf = (exponents << 23).view(torch.float32)  # powers of two, as round_sf makes them
        words = ue8m0_pack(sf)
        for packed in (words, tma_aligned_col_major(words)):
            _same(back.cast_back((q, packed), "bf16", block), per_block_cast_back_ref(q, sf, "bf16", block))
        errors = importlib.import_module("tkc_small_kernels.errors")
        with pytest.raises(errors.KernelArgumentError, match=r"x\[1\] \(sf\): expected float32 per-block scales .*\(or int32 UE8M0 words"):
            back.cast_back((q, words[:, :-1]), "bf16", block)


def _poisoned(t: torch.Tensor) -> torch.Tensor:
    """t with every byte of its storage set to 0x7F, so that an unwritten element shows."""
    t.untyped_storage().fill_(0x7F)
    return t


@pytest.mark.parametrize("num_tokens", [0, 1, 9])
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=["row_major", "col_major", "ue8m0", "per_row"])
def test_out_is_written_in_place_and_returned(ops: tuple[ModuleType, ModuleType], case: tuple[Any, ...],
                                              num_tokens: int) -> None:
    cast, _ = ops
    fmt, npc, round_sf, flags = case
    x = torch.randn(num_tokens, 2560 + 64).bfloat16()[:, :2560]
    expected = cast.per_token_cast(x, fmt, npc, round_sf=round_sf, **flags)
    # out as an earlier call returned it (col_major / ue8m0: a view of padded storage), poisoned
    out = tuple(_poisoned(t) for t in cast.per_token_cast(torch.randn_like(x), fmt, npc, round_sf=round_sf, **flags))
    for _ in range(2):  # a second call of the signature behaves as the first
        result = cast.per_token_cast(x, fmt, npc, round_sf=round_sf, **flags, out=out)
        assert result[0] is out[0] and result[1] is out[1]
        _same(out[0], expected[0])
        _same(out[1], expected[1])
        q = _poisoned(torch.empty_like(expected[0]))
        given = cast.per_token_cast_with_precomputed_sf(x, fmt, npc, expected[1], round_sf=round_sf, **flags, out=q)
        assert given is q
        values = ue8m0_unpack(expected[1], 2560 // npc) if flags.get("use_packed_ue8m0") else expected[1]
        _same(q, precomputed_sf_cast_ref(x, fmt, npc, values))


def test_out_errors_name_the_argument(ops: tuple[ModuleType, ModuleType]) -> None:
    """What the op checks itself; the launcher checks out's tensors (overlaps included: GPU tests)."""
    from tkc_small_kernels.errors import KernelArgumentError

    cast, _ = ops
    x = torch.randn(9, 2560).bfloat16()
    q, sf = cast.per_token_cast(x, "e4m3", 128)
    for _ in range(2):  # a second call of the signature behaves as the first
        with pytest.raises(TypeError, match=r"^out: expected \(q, sf\)"):
            cast.per_token_cast(x, "e4m3", 128, out=q)
    q, sf = cast.per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=True)
    with pytest.raises(KernelArgumentError, match=r"^sf: expected the column-major layout"):
        cast.per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=True, out=(q, sf.contiguous()))
    with pytest.raises(KernelArgumentError, match=r"^sf: expected torch.float32 of shape \(9, 80\)"):
        cast.per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=True, out=(q, sf[:, :40]))
    with pytest.raises(NotImplementedError, match=r"^fmt: "):  # routed as without out; no _e5m6 module here
        cast.per_token_cast(x, "e5m6", 2560, out=(q, sf))
    with pytest.raises(ValueError, match=r"^out: not for a quantized \(data, sf\) pair"):
        cast.per_token_cast((q, sf), "e4m3", 128, x_block_size=(1, 32), out=(q, sf))


# --- the op layer, on the stub runtime ---------------------------------------------------------


@pytest.fixture(scope="module")
def stubbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, ModuleType], Any]]:
    ops = ("per_token_cast", "per_token_cast_back", "e5m6")
    with stub_package(tmp_path_factory.mktemp("token_stub"), "token_stub_pkg", "quant", ops) as stubbed:
        yield stubbed


def _logged(runtime: Any, call: Callable[[], Any]) -> Any:
    for log in (runtime.LAUNCHES, runtime.REMEMBERED, runtime.DISPATCHED):
        log.clear()
    return call()


def _row_major_calls(cast: ModuleType, x: torch.Tensor) -> dict[str, Callable[[], Any]]:
    q, sf = cast.per_token_cast(x, "e4m3", 128)
    q4, sf4 = cast.per_token_cast(x, "e2m1", 32, round_sf=True)
    return {
        "cast": lambda: cast.per_token_cast(x, "e4m3", 128),
        "cast out=": lambda: cast.per_token_cast(x, "e4m3", 128, out=(q, sf)),
        "cast e2m1 round_sf out=": lambda: cast.per_token_cast(x, "e2m1", 32, None, False, True, out=(q4, sf4)),
        "per row": lambda: cast.per_token_cast(x, "e4m3", 2048),
        "precomputed": lambda: cast.per_token_cast_with_precomputed_sf(x, "e4m3", 128, sf),
        "precomputed out=": lambda: cast.per_token_cast_with_precomputed_sf(x, "e4m3", 128, sf, out=q),
    }


@pytest.mark.parametrize("name", ["cast", "cast out=", "cast e2m1 round_sf out=", "per row", "precomputed",
                                  "precomputed out="])
def test_row_major_calls_are_remembered_as_launched(stubbed: tuple[dict[str, ModuleType], Any], name: str) -> None:
    """dispatch() is asked first, then the recipe remembered resolves, against the very call, to the launch."""
    modules, runtime = stubbed
    cast = modules["per_token_cast"]
    x = torch.randn(5, 2048 + 64).bfloat16()[:, :2048]  # strided rows: the stride is a rule, not a key
    result = _logged(runtime, _row_major_calls(cast, x)[name])
    ((_, launch_values, launched),) = runtime.LAUNCHES
    ((fast, _, arguments, rules, call, allocated),) = runtime.REMEMBERED
    ((dispatched_fast, dispatched),) = runtime.DISPATCHED
    assert dispatched_fast is fast and len(dispatched) == len(call) and all(a is b for a, b in zip(dispatched, call))
    (inputs, outputs), _ = fast
    assert inputs == (((1,),) if name.startswith("cast") or name == "per row" else ((1,), ()))  # x keyed by hidden
    assert call[0] is x and rules == (("stride_bytes_multiple", 0, 0, 16),)  # x's row stride, re-checked
    out = call[len(inputs)]
    if out is None:  # dispatch() allocates as the op did: T rows, the variant's widths
        out = result
        for recipe, tensor in zip(allocated, (out,) if outputs == 1 else out, strict=True):
            dims = tuple(d if isinstance(d, int) else call[d[0]].shape[d[1]] * d[2] // d[4] for d in recipe.dims)
            assert (recipe.dtype, dims) == (tensor.dtype, tuple(tensor.shape)) and tensor.is_contiguous()
    else:
        assert result is out or all(r is o for r, o in zip(result, out, strict=True))
    resolved = [a if type(a).__name__ != "Source" else call[a.index] if a.kind == "input" else
                (out if outputs == 1 else out[a.index]) for a in arguments]
    assert len(resolved) == len(launched) and all(
        r is a if isinstance(a, torch.Tensor) else (type(r), r) == (type(a), a) for r, a in zip(resolved, launched))
    assert launched[3] == (2 if name.startswith("precomputed") else 0)  # the mode: cast, or given scales
    assert launch_values["npc"] == (0 if name == "per row" else launch_values["npc"])


def test_calls_dispatch_cannot_replay_still_run(stubbed: tuple[dict[str, ModuleType], Any]) -> None:
    """Column-major scales (views of a padded storage), scales only (q is dropped), a dequantized pair,
    fmt 'e5m6' and given column-major scales launch as before but are not remembered."""
    modules, runtime = stubbed
    cast = modules["per_token_cast"]
    x = torch.randn(5, 2048).bfloat16()
    col = cast.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True)
    ue8m0 = dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
    words = cast.per_token_cast(x, "e4m3", 128, **ue8m0)
    calls = {
        "col_major": (lambda: cast.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True), 1),
        "col_major out=": (lambda: cast.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True, out=col), 1),
        "ue8m0 out=": (lambda: cast.per_token_cast(x, "e4m3", 128, **ue8m0, out=words), 1),
        "sf_only": (lambda: cast.per_token_cast_with_sf_only(x, "e4m3", 128), 1),
        "pair": (lambda: cast.per_token_cast(col, "e2m1", 32, x_block_size=(1, 128)), 2),
        "e5m6": (lambda: cast.per_token_cast(x, "e5m6", 2048), 1),
        "given col_major": (lambda: cast.per_token_cast_with_precomputed_sf(x, "e4m3", 128, col[1],
                                                                           use_tma_aligned_col_major_sf=True), 1),
    }
    mine = [f.op.fast for f in (cast.per_token_cast, cast.per_token_cast_with_sf_only,
                                cast.per_token_cast_with_precomputed_sf)]
    for name, (call, launches) in calls.items():
        result = _logged(runtime, call)  # (the pair's cast back, an op of its own, may remember its call)
        assert len(runtime.LAUNCHES) == launches and not [e for e in runtime.REMEMBERED if any(e[0] is f for f in mine)], name
        if name.endswith("out="):
            assert all(r is o for r, o in zip(result, col if name.startswith("col") else words, strict=True))
    # The kernel writes the column-major scales through their storage: (G, align(T, 4)), or its bytes for UE8M0.
    _logged(runtime, calls["col_major out="][0])
    assert runtime.LAUNCHES[0][2][2].shape == (16, 8) and runtime.LAUNCHES[0][2][2].data_ptr() == col[1].data_ptr()
    _logged(runtime, calls["ue8m0 out="][0])
    assert runtime.LAUNCHES[0][2][2].shape == (4, 8, 4) and runtime.LAUNCHES[0][2][2].dtype == torch.uint8
    assert runtime.LAUNCHES[0][2][2].data_ptr() == words[1].data_ptr()
    assert _logged(runtime, calls["sf_only"][0]).shape == (5, 16) and runtime.LAUNCHES[0][2][3] == 1
    assert runtime.LAUNCHES[-1][0] == "per_token_cast" and _logged(runtime, calls["e5m6"][0])[0].dtype == torch.uint8
    assert runtime.LAUNCHES[0][0] == "per_token_cast_e5m6"


def test_fused_requantization_is_one_launch_of_its_tensors(stubbed: tuple[dict[str, ModuleType], Any]) -> None:
    """A pair of a built combination (the shipped specs') is one launch of per_token_cast_requant: the codes as
    given, the UE8M0 words' column storage as bytes in place, q and the bytes of the returned sf's storage. It is
    not remembered for dispatch (x is a pair): each such call runs its plan."""
    modules, runtime = stubbed
    cast = modules["per_token_cast"]
    codes = torch.zeros(300, 2560, dtype=torch.float8_e4m3fn)
    words = tma_aligned_col_major(torch.zeros(3, 5, dtype=torch.int32))  # 20 blocks of 128 over ceil(300 / 128) rows
    q, sf = _logged(runtime, lambda: cast.per_token_cast((codes, words), "e2m1", 32, (128, 128), True, True, True))
    ((name, values, args),) = runtime.LAUNCHES
    assert name == "per_token_cast_requant" and values == {
        "x_fmt": "e4m3", "x_block_m": 128, "x_block_k": 128, "x_sf_layout": "ue8m0", "fmt": "e2m1", "npc": 32,
        "round_sf": True, "sf_layout": "ue8m0"}
    assert args[0] is codes and args[1].dtype == torch.uint8 and args[1].shape == (5, 4, 4)
    assert args[1].data_ptr() == words.data_ptr()
    assert args[2] is q and q.shape == (300, 1280) and q.dtype == torch.int8
    assert sf.shape == (300, 20) and sf.stride() == (1, 300) and sf.dtype == torch.int32
    assert args[3].shape == (20, 300, 4) and args[3].data_ptr() == sf.data_ptr()
    assert runtime.REMEMBERED == []
    scales = torch.ones(10, 80)  # fp32 per (32, 32) block of FP4 codes, row-major
    fp4 = torch.zeros(300, 1280, dtype=torch.int8)
    q, sf = _logged(runtime, lambda: cast.per_token_cast((fp4, scales), "e4m3", 128, (32, 32), round_sf=True))
    ((name, values, args),) = runtime.LAUNCHES
    assert name == "per_token_cast_requant" and (values["x_fmt"], values["x_sf_layout"]) == ("e2m1", "row_major")
    assert args[0] is fp4 and args[1] is scales and args[2] is q and args[3] is sf
    assert q.shape == (300, 2560) and q.dtype == torch.float8_e4m3fn and sf.shape == (300, 20) and sf.is_contiguous()


def test_option_errors_fire_before_any_launch_or_memory(stubbed: tuple[dict[str, ModuleType], Any]) -> None:
    modules, runtime = stubbed
    cast = modules["per_token_cast"]
    errors = importlib.import_module("token_stub_pkg.errors")
    x = torch.randn(5, 2048).bfloat16()
    q, sf = cast.per_token_cast(x, "e4m3", 128)
    col = cast.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True)
    strided = torch.zeros(5, 2049, dtype=torch.bfloat16)[:, :2048]
    for call, error, match in [
        (lambda: cast.per_token_cast(strided, "e4m3", 128), errors.KernelArgumentError, r"^x: the row stride \(2049 "),
        (lambda: cast.per_token_cast(x, "e4m3", 128.0), TypeError, r"^num_per_channels: expected an int"),
        (lambda: cast.per_token_cast(x, "e4m3", 128, use_packed_ue8m0=True), ValueError, r"^use_packed_ue8m0: "),
        (lambda: cast.per_token_cast(x, "e4m3", 128, round_sf=True, use_tma_aligned_col_major_sf=True,
                                     use_packed_ue8m0=False, out=(q, sf)), errors.KernelArgumentError,
         r"^sf: expected the column-major layout"),
        (lambda: cast.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True, out=(col[0], col[1][:, :8])),
         errors.KernelArgumentError, r"^sf: expected torch.float32 of shape \(5, 16\)"),
        (lambda: cast.per_token_cast(x, "e4m3", 128, out=q), TypeError, r"^out: expected \(q, sf\)"),
        (lambda: cast.per_token_cast(col, "e4m3", 128, x_block_size=(1, 128), out=col), ValueError,
         r"^out: not for a quantized \(data, sf\) pair"),
        (lambda: cast.per_token_cast(x, "e5m6", 2048, x_block_size=(1, 2048)), ValueError, r"^x_block_size: fmt"),
        (lambda: cast.per_token_cast(x, "e3m2", 128), ValueError, r"^fmt: "),
        (lambda: cast.per_token_cast_with_sf_only(x, "e5m6", 2048), ValueError, r"^fmt: "),
        (lambda: cast.per_token_cast_with_precomputed_sf(x, "e4m3", 128, sf[:, :8]), errors.KernelArgumentError,
         r"^sf: expected torch.float32 of shape \(5, 16\)"),
        (lambda: cast.per_token_cast_with_precomputed_sf(x, "e4m3", 128, [sf]), TypeError, r"^sf: "),
    ]:
        with pytest.raises(error, match=match):
            _logged(runtime, call)
        assert runtime.LAUNCHES == [] and runtime.REMEMBERED == [], match


def test_compiling_allocates_from_the_same_recipes(stubbed: tuple[dict[str, ModuleType], Any],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """While torch.compile traces, each form is one call of its torch op (the stub's is the function
    itself) whose outputs have the eager layouts; a repeated call reuses its template, and out= is
    a copy into out."""
    modules, runtime = stubbed
    cast = modules["per_token_cast"]
    templates = importlib.import_module("token_stub_pkg._op")._templates
    x = torch.randn(9, 2048).bfloat16()
    flags = dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
    eager = (cast.per_token_cast(x, "e4m3", 128), cast.per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=True),
             cast.per_token_cast(x, "e4m3", 128, **flags))
    runtime.REMEMBERED.clear()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for _ in range(2):
        before = len(templates)
        traced = (cast.per_token_cast(x, "e4m3", 128),
                  cast.per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=True),
                  cast.per_token_cast(x, "e4m3", 128, **flags))
        for a, b in zip(traced, eager, strict=True):
            assert [(t.dtype, t.shape, t.stride()) for t in a] == [(t.dtype, t.shape, t.stride()) for t in b]
        assert cast.per_token_cast_with_sf_only(x, "e4m3", 128, **flags).stride() == (1, 12)
        assert cast.per_token_cast_with_precomputed_sf(x, "e4m3", 128, eager[2][1], **flags).shape == (9, 2048)
    assert len(templates) == before and runtime.REMEMBERED == []
    monkeypatch.setattr(cast, "_kernel", WritingKernel(cast._kernel, (1, 2)))
    out = tuple(poisoned(t) for t in eager[1])
    result = cast.per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=True, out=out)
    assert result[0] is out[0] and result[1] is out[1] and marked(out[0]) and marked(out[1])
    assert all(a is not t for a in runtime.LAUNCHES[-1][2] for t in out)  # launched into the op's own outputs
