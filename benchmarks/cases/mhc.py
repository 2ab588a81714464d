"""mHC at T = 8192, mhc_mult = 4, H = 7168: the pre-norm mixes (the split-K product of the 4 streams with the
24 x 28672 weight, plus the RMSNorm), the stream mix into the layer input, the post step, the fused inference
pre step, and the stream copy; against TileKernels' torch references (tests/reference/mhc*.py), eager and
torch.compile. Bytes: every input and output once. Target (issue 33): 90% of the byte-mix ceiling for the
memory-bound kernels; pre_norm_fn is also a GEMM (T x 28672 x 24: 11 GFLOP).

Then the backward kernels and the small mix kernels at the same T: the post backward (``fuse_grad_acc=False``: the
gradients returned, not added to buffers), the backward of the stream mix and of the stream copy (through autograd:
the row is a forward and a backward), Sinkhorn forward and backward (20 repeats), and the split and head mixes
(a few MB: latency-bound).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from bench import REPO, Row, Timer, bench_case, reason

T, M, H = 8192, 4, 7168
N = M * (M + 2)  # mixes per token
EPS = 1e-6


def rows(timer: Timer, copy_gb_s: float, tk: Any) -> list[Row]:
    sys.path.insert(0, str(REPO))
    try:
        from tests.reference.mhc import expand_to_mhc_ref
        from tests.reference.mhc_mix import pre_apply_mix_ref
        from tests.reference.mhc_norm import norm_fn_ref
        from tests.reference.mhc_post import post_ref
    except Exception as exc:
        return [Row("mhc", "-", None, None, None, None, None,
                    f"n/a: tests/reference/mhc*.py not importable ({reason(exc)})")]
    # TileKernels' functions live in modeling.mhc.ops (its mhc package holds the kernels, no public names): read
    # them there, so that bench.py --tilekernels times TileKernels' own through the same calls.
    ops = getattr(getattr(getattr(tk, "modeling", None), "mhc", None), "ops", None)

    def op(name: str) -> Any:
        return getattr(ops, name, None)

    def missing(name: str) -> str:
        return "" if op(name) else f"ours n/a: the wheel has no modeling.mhc.ops.{name}"

    streams = f"T={T} m={M} H={H} bf16"

    def residual() -> torch.Tensor:
        return torch.randn(T, M, H, device="cuda").bfloat16()

    def make_norm() -> tuple[torch.Tensor, ...]:
        return residual(), torch.randn(N, M * H, device="cuda") * 1e-2

    def make_apply() -> tuple[torch.Tensor, ...]:
        return residual(), torch.rand(T, M, 1, device="cuda")

    def make_post() -> tuple[torch.Tensor, ...]:
        # (1, T, ...): TileKernels' mhc_post_fwd takes (num_seqs, num_tokens, ...) only
        return (torch.randn(1, T, H, device="cuda").bfloat16(), residual()[None],
                torch.rand(1, T, M, 1, device="cuda"), torch.rand(1, T, M, M, device="cuda"))

    def make_fuse() -> tuple[torch.Tensor, ...]:
        return (residual(), torch.randn(N, M * H, device="cuda") * 1e-2, torch.rand(3, device="cuda"),
                torch.randn(N, device="cuda"))

    norm_fn, apply_mix, post, big_fuse, expand = (op(n) for n in (
        "mhc_pre_norm_fn", "mhc_pre_apply_mix", "mhc_post_fwd", "mhc_pre_big_fuse", "expand_to_mhc"))
    return [
        bench_case(timer, copy_gb_s, "mhc_pre_norm_fn", streams, make_norm,
                   (lambda r, f: norm_fn(r, f, None, EPS)) if norm_fn else None,
                   lambda r, f: norm_fn_ref(r, f, None, EPS), missing("mhc_pre_norm_fn")),
        bench_case(timer, copy_gb_s, "mhc_pre_apply_mix", streams, make_apply, apply_mix, pre_apply_mix_ref,
                   missing("mhc_pre_apply_mix")),
        bench_case(timer, copy_gb_s, "mhc_post_fwd", streams, make_post, post,
                   post_ref,
                   missing("mhc_post_fwd")),
        bench_case(timer, copy_gb_s, "mhc_pre_big_fuse", streams, make_fuse,
                   (lambda r, f, s, b: big_fuse(r, f, s, b, EPS, EPS, EPS, 2.0, 10)) if big_fuse else None, None,
                   missing("mhc_pre_big_fuse") or "eager n/a: the fused step has no single reference"),
        bench_case(timer, copy_gb_s, "expand_to_mhc", f"T={T} H={H} bf16 -> m={M}",
                   lambda: (torch.randn(T, H, device="cuda").bfloat16(),),
                   (lambda x: expand(x, M)) if expand else None, lambda x: expand_to_mhc_ref(x, M),
                   missing("expand_to_mhc")),
        *more_rows(timer, copy_gb_s, op, missing, streams, make_post, make_apply),
    ]


def _grads(fn: Any, inputs: tuple[torch.Tensor, ...], grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """fn's forward on leaves of ``inputs`` and the backward of ``grad`` through it: the inputs' gradients."""
    leaves = tuple(t.detach().requires_grad_() for t in inputs)
    return torch.autograd.grad(fn(*leaves), leaves, grad)


def more_rows(timer: Timer, copy_gb_s: float, op: Any, missing: Any, streams: str, make_post: Any,
              make_apply: Any) -> list[Row]:
    from tests.reference.mhc import expand_to_mhc_bwd_ref, sinkhorn_normalize_bwd_ref, sinkhorn_normalize_ref
    from tests.reference.mhc_mix import head_compute_mix_ref, pre_apply_mix_bwd_formula, pre_split_mixes_ref
    from tests.reference.mhc_post import post_bwd_formula

    post_bwd, apply_mix, expand, sinkhorn, split, head = (op(n) for n in (
        "mhc_post_bwd", "mhc_pre_apply_mix", "expand_to_mhc", "sinkhorn_normalize", "mhc_pre_split_mixes",
        "mhc_head_compute_mix"))
    repeat = 20

    def make_post_bwd() -> tuple[torch.Tensor, ...]:
        return (*make_post(), torch.randn(1, T, M, H, device="cuda").bfloat16())

    def make_apply_bwd() -> tuple[torch.Tensor, ...]:
        return (*make_apply(), torch.randn(T, H, device="cuda").bfloat16())

    def make_expand_bwd() -> tuple[torch.Tensor, ...]:
        return torch.randn(T, H, device="cuda").bfloat16(), torch.randn(T, M, H, device="cuda").bfloat16()

    def make_comb() -> tuple[torch.Tensor, ...]:
        return torch.randn(1, T, M, M, device="cuda"), torch.randn(1, T, M, M, device="cuda")

    def make_split() -> tuple[torch.Tensor, ...]:
        return torch.randn(1, T, N, device="cuda"), torch.randn(3, device="cuda"), torch.randn(N, device="cuda")

    def make_head() -> tuple[torch.Tensor, ...]:
        return torch.randn(1, T, M, device="cuda"), torch.randn(1, device="cuda"), torch.randn(M, device="cuda")

    mixes = f"T={T} m={M} fp32"
    return [
        bench_case(timer, copy_gb_s, "mhc_post_bwd", streams, make_post_bwd,
                   (lambda x, r, p, c, g: post_bwd(x, r, p, c, g, fuse_grad_acc=False)) if post_bwd else None,
                   post_bwd_formula, missing("mhc_post_bwd")),
        bench_case(timer, copy_gb_s, "mhc_pre_apply_mix fwd+bwd", streams, make_apply_bwd,
                   (lambda x, mix, g: _grads(apply_mix, (x, mix), g)) if apply_mix else None,
                   lambda x, mix, g: pre_apply_mix_bwd_formula(g, x, mix), missing("mhc_pre_apply_mix")),
        bench_case(timer, copy_gb_s, "expand_to_mhc fwd+bwd", f"T={T} H={H} bf16 -> m={M}", make_expand_bwd,
                   (lambda x, g: _grads(lambda t: expand(t, M), (x,), g)) if expand else None,
                   lambda x, g: expand_to_mhc_bwd_ref(g), missing("expand_to_mhc")),
        bench_case(timer, copy_gb_s, "sinkhorn_normalize", f"{mixes} repeat={repeat}", lambda: make_comb()[:1],
                   (lambda x: sinkhorn(x, repeat, EPS)) if sinkhorn else None,
                   lambda x: sinkhorn_normalize_ref(x, repeat, EPS), missing("sinkhorn_normalize")),
        bench_case(timer, copy_gb_s, "sinkhorn_normalize fwd+bwd", f"{mixes} repeat={repeat}", make_comb,
                   (lambda x, g: _grads(lambda t: sinkhorn(t, repeat, EPS), (x,), g)) if sinkhorn else None,
                   lambda x, g: sinkhorn_normalize_bwd_ref(g, x, repeat, EPS), missing("sinkhorn_normalize")),
        bench_case(timer, copy_gb_s, "mhc_pre_split_mixes", mixes, make_split,
                   (lambda x, s, b: split(x, s, b, M, 2.0, EPS)) if split else None,
                   lambda x, s, b: pre_split_mixes_ref(x, s, b, M, 2.0, EPS), missing("mhc_pre_split_mixes")),
        bench_case(timer, copy_gb_s, "mhc_head_compute_mix", mixes, make_head,
                   (lambda x, s, b: head(x, s, b, EPS)) if head else None,
                   lambda x, s, b: head_compute_mix_ref(x, s, b, EPS), missing("mhc_head_compute_mix")),
    ]
