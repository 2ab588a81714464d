"""per_token_cast forms beyond bench.py's base rows, at T = 8192, H = 7168, bf16 input.

sf only and precomputed sf (the two forms share the cast's variant, chosen by a runtime mode),
one scale per row (npc = hidden), strided rows (x[:, :7168] of an (8192, 7680) tensor),
per_token_cast_back with npc = hidden, and the re-quantization of a quantized pair (one launch of
per_token_cast_requant where the wheel has it, else the cast back and the fp32 cast): FP8 1x128 ->
FP4 npc 32, and FP4 per 32x32 block -> FP8 npc 128, round_sf as in TileKernels' tests (with
--tilekernels, its JIT kernel on the same pairs). Each row compares with the torch reference of
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
        from tests.reference.quant_cast_back import per_token_cast_back_ref, requant_ref
        from tests.reference.quant_per_block import per_block_cast_ref
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
    out += requant_rows(timer, copy_gb_s, quant, requant_ref, per_token_cast_ref, per_block_cast_ref)
    return out


def requant_rows(timer: Timer, copy_gb_s: float, quant: Any, requant_ref: Any, per_token_cast_ref: Any,
                 per_block_cast_ref: Any) -> list[Row]:
    """per_token_cast of quantized pairs: (codes, scales, x_block_size, fmt, npc) as TileKernels takes them."""
    missing = "" if quant is not None else "ours n/a: the wheel has no quant module"
    rows = []
    for name, x_fmt, block, fmt, npc in (("e4m3 1x128 -> e2m1 npc=32", "e4m3", (1, 128), "e2m1", 32),
                                        ("e2m1 32x32 -> e4m3 npc=128", "e2m1", (32, 32), "e4m3", 128)):

        def make(x_fmt: str = x_fmt, block: tuple[int, int] = block) -> Inputs:
            x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")
            if block[0] == 1:
                return per_token_cast_ref(x, x_fmt, block[1], True)
            return per_block_cast_ref(x, x_fmt, block, True)

        def ours(q: torch.Tensor, sf: torch.Tensor, block: tuple[int, int] = block, fmt: str = fmt,
                 npc: int = npc) -> Any:
            return quant.per_token_cast((q, sf), fmt, npc, x_block_size=block, round_sf=True)

        def eager(q: torch.Tensor, sf: torch.Tensor, block: tuple[int, int] = block, fmt: str = fmt,
                  npc: int = npc) -> Any:
            return requant_ref((q, sf), block, fmt, npc, True)

        rows.append(bench_case(timer, copy_gb_s, f"per_token_cast re-quantization {name}", f"({TOKENS}, {HIDDEN})",
                               make, ours if quant is not None else None, eager, missing))
    return rows
