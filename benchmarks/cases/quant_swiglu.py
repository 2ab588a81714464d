"""Benchmark rows of the fused SwiGLU + FP8 cast ops (kernel_specs/quant_swiglu.yaml).

Production shape: 8192 tokens, top-2 of 8 experts (16384 expanded rows plus alignment
padding), H = 7168; the per-channel form at T = 8192. Eager and compiled columns run the torch
references of tests/reference/quant_swiglu.py on the same inputs.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from bench import REPO, Inputs, Row, Timer, bench_case, reason

TOKENS, TOPK, HIDDEN = 8192, 2, 7168


def rows(timer: Timer, copy_gb_s: float, tk: Any) -> list[Row]:
    sys.path.insert(0, str(REPO))
    try:
        from tests.reference.quant import per_token_cast_ref
        from tests.reference.quant_swiglu import (
            expert_major_routing,
            swiglu_backward_ref,
            swiglu_forward_and_per_channel_cast_and_transpose_ref,
            swiglu_forward_and_per_token_cast_ref,
        )
        pos_to_expert, pos_to_token_topk, token_topk_to_pos = expert_major_routing(TOKENS, TOPK)
    except Exception as exc:  # the references are optional here: the row says they are missing
        return [Row("swiglu_* (quant_swiglu)", "-", None, None, None, None, None,
                    f"n/a: references not importable ({reason(exc)})")]
    quant = getattr(tk, "quant", None)
    forward = getattr(quant, "swiglu_forward_and_per_token_cast", None)
    backward = getattr(quant, "swiglu_backward_and_per_token_cast", None)
    per_channel = getattr(quant, "swiglu_forward_and_per_channel_cast_and_transpose", None)
    expanded = pos_to_expert.shape[0]
    weights = torch.rand(TOKENS, TOPK, device="cuda")
    out = []

    for npc in (128, HIDDEN):
        def make() -> Inputs:
            return (torch.randn(expanded, 2 * HIDDEN, device="cuda").bfloat16(),)

        out.append(bench_case(
            timer, copy_gb_s, f"swiglu_forward_and_per_token_cast npc={npc} clamp", f"({expanded}, {2 * HIDDEN}) bf16",
            make,
            (lambda x, n=npc: forward(x, "e4m3", n, pos_to_token_topk, weights, pos_to_expert, round_sf=True,
                                      swiglu_clamp_value=10.0)) if forward else None,
            lambda x, n=npc: swiglu_forward_and_per_token_cast_ref(x, n, pos_to_token_topk, weights, True, 10.0),
            "" if forward else "ours n/a: the wheel has no quant.swiglu_forward_and_per_token_cast"))

    def make_backward() -> Inputs:
        xq, x_sf = per_token_cast_ref(torch.randn(expanded, 2 * HIDDEN, device="cuda"), "e4m3", 128)
        return (xq, x_sf, torch.randn(expanded, HIDDEN, device="cuda").bfloat16())

    out.append(bench_case(
        timer, copy_gb_s, "swiglu_backward_and_per_token_cast npc=128", f"({expanded}, {2 * HIDDEN}) e4m3",
        make_backward,
        (lambda xq, x_sf, g: backward((xq, x_sf), g, weights, pos_to_token_topk, token_topk_to_pos, 128,
                                      round_sf=True)) if backward else None,
        lambda xq, x_sf, g: swiglu_backward_ref(xq, x_sf, g, weights, pos_to_token_topk, token_topk_to_pos, 128,
                                                True)[:4],
        "" if backward else "ours n/a: the wheel has no quant.swiglu_backward_and_per_token_cast"))

    for npt, without_transpose in ((128, False), (32, False), (128, True)):
        def make_x() -> Inputs:
            return (torch.randn(TOKENS, 2 * HIDDEN, device="cuda").bfloat16(),)

        label = "" if without_transpose else " transposed"
        out.append(bench_case(
            timer, copy_gb_s, f"swiglu_forward_and_per_channel_cast npt={npt}{label}", f"({TOKENS}, {2 * HIDDEN}) bf16",
            make_x,
            (lambda x, n=npt, t=without_transpose: per_channel(x, "e4m3", n, round_sf=True, without_transpose=t))
            if per_channel else None,
            lambda x, n=npt, t=without_transpose: swiglu_forward_and_per_channel_cast_and_transpose_ref(x, n, True, t),
            "" if per_channel else
            "ours n/a: the wheel has no quant.swiglu_forward_and_per_channel_cast_and_transpose"))
    return out
