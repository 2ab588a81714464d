"""Engram: the fused gate forward (training and inference) and backward at T = 8192, hc_mult = 4,
H = 7168, against torch written from the same formulas (tests/reference/engram_gate.py for the
forward, the closed-form gradients below for the backward), eager and torch.compile. Bytes: every
input and output once (x, k, v, the fp32 fused weight, the statistics; the backward's partial weight
gradients, one row per block). Target (issue 32): 90% of the byte-mix ceiling.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from bench import REPO, Row, Timer, bench_case, reason

T, HC, H = 8192, 4, 7168
EPS, CLAMP = 1e-20, 1e-6


def gate_bwd_torch(go, x, k, v, w, dot, gate, rstd_x, rstd_k, clamp_value):  # type: ignore[no-untyped-def]
    """The backward in torch, term for term as kernels/engram/gate_bwd.py.j2 states it."""
    xf, kf, gof = x.float(), k.float(), go.float()
    s = rstd_x * rstd_k * H**-0.5
    dldg = (gof * v.float().unsqueeze(1)).sum(-1)
    coef = torch.where(dot.abs() * s < clamp_value, 0.0, dldg * gate * (1 - gate) * 0.5 * (s / dot.abs()).sqrt())
    c = coef.unsqueeze(-1)
    grad_x = gof + c * (kf * w - xf * (dot * rstd_x * rstd_x / H).unsqueeze(-1))
    grad_k = c * (xf * w - kf * (dot * rstd_k * rstd_k / H).unsqueeze(-1))
    grad_v = (gate.unsqueeze(-1) * gof).sum(1)
    grad_w = (c * xf * kf).sum(0)
    return grad_x.bfloat16(), grad_k.bfloat16(), grad_v.bfloat16(), grad_w


def rows(timer: Timer, copy_gb_s: float, tk: Any) -> list[Row]:
    sys.path.insert(0, str(REPO))
    try:
        from tests.reference.engram_gate import engram_gate_ref
    except Exception as exc:
        return [Row("engram", "-", None, None, None, None, None,
                    f"n/a: tests/reference/engram_gate.py not importable ({reason(exc)})")]
    engram = getattr(tk, "engram", None)
    fwd = getattr(engram, "engram_gate_fwd", None)
    bwd = getattr(engram, "engram_gate_bwd", None)
    shape = f"T={T} hc={HC} H={H} bf16"

    def make() -> tuple[torch.Tensor, ...]:
        x, k = (torch.randn(T, HC, H, device="cuda").bfloat16() for _ in range(2))
        return x, k, torch.randn(T, H, device="cuda").bfloat16(), torch.randn(HC, H, device="cuda")

    def ref(x, k, v, w, save=True):  # type: ignore[no-untyped-def]
        out = engram_gate_ref(x, k, v, w, torch.ones_like(w), CLAMP, EPS)
        return out if save else out[0]

    result = [
        bench_case(timer, copy_gb_s, "engram_gate_fwd save", shape, make,
                   (lambda x, k, v, w: fwd(x, k, v, w, EPS, CLAMP)) if fwd else None, ref,
                   "" if fwd else "ours n/a: the wheel has no engram.engram_gate_fwd"),
        bench_case(timer, copy_gb_s, "engram_gate_fwd inference", shape, make,
                   (lambda x, k, v, w: fwd(x, k, v, w, EPS, CLAMP, save_for_backward=False)[0]) if fwd else None,
                   lambda x, k, v, w: ref(x, k, v, w, save=False),
                   "" if fwd else "ours n/a: the wheel has no engram.engram_gate_fwd"),
    ]

    def make_bwd() -> tuple[Any, ...]:
        x, k, v, w = make()
        _, dot, gate, rstd_x, rstd_k = ref(x, k, v, w)
        return torch.randn(T, HC, H, device="cuda").bfloat16(), x, k, v, w, dot, gate, rstd_x, rstd_k

    result.append(bench_case(
        timer, copy_gb_s, "engram_gate_bwd", shape, make_bwd,
        (lambda *a: bwd(*a, CLAMP)) if bwd else None, lambda *a: gate_bwd_torch(*a, CLAMP),
        "" if bwd else "ours n/a: the wheel has no engram.engram_gate_bwd"))
    return result
