"""Where the launcher's host time goes: cProfile over many calls of one variant (needs the installed wheel)."""

from __future__ import annotations

import cProfile
import pstats
import time

import tile_kernels_aot as tk
import tile_kernels_aot._runtime  # a submodule that op modules load lazily
import torch


def main() -> None:
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    q = torch.empty(1, 2048, device="cuda", dtype=torch.float8_e4m3fn)
    sf = torch.empty(1, 16, device="cuda")
    launch = tk._runtime.get_kernel("per_token_cast").select(in_dtype="bfloat16", hidden=2048, fmt="e4m3", npc=128,
                                                             round_sf=False, sf_layout="row_major")
    for _ in range(1000):
        launch(x, q, sf)
    torch.cuda.synchronize()
    print("raw stream getter:", hasattr(torch._C, "_cuda_getCurrentRawStream"),
          "device getter:", hasattr(torch._C, "_cuda_getDevice"))
    for name, fn in [
        ("launcher", lambda: launch(x, q, sf)),
        ("current_stream", lambda: tk._runtime._current_stream(0)),
        ("current_device", lambda: tk._runtime._current_device()),
        ("check_tensor", lambda: tk._runtime.check_tensor("x", x, torch.bfloat16, (None, 2048), None)),
        ("x.device", lambda: x.device),
        ("empty", lambda: torch.empty(1, 2048, device="cuda")),
    ]:
        start = time.perf_counter_ns()
        for _ in range(2000):
            fn()
        print(f"{name}: {(time.perf_counter_ns() - start) / 2000 / 1e3:.2f} us")
        torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(5000):
        launch(x, q, sf)
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
