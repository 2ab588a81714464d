"""Benchmark rows of the per-channel casts and the lossless re-cast (kernel_specs/quant_per_channel.yaml).

Production shape: T = 8192 tokens, H = 7168. The gather row reads 8192 + 1024 rows through a
pos_to_token with about 1 in 8 entries -1 (padding). Eager and compiled columns run the torch
references of tests/reference/quant_per_channel.py on the same inputs.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from bench import REPO, Inputs, Row, Timer, bench_case, reason

TOKENS, HIDDEN = 8192, 7168


def rows(timer: Timer, copy_gb_s: float, tk: Any) -> list[Row]:
    sys.path.insert(0, str(REPO))
    try:
        from tests.reference.quant import per_token_cast_ref
        from tests.reference.quant_per_channel import (
            per_block_cast_lossless_ref,
            per_channel_cast_and_transpose_ref,
            per_channel_cast_ref,
        )
    except Exception as exc:  # the references are optional here: the row says they are missing
        return [Row("per_channel_cast* / per_block_cast_lossless", "-", None, None, None, None, None,
                    f"n/a: references not importable ({reason(exc)})")]
    quant = getattr(tk, "quant", None)

    def ours(name: str) -> Any:
        return getattr(quant, name, None)

    def missing(name: str) -> str:
        return "" if ours(name) else f"ours n/a: the wheel has no quant.{name}"

    def make_bf16() -> Inputs:
        return (torch.randn(TOKENS, HIDDEN, device="cuda").bfloat16(),)

    out = []
    cast = ours("per_channel_cast")
    for round_sf in (False, True):
        out.append(bench_case(
            timer, copy_gb_s, f"per_channel_cast npt=128{' round_sf' if round_sf else ''}",
            f"({TOKENS}, {HIDDEN}) bf16", make_bf16,
            (lambda x, r=round_sf: cast(x, "e4m3", 128, round_sf=r)) if cast else None,
            lambda x, r=round_sf: per_channel_cast_ref(x, r), missing("per_channel_cast")))

    fused = ours("per_channel_cast_fused")
    num_out = TOKENS + 1024
    pos = torch.randint(0, TOKENS, (num_out,), dtype=torch.int32, device="cuda")
    pos[torch.rand(num_out, device="cuda") < 0.125] = -1
    out.append(bench_case(
        timer, copy_gb_s, "per_channel_cast_fused gather", f"({TOKENS}, {HIDDEN}) bf16 -> {num_out} rows", make_bf16,
        (lambda x: fused(x, "e4m3", 128, pos_to_token=pos)) if fused else None,
        lambda x: per_channel_cast_ref(x, pos_to_token=pos), missing("per_channel_cast_fused")))

    def make_pair() -> Inputs:
        return per_token_cast_ref(torch.randn(TOKENS, HIDDEN, device="cuda"), "e4m3", 128)

    out.append(bench_case(
        timer, copy_gb_s, "per_channel_cast_fused fp8 pair", f"({TOKENS}, {HIDDEN}) e4m3 + 1x128 sf", make_pair,
        (lambda q, sf: fused((q, sf), "e4m3", 128, num_per_channels=128)) if fused else None,
        lambda q, sf: per_channel_cast_ref(q, x_sf=sf), missing("per_channel_cast_fused")))

    transpose = ours("per_channel_cast_and_transpose")
    for npt in (128, 32):
        out.append(bench_case(
            timer, copy_gb_s, f"per_channel_cast_and_transpose npt={npt}", f"({TOKENS}, {HIDDEN}) bf16", make_bf16,
            (lambda x, n=npt: transpose(x, "e4m3", n)) if transpose else None,
            lambda x, n=npt: per_channel_cast_and_transpose_ref(x, n), missing("per_channel_cast_and_transpose")))

    lossless = ours("per_block_cast_lossless")

    def make_fp4() -> Inputs:
        return per_token_cast_ref(torch.randn(TOKENS, HIDDEN, device="cuda"), "e2m1", 32, True)

    for block in ((1, 128), (128, 128)):
        out.append(bench_case(
            timer, copy_gb_s, f"per_block_cast_lossless -> {block[0]}x{block[1]}",
            f"({TOKENS}, {HIDDEN}) e2m1 + 1x32 sf", make_fp4,
            (lambda x, sf, b=block: lossless((x, sf), "e4m3", (1, 32), b)) if lossless else None,
            lambda x, sf, b=block: per_block_cast_lossless_ref(x, sf, b), missing("per_block_cast_lossless")))
    return out
