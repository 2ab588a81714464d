"""Python overhead per call of the hot op modules, on the CPU, with no build and no GPU.

The op modules (ops/<family>/<op>.py) are imported into the stub package of the CPU op
tests (tests/op_stub.py), whose launchers record the launch instead of running it, and called
on tiny CPU tensors. What is timed is the op module's own Python (argument checks, variant
selection, output allocation) plus the stub's select and launch, which stand in for the real
ones (a dictionary lookup, and the launcher that the lead measures apart). The stub's dispatch()
always declines, so an out= call here times the op's Python path plus its remember() of the
signature: what the first out= call of a signature costs, where the compiled dispatch() takes
the later ones (benchmarks/runtime_overhead.py measures those on the GPU). The numbers compare
versions of the op modules on one machine; the H200 host's absolute times differ.

    PYTHONPATH=. python benchmarks/op_overhead_cpu.py [--calls N] [--rounds R] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from tests.op_stub import stub_package

CALLS = 10000
BATCH = 200
ROUNDS = 5


def host_us(fn: Callable[[], object], runtimes: list[Any], calls: int) -> float:
    """Median microseconds per call over batches of BATCH calls; the stubs' launch logs are emptied
    between batches so that they do not grow (and are not timed)."""
    for _ in range(BATCH):
        fn()
    samples = []
    for _ in range(max(1, calls // BATCH)):
        for runtime in runtimes:
            runtime.LAUNCHES.clear()
            runtime.REMEMBERED.clear()
            runtime.DISPATCHED.clear()
        start = time.perf_counter_ns()
        for _ in range(BATCH):
            fn()
        samples.append((time.perf_counter_ns() - start) / BATCH / 1e3)
    for runtime in runtimes:
        runtime.LAUNCHES.clear()
        runtime.REMEMBERED.clear()
        runtime.DISPATCHED.clear()
    return statistics.median(samples)


@contextmanager
def stubbed_ops(root: Path) -> Iterator[tuple[dict[str, ModuleType], list[Any]]]:
    """(op modules by family/stem, the stub runtimes) of three stub packages, one per family."""
    families = {
        "quant": ("per_token_cast", "per_token_cast_back", "per_block_cast", "per_channel_cast",
                  "per_channel_cast_and_transpose", "swiglu_forward_and_per_token_cast",
                  "swiglu_forward_and_per_channel_cast_and_transpose", "swiglu_backward_and_per_token_cast"),
        "transpose": ("batched_transpose",),
        "moe": ("topk_gate", "top2_sum_gate", "normalize_weight", "expand", "reduce", "fused_mapping"),
    }
    with ExitStack() as stack:
        modules: dict[str, ModuleType] = {}
        runtimes = []
        for family, ops in families.items():
            found, runtime = stack.enter_context(stub_package(root / family, f"overhead_{family}", family, ops))
            modules.update({f"{family}/{op}": module for op, module in found.items()})
            runtimes.append(runtime)
        yield modules, runtimes


def calls(m: dict[str, ModuleType]) -> dict[str, Callable[[], object]]:
    """name -> one call of an op on tiny inputs (the shapes of benchmarks/runtime_overhead.py)."""
    cast, back = m["quant/per_token_cast"], m["quant/per_token_cast_back"]
    # The stub kernel has no grid keys; the shipped spec builds every scale layout.
    cast._HAS_LAYOUTS = True  # type: ignore[attr-defined]
    moe_gate, moe_top2, moe_norm = m["moe/topk_gate"], m["moe/top2_sum_gate"], m["moe/normalize_weight"]
    moe_expand, moe_reduce, moe_map = m["moe/expand"], m["moe/reduce"], m["moe/fused_mapping"]
    x = torch.randn(1, 7168).bfloat16()
    q, sf = torch.zeros(1, 7168, dtype=torch.float8_e4m3fn), torch.ones(1, 56)
    xt = torch.randn(1, 64, 64).bfloat16()
    scores, bias = torch.rand(1, 256), torch.zeros(256)
    ids = torch.randperm(32)[:8].view(1, 8)
    w = torch.rand(1, 8)
    n = 8 * 128
    # The fused buffers are kept small (16 rows, H = 256): a CPU allocation of megabytes costs
    # more than the whole op's Python, where the GPU caching allocator's costs a few microseconds.
    xh = torch.randn(1, 256).bfloat16()
    pos = torch.arange(8, dtype=torch.int32).view(1, 8) * 2
    p2e = torch.full((16,), -1, dtype=torch.int32)
    xe = torch.zeros(16, 256, dtype=torch.bfloat16)
    xq = (torch.zeros(1, 256, dtype=torch.float8_e4m3fn), torch.ones(1, 2))
    # What out= writes into: each op's own result, kept (the caller's reused buffers).
    cast_out = cast.per_token_cast(x, "e4m3", 128)
    back_out = back.per_token_cast_back((q, sf), "bf16", 128)
    top2_args = (scores, bias, 8, 4, 8, False, 0, 2.5, 0, 1, 0, 1, "sigmoid")
    top2_out = moe_top2.top2_sum_gate(*top2_args)
    # The mapped form: one shared expert, each of the 257 logical experts on 2 physical ones (ep_rank 1 of 2).
    top2_mapped = (scores, bias, 8, 4, 8, True, 1, 2.5, 1, 2, 0, 1, "sigmoid", None, None,
                   torch.zeros(257, 2, dtype=torch.int32), torch.ones(257, dtype=torch.int32))
    top2_mapped_out = moe_top2.top2_sum_gate(*top2_mapped)
    expand_out = moe_expand.expand_to_fused(xh, pos, p2e)
    topk_out = moe_gate.topk_gate(scores, 8)
    normalize_out = moe_norm.normalize_weight(w)
    transpose_y = m["transpose/batched_transpose"].batched_transpose(xt)
    reduce_out = moe_reduce.reduce_fused(xe, w, pos)
    xeq, one = (torch.zeros(16, 256, dtype=torch.float8_e4m3fn), torch.ones(16)), torch.ones(1)
    reduce_fp8_out = moe_reduce.reduce_fused(xeq, w, pos, "e4m3", one)
    block, channel, transpose = m["quant/per_block_cast"], m["quant/per_channel_cast"], \
        m["quant/per_channel_cast_and_transpose"]
    swiglu_fwd = m["quant/swiglu_forward_and_per_token_cast"]
    swiglu_channel = m["quant/swiglu_forward_and_per_channel_cast_and_transpose"]
    swiglu_bwd = m["quant/swiglu_backward_and_per_token_cast"]
    block_out = block.per_block_cast(x, "e4m3", (128, 128))
    # The per-channel casts need 128 tokens: a narrow hidden keeps their CPU allocations small.
    xc = torch.randn(128, 256).bfloat16()
    channel_out = channel.per_channel_cast(xc, "e4m3", 128)
    transpose_out = transpose.per_channel_cast_and_transpose(xc, "e4m3", 128)
    fused_args = (xq, "e4m3", 128, False, 128, p2e)  # an FP8 pair gathered into 16 rows
    fused_out = channel.per_channel_cast_fused(*fused_args)
    xs = torch.randn(1, 2 * 7168).bfloat16()
    p2t, p2x = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    fwd_args = (xs, "e4m3", 128, p2t, w, p2x)
    fwd_out = swiglu_fwd.swiglu_forward_and_per_token_cast(*fwd_args)
    swiglu_channel_out = swiglu_channel.swiglu_forward_and_per_channel_cast_and_transpose(xc, "e4m3", 128)
    bwd_args = ((torch.zeros(1, 2 * 7168, dtype=torch.float8_e4m3fn), torch.ones(1, 112)),
                torch.zeros(1, 7168).bfloat16(), w, p2t, torch.zeros(1, 8, dtype=torch.int32), 128)
    bwd_out = swiglu_bwd.swiglu_backward_and_per_token_cast(*bwd_args)
    return {
        "quant.per_token_cast e4m3/128": lambda: cast.per_token_cast(x, "e4m3", 128),
        "quant.per_token_cast e4m3/128 out=": lambda: cast.per_token_cast(x, "e4m3", 128, out=cast_out),
        "quant.per_token_cast e2m1/32 col_major": lambda: cast.per_token_cast(
            x, "e2m1", 32, use_tma_aligned_col_major_sf=True),
        "quant.per_token_cast_with_sf_only e4m3/128": lambda: cast.per_token_cast_with_sf_only(x, "e4m3", 128),
        "quant.per_token_cast_with_precomputed_sf e4m3/128": lambda: cast.per_token_cast_with_precomputed_sf(
            x, "e4m3", 128, sf),
        "quant.per_token_cast_back e4m3/128 bf16": lambda: back.per_token_cast_back((q, sf), "bf16", 128),
        "quant.per_token_cast_back e4m3/128 bf16 out=": lambda: back.per_token_cast_back((q, sf), "bf16", 128,
                                                                                          out=back_out),
        "quant.per_block_cast e4m3/128x128": lambda: block.per_block_cast(x, "e4m3", (128, 128)),
        "quant.per_block_cast e4m3/128x128 out=": lambda: block.per_block_cast(x, "e4m3", (128, 128),
                                                                              out=block_out),
        "quant.per_block_cast_with_precomputed_sf e4m3/128x128": lambda: block.per_block_cast_with_precomputed_sf(
            x, "e4m3", (128, 128), block_out[1]),
        "quant.per_block_cast_with_precomputed_sf e4m3/128x128 out=": lambda: (
            block.per_block_cast_with_precomputed_sf(x, "e4m3", (128, 128), block_out[1], out=block_out[0])),
        "quant.per_channel_cast T=128 H=256": lambda: channel.per_channel_cast(xc, "e4m3", 128),
        "quant.per_channel_cast T=128 H=256 out=": lambda: channel.per_channel_cast(xc, "e4m3", 128,
                                                                                    out=channel_out),
        "quant.per_channel_cast_and_transpose T=128 H=256": lambda: transpose.per_channel_cast_and_transpose(
            xc, "e4m3", 128),
        "quant.per_channel_cast_and_transpose T=128 H=256 out=": lambda: transpose.per_channel_cast_and_transpose(
            xc, "e4m3", 128, out=transpose_out),
        "quant.per_channel_cast_fused fp8 pair gather": lambda: channel.per_channel_cast_fused(*fused_args),
        "quant.per_channel_cast_fused fp8 pair gather out=": lambda: channel.per_channel_cast_fused(
            *fused_args, out=fused_out),
        "quant.swiglu_forward_and_per_token_cast weighted": lambda: swiglu_fwd.swiglu_forward_and_per_token_cast(
            *fwd_args),
        "quant.swiglu_forward_and_per_token_cast weighted out=": lambda: (
            swiglu_fwd.swiglu_forward_and_per_token_cast(*fwd_args, out=fwd_out)),
        "quant.swiglu_forward_and_per_channel_cast_and_transpose T=128": lambda: (
            swiglu_channel.swiglu_forward_and_per_channel_cast_and_transpose(xc, "e4m3", 128)),
        "quant.swiglu_forward_and_per_channel_cast_and_transpose T=128 out=": lambda: (
            swiglu_channel.swiglu_forward_and_per_channel_cast_and_transpose(xc, "e4m3", 128,
                                                                             out=swiglu_channel_out)),
        "quant.swiglu_backward_and_per_token_cast": lambda: swiglu_bwd.swiglu_backward_and_per_token_cast(
            *bwd_args),
        "quant.swiglu_backward_and_per_token_cast out=": lambda: swiglu_bwd.swiglu_backward_and_per_token_cast(
            *bwd_args, out=bwd_out),
        "transpose.batched_transpose bf16": lambda: m["transpose/batched_transpose"].batched_transpose(xt),
        "transpose.batched_transpose bf16 out=": lambda: m["transpose/batched_transpose"].batched_transpose(
            xt, out=transpose_y),
        "moe.topk_gate E=256 K=8": lambda: moe_gate.topk_gate(scores, 8),
        "moe.topk_gate E=256 K=8 out=": lambda: moe_gate.topk_gate(scores, 8, out=topk_out),
        "moe.top2_sum_gate E=256 K=8 8/4 groups": lambda: moe_top2.top2_sum_gate(*top2_args),
        "moe.top2_sum_gate E=256 K=8 8/4 groups out=": lambda: moe_top2.top2_sum_gate(*top2_args, out=top2_out),
        "moe.top2_sum_gate E=256 K=8 mapped": lambda: moe_top2.top2_sum_gate(*top2_mapped),
        "moe.top2_sum_gate E=256 K=8 mapped out=": lambda: moe_top2.top2_sum_gate(*top2_mapped, out=top2_mapped_out),
        "moe.normalize_weight K=8": lambda: moe_norm.normalize_weight(w),
        "moe.normalize_weight K=8 out=": lambda: moe_norm.normalize_weight(w, out=normalize_out),
        "moe.expand_to_fused H=256": lambda: moe_expand.expand_to_fused(xh, pos, p2e),
        "moe.expand_to_fused H=256 out=": lambda: moe_expand.expand_to_fused(xh, pos, p2e, out=expand_out),
        "moe.expand_to_fused_with_sf H=256": lambda: moe_expand.expand_to_fused_with_sf(xq, 128, pos, p2e),
        "moe.reduce_fused H=256": lambda: moe_reduce.reduce_fused(xe, w, pos),
        "moe.reduce_fused H=256 out=": lambda: moe_reduce.reduce_fused(xe, w, pos, out=reduce_out),
        "moe.reduce_fused H=256 unweighted": lambda: moe_reduce.reduce_fused(xe, None, pos),
        "moe.reduce_fused H=256 unweighted out=": lambda: moe_reduce.reduce_fused(xe, None, pos, out=reduce_out),
        "moe.reduce_fused H=256 fp8 pair e4m3": lambda: moe_reduce.reduce_fused(xeq, w, pos, "e4m3", one),
        "moe.reduce_fused H=256 fp8 pair e4m3 out=": lambda: moe_reduce.reduce_fused(xeq, w, pos, "e4m3", one,
                                                                                   out=reduce_fp8_out),
        "moe.get_fused_mapping E=32 (no sync)": lambda: moe_map.get_fused_mapping(ids, 32, n, 128),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=CALLS, help="timed calls per op")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds over all ops; the best is reported")
    parser.add_argument("--json", type=Path, help="also write {op: microseconds} here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp, stubbed_ops(Path(tmp)) as (modules, runtimes):
        ops = calls(modules)
        # The best of several rounds over all ops: a shared CPU's noise only ever adds time.
        rounds = [{name: host_us(fn, runtimes, args.calls) for name, fn in ops.items()} for _ in range(args.rounds)]
        results = {name: min(r[name] for r in rounds) for name in ops}
    width = max(map(len, results))
    for name, us in results.items():
        print(f"{name:<{width}}  {us:7.2f} us")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
