"""E5M6: per_token_cast_e5m6 (bf16 and fp32 in) and cast_back_e5m6 (bf16 and fp32 out) at
T = 8192, H = 7168, against the plain-torch references of tests/reference/quant_e5m6.py (eager
and torch.compile). Bytes: x read + 1.5 H codes and one scale per token written (cast), and
the reverse (cast back). Target: 80% of copy bandwidth.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from bench import REPO, Row, Timer, bench_case, reason

T, H = 8192, 7168


def rows(timer: Timer, copy_gb_s: float, tk: Any) -> list[Row]:
    sys.path.insert(0, str(REPO))
    try:
        from tests.reference.quant_e5m6 import cast_back_e5m6_ref, per_token_cast_e5m6_ref
    except Exception as exc:  # the reference is optional here: the row says it is missing
        return [Row("per_token_cast_e5m6 / cast_back_e5m6", "-", None, None, None, None, None,
                    f"n/a: tests/reference/quant_e5m6.py not importable ({reason(exc)})")]
    quant = getattr(tk, "quant", None)
    cast = getattr(quant, "per_token_cast_e5m6", None)
    back = getattr(quant, "cast_back_e5m6", None)
    result = []
    for dtype, label in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):

        def make(dtype: torch.dtype = dtype) -> tuple[torch.Tensor]:
            return (torch.randn(T, H, device="cuda").to(dtype),)

        result.append(bench_case(
            timer, copy_gb_s, f"per_token_cast_e5m6 {label}", f"({T}, {H}) {label}", make,
            cast, per_token_cast_e5m6_ref, "" if cast else "ours n/a: the wheel has no quant.per_token_cast_e5m6"))

    def make_pair() -> tuple[torch.Tensor, torch.Tensor]:
        return per_token_cast_e5m6_ref(torch.randn(T, H, device="cuda"))

    for dtype, label in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        result.append(bench_case(
            timer, copy_gb_s, f"cast_back_e5m6 -> {label}", f"({T}, {H})", make_pair,
            (lambda q, sf, f=label: back((q, sf), f)) if back else None,
            lambda q, sf, d=dtype: cast_back_e5m6_ref(q, sf, d),
            "" if back else "ours n/a: the wheel has no quant.cast_back_e5m6"))
    return result
