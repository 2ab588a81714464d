"""The generated loader on a real GPU, through the loader test kernels (tests/data/specs/loader.yaml).

They exercise what the shipped kernels may not: TMA descriptors encoded at run time,
dynamic shared memory above 48 KB (opt-in per device), a runtime fp32 scalar, launches
on a side stream, CUDA graph capture, and the arch check (the sm100 wheel on an sm90 GPU).
The GPU session builds their wheels into dist/loader/ and installs the sm90 one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.gpu.threads import in_new_thread

tk = pytest.importorskip("tkc_loader_test_kernels")
runtime = pytest.importorskip("tkc_loader_test_kernels._runtime")  # op modules import it lazily
from tkc_loader_test_kernels.errors import ArchMismatchError, KernelArgumentError  # noqa: E402

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


def _reference(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.float().transpose(1, 2) * scale).to(x.dtype)


@pytest.mark.parametrize(("dtype", "tile"), [(torch.float32, 64), (torch.float32, 128), (torch.bfloat16, 64)])
@pytest.mark.parametrize("shape", [(1, 64, 64), (3, 128, 320), (2, 504, 130), (0, 64, 64), (4, 8, 257)])
def test_tma_transpose_matches_torch(dtype: torch.dtype, tile: int, shape: tuple[int, int, int]) -> None:
    # M, N that are not multiples of the tile exercise the TMA store's clipping at the tensor edge
    # (the descriptor's global dims); TMA needs y's rows (M elements) to be a multiple of 16 bytes.
    x = torch.randn(shape, device="cuda").add_(0.25).to(dtype)
    scale = float(torch.rand(()).item() + 0.5)
    y = tk.transpose.tma_transpose(x, scale, tile=tile)
    torch.cuda.synchronize()
    assert torch.equal(y, _reference(x, scale))


@pytest.mark.parametrize("shape", [(2, 500, 130), (4, 1, 256)])
def test_tma_stride_rules_raise_naming_the_tensor(shape: tuple[int, int, int]) -> None:
    # bf16 rows of 500 or 1 elements are not multiples of 16 bytes: the driver would only say
    # CUDA_ERROR_INVALID_VALUE, the loader names y and the fix.
    x = torch.randn(shape, device="cuda").to(torch.bfloat16)
    with pytest.raises(KernelArgumentError, match=r"^y: the kernel moves y with the tensor memory accelerator"):
        tk.transpose.tma_transpose(x, 1.0)


def test_launcher_overwrites_poisoned_output_and_leaves_neighbours_alone() -> None:
    x = torch.randn(2, 192, 256, device="cuda")
    launch = tk._runtime.get_kernel("tma_transpose").select(dtype="float32", tile=128)
    # The output is a view into a larger poisoned buffer: everything around it must stay poisoned.
    backing = torch.full((2 * 256 * 192 + 64,), float("nan"), device="cuda")
    y = backing[:-64].view(2, 256, 192)
    launch(x, y, 2.0)
    torch.cuda.synchronize()
    assert torch.equal(y, _reference(x, 2.0))
    assert torch.isnan(backing[-64:]).all()


def test_side_stream_and_graph_capture() -> None:
    x = torch.randn(2, 256, 128, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = tk.transpose.tma_transpose(x, 3.0)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(y, _reference(x, 3.0))
    static_x = torch.randn(2, 256, 128, device="cuda")
    static_y = torch.empty(2, 128, 256, device="cuda")
    launch = tk._runtime.get_kernel("tma_transpose").select(dtype="float32", tile=64)
    launch(static_x, static_y, 1.0)  # warm-up: load the cubin outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(static_x, static_y, 1.0)
    static_x.copy_(torch.randn_like(static_x))
    static_y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, _reference(static_x, 1.0))


def test_launch_from_a_thread_that_never_used_cuda() -> None:
    # A new thread has no current CUDA context: the launch there is refused with
    # CUDA_ERROR_INVALID_CONTEXT, and the loader binds torch's context to the thread and retries.
    launch = runtime.get_kernel("tma_transpose").select(dtype="float32", tile=64)
    x = torch.randn(2, 256, 128, device="cuda")
    y = torch.full((2, 128, 256), float("nan"), device="cuda")
    launch(x, torch.empty_like(y), 1.0)  # the kernel is ready on this device: the thread takes the fast path
    torch.cuda.synchronize()
    in_new_thread(lambda: launch(x, y, 2.0))
    assert torch.equal(y, _reference(x, 2.0))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_another_device_than_the_current_one() -> None:
    # The launch goes to the current context; tensors on cuda:1 while cuda:0 is current are
    # launched from cuda:1's context, on cuda:1's current stream, every time.
    launch = runtime.get_kernel("tma_transpose").select(dtype="float32", tile=64)
    x = torch.randn(2, 256, 128, device="cuda:1")
    with torch.cuda.device(0):
        for scale in (2.0, 3.0):  # the first call loads the kernel on cuda:1, the second finds it
            y = torch.full((2, 128, 256), float("nan"), device="cuda:1")
            launch(x, y, scale)
            torch.cuda.synchronize(1)
            assert torch.equal(y, _reference(x, scale))
        with pytest.raises(KernelArgumentError, match="^y: is on cuda:0 but the other arguments are on cuda:1"):
            launch(x, torch.empty(2, 128, 256, device="cuda:0"), 1.0)


def test_bad_arguments_name_the_argument() -> None:
    launch = tk._runtime.get_kernel("tma_transpose").select(dtype="float32", tile=64)
    x = torch.randn(2, 64, 128, device="cuda")
    with pytest.raises(KernelArgumentError, match="^y: expected shape"):
        launch(x, torch.empty(2, 64, 128, device="cuda"), 1.0)
    with pytest.raises(KernelArgumentError, match="^x: expected dtype torch.float32"):
        launch(x.double(), torch.empty(2, 128, 64, device="cuda"), 1.0)
    with pytest.raises(KernelArgumentError, match="^x: expected strides"):
        launch(x.transpose(1, 2).contiguous().transpose(1, 2), torch.empty(2, 128, 64, device="cuda"), 1.0)
    with pytest.raises(KernelArgumentError, match="^x: data pointer .* not 16-byte aligned"):
        flat = torch.randn(2 * 64 * 128 + 1, device="cuda")
        launch(flat[1:].view(2, 64, 128), torch.empty(2, 128, 64, device="cuda"), 1.0)
    with pytest.raises(KernelArgumentError, match="^y: is on cpu|^y: expected a CUDA tensor"):
        launch(x, torch.empty(2, 128, 64), 1.0)


def test_sm100_wheel_on_this_gpu_names_both_archs(tmp_path: Path) -> None:
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) == (10, 0):
        pytest.skip("this GPU is sm100: the sm100 wheel is the right one here")
    wheels = sorted((REPO / "dist" / "loader").glob("tkc_loader_test_kernels-*+sm100-*.whl"))
    if not wheels:
        pytest.skip("no sm100 loader test wheel in dist/loader (build it with tkc build --dist dist/loader)")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheels[-1])], check=True)
    script = (
        "import torch, tkc_loader_test_kernels as tk\n"
        "from tkc_loader_test_kernels.errors import ArchMismatchError\n"
        "try:\n"
        "    tk.transpose.tma_transpose(torch.randn(1, 64, 64, device='cuda'))\n"
        "except ArchMismatchError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    assert "sm_100a" in out.stdout and f"sm_{major}{minor}" in out.stdout and f"sm{major}{minor}" in out.stdout
    assert ArchMismatchError.__name__ == "ArchMismatchError"


def test_cooperative_launch_with_grid_barrier_sized_from_the_sm_count() -> None:
    rows = tk.transpose.sm_count(torch.device("cuda"))
    assert rows == torch.cuda.get_device_properties(0).multi_processor_count
    for _ in range(3):
        x = torch.randn(rows, 128, device="cuda")
        y = tk.transpose.grid_rotate(x, cluster=1)
        torch.cuda.synchronize()
        assert torch.equal(y, 2 * x.roll(-1, dims=0))


def test_cooperative_grid_too_large_raises_naming_the_sm_count() -> None:
    x = torch.randn(200_000, 128, device="cuda")
    with pytest.raises(KernelArgumentError, match=r"cannot all be resident .* sm_count"):
        tk.transpose.grid_rotate(x, cluster=1)


def test_cluster_launch() -> None:
    x = torch.randn(64, 128, device="cuda")
    assert torch.equal(tk.transpose.grid_rotate(x, cluster=2), 2 * x)
    with pytest.raises(KernelArgumentError, match=r"multiple of the thread-block cluster \(2, 1, 1\)"):
        tk.transpose.grid_rotate(torch.randn(63, 128, device="cuda"), cluster=2)
