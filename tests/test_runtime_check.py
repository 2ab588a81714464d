"""The compiled tensor check (``_launch.check`` over the contracts tkc/pack.py packs) on CPU tensors.

The contracts here ask for DLPack's CPU device (``device_type=1``) so that the C comparison runs
without a GPU; the generated launchers' contracts ask for CUDA and must decline CPU tensors, so
that the Python checks (and their errors) keep deciding there. check() may only accept what the
Python checks accept, and must return the pointers and sizes they would read.
"""

from __future__ import annotations

import importlib
import random
from types import ModuleType

import pytest
import torch

from tkc import pack

pytestmark = pytest.mark.slow

KDL_CPU = 1


@pytest.fixture(scope="module")
def runtime(small_package: ModuleType, tensor_reader: str) -> ModuleType:
    """The small package's runtime, its compiled check reading tensors as tensor_reader says."""
    rt = importlib.import_module("tkc_small_kernels._runtime")
    if not rt.NATIVE_CHECK:
        pytest.skip("the small package was built without its compiled module (no C compiler or Python.h)")
    return rt


def token_contract(rt: ModuleType, limit: int = 2**31) -> bytes:
    """per_token_cast's shape: strided rows in, a row-major output, one scale per 128 channels,
    and a scale table whose rows are an expression of the tokens (per_block_cast's 128-row blocks)."""
    return pack.contract(
        (
            ("x", torch.bfloat16, ("num_tokens", 2048), ("x_row_stride", 1)),
            ("q", torch.float8_e4m3fn, ("num_tokens", 2048), pack.ROW_MAJOR),
            ("sf", torch.float32, ("(num_tokens + 127) // 128", 16), pack.ROW_MAJOR),
        ),
        sizes=(("num_tokens", "x", "shape", 0, limit), ("x_row_stride", "x", "stride", 0, limit)),
        written=("q", "sf"),
        alignment=16,
        device_type=KDL_CPU,
    )


def token_tensors(tokens: int = 300, row_stride: int = 2560) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(tokens, row_stride).to(torch.bfloat16)[:, :2048]
    q = torch.empty(tokens, 2048, dtype=torch.float8_e4m3fn)
    sf = torch.empty((tokens + 127) // 128, 16)
    return x, q, sf


def test_check_returns_the_device_pointers_and_sizes(runtime: ModuleType) -> None:
    x, q, sf = token_tensors()
    assert runtime.check(token_contract(runtime), x, q, sf) == (0, x.data_ptr(), q.data_ptr(), sf.data_ptr(), 300, 2560)


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.numel() + 16, dtype=t.dtype)[1:t.numel() + 1].view(t.shape)


@pytest.mark.parametrize("case", [
    "x dtype", "q dtype", "q rows", "q channels", "sf rows", "q 3-d", "q column-major", "x channel stride",
    "x misaligned", "sf misaligned", "not a tensor", "sizes over the limit", "CUDA contract", "x negated view",
    "sf negated view",
])
def test_check_declines_what_the_python_checks_refuse(runtime: ModuleType, case: str) -> None:
    x, q, sf = token_tensors()
    contract = token_contract(runtime)
    args: list[object] = [x, q, sf]
    if case == "x dtype":
        args[0] = x.float()
    elif case == "q dtype":
        args[1] = q.view(torch.int8)
    elif case == "q rows":
        args[1] = q[:299]
    elif case == "q channels":
        args[1] = torch.empty(300, 1024, dtype=torch.float8_e4m3fn)
    elif case == "sf rows":
        args[2] = torch.empty(2, 16)  # 300 tokens need ceil(300 / 128) = 3
    elif case == "q 3-d":
        args[1] = q.view(300, 2048, 1)
    elif case == "q column-major":
        args[1] = q.t().contiguous().t()
    elif case == "x channel stride":
        args[0] = torch.randn(300, 4096).to(torch.bfloat16)[:, ::2]
    elif case == "x misaligned":
        args[0] = torch.randn(300, 2049).to(torch.bfloat16)[:, 1:]
    elif case == "sf misaligned":
        args[2] = _misaligned(sf)
    elif case == "not a tensor":
        args[2] = sf.tolist()
    elif case == "x negated view":  # DLPack exports the memory without the bit: the kernel would read -x as x
        args[0] = torch._neg_view(x)
    elif case == "sf negated view":
        args[2] = torch._neg_view(sf)
    elif case == "sizes over the limit":
        contract = token_contract(runtime, limit=300)  # num_tokens must be < limit
    elif case == "CUDA contract":  # what the generated launchers hold: CPU tensors go to the Python checks
        contract = pack.contract([(name, t.dtype, tuple(t.shape), None) for name, t in zip("xqs", (x, q, sf))])
    assert runtime.check(contract, *args) is None


def test_python_checks_refuse_lazy_views_by_name(runtime: ModuleType) -> None:
    x, _, _ = token_tensors()
    errors = importlib.import_module("tkc_small_kernels.errors")
    with pytest.raises(errors.KernelArgumentError, match=r"^x: a lazily negated view .*pass x.resolve_neg\(\)"):
        runtime.check_tensor("x", torch._neg_view(x), torch.bfloat16, (None, 2048), None)
    imag = torch.randn(4, 8, dtype=torch.complex64).conj().imag  # a real view with the negative bit
    with pytest.raises(errors.KernelArgumentError, match=r"^w: a lazily negated view"):
        runtime.check_tensor("w", imag, torch.float32, (4, 8), None)


def test_check_skips_strides_torch_never_steps_over(runtime: ModuleType) -> None:
    contract = token_contract(runtime)
    # One token: its row stride is never stepped over, the kernel reads row 0 only. torch's DLPack
    # export writes 1 for it (strides of size-1 dimensions are normalised); either value is right.
    x, q, sf = token_tensors(tokens=1)
    assert runtime.check(contract, x, q.t().contiguous().t(), sf)[4:] in ((1, 1), (1, 2560))
    # No tokens: empty tensors are never indexed, any strides will do; sizes are still read.
    x, q, sf = token_tensors(tokens=0)
    assert runtime.check(contract, x, q.as_strided((0, 2048), (1, 7)), sf)[4:] == (0, 2560)


def test_check_declines_contracts_it_cannot_read(runtime: ModuleType) -> None:
    x, q, sf = token_tensors()
    contract = token_contract(runtime)
    assert runtime.check(None, x, q, sf) is None  # no contract: a dtype this torch cannot export
    assert runtime.check(contract[:-8], x, q, sf) is None  # truncated
    assert runtime.check(contract + bytes(8), x, q, sf) is None  # trailing words
    assert runtime.check(contract, x, q) is None  # a tensor short
    assert contract[:8] == (4).to_bytes(8, "little")  # the format check() reads (_protocol.CONTRACT_VERSION)
    assert runtime.check((9).to_bytes(8, "little") + contract[8:], x, q, sf) is None  # another version


def _assert_expression(runtime: ModuleType, a: int, b: int, text: str, value: int) -> None:
    """check() takes a tensor of length ``text`` (an expression of sizes a and b) where it is ``value`` long,
    and declines one element more."""
    contract = pack.contract(
        (("s", torch.int8, ("a", "b"), pack.ROW_MAJOR), ("t", torch.int8, (text,), None)),
        sizes=(("a", "s", "shape", 0, 0), ("b", "s", "shape", 1, 0)), alignment=1, device_type=KDL_CPU)
    s = torch.empty(a, b, dtype=torch.int8)
    assert runtime.check(contract, s, torch.empty(value, dtype=torch.int8)) is not None, text
    assert runtime.check(contract, s, torch.empty(value + 1, dtype=torch.int8)) is None, text


def test_expressions_follow_python_arithmetic(runtime: ModuleType) -> None:
    """Sums, products, floor quotients and remainders of sizes, as the launchers' Python spells them."""
    rng = random.Random(0)
    for _ in range(200):
        a, b = rng.randrange(0, 50), rng.randrange(1, 9)
        for text, value in (("(a + 7) // b * b - a", (a + 7) // b * b - a), ("a % b + 2 * a", a % b + 2 * a),
                            ("(a - 60) // b", (a - 60) // b), ("(a - 60) % b", (a - 60) % b)):
            if value < 0:
                continue  # a negative dimension matches no tensor
            _assert_expression(runtime, a, b, text, value)


def test_expressions_outside_the_grammar_are_refused(runtime: ModuleType) -> None:
    with pytest.raises(ValueError, match="not a sum, product, floor quotient, max or min"):
        pack.contract((("t", torch.int8, ("n ** 2",), None),), sizes=(("n", "t", "shape", 0, 0),))
    with pytest.raises(ValueError, match="not a sum, product, floor quotient, max or min"):
        pack.contract((("t", torch.int8, ("m",), None),), sizes=(("n", "t", "shape", 0, 0),))


def _python_accepts(t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], strides: str | tuple[int, ...],
                    alignment: int) -> bool:
    """check_tensor + check_strides (or is_contiguous) + the alignment test, without the device."""
    if t.dtype != dtype or tuple(t.shape) != shape or t.data_ptr() % alignment:
        return False
    if strides == "row_major":
        return t.is_contiguous()
    return t.numel() == 0 or all(size <= 1 or want == got for want, got, size in zip(strides, t.stride(), t.shape))


def test_check_agrees_with_the_python_checks_on_random_views(runtime: ModuleType) -> None:
    """Random views (slices, transposes, steps, offsets, sizes 0 and 1) against one contract each."""
    rng = random.Random(1)
    dtypes = (torch.bfloat16, torch.float32, torch.int8, torch.float8_e4m3fn, torch.int64)
    accepted = declined = 0
    for _ in range(600):
        dtype = rng.choice(dtypes)
        rows, cols = rng.choice((0, 1, 2, 3, 8)), rng.choice((0, 1, 2, 16, 24))
        base = torch.zeros(rows * 2 + 1, cols * 2 + 16).to(dtype)
        offset = rng.choice((0, 0, 1, 8))
        view = base[offset % 2: offset % 2 + rows, offset: offset + cols]
        if rng.random() < 0.3:
            view = base[: 2 * rows: 2, :cols]
        if rng.random() < 0.3:
            view = view.contiguous()
        if rng.random() < 0.2:
            view = view.t().contiguous().t()
        want_dtype = dtype if rng.random() < 0.9 else rng.choice(dtypes)
        layout = rng.choice(("row_major", (cols, 1), (base.stride(0), 1), (1, rows)))
        alignment = rng.choice((1, 16))
        contract = pack.contract(
            (("t", want_dtype, ("rows", cols), layout if layout == "row_major" else tuple(layout)),),
            sizes=(("rows", "t", "shape", 0, 0),), alignment=alignment, device_type=KDL_CPU)
        got = runtime.check(contract, view)
        expected = _python_accepts(view, want_dtype, (view.shape[0], cols), layout, alignment)
        assert (got is not None) == expected, (view.shape, view.stride(), dtype, want_dtype, layout, alignment)
        if got is not None:
            assert got == (0, view.data_ptr(), view.shape[0])
        accepted += expected
        declined += not expected
    assert accepted > 100 and declined > 100  # both sides were exercised


def test_generated_launchers_hold_a_contract_and_decline_cpu_tensors(small_package: ModuleType,
                                                                     runtime: ModuleType) -> None:
    """Each variant's launcher module takes its contract and plan from the kernel's table; CPU tensors are
    declined by run() and refused by the Python checks with the usual error, not accepted by the CUDA
    contract."""
    errors = importlib.import_module("tkc_small_kernels.errors")
    kernel = runtime.get_kernel("per_token_cast")
    launch = kernel.select(in_dtype="bfloat16", hidden=2048, fmt="e4m3", npc=128, round_sf=True,
                           sf_layout="row_major") if "sf_layout" in kernel.keys else next(iter(kernel.variants.values()))
    module = importlib.import_module(launch.__module__)
    contract = module._CONTRACT
    assert isinstance(contract, bytes) and len(contract) % 8 == 0
    plan = module._PLAN
    assert isinstance(plan, bytes) and len(plan) % 8 == 0
    x, q, _ = token_tensors(tokens=4)
    assert runtime.check(contract, x.contiguous(), q, torch.empty(4, 16)) is None
    assert runtime.run(contract, plan, {0: 1}, x.contiguous(), q, torch.empty(4, 16), 0) is False
    with pytest.raises((errors.KernelArgumentError, errors.NoGpuError), match="^x: "):
        launch(x.contiguous(), q, torch.empty(4, 16), 0)


def test_check_declines_a_written_tensor_that_overlaps_another(runtime: ModuleType) -> None:
    """q and sf are written: either may not share a byte with x or with each other; empty tensors
    never overlap, and a tensor that is only read may overlap another read one."""
    contract = token_contract(runtime)
    x, q, sf = token_tensors()
    base = torch.empty(300 * 2560 * 2 + 4096, dtype=torch.uint8)
    x_in_base = base[: 300 * 2560 * 2].view(torch.bfloat16).view(300, 2560)[:, :2048]
    assert runtime.check(contract, x_in_base, q, sf) is not None
    overlapping_q = base[4096: 4096 + 300 * 2048].view(torch.float8_e4m3fn).view(300, 2048)  # inside x's rows
    assert runtime.check(contract, x_in_base, overlapping_q, sf) is None
    sf_in_q = q.view(torch.uint8).view(-1)[: 3 * 16 * 4].view(torch.float32).view(3, 16)
    assert runtime.check(contract, x, q, sf_in_q) is None
    after_x = base[300 * 2560 * 2:][: 3 * 16 * 4].view(torch.float32).view(3, 16)  # right behind x: disjoint
    assert runtime.check(contract, x_in_base, q, after_x) is not None
    x0, q0, sf0 = token_tensors(tokens=0)
    assert runtime.check(contract, x0, q0, sf0) is not None
    read_only = pack.contract((("a", torch.float32, (4,), None), ("b", torch.float32, (4,), None)),
                                 alignment=1, device_type=KDL_CPU)
    shared = torch.zeros(6)
    assert runtime.check(read_only, shared[:4], shared[2:]) is not None


def test_compiled_overlap_check_agrees_with_check_disjoint(runtime: ModuleType) -> None:
    """Random views of one buffer, one of them written: check() declines exactly when
    check_disjoint raises (the Python path a pure wheel or a declined call takes)."""
    rng = random.Random(2)
    errors = importlib.import_module("tkc_small_kernels.errors")
    base = torch.zeros(64, 64)
    declined = accepted = 0
    for _ in range(400):
        views = []
        for _ in range(2):
            rows, cols = rng.choice((0, 1, 3, 8)), rng.choice((1, 4, 16))
            r0, c0 = rng.randrange(0, 12), rng.randrange(0, 40)
            step = rng.choice((1, 2))
            views.append(base[r0: r0 + rows * step: step, c0: c0 + cols])
        a, b = views
        contract = pack.contract(
            (("a", torch.float32, tuple(a.shape), None), ("b", torch.float32, tuple(b.shape), None)),
            written=("a",), alignment=1, device_type=KDL_CPU)
        got = runtime.check(contract, a, b)
        try:
            runtime.check_disjoint((("a", a),), (("b", b),))
            raised = False
        except errors.KernelArgumentError as exc:
            assert str(exc).startswith("a: its memory overlaps b's")
            raised = True
        assert (got is None) == raised, (a.shape, a.stride(), a.storage_offset(), b.shape, b.stride(),
                                         b.storage_offset())
        declined += raised
        accepted += not raised
    assert declined > 50 and accepted > 50


def test_expressions_take_max_and_min_of_two(runtime: ModuleType) -> None:
    """Grids like max(num_tokens, num_expanded_tokens), as the launchers' Python spells them."""
    for a, b in ((0, 5), (7, 3), (4, 4)):
        for text, value in (("max(a, b)", max(a, b)), ("min(a + 1, b) * 2", min(a + 1, b) * 2)):
            _assert_expression(runtime, a, b, text, value)
    with pytest.raises(ValueError, match="max or min"):
        pack.contract((("t", torch.int8, ("max(n, 1, 2)",), None),), sizes=(("n", "t", "shape", 0, 0),))


def test_both_readers_see_the_same_tensor(runtime: ModuleType, tensor_reader: str) -> None:
    """The exchange API and _to_dlpack spell every dtype alike, as the packed contracts do
    (_protocol.DLPACK_DTYPES), and read the same pointer, shape and strides."""
    dtypes = (torch.bfloat16, torch.float16, torch.float32, torch.int8, torch.uint8, torch.int32, torch.int64,
              torch.bool, torch.float8_e4m3fn, torch.float8_e5m2)
    spelled = {}
    try:
        for reader in ("to_dlpack", "exchange"):
            if runtime.use_exchange(reader == "exchange") != (reader == "exchange"):
                pytest.skip("this torch has no DLPack C exchange API")
            spelled[reader] = [importlib.import_module("tkc_small_kernels._launch").dlpack_dtype(torch.empty(0, dtype=d)) for d in dtypes]
    finally:
        runtime.use_exchange(tensor_reader == "exchange")
    assert spelled["exchange"] == spelled["to_dlpack"]
    assert len(set(spelled["exchange"])) == len(dtypes)
    # ... and as tkc packed them into the contracts at build time.
    protocol = importlib.import_module("tkc_small_kernels._protocol")
    assert spelled["exchange"] == [protocol.DLPACK_DTYPES[str(d).removeprefix("torch.")] for d in dtypes]


def test_tensor_subclasses_are_read_too(runtime: ModuleType) -> None:
    """Only exactly torch.Tensor goes through the exchange API (its producer must be the object's own
    type); an nn.Parameter takes _to_dlpack and is accepted alike."""
    x, q, sf = token_tensors()
    contract = token_contract(runtime)
    parameter = torch.nn.Parameter(x, requires_grad=False)
    assert type(parameter) is not torch.Tensor
    assert runtime.check(contract, parameter, q, sf) == runtime.check(contract, x, q, sf) is not None


def test_check_declines_sizes_the_kernels_requirements_refuse(runtime: ModuleType) -> None:
    """A spec's requires ("M % 64 == 0") travel in the contract: check() accepts only sizes that meet them,
    so a launcher called directly cannot launch a kernel on tiles it does not cover."""
    contract = pack.contract((("x", torch.int8, ("m", "n"), pack.ROW_MAJOR),),
                             sizes=(("m", "x", "shape", 0, 0), ("n", "x", "shape", 1, 0)), alignment=1,
                             device_type=KDL_CPU, requires=(("m % 64", "0"), ("n // 2", "max(m, 32)")))
    assert runtime.check(contract, torch.empty(64, 128, dtype=torch.int8)) is not None
    assert runtime.check(contract, torch.empty(0, 64, dtype=torch.int8)) is not None  # 0 % 64 == 0, 32 == max(0, 32)
    assert runtime.check(contract, torch.empty(32, 128, dtype=torch.int8)) is None  # 32 % 64
    assert runtime.check(contract, torch.empty(64, 130, dtype=torch.int8)) is None  # 65 != 64
    with pytest.raises(ValueError, match="not a sum, product"):
        pack.contract((("x", torch.int8, ("m",), None),), sizes=(("m", "x", "shape", 0, 0),), requires=(("k", "0"),))
