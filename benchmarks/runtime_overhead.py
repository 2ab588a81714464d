"""Host overhead per call and cold start of the prebuilt ops (needs torch and the installed wheel).

Host overhead: the wall time from call to return of an op on tiny inputs (GPU time
negligible), median over many calls, next to torch eager's cost for one small op
(``torch.add(a, b, out=c)``), timed again right before each row so that host drift
during the run does not skew the ratios. torch's own allocating small ops
(``torch.add(a, b)``, ``torch.topk``) are rows too: the fair yardstick for ops that
allocate their outputs. Both the direct path and the ``torch.library`` custom-op
path (what ``torch.compile`` calls) are timed where the package registers one.

Cold start: in a fresh process, ``import tile_kernels_aot`` plus the first call
(cubin load included) minus ``import torch`` plus CUDA context creation.

    python benchmarks/runtime_overhead.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType

import torch

CALLS = 2000


def host_us(fn: Callable[[], object], calls: int = CALLS) -> float:
    """Median microseconds from call to return, in batches of 50 so clock reads cost nothing."""
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(calls // 50):
        start = time.perf_counter_ns()
        for _ in range(50):
            fn()
        samples.append((time.perf_counter_ns() - start) / 50 / 1e3)
        torch.cuda.synchronize()  # keep the launch queue short: measure the host, not back-pressure
    return statistics.median(samples)


def with_globals(launcher: Callable[..., None], swaps: dict[str, object], *args: object) -> Callable[[], None]:
    """A call of a generated launcher with some of its module's globals (``run``, ``check``, ``launch``) swapped;
    ``run`` only where the module has it (a package from before run())."""
    namespace = vars(sys.modules[launcher.__module__])
    swaps = {name: value for name, value in swaps.items() if name in namespace}

    def call() -> None:
        kept = {name: namespace[name] for name in swaps}
        namespace.update(swaps)
        try:
            launcher(*args)
        finally:
            namespace.update(kept)

    return call


def _runtime_of(launcher: Callable[..., None]) -> ModuleType:
    """The module holding the launch paths: ``_compiled`` since the runtime was split, ``_runtime`` before (so that
    one run can time an older wheel beside a newer one)."""
    package = launcher.__module__.split(".", 1)[0]
    return sys.modules.get(package + "._compiled") or sys.modules[package + "._runtime"]


def _no_run(*args: object) -> bool:
    return False


def through_ctypes(launcher: Callable[..., None], *args: object) -> Callable[[], None]:
    """A call of a generated launcher on the launch path of a package built without the compiled module."""
    return with_globals(launcher, {"run": _no_run, "launch": _runtime_of(launcher)._ctypes_launch}, *args)


def python_checks(launcher: Callable[..., None], *args: object) -> Callable[[], None]:
    """A call of a generated launcher with its tensors checked in Python (run() and the compiled check declining)."""
    return with_globals(launcher, {"run": _no_run, "check": _runtime_of(launcher)._no_check}, *args)


def without_run(launcher: Callable[..., None], *args: object) -> Callable[[], None]:
    """A call of a generated launcher that skips run(): the compiled check, then the launch from Python."""
    return with_globals(launcher, {"run": _no_run}, *args)


def ops() -> dict[str, Callable[[], object]]:
    """name -> a call of one op on tiny inputs (GPU time negligible, host time is what is left)."""
    import tile_kernels_aot as tk
    import tile_kernels_aot._runtime  # a submodule that op modules load lazily

    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    xt = torch.randn(1, 64, 64, device="cuda", dtype=torch.bfloat16)
    quant, transpose = tk.quant, tk.transpose
    out: dict[str, Callable[[], object]] = {}
    for fmt, npc in (("e4m3", 128), ("e2m1", 32)):
        out[f"per_token_cast {fmt}/{npc}"] = partial(quant.per_token_cast, x, fmt, npc)
    # Where the time goes: the launcher alone on preallocated outputs, and torch's two allocations.
    launch = tk._runtime.get_kernel("per_token_cast").select(in_dtype="bfloat16", hidden=2048, fmt="e4m3", npc=128,
                                                             round_sf=False, sf_layout="row_major")
    q = torch.empty(1, 2048, device="cuda", dtype=torch.float8_e4m3fn)
    sf = torch.empty(1, 16, device="cuda")
    out["per_token_cast launcher only"] = lambda: launch(x, q, sf, 0)  # mode 0: cast
    if getattr(tk._runtime, "NATIVE_RUN", False):
        out["per_token_cast launcher only, check and launch apart"] = without_run(launch, x, q, sf, 0)
    if tk._runtime.NATIVE_LAUNCH:
        out["per_token_cast launcher only, ctypes fallback"] = through_ctypes(launch, x, q, sf, 0)
    if getattr(tk._runtime, "NATIVE_CHECK", False):
        out["per_token_cast launcher only, Python checks"] = python_checks(launch, x, q, sf, 0)
    out["torch.empty x2 (the op's outputs)"] = lambda: (
        torch.empty(1, 2048, device="cuda", dtype=torch.float8_e4m3fn), torch.empty(1, 16, device="cuda"))
    # out=: the caller's tensors instead of two allocations (the op checks that they do not overlap x)
    out["per_token_cast e4m3/128 out="] = partial(quant.per_token_cast, x, "e4m3", 128, out=(q, sf))
    y = torch.empty(1, 2048, device="cuda", dtype=torch.bfloat16)
    out["per_token_cast_back e4m3/128 bf16"] = partial(quant.per_token_cast_back, (q, sf), "bf16", 128)
    out["per_token_cast_back e4m3/128 bf16 out="] = partial(quant.per_token_cast_back, (q, sf), "bf16", 128, out=y)
    block_out = (torch.empty(1, 2048, device="cuda", dtype=torch.float8_e4m3fn), torch.empty(1, 16, device="cuda"))
    out["per_block_cast e4m3 128x128"] = partial(quant.per_block_cast, x, "e4m3", (128, 128))
    out["per_block_cast e4m3 128x128 out="] = partial(quant.per_block_cast, x, "e4m3", (128, 128), out=block_out)
    # SwiGLU forward of one expanded row as a MoE layer runs it: H 7168, npc 128, its top-k weight and expert.
    xs = torch.randn(1, 2 * 7168, device="cuda", dtype=torch.bfloat16)
    # (distinct tensors: a call passing one tensor as two arguments keeps the Python path, as a
    # replay could not tell which argument each launcher argument came from)
    position, expert = (torch.zeros(1, device="cuda", dtype=torch.int32) for _ in range(2))
    swiglu_args = (xs, "e4m3", 128, position, torch.rand(1, 8, device="cuda"), expert)
    swiglu_out = (torch.empty(1, 7168, device="cuda", dtype=torch.float8_e4m3fn), torch.empty(1, 56, device="cuda"))
    out["swiglu_forward_and_per_token_cast H=7168"] = partial(quant.swiglu_forward_and_per_token_cast, *swiglu_args)
    out["swiglu_forward_and_per_token_cast H=7168 out="] = partial(quant.swiglu_forward_and_per_token_cast,
                                                                   *swiglu_args, out=swiglu_out)
    # per_channel_cast of one 128-token tile (its scale groups run down the tokens).
    xc = torch.randn(128, 2048, device="cuda", dtype=torch.bfloat16)
    channel_out = (torch.empty(128, 2048, device="cuda", dtype=torch.float8_e4m3fn),
                   torch.empty(1, 2048, device="cuda"))
    out["per_channel_cast e4m3 T=128"] = partial(quant.per_channel_cast, xc, "e4m3", 128)
    out["per_channel_cast e4m3 T=128 out="] = partial(quant.per_channel_cast, xc, "e4m3", 128, out=channel_out)
    yt = torch.empty_like(xt)
    out["batched_transpose bf16"] = lambda: transpose.batched_transpose(xt)
    out["batched_transpose bf16 out="] = lambda: transpose.batched_transpose(xt, out=yt)
    moe = getattr(tk, "moe", None)
    if moe is not None:
        # One token of the MoE chain (E = 256 global experts, K = 8, 32 local experts, H = 7168).
        scores = torch.rand(1, 256, device="cuda")
        ids = torch.randperm(32, device="cuda")[:8].view(1, 8)
        w = torch.rand(1, 8, device="cuda")
        n = (8 + 127 * 32 + 127) // 128 * 128
        mapping = moe.get_fused_mapping(ids, 32, n, 128)
        p2e, tk2p = mapping[0], mapping[3]
        xh = torch.randn(1, 7168, device="cuda", dtype=torch.bfloat16)
        xe = moe.expand_to_fused(xh, tk2p, p2e)
        idx, xe_out, xh_out = torch.empty(1, 8, device="cuda", dtype=torch.int64), torch.empty_like(xe), \
            torch.empty_like(xh)
        denominator, normalized = torch.empty(1, device="cuda"), torch.empty_like(w)
        out["moe.topk_gate E=256 K=8"] = lambda: moe.topk_gate(scores, 8)
        out["moe.topk_gate E=256 K=8 out="] = lambda: moe.topk_gate(scores, 8, out=idx)
        bias, gate_out = torch.zeros(256, device="cuda"), (torch.empty_like(idx), torch.empty(1, 8, device="cuda"))
        gate_args = (scores, bias, 8, 4, 8, False, 0, 2.5, 0, 1, 0, 1, "sigmoid")
        out["moe.top2_sum_gate E=256 K=8 groups 4/8"] = lambda: moe.top2_sum_gate(*gate_args)
        out["moe.top2_sum_gate E=256 K=8 groups 4/8 out="] = lambda: moe.top2_sum_gate(*gate_args, out=gate_out)
        out["moe.get_fused_mapping E=32 (no sync)"] = lambda: moe.get_fused_mapping(ids, 32, n, 128)
        out["moe.expand_to_fused H=7168"] = lambda: moe.expand_to_fused(xh, tk2p, p2e)
        out["moe.expand_to_fused H=7168 out="] = lambda: moe.expand_to_fused(xh, tk2p, p2e, out=xe_out)
        out["moe.reduce_fused H=7168"] = lambda: moe.reduce_fused(xe, w, tk2p)
        out["moe.reduce_fused H=7168 out="] = lambda: moe.reduce_fused(xe, w, tk2p, out=xh_out)
        out["moe.normalize_weight K=8"] = lambda: moe.normalize_weight(w)
        out["moe.normalize_weight K=8 out="] = lambda: moe.normalize_weight(w, out=(denominator, normalized))
    return out


def custom_op_calls() -> dict[str, Callable[[], object]]:
    """The torch ops (what torch.compile calls) of three ops, on the inputs of ``ops()``.

    A package on the op layer (``_op``) traces every op into ``torch.ops.<package>.<op>(tensors,
    template)``: the plan runs once here, as it does while tracing, and the op is then called with
    its tensors and template id. Older packages registered one custom op per op with its own schema.
    """
    import tile_kernels_aot as tk

    ops_ns = getattr(torch.ops, tk._build_info.PACKAGE)
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    xt = torch.randn(1, 64, 64, device="cuda", dtype=torch.bfloat16)
    scores = torch.rand(1, 256, device="cuda")
    moe = getattr(tk, "moe", None)
    if hasattr(tk.quant.per_token_cast, "op"):
        from tile_kernels_aot import _op

        def traced(fn: Callable[..., object], *args: object) -> Callable[[], object]:
            planned = fn.op.plan(*args)  # type: ignore[attr-defined]
            plans = [planned] if isinstance(planned, _op.Plan) else planned
            tensors = _op._tensors(plans)
            template = _op._template(plans, tensors)
            custom = getattr(ops_ns, fn.op.name)  # type: ignore[attr-defined]
            return lambda: custom(tensors, template)

        calls = {"per_token_cast e4m3/128": traced(tk.quant.per_token_cast, x, "e4m3", 128),
                 "batched_transpose bf16": traced(tk.transpose.batched_transpose, xt)}
        if moe is not None:
            calls["moe.topk_gate E=256 K=8"] = traced(moe.topk_gate, scores, 8)
        return calls
    tk.quant.per_token_cast, tk.transpose.batched_transpose  # noqa: B018  # load the modules: registers the ops
    calls = {
        "per_token_cast e4m3/128": lambda: ops_ns.per_token_cast(x, "e4m3", 128, False, "row_major", False),
        "batched_transpose bf16": lambda: ops_ns.batched_transpose(xt),
    }
    if moe is not None:
        moe.topk_gate  # noqa: B018
        calls["moe.topk_gate E=256 K=8"] = lambda: ops_ns.topk_gate(scores, 8)
    return calls


COLD = """
import time, torch
t0 = time.perf_counter()
torch.cuda.init(); x = torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16); torch.cuda.synchronize()
t1 = time.perf_counter()
{body}
torch.cuda.synchronize()
print(t1 - t0, time.perf_counter() - t1)
"""
# The package's part, and its import alone: the package and the launcher module of the op's kernel
# (where the catalog's size shows: one packed contract and plan per variant), without a GPU call.
IMPORT = "import tile_kernels_aot as tk, tile_kernels_aot._kernels.per_token_cast"
# ... and its largest op module (its checks, its torch ops), which the first call loads too.
IMPORT_OP = "tk.quant.per_token_cast"
CALL = "q, sf = tk.quant.per_token_cast(x, 'e4m3', 128)"


def cold_start(runs: int = 9) -> dict[str, float]:
    """Median ms over fresh processes: torch + context, and the package import + first call on top.

    The three kinds of process take turns, so that a host slowing down during the run (seen as a
    baseline that moved by milliseconds between runs) weighs on all of them alike.
    """
    bodies = {"baseline": "y = x * 2", "import": IMPORT, "import_op": f"{IMPORT}\n{IMPORT_OP}",
              "package": f"{IMPORT}\n{CALL}"}
    samples: dict[str, list[list[float]]] = {name: [] for name in bodies}
    for _ in range(runs):
        for name, body in bodies.items():
            proc = subprocess.run([sys.executable, "-c", COLD.format(body=body)], capture_output=True, text=True,
                                  check=True)
            samples[name].append([float(v) for v in proc.stdout.split()])
    result = {}
    for name in bodies:
        result[f"{name}_torch_ctx_ms"] = statistics.median(s[0] for s in samples[name]) * 1e3
        result[f"{name}_after_ctx_ms"] = statistics.median(s[1] for s in samples[name]) * 1e3
    # The goal's figure: what the package's import and first call add over torch's own first op. The import
    # alone makes no GPU call, so its time after the context is the import's own (not a difference).
    result["added_ms"] = result["package_after_ctx_ms"] - result["baseline_after_ctx_ms"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--cold-runs", type=int, default=9, help="fresh processes per kind for the cold start")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    a, b, c = (torch.randn(16, device="cuda") for _ in range(3))
    scores = torch.rand(1, 256, device="cuda")
    add_us = host_us(lambda: torch.add(a, b, out=c))
    rows = []
    custom = custom_op_calls()
    # Torch's own small ops that allocate their outputs, as our ops do: the yardstick for them.
    eager = {"torch.add(a, b) (eager, one output allocated)": lambda: torch.add(a, b),
             "torch.topk(scores, 8) (eager, two outputs allocated)": lambda: torch.topk(scores, 8)}
    calls = {**eager, **ops()}
    import tile_kernels_aot._runtime as runtime

    # The flag lives where the launch paths are: _compiled since the runtime was split, _runtime before.
    paths = sys.modules.get("tile_kernels_aot._compiled", runtime)
    exchange = getattr(paths, "NATIVE_EXCHANGE", False)
    for name, direct in calls.items():
        # torch.add(out=) timed right before each op: host speed drifts during a run, and the
        # ratio should compare the two under the same conditions.
        add_here = host_us(lambda: torch.add(a, b, out=c), calls=1000)
        d = host_us(direct)
        k = host_us(custom[name]) if name in custom else float("nan")
        rows.append({"op": name, "direct_us": d, "custom_op_us": k, "torch_add_us": add_here,
                     "direct_over_add": d / add_here})
    if exchange:
        # The same compiled paths reading tensors through torch._C._to_dlpack instead of torch's
        # DLPack C exchange API: what the exchange API saves, in the same run.
        runtime.use_exchange(False)
        try:
            for name in [n for n in calls if n.endswith("out=") or n.endswith("launcher only")]:
                add_here = host_us(lambda: torch.add(a, b, out=c), calls=1000)
                d = host_us(calls[name])
                rows.append({"op": f"{name}, _to_dlpack reads", "direct_us": d, "custom_op_us": float("nan"),
                             "torch_add_us": add_here, "direct_over_add": d / add_here})
        finally:
            runtime.use_exchange(True)
    cold = cold_start(args.cold_runs)

    native = runtime.NATIVE_LAUNCH
    (args.out / "runtime_overhead.json").write_text(json.dumps({"host": rows, "cold_start": cold,
                                                                "native_launch": native,
                                                                "dlpack_exchange": exchange}, indent=1))
    lines = [f"torch.add(a, b, out=c): {add_us:.2f} us per call at the start (and before each row, in its column); "
             f"compiled launch module: {native}; tensors read through torch's DLPack C exchange API: {exchange}", "",
             "| op | direct µs | custom-op µs | torch.add(out=) µs | direct / torch.add |",
             "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['op']} | {r['direct_us']:.2f} | {r['custom_op_us']:.2f} | {r['torch_add_us']:.2f} | "
              f"{r['direct_over_add']:.2f} |" for r in rows]
    lines += ["", f"cold start (median of {args.cold_runs} fresh processes each, taking turns): "
              + ", ".join(f"{k} {v:.1f}" for k, v in cold.items())]
    text = "\n".join(lines)
    (args.out / "runtime_overhead.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
