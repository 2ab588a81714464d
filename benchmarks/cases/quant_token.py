"""per_token_cast forms beyond bench.py's base rows, at T = 8192, H = 7168, bf16 input.

sf only and precomputed sf (the two forms share the cast's variant, chosen by a runtime mode),
one scale per row (npc = hidden), strided rows (x[:, :7168] of an (8192, 7680) tensor), and
per_token_cast_back with npc = hidden. Each row compares with the torch reference of
tests/reference/quant.py, eager and compiled.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from bench import Inputs, Row, Timer, bench_case, reason

TOKENS, HIDDEN = 8192, 7168


def rows(timer: Timer, copy_gb_s: float, tk: Any) -> list[Row]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    try:
        from tests.reference.quant import per_token_cast_ref, precomputed_sf_cast_ref
        from tests.reference.quant_cast_back import per_token_cast_back_ref
    except Exception as exc:  # the references are optional here: the row says they are missing
        return [Row("per_token_cast forms", "-", None, None, None, None, None,
                    f"n/a: references not importable ({reason(exc)})")]
    quant: Any = getattr(tk, "quant", None)
    sf_only = getattr(quant, "per_token_cast_with_sf_only", None)
    given = getattr(quant, "per_token_cast_with_precomputed_sf", None)
    missing = "" if given else "ours n/a: the wheel has no per_token_cast_with_precomputed_sf"
    shape = f"({TOKENS}, {HIDDEN}) bf16"

    def make() -> Inputs:
        return (torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda"),)

    def make_with_sf() -> Inputs:
        x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")
        return x, per_token_cast_ref(x, "e4m3", 128)[1]

    def make_strided() -> Inputs:
        return (torch.randn(TOKENS, HIDDEN + 512, dtype=torch.bfloat16, device="cuda")[:, :HIDDEN],)

    def make_row_pair() -> Inputs:
        return per_token_cast_ref(torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda"), "e4m3", HIDDEN)

    out = [
        bench_case(timer, copy_gb_s, "per_token_cast_with_sf_only e4m3 npc=128", shape, make,
                   (lambda x: sf_only(x, "e4m3", 128)) if sf_only else None,
                   lambda x: per_token_cast_ref(x, "e4m3", 128)[1], missing),
        bench_case(timer, copy_gb_s, "per_token_cast_with_precomputed_sf e4m3 npc=128", shape, make_with_sf,
                   (lambda x, sf: given(x, "e4m3", 128, sf)) if given else None,
                   lambda x, sf: precomputed_sf_cast_ref(x, "e4m3", 128, sf), missing),
    ]
    for fmt in ("e4m3", "e2m1"):
        out.append(bench_case(timer, copy_gb_s, f"per_token_cast {fmt} npc=H", shape, make,
                              (lambda x, f=fmt: quant.per_token_cast(x, f, HIDDEN)) if given else None,
                              lambda x, f=fmt: per_token_cast_ref(x, f, HIDDEN), missing))
    out.append(bench_case(timer, copy_gb_s, "per_token_cast e4m3 npc=128 strided rows", f"{shape}, row stride 7680",
                          make_strided, (lambda x: quant.per_token_cast(x, "e4m3", 128)) if given else None,
                          lambda x: per_token_cast_ref(x, "e4m3", 128), missing))
    out.append(bench_case(timer, copy_gb_s, "per_token_cast_back e4m3 npc=H -> bf16", f"({TOKENS}, {HIDDEN})",
                          make_row_pair, (lambda q, sf: quant.per_token_cast_back((q, sf), "bf16", HIDDEN))
                          if given else None,
                          lambda q, sf: per_token_cast_back_ref(q, sf, torch.bfloat16, HIDDEN), missing))
    return out
