"""GPU tests of ``tile_kernels_aot.transpose`` against the torch reference (tests/reference/transpose.py).

A transpose only moves bits, so every comparison is bit-exact on integer views
(tolerance: none). Inputs are fresh random bit patterns with no zero and no copy of
the sentinel that poisons the output, so an element the kernel fails to write, or
writes from the wrong place, cannot pass unnoticed.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.gpu.threads import in_new_thread
from tests.reference.transpose import batched_transpose_ref, transpose_ref

tile_kernels_aot = pytest.importorskip("tile_kernels_aot")
tk_transpose = importlib.import_module("tile_kernels_aot.transpose")
errors = importlib.import_module("tile_kernels_aot.errors")
runtime = importlib.import_module("tile_kernels_aot._runtime")

pytestmark = pytest.mark.gpu

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float8_e4m3fn": torch.float8_e4m3fn}
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}  # same-width integer view of each dtype
BATCHES = (0, 1, 3, 8)
MATRICES = ((64, 64), (128, 7168), (512, 7168), (7168, 192), (4096, 2048))
SENTINEL = 0x5A  # poison: every byte of an unwritten output element reads 0x5A


def _bits(dtype: torch.dtype) -> torch.dtype:
    return BITS[torch.empty(0, dtype=dtype).element_size()]


def _sentinel(dtype: torch.dtype) -> int:
    # 0x5A..5A is positive in every signed width, so it fits the integer view as is.
    return int.from_bytes(bytes([SENTINEL]) * torch.empty(0, dtype=dtype).element_size(), "little")


def random_input(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Random bit patterns (NaNs included: bits are compared, not values), never 0 or the sentinel."""
    bits = _bits(dtype)
    info = torch.iinfo(bits)
    x = torch.randint(info.min, info.max, shape, dtype=bits, device="cuda")
    x[(x == 0) | (x == _sentinel(dtype))] = 1
    return x.view(dtype)


def poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, _sentinel(dtype), dtype=_bits(dtype), device="cuda").view(dtype)


def assert_bit_equal(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert out.is_contiguous()
    out_bits, ref_bits = out.view(_bits(out.dtype)), ref.view(_bits(ref.dtype))
    unwritten = int((out_bits == _sentinel(out.dtype)).sum())
    assert unwritten == 0, f"{unwritten} of {out.numel()} output elements were never written"
    wrong = int((out_bits != ref_bits).sum())
    assert wrong == 0, f"{wrong} of {out.numel()} output elements differ from the reference"


@pytest.mark.parametrize("mn", MATRICES, ids=lambda mn: f"{mn[0]}x{mn[1]}")
@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: f"B{b}")
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_launcher_writes_every_element(dtype_name: str, batch: int, mn: tuple[int, int]) -> None:
    """The variant's launcher, called directly on a poisoned output."""
    dtype = DTYPES[dtype_name]
    m, n = mn
    x = random_input((batch, m, n), dtype)
    y = poisoned((batch, n, m), dtype)
    runtime.get_kernel("batched_transpose").select(dtype=dtype_name)(x, y)
    torch.cuda.synchronize()
    assert_bit_equal(y, batched_transpose_ref(x))


@pytest.mark.parametrize("shape", [(0, 64, 64), (1, 64, 128), (3, 192, 320), (8, 512, 7168)], ids=str)
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_batched_transpose(dtype_name: str, shape: tuple[int, int, int]) -> None:
    x = random_input(shape, DTYPES[dtype_name])
    assert_bit_equal(tk_transpose.batched_transpose(x), batched_transpose_ref(x))


@pytest.mark.parametrize("shape", [(64, 64), (128, 7168), (7168, 192), (4096, 2048)], ids=str)
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_transpose(dtype_name: str, shape: tuple[int, int]) -> None:
    x = random_input(shape, DTYPES[dtype_name])
    assert_bit_equal(tk_transpose.transpose(x), transpose_ref(x))


def test_runs_on_the_current_stream() -> None:
    """The launch goes on torch's current stream: results are ready once that stream is synchronized."""
    x = random_input((8, 512, 7168), torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = tk_transpose.batched_transpose(x)
    stream.synchronize()
    assert_bit_equal(y, batched_transpose_ref(x))


def test_other_dtype_names_the_built_variants() -> None:
    x = torch.ones(2, 64, 64, dtype=torch.float16, device="cuda")
    with pytest.raises(errors.VariantNotFoundError) as info:
        tk_transpose.batched_transpose(x)
    message = str(info.value)
    assert "float16" in message
    for built in DTYPES:
        assert built in message


def test_cpu_tensor_is_refused_naming_x() -> None:
    x = torch.ones(2, 64, 64, dtype=torch.bfloat16)
    with pytest.raises(errors.KernelError, match=r"\bx\b"):
        tk_transpose.batched_transpose(x)


@pytest.mark.parametrize("shape", [(2, 96, 64), (2, 64, 96), (2, 100, 130)], ids=str)
def test_sizes_not_multiple_of_64_are_refused(shape: tuple[int, int, int]) -> None:
    x = torch.ones(shape, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=rf"\bx\b.*M={shape[1]}, N={shape[2]}"):
        tk_transpose.batched_transpose(x)
    with pytest.raises(ValueError, match=rf"M={shape[1]}, N={shape[2]}"):
        tk_transpose.transpose(x[0])


def test_non_contiguous_x_is_refused() -> None:
    x = torch.ones(2, 128, 64, dtype=torch.bfloat16, device="cuda").transpose(1, 2)  # (2, 64, 128), strided
    with pytest.raises(ValueError, match=r"\bx\b.*contiguous"):
        tk_transpose.batched_transpose(x)
    with pytest.raises(ValueError, match=r"\bx\b.*contiguous"):
        tk_transpose.transpose(x[0])


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize(("m", "n", "width"), [(4032, 576, 1152), (128, 7168, 7168 + 16), (64, 64, 4096)], ids=str)
def test_strided_rows_are_read_in_place(dtype_name: str, m: int, n: int, width: int) -> None:
    # x[:, :n] of a wider tensor (TileKernels' tests pass twice the width): rows width elements apart.
    dtype = DTYPES[dtype_name]
    wide = torch.randn(m, width, device="cuda").to(dtype)
    x = wide[:, :n]
    y = tk_transpose.transpose(x)
    assert torch.equal(y.view(torch.uint8), x.T.contiguous().view(torch.uint8))
    batched = torch.randn(3, m, width, device="cuda").to(dtype)[:, :, :n]
    y = tk_transpose.batched_transpose(batched)
    assert torch.equal(y.view(torch.uint8), batched.transpose(1, 2).contiguous().view(torch.uint8))


def test_row_stride_off_the_vector_grid_is_refused() -> None:
    x = torch.ones(64, 72, dtype=torch.bfloat16, device="cuda")[:, :64]  # rows 72 elements apart
    with pytest.raises(ValueError, match=r"\bx\b.*multiples of 16 elements"):
        tk_transpose.transpose(x)


def test_launcher_checks_strides_of_x() -> None:
    """The launcher's own contract check, for callers that bypass the op."""
    x = torch.ones(2, 128, 64, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    y = torch.empty(2, 128, 64, dtype=torch.bfloat16, device="cuda")
    launch = runtime.get_kernel("batched_transpose").select(dtype="bfloat16")
    with pytest.raises(errors.KernelArgumentError, match=r"\bx\b"):
        launch(x, y)


def test_launcher_checks_shape_of_y() -> None:
    """y must be (B, N, M) for the x it goes with; (B, M, N) would be written out of bounds."""
    x = torch.ones(2, 128, 64, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(2, 128, 64, dtype=torch.bfloat16, device="cuda")
    launch = runtime.get_kernel("batched_transpose").select(dtype="bfloat16")
    with pytest.raises(errors.KernelArgumentError, match=r"\by\b"):
        launch(x, y)


def test_wrong_rank_is_refused() -> None:
    x = torch.ones(64, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"\bx\b.*3-D.*transpose\(\)"):
        tk_transpose.batched_transpose(x)
    with pytest.raises(ValueError, match=r"\bx\b.*2-D"):
        tk_transpose.transpose(x.unsqueeze(0))


def test_non_tensor_is_refused() -> None:
    with pytest.raises(errors.KernelArgumentError, match=r"\bx\b"):
        tk_transpose.batched_transpose([[1.0]])  # type: ignore[arg-type]


def test_launch_from_a_thread_that_never_used_cuda() -> None:
    # A new thread has no current CUDA context: the compiled launch gets
    # CUDA_ERROR_INVALID_CONTEXT, and the loader binds torch's context to the thread and retries.
    launch = runtime.get_kernel("batched_transpose").select(dtype="bfloat16")
    x = torch.randn(2, 128, 256, device="cuda", dtype=torch.bfloat16)
    launch(x, torch.empty(2, 256, 128, device="cuda", dtype=torch.bfloat16))  # ready: the thread takes the fast path
    y = torch.full((2, 256, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    in_new_thread(lambda: launch(x, y))
    assert torch.equal(y, x.transpose(1, 2))


def test_the_launcher_itself_refuses_partial_tiles() -> None:
    """The spec's requires (M, N multiples of 64) are in the launcher's contract: a direct call of the launcher,
    past the op's checks, raises naming x instead of launching on tiles the kernel does not cover."""
    launch = runtime.get_kernel("batched_transpose").select(dtype="bfloat16")
    x = torch.randn(1, 32, 64, device="cuda", dtype=torch.bfloat16)
    y = torch.full((1, 64, 32), 7.0, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(errors.KernelArgumentError, match=r"^x: the kernel requires M % 64 == 0, got M = 32"):
        launch(x, y)
    torch.cuda.synchronize()
    assert bool((y == 7.0).all())  # nothing was launched
