"""Run one op at its benchmark shape a few times, for a profiler (ncu) to capture the last call.

    ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:NAME \
        python benchmarks/profile_kernel.py OP

OP is one of the keys of CASES; needs torch and the installed wheel only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

TOKENS, HIDDEN = 8192, 7168


def _cases() -> dict[str, Callable[[], Callable[[], object]]]:
    import tile_kernels_aot.moe as moe
    import tile_kernels_aot.quant as quant
    import tile_kernels_aot.transpose as transpose

    def cast(fmt: str, npc: int) -> Callable[[], object]:
        x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")
        return lambda: quant.per_token_cast(x, fmt, npc)

    def cast_back(fmt: str, npc: int, out: str = "bf16") -> Callable[[], object]:
        pair = quant.per_token_cast(torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda"), fmt, npc)
        return lambda: quant.per_token_cast_back(pair, out, npc)

    def lossless(block: tuple[int, int]) -> Callable[[], object]:
        pair = quant.per_token_cast(torch.randn(TOKENS, HIDDEN, device="cuda"), "e2m1", 32, round_sf=True)
        return lambda: quant.per_block_cast_lossless(pair, "e4m3", (1, 32), block)

    def swiglu_per_channel() -> Callable[[], object]:
        x = torch.randn(TOKENS, 2 * HIDDEN, dtype=torch.bfloat16, device="cuda")
        return lambda: quant.swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", 128, round_sf=True)

    def swiglu_per_token(npc: int) -> Callable[[], object]:
        # bench.py's quant_swiglu rows: T 8192, top-2 of 8 experts in expert-major order, clamp 10.
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.reference.quant_swiglu import expert_major_routing

        pos_to_expert, pos_to_token_topk, _ = expert_major_routing(TOKENS, 2)
        weights = torch.rand(TOKENS, 2, device="cuda")
        x = torch.randn(pos_to_expert.shape[0], 2 * HIDDEN, device="cuda").bfloat16()
        return lambda: quant.swiglu_forward_and_per_token_cast(x, "e4m3", npc, pos_to_token_topk, weights,
                                                               pos_to_expert, round_sf=True, swiglu_clamp_value=10.0)

    def block_cast(fmt: str, block: tuple[int, int]) -> Callable[[], object]:
        x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")
        return lambda: quant.per_block_cast(x, fmt, block)

    def channel_transpose(npt: int) -> Callable[[], object]:
        x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")
        return lambda: quant.per_channel_cast_and_transpose(x, "e4m3", npt)

    def transpose_e4m3() -> Callable[[], object]:
        x = torch.randn(8, 512, HIDDEN, device="cuda").to(torch.float8_e4m3fn)
        return lambda: transpose.batched_transpose(x)

    def fused_fp8_pair() -> Callable[[], object]:
        pair = quant.per_token_cast(torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda"), "e4m3", 128)
        return lambda: quant.per_channel_cast_fused(pair, "e4m3", 128, num_per_channels=128)

    def expand() -> Callable[[], object]:
        tokens, topk, experts = 16384, 8, 32
        ids = torch.stack([torch.randperm(experts, device="cuda")[:topk] for _ in range(tokens)])
        n = (tokens * topk + 127 * experts + 127) // 128 * 128
        mapping = moe.get_fused_mapping(ids, experts, n, 128)
        x = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16, device="cuda")
        return lambda: moe.expand_to_fused(x, mapping[3], mapping[0])

    def gates(kind: str) -> Callable[[], object]:
        # bench.py's moe_gate rows: T = 16384, E = 256, K = 8; top2_sum_gate sigmoid with groups 4 of 8.
        logits = torch.randn(16384, 256, device="cuda")
        if kind == "topk":
            return lambda: moe.topk_gate(logits, 8)
        bias = torch.randn(256, device="cuda") * 0.1
        return lambda: moe.top2_sum_gate(logits, bias, 8, 4, 8, False, 0, 2.5, 0, 1, 0, 1, "sigmoid")

    def mhc_post_bwd() -> Callable[[], object]:
        # bench.py's mhc_post_bwd row: T 8192, m 4, H 7168.
        from tile_kernels_aot.modeling.mhc.ops import mhc_post_bwd as post_bwd

        m = 4
        x, g = (torch.randn(1, TOKENS, *shape, device="cuda").bfloat16() for shape in ((HIDDEN,), (m, HIDDEN)))
        residual = torch.randn(1, TOKENS, m, HIDDEN, device="cuda").bfloat16()
        post, comb = torch.rand(1, TOKENS, m, 1, device="cuda"), torch.rand(1, TOKENS, m, m, device="cuda")
        return lambda: post_bwd(x, residual, post, comb, g, fuse_grad_acc=False)

    def engram_gate_bwd() -> Callable[[], object]:
        # bench.py's engram_gate_bwd row: T 8192, hc 4, H 7168, clamp 10.
        from tile_kernels_aot import engram

        hc = 4
        x, k, grad = (torch.randn(TOKENS, hc, HIDDEN, device="cuda").bfloat16() for _ in range(3))
        v, w = torch.randn(TOKENS, HIDDEN, device="cuda").bfloat16(), torch.randn(hc, HIDDEN, device="cuda")
        _, dot, gate, rstd_x, rstd_k = engram.engram_gate_fwd(x, k, v, w, 1e-6, 10.0)
        return lambda: engram.engram_gate_bwd(grad, x, k, v, w, dot, gate, rstd_x, rstd_k, 10.0)

    def sinkhorn_bwd(repeat: int) -> Callable[[], object]:
        from tile_kernels_aot.modeling.mhc.ops import sinkhorn_normalize

        comb = torch.randn(1, TOKENS, 4, 4, device="cuda").requires_grad_()
        grad = torch.randn(1, TOKENS, 4, 4, device="cuda")
        return lambda: torch.autograd.grad(sinkhorn_normalize(comb, repeat, 1e-6), comb, grad)

    return {
        "mhc_post_bwd": mhc_post_bwd,
        "engram_gate_bwd": engram_gate_bwd,
        "sinkhorn_bwd": lambda: sinkhorn_bwd(20),
        "per_block_cast_e4m3": lambda: block_cast("e4m3", (128, 128)),
        "per_block_cast_e2m1": lambda: block_cast("e2m1", (32, 32)),
        "batched_transpose_e4m3": transpose_e4m3,
        "per_channel_cast_and_transpose": lambda: channel_transpose(128),
        "per_channel_cast_fused_fp8": fused_fp8_pair,
        "expand_to_fused": expand,
        "per_block_cast_lossless_e": lambda: lossless((1, 128)),
        "per_block_cast_lossless_128x128": lambda: lossless((128, 128)),
        "topk_gate": lambda: gates("topk"),
        "top2_sum_gate": lambda: gates("top2_sum"),
        "swiglu_forward_and_per_channel_cast_and_transpose_e": swiglu_per_channel,
        "swiglu_forward_and_per_token_cast_e": lambda: swiglu_per_token(128),
        "per_token_cast_e4m3": lambda: cast("e4m3", 128),
        "per_token_cast_e2m1": lambda: cast("e2m1", 32),
        "per_token_cast_back_e4m3": lambda: cast_back("e4m3", 128),
        "per_token_cast_back_e2m1": lambda: cast_back("e2m1", 32),
        "per_token_cast_back_e4m3_fp32": lambda: cast_back("e4m3", 128, "fp32"),
        "per_token_cast_back_e2m1_fp32": lambda: cast_back("e2m1", 32, "fp32"),
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
