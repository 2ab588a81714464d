"""Run one op at its benchmark shape a few times, for a profiler (ncu) to capture the last call.

    ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:NAME \
        python benchmarks/profile_kernel.py OP

OP is one of the keys of CASES; needs torch and the installed wheel only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

TOKENS, HIDDEN = 8192, 7168


def _cases() -> dict[str, Callable[[], Callable[[], object]]]:
    import tile_kernels_aot.quant as quant

    def cast(fmt: str, npc: int) -> Callable[[], object]:
        x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")
        return lambda: quant.per_token_cast(x, fmt, npc)

    def cast_back(fmt: str, npc: int) -> Callable[[], object]:
        pair = quant.per_token_cast(torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda"), fmt, npc)
        return lambda: quant.per_token_cast_back(pair, "bf16", npc)

    def lossless() -> Callable[[], object]:
        pair = quant.per_token_cast(torch.randn(TOKENS, HIDDEN, device="cuda"), "e2m1", 32, round_sf=True)
        return lambda: quant.per_block_cast_lossless(pair, "e4m3", (1, 32), (1, 128))

    def swiglu_per_channel() -> Callable[[], object]:
        x = torch.randn(TOKENS, 2 * HIDDEN, dtype=torch.bfloat16, device="cuda")
        return lambda: quant.swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", 128, round_sf=True)

    return {
        "per_block_cast_lossless_e": lossless,
        "swiglu_forward_and_per_channel_cast_and_transpose_e": swiglu_per_channel,
        "per_token_cast_e4m3": lambda: cast("e4m3", 128),
        "per_token_cast_e2m1": lambda: cast("e2m1", 32),
        "per_token_cast_back_e4m3": lambda: cast_back("e4m3", 128),
        "per_token_cast_back_e2m1": lambda: cast_back("e2m1", 32),
    }


def main(argv: list[str]) -> int:
    cases = _cases()
    if len(argv) != 1 or argv[0] not in cases:
        print(f"usage: profile_kernel.py {{{','.join(cases)}}}", file=sys.stderr)
        return 2
    call = cases[argv[0]]()
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
