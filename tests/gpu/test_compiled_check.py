"""The compiled tensor check on real CUDA tensors: taken where it should be, declining where the Python
checks must speak, and reading the same pointers and sizes as they do.

Every other GPU test launches through it too (the launchers ask it first), so wrong pointers or sizes
would show there as wrong results; these tests make sure the fast path is not silently skipped, e.g.
by a torch whose DLPack export lacks float8.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.gpu.installed import installed_package

tile_kernels_aot, quant, errors, runtime = installed_package()
protocol = importlib.import_module("tile_kernels_aot._protocol")

pytestmark = pytest.mark.gpu


def _contract(launch: object) -> bytes | None:
    module = sys.modules[launch.__module__]
    return module._CONTRACT


def _plan(launch: object) -> bytes | None:
    module = sys.modules[launch.__module__]
    return getattr(module, "_PLAN", None)


def _handles(launch: object) -> dict[int, int]:
    module = sys.modules[launch.__module__]
    return module._KERNEL.handles  # type: ignore[no-any-return]


def _per_token_launcher(fmt: str, npc: int) -> object:
    return runtime.get_kernel("per_token_cast").select(in_dtype="bfloat16", hidden=0, fmt=fmt, npc=npc,
                                                       round_sf=False, sf_layout="row_major")


def test_the_package_has_the_compiled_check() -> None:
    assert runtime.NATIVE_LAUNCH and runtime.NATIVE_CHECK and runtime.NATIVE_RUN


@pytest.mark.parametrize(("fmt", "npc"), [("e4m3", 128), ("e2m1", 32)])
def test_check_accepts_well_formed_tensors_and_reads_what_python_reads(fmt: str, npc: int) -> None:
    launch = _per_token_launcher(fmt, npc)
    contract = _contract(launch)
    assert contract is not None, "contract() packed nothing: this torch cannot export a dtype through DLPack"
    wide = torch.randn(33, 7680, device="cuda", dtype=torch.bfloat16)
    x = wide[:, :7168]  # strided rows, as the op allows
    q = torch.empty(33, 7168 if fmt == "e4m3" else 3584, device="cuda",
                    dtype=torch.float8_e4m3fn if fmt == "e4m3" else torch.int8)
    sf = torch.empty(33, 7168 // npc, device="cuda")
    # the sizes: num_tokens, hidden (a runtime size of the grouped variants), x's row stride
    assert runtime.check(contract, x, q, sf) == (x.get_device(), x.data_ptr(), q.data_ptr(), sf.data_ptr(), 33, 7168,
                                                 7680)


def test_check_declines_and_the_python_checks_name_the_argument() -> None:
    launch = _per_token_launcher("e4m3", 128)
    contract = _contract(launch)
    x = torch.randn(8, 7168, device="cuda", dtype=torch.bfloat16)
    q = torch.empty(8, 7168, device="cuda", dtype=torch.float8_e4m3fn)
    sf = torch.empty(8, 56, device="cuda")
    bad = {
        "x": (x.float(), "x: expected dtype torch.bfloat16"),
        "q": (q[:7], r"q: expected shape \(8, 7168\)"),
        "sf": (torch.empty(8, 57, device="cuda")[:, 1:], "sf: "),  # misaligned or strided: both refused
    }
    for name, (tensor, message) in bad.items():
        args = {"x": x, "q": q, "sf": sf, name: tensor}
        assert runtime.check(contract, args["x"], args["q"], args["sf"]) is None, name
        with pytest.raises(errors.KernelArgumentError, match=message):
            launch(args["x"], args["q"], args["sf"], 0)
    q_cpu = q.cpu()
    assert runtime.check(contract, x, q_cpu, sf) is None
    with pytest.raises(errors.KernelArgumentError, match="^q: "):
        launch(x, q_cpu, sf, 0)


def test_every_catalogue_dtype_exports_as_the_contracts_spell_it() -> None:
    """Each dtype a launcher of the catalogue checks is exported by this torch with the DLPack code tkc
    packed into the contracts at build time (_protocol.DLPACK_DTYPES); a different code would make every
    compiled check of that dtype decline, silently leaving the fast path."""
    dtypes = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.int8, torch.uint8,
              torch.int32, torch.int64, torch.bool)
    exported = {str(d).removeprefix("torch."): importlib.import_module(f"{runtime.__package__}._launch").dlpack_dtype(torch.empty(0, dtype=d, device="cuda"))
                for d in dtypes}
    assert exported == {name: protocol.DLPACK_DTYPES[name] for name in exported}, torch.__version__


def test_launchers_of_every_kernel_module_hold_contracts() -> None:
    info = importlib.import_module("tile_kernels_aot._build_info")
    empty = []
    for name in info.KERNELS:
        kernel = runtime.get_kernel(name)
        for launch in kernel.variants.values():
            if _contract(launch) is None:
                empty.append(launch.__name__)
    assert not empty, f"{len(empty)} launchers have no compiled check, e.g. {empty[:3]}"


@pytest.fixture(params=["exchange", "to_dlpack"])
def reader(request: pytest.FixtureRequest) -> Iterator[str]:
    """How the compiled paths read tensors (and, with the exchange API, find the current stream)."""
    if runtime.use_exchange(request.param == "exchange") != (request.param == "exchange"):
        pytest.skip(f"torch {torch.__version__} has no DLPack C exchange API")
    yield request.param
    runtime.use_exchange(True)


def test_run_launches_what_the_python_path_launches_on_the_current_stream(reader: str) -> None:
    """run() after the first launch (which loads the kernel through the Python path): the same codes and
    scales as the Python path, on the current stream; its declines leave the errors to the Python checks."""
    launch = _per_token_launcher("e4m3", 128)
    contract, plan, handles = _contract(launch), _plan(launch), _handles(launch)
    assert plan is not None
    x = torch.randn(33, 7680, device="cuda", dtype=torch.bfloat16)[:, :7168] * 100
    outputs = [(torch.full((33, 7168), 1.0, device="cuda").to(torch.float8_e4m3fn),
                torch.full((33, 56), float("nan"), device="cuda")) for _ in range(2)]
    launch(x, *outputs[0], 0)  # the first launch: the Python path loads the kernel on this device
    assert x.get_device() in handles
    # The side stream sleeps first, so a launch on it cannot have run when the main stream (idle) takes a
    # snapshot; a launch on the main or legacy stream would have.
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # about 0.1 s
        assert runtime.run(contract, plan, handles, x, *outputs[1], 0) is True
    snapshot = outputs[1][1].clone()  # on the main stream, while the side stream sleeps
    main.synchronize()
    assert torch.isnan(snapshot).all(), "run() launched on another stream than the current one"
    side.synchronize()
    assert torch.equal(outputs[0][0].view(torch.uint8), outputs[1][0].view(torch.uint8))
    assert torch.equal(outputs[0][1], outputs[1][1])
    q, sf = outputs[1]
    assert runtime.run(contract, plan, handles, x.float(), q, sf, 0) is False
    assert runtime.run(contract, plan, handles, x, q[:7], sf, 0) is False
    assert runtime.run(contract, plan, {}, x, q, sf, 0) is False  # no kernel on this device yet
    assert runtime.run(contract, plan, handles, x[:0], q[:0], sf[:0], 0) is True  # empty: nothing to launch


def test_both_readers_spell_the_catalogues_dtypes_alike() -> None:
    """The contracts hold the dtype codes of one reader; the other must read the same codes."""
    dtypes = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.int8, torch.uint8,
              torch.int32, torch.int64, torch.bool)
    spelled = {}
    try:
        for reader in ("to_dlpack", "exchange"):
            if runtime.use_exchange(reader == "exchange") != (reader == "exchange"):
                pytest.skip(f"torch {torch.__version__} has no DLPack C exchange API")
            spelled[reader] = [importlib.import_module(f"{runtime.__package__}._launch").dlpack_dtype(torch.empty(0, dtype=d, device="cuda")) for d in dtypes]
    finally:
        runtime.use_exchange(True)
    assert spelled["exchange"] == spelled["to_dlpack"]


def _uses_tensor_maps() -> set[str]:
    """The variants whose launch builds a TMA descriptor (from the installed manifest's contracts)."""
    root = Path(tile_kernels_aot.__file__).parent
    top = json.loads((root / "manifest.json").read_text())
    # A multi-arch package's manifest.json names one manifest per arch.
    manifests = [root / path for path in top["archs"].values()] if "archs" in top else [root / "manifest.json"]
    return {v["id"] for path in manifests for k in json.loads(path.read_text())["kernels"].values()
            for v in k["variants"]
            if any(a["ctype"] == "tensormap" for launch in v["contract"]["launches"] for a in launch["args"])}


def test_launchers_of_every_kernel_module_hold_plans() -> None:
    """Every launcher of the catalogue takes run() (one plain or cooperative launch), except those that build
    a TMA descriptor per call: the launcher itself encodes it, so they have no plan."""
    info = importlib.import_module("tile_kernels_aot._build_info")
    launchers = {launch.__name__: launch for name in info.KERNELS
                 for launch in runtime.get_kernel(name).variants.values()}
    missing = {name for name, launch in launchers.items() if _plan(launch) is None}
    assert missing == _uses_tensor_maps() & set(launchers), "launchers without a plan that need none"
    assert len(missing) < len(launchers)
    # ... and carry it for the ops' dispatch(): the same contract, plan and handles the launcher runs.
    for name, launch in launchers.items():
        if name in missing:
            assert launch.planned is None  # type: ignore[attr-defined]  # dispatch calls the launcher itself
        else:
            contract, plan, handles = launch.planned  # type: ignore[attr-defined]
            assert contract is _contract(launch) and plan is _plan(launch) and handles is _handles(launch)
