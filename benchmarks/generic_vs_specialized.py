"""A variant built for any hidden against the variants built per hidden, on the same GPU in one run
(per_token_cast, moe.expand_to_fused(_with_sf) / moe.reduce_fused, and the ``coverage`` section: the SwiGLU casts,
per_token_cast_back and topk_gate's variant for any E; the per-channel casts, timed there once, now have no
variants but those for any hidden).

Two wheels of tile_kernels_aot cannot share a process, so each is timed in its own, with the same
timer (benchmarks/bench.py: median kernel time over rotating inputs that defeat the L2 cache):

    python benchmarks/generic_vs_specialized.py time --site /tmp/new --generic --label generic --out generic.json
    python benchmarks/generic_vs_specialized.py time --site /tmp/new --label specialized --out specialized.json
    python benchmarks/generic_vs_specialized.py table specialized.json generic.json > generic.md

(``--generic`` makes the op skip the variants built for the case's hidden; a second wheel, such as
the one before a template change, can be timed the same way and compared with ``table``.)

``table`` prints one row per case: the times, their ratio (specialized / generic: above 1 the
generic variant is faster) and the kernel's bandwidth as a share of the card's copy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HIDDEN = (2048, 2560, 4096, 6144, 7168)  # the hidden sizes the specialized variants were built for
TOKENS = 8192
# (in_dtype, fmt, npc, flags): the per-token casts of the old grid, every layout it had.
CASES = [
    ("bfloat16", "e4m3", 128, {}), ("bfloat16", "e4m3", 32, {}), ("float32", "e4m3", 128, {}),
    ("bfloat16", "e2m1", 32, {}), ("bfloat16", "e2m1", 16, {}), ("float32", "e2m1", 32, {}),
    ("bfloat16", "e4m3", 128, {"use_tma_aligned_col_major_sf": True}),
    ("bfloat16", "e4m3", 128, {"use_tma_aligned_col_major_sf": True, "round_sf": True, "use_packed_ue8m0": True}),
    ("bfloat16", "e2m1", 32, {"use_tma_aligned_col_major_sf": True, "round_sf": True, "use_packed_ue8m0": True}),
]


# moe.expand_to_fused (bf16; fp8 with 1 x 128 scales) and moe.reduce_fused (bf16 weighted, fp8 pair) at the sizes
# their specialized variants are built for: T tokens routed to K of E experts (every pair local).
MOE_EXPAND_HIDDEN, MOE_REDUCE_HIDDEN = (2048, 2560, 4096, 7168), (2048, 4096, 7168)
MOE_TOPK, MOE_EXPERTS = 8, 32


def _moe_cases(moe: Any) -> list[tuple[str, Any, list[tuple[Any, ...]]]]:
    """(name, op, rotating inputs) per MoE case."""
    import torch
    from bench import rotating_inputs

    idx = torch.rand((TOKENS, MOE_EXPERTS), device="cuda").topk(MOE_TOPK, dim=1).indices
    p2e, _, _, tk2p, *_ = moe.get_fused_mapping(idx, MOE_EXPERTS, 0, 128)
    rows = int(p2e.shape[0])
    w = torch.rand((TOKENS, MOE_TOPK), device="cuda")
    cases: list[tuple[str, Any, list[tuple[Any, ...]]]] = []
    for hidden in MOE_EXPAND_HIDDEN:
        cases.append((f"moe.expand_to_fused bf16 H={hidden}", lambda x: moe.expand_to_fused(x, tk2p, p2e),
                      rotating_inputs(lambda h=hidden: (torch.randn(TOKENS, h, device="cuda").bfloat16(),))))
        cases.append((f"moe.expand_to_fused_with_sf e4m3 H={hidden}",
                       lambda x, sf: moe.expand_to_fused_with_sf((x, sf), 128, tk2p, p2e), rotating_inputs(
            lambda h=hidden: (torch.randn(TOKENS, h, device="cuda").to(torch.float8_e4m3fn),
                              torch.rand(TOKENS, h // 128, device="cuda")))))
    for hidden in MOE_REDUCE_HIDDEN:
        cases.append((f"moe.reduce_fused bf16 H={hidden}", lambda x: moe.reduce_fused(x, w, tk2p), rotating_inputs(
            lambda h=hidden: (torch.randn(rows, h, device="cuda").bfloat16(),))))
        cases.append((f"moe.reduce_fused e4m3 pair H={hidden}", lambda x, sf: moe.reduce_fused((x, sf), w, tk2p),
                      rotating_inputs(lambda h=hidden: (torch.randn(rows, h, device="cuda").to(torch.float8_e4m3fn),
                                                        torch.rand(rows, device="cuda")))))
    return cases


# (wheel module, position of hidden (or E) among the values its kernel's find() takes): --generic makes find()
# answer None for every nonzero one, so that the op takes its variant for any size.
COVERAGE_FINDS = {
    "quant._swiglu_forward_and_per_token_cast": 0, "quant._swiglu_backward_and_per_token_cast": 0,
    "quant._per_token_cast_back": 3, "moe._topk_gate": 0, "quant._per_block_cast": 1,
    "quant._per_block_cast_lossless": 0,
}


def _coverage_cases(quant: Any, moe: Any,
                    hidden_sizes: tuple[int, ...]) -> list[tuple[str, Any, list[tuple[Any, ...]]]]:
    """(name, op, rotating inputs) of the ops whose variants for any size the coverage work added, at the sizes
    their specialized variants are built for."""
    import torch
    from bench import rotating_inputs

    cases: list[tuple[str, Any, list[tuple[Any, ...]]]] = []
    # The backward's routing: one expanded row per token, weight 1 column.
    weight = torch.rand(TOKENS, 1, device="cuda")
    p2t = torch.arange(TOKENS, dtype=torch.int32, device="cuda")
    tk2p = p2t.view(TOKENS, 1)
    for hidden in hidden_sizes:
        for npc in (128, hidden):
            cases.append((f"swiglu_forward_and_per_token_cast npc={'H' if npc == hidden else npc} H={hidden}",
                          lambda x, n=npc: quant.swiglu_forward_and_per_token_cast(x, "e4m3", n, round_sf=True),
                          rotating_inputs(lambda h=hidden: (torch.randn(TOKENS, 2 * h, device="cuda").bfloat16(),))))

        def backward_inputs(h: int = hidden) -> tuple[Any, ...]:
            q, sf = quant.per_token_cast(torch.randn(TOKENS, 2 * h, device="cuda").bfloat16(), "e4m3", 128)
            return (q, sf, torch.randn(TOKENS, h, device="cuda").bfloat16())

        cases.append((f"swiglu_backward_and_per_token_cast npc=128 H={hidden}",
                      lambda q, sf, g: quant.swiglu_backward_and_per_token_cast((q, sf), g, weight, p2t, tk2p, 128),
                      rotating_inputs(backward_inputs)))
        for fmt, npc in (("e4m3", 128), ("e2m1", 32)):
            def codes(h: int = hidden, f: str = fmt, n: int = npc) -> tuple[Any, ...]:
                return quant.per_token_cast(torch.randn(TOKENS, h, device="cuda").bfloat16(), f, n)

            cases.append((f"per_token_cast_back {fmt} npc={npc} bf16 H={hidden}",
                          lambda q, sf, n=npc: quant.per_token_cast_back((q, sf), "bf16", n), rotating_inputs(codes)))
        # The other cast backs built per hidden: groups of 32 and 16, fp32 out, UE8M0 scales, one scale per row.
        for fmt, npc, out_dtype, flags in (("e4m3", 32, "bf16", {}), ("e2m1", 16, "bf16", {}),
                                           ("e4m3", 128, "fp32", {}),
                                           ("e4m3", 128, "bf16", {"use_tma_aligned_col_major_sf": True,
                                                                  "round_sf": True, "use_packed_ue8m0": True}),
                                           ("e4m3", hidden, "bf16", {})):
            def coded(h: int = hidden, f: str = fmt, n: int = npc, k: dict = flags) -> tuple[Any, ...]:
                return quant.per_token_cast(torch.randn(TOKENS, h, device="cuda").bfloat16(), f, n, **k)

            layout = " ue8m0" if flags else ""
            groups = "H" if npc == hidden else npc
            cases.append((f"per_token_cast_back {fmt} npc={groups}{layout} {out_dtype} H={hidden}",
                          lambda q, sf, n=npc, o=out_dtype: quant.per_token_cast_back((q, sf), o, n),
                          rotating_inputs(coded)))
        for fmt, block in (("e4m3", (128, 128)), ("e2m1", (32, 32))):
            cases.append((f"per_block_cast {fmt} {block[0]}x{block[1]} H={hidden}",
                          lambda x, f=fmt, b=block: quant.per_block_cast(x, f, b, round_sf=True),
                          rotating_inputs(lambda h=hidden: (torch.randn(TOKENS, h, device="cuda").bfloat16(),))))
        # The other e4m3 shapes and scale layouts built per hidden (whether the variant for any hidden can serve them).
        for block, flags in (((32, 32), {}), ((32, 128), {}), ((128, 32), {}), ((128, 128), {"round_sf": False}),
                             ((128, 128), {"use_tma_aligned_col_major_sf": True}),
                             ((128, 128), {"use_tma_aligned_col_major_sf": True, "use_packed_ue8m0": True}),
                             ((32, 32), {"use_tma_aligned_col_major_sf": True, "use_packed_ue8m0": True})):
            layout = "ue8m0" if flags.get("use_packed_ue8m0") else "col_major" if flags.get(
                "use_tma_aligned_col_major_sf") else "row_major"
            rounding = "" if flags.get("round_sf", True) else " exact sf"
            cases.append((f"per_block_cast e4m3 {block[0]}x{block[1]} {layout}{rounding} H={hidden}",
                          lambda x, b=block, k=flags: quant.per_block_cast(x, "e4m3", b, **{"round_sf": True, **k}),
                          rotating_inputs(lambda h=hidden: (torch.randn(TOKENS, h, device="cuda").bfloat16(),))))
        cases.append((f"per_block_cast_with_precomputed_sf e4m3 128x128 H={hidden}",
                      lambda x, sf: quant.per_block_cast_with_precomputed_sf(x, "e4m3", (128, 128), sf),
                      rotating_inputs(lambda h=hidden: (torch.randn(TOKENS, h, device="cuda").bfloat16(),
                                                        torch.rand(TOKENS // 128, h // 128, device="cuda") + 0.5))))

        def fp4_pair(h: int = hidden) -> tuple[Any, ...]:
            return quant.per_token_cast(torch.randn(TOKENS, h, device="cuda").bfloat16(), "e2m1", 32, round_sf=True)

        for block in ((1, 128), (128, 128)):
            cases.append((f"per_block_cast_lossless -> {block[0]}x{block[1]} H={hidden}",
                          lambda q, sf, b=block: quant.per_block_cast_lossless((q, sf), "e4m3", (1, 32), b),
                          rotating_inputs(fp4_pair)))
    for experts in (64, 72, 256):
        cases.append((f"moe.topk_gate E={experts} K=6", lambda s: moe.topk_gate(s, 6),
                      rotating_inputs(lambda e=experts: (torch.randn(4 * TOKENS, e, device="cuda"),))))
    return cases


def _bytes(inputs: tuple[Any, ...], result: Any) -> int:
    from bench import tensor_bytes

    return sum(tensor_bytes(t) for t in inputs) + tensor_bytes(result)


def _name(in_dtype: str, fmt: str, npc: int, flags: dict[str, bool], hidden: int) -> str:
    layout = "ue8m0" if flags.get("use_packed_ue8m0") else "col_major" if flags else "row_major"
    return f"per_token_cast {in_dtype} {fmt} npc={npc} {layout} H={hidden}"


def time_cases(label: str, out: Path, generic: bool, only: str = "all",
               hidden_sizes: tuple[int, ...] = HIDDEN) -> None:
    import importlib

    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    import tile_kernels_aot
    from bench import Settings, Timer, copy_bandwidth, rotating_inputs

    quant = tile_kernels_aot.quant
    def kernel_of(module: str) -> Any:
        """The op module's kernel, or None in a wheel built without that module (a reduced spec)."""
        try:
            return importlib.import_module(f"tile_kernels_aot.{module}")._kernel
        except ModuleNotFoundError:
            return None

    if generic:  # the op's dispatch without the variants built per hidden (grid key 1), for groups of channels
        if (kernel := kernel_of("quant._per_token_cast")) is not None:
            kernel.find = lambda *values, find=kernel.find: None if values[1] and values[3] else find(*values)
        for name in ("_expand", "_reduce"):  # the MoE ops: hidden is their first grid key
            if (moe_kernel := kernel_of(f"moe.{name}")) is not None:
                moe_kernel.find = lambda *values, find=moe_kernel.find: find(*values) if values[0] == 0 else None
        for module, position in COVERAGE_FINDS.items():
            if (kernel := kernel_of(module)) is not None:
                kernel.find = lambda *values, find=kernel.find, i=position: find(*values) if values[i] == 0 else None
    timer = Timer(Settings(reps=200, warmup=10))
    copy_gb_s = copy_bandwidth(timer)
    results = {"label": label, "gpu": torch.cuda.get_device_name(), "copy_gb_s": copy_gb_s, "cases": {}}
    for in_dtype, fmt, npc, flags in CASES if only in ("all", "quant") else ():
        for hidden in hidden_sizes:
            dtype = getattr(torch, in_dtype)
            inputs = rotating_inputs(lambda h=hidden, d=dtype: (torch.randn(TOKENS, h, device="cuda").to(d),))
            try:
                q, sf = quant.per_token_cast(inputs[0][0], fmt, npc, **flags)
            except tile_kernels_aot.errors.VariantNotFoundError as exc:  # a wheel of part of the catalog
                print(f"{label}: {_name(in_dtype, fmt, npc, flags, hidden)}: skipped ({exc})", flush=True)
                continue
            moved = inputs[0][0].nbytes + q.nbytes + sf.untyped_storage().nbytes()
            us = timer.median_us(lambda x, f=fmt, n=npc, k=flags: quant.per_token_cast(x, f, n, **k), inputs)
            results["cases"][_name(in_dtype, fmt, npc, flags, hidden)] = {"us": us, "bytes": moved}
            print(f"{label}: {_name(in_dtype, fmt, npc, flags, hidden)}: {us:.1f} us", flush=True)
    cases = _moe_cases(tile_kernels_aot.moe) if only in ("all", "moe") else []
    sections = {"blocks": "per_block_cast", "swiglu": "swiglu_"}  # parts of the coverage section by case name
    if only in ("all", "coverage", *sections):
        cases += [case for case in _coverage_cases(quant, tile_kernels_aot.moe, hidden_sizes)
                  if case[0].startswith(sections.get(only, ""))]
    for name, fn, inputs in cases:
        try:
            fn(*inputs[0])
        except tile_kernels_aot.errors.VariantNotFoundError as exc:
            print(f"{label}: {name}: skipped ({exc})", flush=True)
            continue
        us = timer.median_us(fn, inputs)
        results["cases"][name] = {"us": us, "bytes": _bytes(inputs[0], fn(*inputs[0]))}
        print(f"{label}: {name}: {us:.1f} us", flush=True)
    out.write_text(json.dumps(results, indent=1))


def table(specialized: Path, generic: Path) -> str:
    old, new = json.loads(specialized.read_text()), json.loads(generic.read_text())
    copy = new["copy_gb_s"]
    lines = [f"# {new['label']} vs {old['label']} variants ({new['gpu']}, T = {TOKENS}, copy {copy:.0f} GB/s)", "",
             f"| case | {old['label']} us | {new['label']} us | {old['label']} / {new['label']} | "
             f"{new['label']} % of copy |", "|---|---|---|---|---|"]
    ratios = []
    for name, case in new["cases"].items():
        before = old["cases"].get(name)
        if before is None:
            continue
        ratio = before["us"] / case["us"]
        ratios.append(ratio)
        share = 100 * case["bytes"] / (case["us"] * 1e-6) / (copy * 1e9)
        lines.append(f"| {name} | {before['us']:.1f} | {case['us']:.1f} | {ratio:.3f} | {share:.0f}% |")
    geomean = 1.0
    for r in ratios:
        geomean *= r ** (1 / len(ratios))
    lines += ["", f"{len(ratios)} cases: geometric mean {geomean:.3f}, worst {min(ratios):.3f}, best {max(ratios):.3f} "
              f"({old['label']} time / {new['label']} time)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("time", help="time the cases with the wheel installed under --site")
    t.add_argument("--site", type=Path, required=True)
    t.add_argument("--label", required=True)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--generic", action="store_true", help="time the variants for any hidden even where the "
                   "wheel has one built for the case's hidden")
    t.add_argument("--only", choices=("all", "quant", "moe", "coverage", "blocks", "swiglu"),
                   default="all", help="time the per-token casts, the MoE ops, the coverage section, or its "
                   "per-block casts or SwiGLU casts only")
    t.add_argument("--hidden", type=int, action="append", help="time these hidden sizes only (repeatable; "
                   f"default {', '.join(map(str, HIDDEN))}); cases the wheel has no variant for are skipped")
    t.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    m = sub.add_parser("table")
    m.add_argument("specialized", type=Path)
    m.add_argument("generic", type=Path)
    args = parser.parse_args()
    if args.command == "table":
        print(table(args.specialized, args.generic), end="")
        return 0
    if args.inner:
        time_cases(args.label, args.out, args.generic, args.only, tuple(args.hidden or HIDDEN))
        return 0
    env_path = str(args.site.resolve())
    return subprocess.run([sys.executable, __file__, "time", "--site", env_path, "--label", args.label,
                           "--out", str(args.out), "--inner", "--only", args.only,
                           *(["--generic"] if args.generic else []),
                           *(f"--hidden={h}" for h in args.hidden or ())],
                          env={**os.environ, "PYTHONPATH": env_path}).returncode


if __name__ == "__main__":
    sys.exit(main())
