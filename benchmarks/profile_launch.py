"""Where one launch's host time goes, layer by layer (needs torch and the installed wheel).

One per_token_cast variant (H = 2048, one token) is called through each layer of the
loader, from the op down to the bare driver call, each timed as ``runtime_overhead.py``
times ops (median over batches, after warm-up). The differences between rows are the
cost of each layer; ``torch.add(a, b, out=c)`` in the same run is the yardstick.

    python benchmarks/profile_launch.py [--out DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from runtime_overhead import host_us, python_checks, through_ctypes


def layers() -> dict[str, Callable[[], object]]:
    import tile_kernels_aot as tk
    import tile_kernels_aot._compiled as compiled
    import tile_kernels_aot._runtime as rt

    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    q = torch.empty(1, 2048, device="cuda", dtype=torch.float8_e4m3fn)
    sf = torch.empty(1, 16, device="cuda")
    a, b, c = (torch.randn(1, device="cuda") for _ in range(3))
    launcher = rt.get_kernel("per_token_cast").select(in_dtype="bfloat16", hidden=2048, fmt="e4m3", npc=128,
                                                      round_sf=False, sf_layout="row_major")
    launcher(x, q, sf, 0)  # loads the cubin: the Function below is ready on this device
    module = sys.modules[launcher.__module__]
    function = getattr(module, f"_{launcher.__name__.upper()}_KERNEL")
    kernel = function.handles[0]
    values = (q.data_ptr(), sf.data_ptr(), x.data_ptr(), 0, 1, 2048)
    stream = rt._current_stream(0)
    params = compiled._Slots.of(function.kinds).pack(values)
    lib = rt.driver().lib
    block, smem, kinds = function.block, function.smem, function.kinds
    # The context's own CUfunction of the kernel: launching it spares the driver the CUkernel lookup.
    cu_function = ctypes.c_void_p()
    rt.driver().check(lib.cuKernelGetFunction(ctypes.byref(cu_function), ctypes.c_void_p(kernel)),
                      "cuKernelGetFunction")
    function_handle = cu_function.value

    out: dict[str, Callable[[], object]] = {
        "torch.add(a, b, out=c)": lambda: torch.add(a, b, out=c),
        "torch.empty (1, 2048) fp8": lambda: torch.empty(1, 2048, device="cuda", dtype=torch.float8_e4m3fn),
        "op quant.per_token_cast": lambda: tk.quant.per_token_cast(x, "e4m3", 128),
        "launcher (checks + launch)": lambda: launcher(x, q, sf, 0),
        "launcher through the ctypes fallback": through_ctypes(launcher, x, q, sf, 0),
        "launcher with the Python checks": python_checks(launcher, x, q, sf, 0),
        "compiled check alone": lambda: rt.check(getattr(module, f"_{launcher.__name__.upper()}_CONTRACT"), x, q, sf),
        "3 x torch._C._to_dlpack": lambda: (compiled._to_dlpack(x), compiled._to_dlpack(q), compiled._to_dlpack(sf)),
        "Function.launch (values given)": lambda: function.launch(0, (1, 1, 1), *values),
        "_launch + stream getter": lambda: compiled.launch(kernel, 0, (1, 1, 1), block, smem, rt._current_stream(0),
                                                      kinds, *values),
        "_launch (everything given)": lambda: compiled.launch(kernel, 0, (1, 1, 1), block, smem, stream, kinds,
                                                               *values),
        "_launch of the CUfunction (everything given)": lambda: compiled.launch(
            function_handle, 0, (1, 1, 1), block, smem, stream, kinds, *values),
        "ctypes cuLaunchKernel (arguments packed)": lambda: lib.cuLaunchKernel(
            ctypes.c_void_p(kernel), 1, 1, 1, *block, smem, ctypes.c_void_p(stream), params, None),
        "torch._C._cuda_getCurrentRawStream": lambda: rt._current_stream(0),
        "3 x Tensor.data_ptr()": lambda: (x.data_ptr(), q.data_ptr(), sf.data_ptr()),
    }
    print("native launch module:", rt.NATIVE_LAUNCH, "compiled check:", rt.NATIVE_CHECK)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = {name: host_us(fn) for name, fn in layers().items()}
    width = max(map(len, rows))
    for name, us in rows.items():
        print(f"{name:{width}}  {us:6.2f} us")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile_launch.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
