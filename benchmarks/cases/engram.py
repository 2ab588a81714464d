"""Engram: the fused gate forward (training and inference) and backward at T = 8192, hc_mult = 4,
H = 7168, against torch written from the same formulas (tests/reference/engram_gate.py for the
forward, the closed-form gradients below for the backward), eager and torch.compile. Bytes: every
input and output once (x, k, v, the fp32 fused weight, the statistics; the backward's partial weight
gradients, one row per block). Target (issue 32): 90% of the byte-mix ceiling.

Then the three small kernels at TileKernels' benchmark shapes (tests/reference/engram.py): the hash (T = 8192, 3-grams,
2 layers, 8 tables), the fused weight and the weight-gradient reduction (one partial row per SM, as the gate
backward leaves them; it accumulates in place and returns nothing, so its bytes are those read and its bits are not
compared with TileKernels').
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
    return result + small_rows(timer, copy_gb_s, engram)


def small_rows(timer: Timer, copy_gb_s: float, engram: Any) -> list[Row]:
    from tests.reference.engram import engram_hash_ref, fused_weight_ref, grad_w_reduce_torch_ref, make_offsets

    def op(name: str) -> Any:
        return getattr(engram, name, None)

    def missing(name: str) -> str:
        return "" if op(name) else f"ours n/a: the wheel has no engram.{name}"

    def make_hash() -> tuple[torch.Tensor, ...]:
        ids = torch.randint(0, 100000, (T, 3), dtype=torch.int32, device="cuda")
        multipliers = torch.randint(0, 100000, (2, 3), dtype=torch.int64, device="cuda")
        vocab = torch.randint(100000, 1000000, (2, 2, 8), dtype=torch.int32, device="cuda")
        return ids, multipliers, vocab, make_offsets(vocab)

    def make_weights() -> tuple[torch.Tensor, ...]:
        return tuple(torch.randn(HC, H, device="cuda").bfloat16() for _ in range(2))

    def make_reduce() -> tuple[torch.Tensor, ...]:
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        return (torch.randn(sms, HC, H, device="cuda"), *make_weights(), torch.randn(HC, H, device="cuda"),
                torch.randn(HC, H, device="cuda"))

    return [
        bench_case(timer, copy_gb_s, "engram_hash", f"T={T} n=3 layers=2 tables=8", make_hash, op("engram_hash"),
                   engram_hash_ref, missing("engram_hash")),
        bench_case(timer, copy_gb_s, "fused_weight", f"hc={HC} H={H} bf16", make_weights, op("fused_weight"),
                   fused_weight_ref, missing("fused_weight")),
        bench_case(timer, copy_gb_s, "grad_w_reduce", f"P=SMs hc={HC} H={H} fp32", make_reduce, op("grad_w_reduce"),
                   grad_w_reduce_torch_ref, missing("grad_w_reduce")),
    ]
