"""Allocating calls with and without dispatch(), in one process (needs torch, a GPU and the installed wheel).

For each op: whether its second allocating call takes dispatch(), then the host time per call
with dispatch() (before and after) and with the op module's dispatch patched to decline (the op's
Python path: option checks, select, allocation, launcher). Two torch allocations of expand's
output size are the floor of what any allocating call costs.

    python benchmarks/dispatch_ab.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtime_overhead import host_us


def _declining(*args: object) -> None:
    return None


def ab(module: ModuleType, call: Callable[[], object]) -> tuple[bool, float, float, float]:
    """(second call hit, µs with dispatch(), µs on the Python path, µs with dispatch() again)."""
    real = vars(module)["dispatch"]
    hits: list[bool] = []

    def counted(*args: object) -> object:
        result = real(*args)
        hits.append(result is not None)
        return result

    setattr(module, "dispatch", counted)  # noqa: B010 - the op module's global, which its ops call
    call()
    call()
    setattr(module, "dispatch", real)  # noqa: B010
    with_dispatch = host_us(call)
    setattr(module, "dispatch", _declining)  # noqa: B010
    python_path = host_us(call)
    setattr(module, "dispatch", real)  # noqa: B010
    return hits[-1], with_dispatch, python_path, host_us(call)


def main() -> None:
    import tile_kernels_aot as tk

    moe, quant = tk.moe, tk.quant
    ids = torch.randperm(32, device="cuda")[:8].view(1, 8)
    n = (8 + 127 * 32 + 127) // 128 * 128
    mapping = moe.get_fused_mapping(ids, 32, n, 128)
    p2e, tk2p = mapping[0], mapping[3]
    xh = torch.randn(1, 7168, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    cases = {
        "moe.expand_to_fused H=7168": (moe.expand_to_fused, lambda: moe.expand_to_fused(xh, tk2p, p2e)),
        "per_token_cast e4m3/128": (quant.per_token_cast, lambda: quant.per_token_cast(x, "e4m3", 128)),
    }
    print("| op (allocating) | takes dispatch() | µs with dispatch() | µs Python path | µs with dispatch() again |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, (op, call) in cases.items():
        hit, a, b, c = ab(sys.modules[op.__module__], call)
        print(f"| {name} | {hit} | {a:.2f} | {b:.2f} | {c:.2f} |")
    empty = host_us(lambda: torch.empty(n, 7168, dtype=torch.bfloat16, device="cuda"))
    new_empty = host_us(lambda: xh.new_empty((n, 7168)))
    print(f"\ntorch.empty({n}, 7168) bf16: {empty:.2f} µs; x.new_empty: {new_empty:.2f} µs")


if __name__ == "__main__":
    main()
