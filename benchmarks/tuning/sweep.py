"""Time every variant of a tuning package against its kernel's shipped setting, at production shapes.

Needs only torch and the wheel of one tuning package (no TileLang): a spec under benchmarks/tuning whose grid adds
knobs (template arguments the shipped specs leave at their defaults) to a kernel's shipped grid, built with
``tkc build --arch sm90 --specs benchmarks/tuning/<spec> --dist <dir>``, and registered in ``SWEEPS`` with the
knobs' shipped values. ``example.yaml`` (package ``tkc_tuning_example``) is the one kept as a pattern; finished sweeps
leave the repository once their winner ships (git keeps them). Run from the repository root so that
``benchmarks/bench.py`` (the timer), ``benchmarks/cases`` and ``tests/reference`` (the plain-torch references) are
importable:

    python benchmarks/tuning/sweep.py --out "$OUT"      # on the GPU machine, the default package
    python benchmarks/tuning/sweep.py --dry-run         # anywhere: variants, baselines

A *problem* is a kernel's non-knob grid values (per_block_cast e4m3 128 x 128, say); its
*baseline* is the variant whose knobs equal the sweep's baseline for that kernel and problem
(``SWEEPS``): the settings shipped before the sweep. Per problem, every
variant runs once on a check input (for the casts: random rows over a wide range of magnitudes
plus zeros, -0.0, exact e2m1 ties, a NaN and an Inf) and must match the baseline's outputs byte
for byte; the baseline itself is compared with the plain-torch reference of tests/reference on
finite random inputs. Then each variant is timed as benchmarks/bench.py times the ops (CUDA
events, warm-up, median of ``--reps`` calls, inputs rotated over more than three times the L2
size), with a 1 GiB device-to-device copy measured in the same run as the ceiling; GB/s counts
the bytes bench.py counts for the same op (inputs read + outputs written).

Writes OUT/sweep.json and OUT/sweep.md (sorted by time within each problem) and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
TOKENS, HIDDEN = 8192, 7168  # the production shape of the casts
TRANSPOSE_SHAPE = (8, 512, 7168)  # (B, M, N), as in benchmarks/bench.py
DEVICE = "cuda"  # tests run the CPU pieces with "cpu" and small shapes

Inputs = tuple[Any, ...]
Params = tuple[tuple[str, Any], ...]  # (grid key, value) pairs in grid order


@dataclass(frozen=True)
class Sweep:
    """One tuning package: its spec and, per kernel, the knobs and their pre-sweep values."""

    package: str
    spec: str  # under benchmarks/tuning
    baselines: Mapping[str, Mapping[str, Any]]  # kernel -> knob -> shipped value
    # (kernel, grid key, value, knobs): problems with that grid value shipped other knob values; a tuple of keys
    # and a tuple of values match problems with all of them
    overrides: tuple[tuple[str, Any, Any, Mapping[str, Any]], ...] = ()

    def knob_names(self, kernel: str) -> frozenset[str]:
        if kernel not in self.baselines:
            raise SystemExit(f"{self.package}: sweep.py has no baseline for kernel {kernel!r}; add it to SWEEPS")
        return frozenset(self.baselines[kernel])

    def baseline(self, kernel: str, problem: Mapping[str, Any]) -> dict[str, Any]:
        knobs = dict(self.baselines[kernel])
        for name, key, value, changed in self.overrides:
            keys, values = (key, value) if isinstance(key, tuple) else ((key,), (value,))
            if name == kernel and all(problem.get(k) == v for k, v in zip(keys, values, strict=True)):
                knobs.update(changed)
        return knobs


# package -> its sweep. A new sweep: a spec beside example.yaml and an entry with its knobs' shipped values.
SWEEPS = {
    # cast_back_e5m6 -> fp32 at H 4096 / 6144 / 7168: 1024-column pieces of two rows a block (shipped), pieces of
    # one or four rows, or a block per row.
    "tkc_tuning_example": Sweep("tkc_tuning_example", "example.yaml",
                                {"cast_back_e5m6": {"row_pieces": 4, "piece_rows": 2}},
                                overrides=(("cast_back_e5m6", "hidden", 6144, {"row_pieces": 6}),
                                           ("cast_back_e5m6", "hidden", 7168, {"row_pieces": 7}))),
}
DEFAULT_PACKAGE = "tkc_tuning_example"


@dataclass(frozen=True)
class Variant:
    kernel: str
    name: str  # the generated launcher's name (it carries the variant id)
    problem: Params  # non-knob grid values, in grid order
    knobs: Params
    launch: Callable[..., None] = field(compare=False, repr=False)
    baseline: Params = ()  # the knob values shipped before the sweep for this problem

    @property
    def is_baseline(self) -> bool:
        return dict(self.knobs) == dict(self.baseline)

    def describe_knobs(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.knobs)


def split(sweep: Sweep, kernel: str, name: str, params: Params, launch: Callable[..., None]) -> Variant:
    """One variant with its grid values split into problem and knobs, and its problem's baseline."""
    knob_names = sweep.knob_names(kernel)
    problem = tuple((k, v) for k, v in params if k not in knob_names)
    base = sweep.baseline(kernel, dict(problem))
    return Variant(kernel=kernel, name=name, problem=problem, knobs=tuple((k, v) for k, v in params if k in knob_names),
                   launch=launch, baseline=tuple((k, base[k]) for k, _ in params if k in knob_names))


def variants(package: Any, sweep: Sweep) -> list[Variant]:
    """Every built variant of the package, split into problem values and knob values."""
    runtime = importlib.import_module(f"{package.__name__}._runtime")
    info = importlib.import_module(f"{package.__name__}._build_info")
    out = []
    for name in info.KERNELS:
        kernel = runtime.get_kernel(name)
        for key, launch in kernel.variants.items():
            out.append(split(sweep, name, launch.__name__, tuple(zip(kernel.keys, key, strict=True)), launch))
    return out


def problems(found: list[Variant]) -> dict[tuple[str, Params], list[Variant]]:
    """Variants grouped by (kernel, problem); raises if a problem lacks its baseline."""
    groups: dict[tuple[str, Params], list[Variant]] = {}
    for v in found:
        groups.setdefault((v.kernel, v.problem), []).append(v)
    for (kernel, problem), group in groups.items():
        if sum(v.is_baseline for v in group) != 1:
            raise SystemExit(f"{kernel} {dict(problem)}: expected exactly one variant with the baseline knobs "
                             f"{dict(group[0].baseline)}; add it to the sweep's spec in benchmarks/tuning")
    return groups


# ---- inputs, outputs and references per kernel ------------------------------------------------


def check_matrix(tokens: int, hidden: int) -> torch.Tensor:
    """bf16 (tokens, hidden): random rows scaled over 2^-30 .. 2^30, plus the values casts get wrong.

    Row 0 is zeros, row 1 is -0.0, row 2 holds k / 4 for k = 0..24 (with 6 in every 32 channels,
    so per-token e2m1 scales are 1 and every e2m1 tie is hit exactly), row 3 has a NaN, row 4 an Inf.
    """
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(tokens, hidden, device=DEVICE, generator=gen)
    x *= torch.exp2(torch.randint(-30, 31, (tokens, 1), device=DEVICE, generator=gen).float())
    x[0] = 0.0
    x[1] = -0.0
    x[2] = (torch.arange(hidden, device=DEVICE) % 25).float() * 0.25 * torch.where(
        torch.arange(hidden, device=DEVICE) % 2 == 0, 1.0, -1.0)
    x[3, hidden // 3] = float("nan")
    x[4, hidden // 2] = float("inf")
    return x.to(torch.bfloat16)


def random_matrix(tokens: int, hidden: int) -> torch.Tensor:
    return torch.randn(tokens, hidden, device=DEVICE, dtype=torch.bfloat16)


def input_dtype(problem: dict[str, Any]) -> torch.dtype:
    """x's dtype for a cast problem: its in_dtype, bf16 where it has none (fp32 rows are the bf16 matrices widened)."""
    return getattr(torch, problem.get("in_dtype", "bfloat16"))


def cast_outputs(kernel: str, problem: dict[str, Any], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, hidden = x.shape
    if problem["fmt"] == "e4m3":
        q = torch.empty(tokens, hidden, device=DEVICE, dtype=torch.float8_e4m3fn)
    else:
        q = torch.empty(tokens, hidden // 2, device=DEVICE, dtype=torch.int8)
    if kernel == "per_block_cast":
        sf_shape = (-(-tokens // problem["block_m"]), hidden // problem["block_k"])
    else:
        sf_shape = (tokens, hidden // problem["npc"])
    return q, torch.empty(sf_shape, device=DEVICE, dtype=torch.float32)


@dataclass(frozen=True)
class Case:
    """How to run one problem on a tuple of input tensors.

    make(inputs) gives the launch arguments (outputs allocated); outputs(args) picks the output
    tensors; reference(inputs) is the plain-torch result; counted(args) the tensors whose bytes
    benchmarks/bench.py counts for the op (inputs read + outputs written; by default all).
    """

    make: Callable[[Inputs], Inputs]
    new_x: Callable[[], Inputs]
    check_x: Callable[[], Inputs]
    outputs: Callable[[Inputs], tuple[torch.Tensor, ...]]
    reference: Callable[[Inputs], tuple[torch.Tensor, ...]] | None
    counted: Callable[[Inputs], Inputs] = lambda args: args
    # outputs vs reference; byte equality unless the reference rounds differently (gate weights)
    matches: Callable[[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]], bool] = \
        lambda out, ref: same_bytes(out, ref)
    # The outputs every variant must share with the baseline byte for byte. A case whose knobs may
    # change an order of summation (a row sum split another way) leaves those outputs out: each
    # variant is then also checked against the reference with `matches`.
    order_free: Callable[[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]] | None = None


def _reference(module: str, name: str) -> Callable[..., Any] | None:
    """A plain-torch reference from tests/reference, or None where it does not import."""
    if str(REPO) not in sys.path:  # the references import each other as tests.reference.*
        sys.path.insert(0, str(REPO))
    try:
        return getattr(importlib.import_module(f"tests.reference.{module}"), name)
    except Exception as exc:  # optional: the table then says the reference was not checked
        print(f"no reference {module}.{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def _benchmark_case(name: str) -> Any:
    """benchmarks/cases/<name>.py (it imports benchmarks/bench.py), for the shapes bench.py uses."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    return importlib.import_module(f"cases.{name}")


def case(kernel: str, problem: dict[str, Any]) -> Case:
    if kernel == "per_token_cast" and problem["npc"] == 0:
        return per_token_row_case(problem)
    first = first_sweep_case(kernel, problem)
    if first is not None:
        return first
    if kernel == "per_token_cast_back":
        return cast_back_case(problem)
    if kernel == "cast_back_e5m6":
        return e5m6_cast_back_case(problem)
    if kernel in ("per_channel_cast_fused", "per_channel_cast_and_transpose"):
        return per_channel_case(kernel, problem)
    if kernel == "moe_expand":
        return expand_case(problem)
    if kernel == "swiglu_forward_and_per_token_cast":
        return swiglu_case(problem)
    if kernel == "top2_sum_gate" and problem["physical_map"]:
        return mapped_gate_case(problem)
    if kernel in ("topk_gate", "top2_sum_gate"):
        return gate_case(kernel, problem)
    if kernel == "per_block_cast_lossless":
        return lossless_case(problem)
    if kernel == "swiglu_forward_and_per_channel_cast_and_transpose":
        return swiglu_per_channel_case(problem)
    if kernel == "swiglu_backward_and_per_token_cast":
        return swiglu_backward_case(problem)
    if kernel == "normalize_weight":
        return normalize_case(problem)
    if kernel == "mhc_post_bwd":
        return post_bwd_case(problem)
    if kernel == "mhc_expand":
        return mhc_expand_case(problem)
    if kernel == "engram_gate_fwd":
        return engram_gate_fwd_case(problem)
    if kernel == "engram_gate_bwd":
        return engram_gate_bwd_case(problem)
    if kernel in ("mhc_pre_split_mixes_fwd", "mhc_head_compute_mix_fwd"):
        return mix_case(kernel, problem)
    raise SystemExit(f"sweep.py does not know kernel {kernel!r}; add a case for it")


def _on_first(reference: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]) -> Callable[[Inputs], Any]:
    """A reference of one tensor, called on the first of the inputs."""
    return lambda x: reference(x[0])


def first_sweep_case(kernel: str, problem: dict[str, Any]) -> Case | None:
    if kernel == "per_block_cast":
        ref = _reference("quant_per_block", "per_block_cast_ref")
        block = (problem["block_m"], problem["block_k"])
        return Case(
            make=lambda x: (x[0], *cast_outputs(kernel, problem, x[0])),
            new_x=lambda: (random_matrix(TOKENS, HIDDEN),),
            # 37 rows past a multiple of 128 and of 32: the last row tile is partial (sweep 33's full_tiles)
            check_x=lambda: (check_matrix(TOKENS + 37, HIDDEN),),
            outputs=lambda args: args[1:3],
            reference=_on_first(functools.partial(ref, fmt=problem["fmt"], block_size=block,
                                                  round_sf=problem["round_sf"])) if ref else None,
        )
    if kernel == "per_token_cast":
        assert problem["sf_layout"] == "row_major" and problem["npc"] != 0, problem
        ref = _reference("quant", "per_token_cast_ref")
        dtype = input_dtype(problem)
        return Case(
            make=lambda x: (x[0], *cast_outputs(kernel, problem, x[0]), 0),  # mode 0: cast (q and sf)
            new_x=lambda: (random_matrix(TOKENS, HIDDEN).to(dtype),),
            check_x=lambda: (check_matrix(TOKENS + 37, HIDDEN).to(dtype),),  # a partial last row tile
            outputs=lambda args: args[1:3],
            reference=_on_first(functools.partial(ref, fmt=problem["fmt"], npc=problem["npc"],
                                                  round_sf=problem["round_sf"])) if ref else None,
        )
    if kernel == "batched_transpose":
        dtype = getattr(torch, problem["dtype"])

        def new_x() -> Inputs:
            return (torch.randn(TRANSPOSE_SHAPE, device=DEVICE).to(dtype),)

        return Case(
            make=lambda x: (x[0], torch.empty(x[0].shape[0], x[0].shape[2], x[0].shape[1], device=DEVICE,
                                              dtype=x[0].dtype)),
            new_x=new_x, check_x=new_x,
            outputs=lambda args: args[1:2],
            reference=lambda x: (x[0].transpose(-1, -2).contiguous(),),
        )
    return None


# ---- the casts, the transpose and the MoE routing; shapes and byte counts as in benchmarks/bench.py --------


def cast_back_case(problem: dict[str, Any]) -> Case:
    """(q, sf) from per_token_cast_ref, as bench.py makes them; out bf16 or fp32 (T, H)."""
    assert problem["sf_layout"] == "row_major", problem
    cast = _reference("quant", "per_token_cast_ref")
    ref = _reference("quant_cast_back", "per_token_cast_back_ref")
    fmt_, npc = problem["fmt"], problem["npc"] or HIDDEN  # npc 0: one scale per row
    out_dtype = getattr(torch, problem["out_dtype"])
    if cast is None:
        raise SystemExit("per_token_cast_back needs tests/reference/quant.py to make its (q, sf) inputs")
    return Case(
        make=lambda x: (x[0], x[1], torch.empty(x[0].shape[0], HIDDEN, device=DEVICE, dtype=out_dtype)),
        new_x=lambda: tuple(cast(random_matrix(TOKENS, HIDDEN), fmt_, npc, False)),
        check_x=lambda: tuple(cast(check_matrix(TOKENS + 37, HIDDEN), fmt_, npc, False)),  # a partial last tile
        outputs=lambda args: args[2:3],
        reference=(lambda x: (ref(x[0], x[1], out_dtype, npc),)) if ref else None,
    )


def e5m6_cast_back_case(problem: dict[str, Any]) -> Case:
    """(q, sf) from per_token_cast_e5m6_ref, as bench.py makes them, seen as the kernel takes them: q's bytes as
    int32 words (T, 3 H / 8), sf as (T,); out bf16 or fp32 (T, H)."""
    cast = _reference("quant_e5m6", "per_token_cast_e5m6_ref")
    ref = _reference("quant_e5m6", "cast_back_e5m6_ref")
    hidden = problem["hidden"]
    out_dtype = getattr(torch, problem["out_dtype"])
    if cast is None:
        raise SystemExit("cast_back_e5m6 needs tests/reference/quant_e5m6.py to make its (q, sf) inputs")

    def pair(x: torch.Tensor) -> Inputs:
        q, sf = cast(x)
        return q.view(torch.int32), sf.reshape(-1)

    return Case(
        make=lambda x: (x[0], x[1], torch.empty(x[0].shape[0], hidden, device=DEVICE, dtype=out_dtype)),
        new_x=lambda: pair(random_matrix(TOKENS, hidden)),
        check_x=lambda: pair(check_matrix(TOKENS + 37, hidden)),
        outputs=lambda args: args[2:3],
        reference=(lambda x: (ref(x[0].view(torch.uint8), x[1], out_dtype),)) if ref else None,
    )


def gather_positions(num_tokens: int) -> torch.Tensor:
    """pos_to_token of bench.py's gather row: num_tokens + 1024 rows, about 1 in 8 of them -1."""
    num_out = num_tokens + 1024
    pos = torch.randint(0, num_tokens, (num_out,), dtype=torch.int32, device=DEVICE)
    pos[torch.rand(num_out, device=DEVICE) < 0.125] = -1
    return pos


def per_channel_case(kernel: str, problem: dict[str, Any]) -> Case:
    """per_channel_cast(_fused) of bf16 rows, gathered rows or an e4m3 (q, 1 x 128 sf) pair; or the
    transposed cast. bench.py counts x (or the pair) and q, sf, not pos_to_token."""
    assert not problem["round_sf"], problem
    cast = _reference("quant", "per_token_cast_ref")
    if kernel == "per_channel_cast_and_transpose":
        ref_t = _reference("quant_per_channel", "per_channel_cast_and_transpose_ref")
        npt = problem["npt"]
        return Case(
            make=lambda x: (x[0], torch.empty(HIDDEN, TOKENS, device=DEVICE, dtype=torch.float8_e4m3fn),
                            torch.empty(TOKENS // npt, HIDDEN, device=DEVICE, dtype=torch.float32)),
            new_x=lambda: (random_matrix(TOKENS, HIDDEN),),
            check_x=lambda: (check_matrix(TOKENS, HIDDEN),),
            outputs=lambda args: args[1:3],
            reference=(lambda x: ref_t(x[0], npt)) if ref_t else None,
        )
    ref = _reference("quant_per_channel", "per_channel_cast_ref")
    pair = problem["in_dtype"] == "float8_e4m3fn"
    expand = problem["expand"]
    if pair and cast is None:
        raise SystemExit("per_channel_cast_fused fp8 needs tests/reference/quant.py to make its (q, sf) inputs")

    def outputs(num_out: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.empty(num_out, HIDDEN, device=DEVICE, dtype=torch.float8_e4m3fn),
                torch.empty(-(-num_out // 128), HIDDEN, device=DEVICE, dtype=torch.float32))

    def inputs(x: torch.Tensor) -> Inputs:
        if pair:
            assert cast is not None
            return tuple(cast(x.float(), "e4m3", 128))  # bench.py quantizes fp32 rows
        if problem["in_dtype"] == "float32":  # per_channel_cast of fp32 rows (never gathered)
            x = x.float()
        return (x, gather_positions(x.shape[0])) if expand else (x,)

    def reference(x: Inputs) -> tuple[torch.Tensor, ...]:
        assert ref is not None
        if pair:
            return tuple(ref(x[0], x_sf=x[1]))
        return tuple(ref(x[0], pos_to_token=x[1] if expand else None))

    return Case(
        make=lambda x: (*x, *outputs(x[-1].shape[0] if expand else x[0].shape[0])),
        new_x=lambda: inputs(random_matrix(TOKENS, HIDDEN)),
        check_x=lambda: inputs(check_matrix(TOKENS + 37, HIDDEN)),  # a partial last row tile (sweep 34)
        outputs=lambda args: args[-2:],
        reference=reference if ref else None,
        counted=(lambda args: (args[0], *args[2:])) if expand else (lambda args: args),
    )


def expand_case(problem: dict[str, Any]) -> Case:
    """expand_to_fused as in benchmarks/cases/moe_route.py: T tokens, K of E local experts each,
    the no-sync worst-case buffer of N rows (padding rows zeroed); bytes x, mapping and out. With
    ``routing`` sparse (a grid value of the sweep, not a template parameter) the ids are drawn from
    E_GLOBAL experts, as bench.py's gate -> mapping -> expand -> reduce chain does: about an eighth
    of the pairs are local and most of the buffer is padding rows to zero."""
    assert problem["dtype"] == "bfloat16" and not problem["with_sf"], problem
    routing = _benchmark_case("moe_route")
    ref = _reference("moe_route", "expand_to_fused_ref")
    experts = routing.E_GLOBAL if problem.get("routing", "dense") == "sparse" else routing.E

    def inputs(x: torch.Tensor) -> Inputs:
        ids = torch.rand((routing.T, experts), device=DEVICE).topk(routing.K, dim=1).indices
        return (x, *routing.torch_mapping(ids))

    return Case(
        make=lambda x: (x[0], x[1], x[2], torch.empty(x[2].shape[0], x[0].shape[1], device=DEVICE, dtype=x[0].dtype)),
        new_x=lambda: inputs(random_matrix(routing.T, routing.H)),
        check_x=lambda: inputs(check_matrix(routing.T, routing.H)),
        outputs=lambda args: args[3:4],
        reference=(lambda x: (ref(*x),)) if ref else None,
    )


SWIGLU_TOKENS, SWIGLU_TOPK, SWIGLU_CLAMP = 8192, 2, 10.0  # benchmarks/cases/quant_swiglu.py: 16448 rows


def swiglu_case(problem: dict[str, Any]) -> Case:
    """swiglu_forward_and_per_token_cast as in benchmarks/cases/quant_swiglu.py (top-2 of 8 experts,
    weights, pos_to_expert, clamp 10, round_sf); bytes x, q, sf. Skipped (padding) rows are left
    unwritten, so q and sf start as zeros and the reference zeroes those rows."""
    assert problem["with_weights"] and problem["with_pos_to_expert"], problem
    routing = _reference("quant_swiglu", "expert_major_routing")
    ref = _reference("quant_swiglu", "swiglu_forward_and_per_token_cast_ref")
    if routing is None:
        raise SystemExit("swiglu_forward_and_per_token_cast needs tests/reference/quant_swiglu.py for its routing")
    pos_to_expert, pos_to_token_topk, _ = routing(SWIGLU_TOKENS, SWIGLU_TOPK, device=DEVICE)
    weights = torch.rand(SWIGLU_TOKENS, SWIGLU_TOPK, device=DEVICE,  # seeded: each case() gives the same
                         generator=torch.Generator(device=DEVICE).manual_seed(1))
    rows, hidden, npc = pos_to_expert.shape[0], problem["hidden"], problem["npc"]

    def reference(x: Inputs) -> tuple[torch.Tensor, ...]:
        assert ref is not None
        q, sf = ref(x[0], npc, pos_to_token_topk, weights, True, SWIGLU_CLAMP)
        skipped = pos_to_expert < 0
        q.view(torch.uint8)[skipped] = 0
        sf[skipped] = 0.0
        return q, sf

    return Case(
        make=lambda x: (x[0], torch.zeros(rows, hidden, device=DEVICE, dtype=torch.float8_e4m3fn),
                        torch.zeros(rows, hidden // npc, device=DEVICE, dtype=torch.float32),
                        pos_to_token_topk, weights, pos_to_expert, SWIGLU_CLAMP, 1),  # 1: round_sf
        new_x=lambda: (random_matrix(rows, 2 * hidden),),
        check_x=lambda: (check_matrix(rows, 2 * hidden),),
        outputs=lambda args: args[1:3],
        reference=reference if ref else None,
        counted=lambda args: args[:3],
    )


# ---- the MoE gates, as benchmarks/cases/moe_gate.py runs them ----------------------------------------------

GATE_TOKENS, GATE_SCALE = 16384, 2.5  # benchmarks/cases/moe_gate.py: T and routed_scaling_factor
WEIGHT_RTOL, WEIGHT_ATOL = 2e-6, 1e-7  # tests/gpu/test_moe_gate.py: sigmoid rounds differently from torch's


def gate_check_scores(tokens: int, experts: int) -> torch.Tensor:
    """fp32 (tokens, experts) where the selection order is easy to get wrong.

    A quarter of the rows hold values from a set of 8 (many equal scores: ties go to the lower
    id), a quarter random normals; the rest cycle through rows with a NaN, -inf, +inf, -0.0
    and +0.0 mixed in, a row of all -inf (every expert ties), and a row of all NaN (read as -inf).
    """
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(tokens, experts, device=DEVICE, generator=gen)
    few = torch.randint(0, 8, (tokens, experts), device=DEVICE, generator=gen).float() * 0.5 - 2.0
    rows = torch.arange(tokens, device=DEVICE)
    x = torch.where((rows % 4 == 1)[:, None], few, x)
    col = torch.randint(0, experts, (tokens, 5), device=DEVICE, generator=gen)
    special = torch.tensor([float("nan"), float("-inf"), float("inf"), -0.0, 0.0], device=DEVICE)
    odd = rows % 4 >= 2
    for j in range(5):
        x[odd, col[odd, j]] = special[j]
    x[rows % 16 == 2] = float("-inf")
    x[rows % 16 == 3] = float("nan")
    x[rows % 16 == 6] = torch.where(torch.arange(experts, device=DEVICE) % 2 == 0, -0.0, 0.0)
    return x


def gate_case(kernel: str, problem: dict[str, Any]) -> Case:
    """topk_gate(scores, K) and top2_sum_gate (sigmoid, groups, no map, no shared experts, one EP
    and TP rank) at T = 16384 as benchmarks/cases/moe_gate.py; bytes as bench.py counts them
    (the scores or logits and bias read, ids and weights written)."""
    experts, topk = problem["num_experts"], problem["num_topk"]
    if kernel == "topk_gate":
        ref = _reference("moe_gate", "topk_gate_ref")
        return Case(
            make=lambda x: (x[0], torch.empty(x[0].shape[0], topk, device=DEVICE, dtype=torch.int64)),
            new_x=lambda: (torch.randn(GATE_TOKENS, experts, device=DEVICE),),
            check_x=lambda: (gate_check_scores(GATE_TOKENS, experts),),
            outputs=lambda args: args[1:2],
            reference=(lambda x: (ref(x[0], topk),)) if ref else None,
        )
    assert problem["scoring"] == "sigmoid" and not problem["physical_map"], problem
    groups, top_groups = problem["num_groups"], problem["num_topk_groups"]
    ref2 = _reference("moe_gate", "top2_sum_gate_ref")
    ties = _reference("moe_gate", "tie_inputs")

    def check_x() -> Inputs:
        # Tie rows: equal (logit, bias) pairs give equal keys and equal group sums in any
        # implementation; the other rows carry NaN, -inf, +inf and signed zeros.
        logits = gate_check_scores(GATE_TOKENS, experts)
        bias = torch.randn(experts, device=DEVICE, generator=torch.Generator(device=DEVICE).manual_seed(2)) * 0.1
        if ties is not None:
            tie_logits, bias = ties(GATE_TOKENS, experts, experts // max(groups, 1), device=DEVICE,
                                    generator=torch.Generator(device=DEVICE).manual_seed(3))
            logits = torch.where((torch.arange(GATE_TOKENS, device=DEVICE) % 4 == 1)[:, None], tie_logits, logits)
        return logits, bias

    def matches(out: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> bool:
        return torch.equal(out[0], ref[0]) and torch.allclose(out[1], ref[1], rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL)

    def outputs(num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.empty(num_tokens, topk, device=DEVICE, dtype=torch.int64),
                torch.empty(num_tokens, topk, device=DEVICE, dtype=torch.float32))

    return Case(
        # routed_scaling_factor, ep_rank, experts_per_rank (one EP rank: all E), tp_rank, num_tp_ranks
        make=lambda x: (x[0], x[1], *outputs(x[0].shape[0]), GATE_SCALE, 0, experts, 0, 1),
        new_x=lambda: (torch.randn(GATE_TOKENS, experts, device=DEVICE), torch.randn(experts, device=DEVICE) * 0.1),
        check_x=check_x,
        outputs=lambda args: args[2:4],
        reference=(lambda x: ref2(x[0], x[1], topk, top_groups, groups, 0, GATE_SCALE, 0, 1, 0, 1, "sigmoid"))
        if ref2 else None,
        matches=matches,
    )


# ---- the lossless re-cast; inputs as benchmarks/cases/quant_per_channel.py ----------------------------------


def lossless_case(problem: dict[str, Any]) -> Case:
    """per_block_cast_lossless of an e2m1 pair (x int8 (T, H / 2), power-of-two 1 x 32 sf) as
    bench.py makes it: per_token_cast_ref(fp32 rows, 'e2m1', 32, round_sf=True). The check input
    is the pair of check_matrix (zeros, -0.0, every e2m1 code, NaN / Inf rows) with its scales
    spread over 2^-40 .. 2^40 per row and per block, so that some input blocks lie more than
    2^5 below their output block's largest (the float fallback of the PRMT decode) and the
    (128, 128) blocks mix scales. Bytes counted: x, x_sf, q, sf."""
    cast = _reference("quant", "per_token_cast_ref")
    ref = _reference("quant_per_channel", "per_block_cast_lossless_ref")
    block, hidden = (problem["block_m"], problem["block_k"]), problem.get("hidden", HIDDEN)
    if cast is None:
        raise SystemExit("per_block_cast_lossless needs tests/reference/quant.py to make its (x, sf) inputs")

    def pair(x: torch.Tensor) -> Inputs:
        return tuple(cast(x.float(), "e2m1", 32, True))

    def check_pair() -> Inputs:
        q, sf = pair(check_matrix(TOKENS + 37, hidden))  # a partial last row tile (sweep 35)
        gen = torch.Generator(device=DEVICE).manual_seed(2)
        shift = torch.randint(-40, 41, sf.shape, device=DEVICE, generator=gen).float()
        return q, sf * torch.exp2(shift)  # still powers of two (or 0, NaN, Inf)

    def outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = x.shape[0]
        return (torch.empty(tokens, hidden, device=DEVICE, dtype=torch.float8_e4m3fn),
                torch.empty(-(-tokens // block[0]), hidden // block[1], device=DEVICE, dtype=torch.float32))

    return Case(
        make=lambda x: (x[0], x[1], *outputs(x[0])),
        new_x=lambda: pair(torch.randn(TOKENS, hidden, device=DEVICE)),
        check_x=check_pair,
        outputs=lambda args: args[2:4],
        reference=(lambda x: tuple(ref(x[0], x[1], block))) if ref else None,
    )


def swiglu_per_channel_case(problem: dict[str, Any]) -> Case:
    """swiglu_forward_and_per_channel_cast_and_transpose as in benchmarks/cases/quant_swiglu.py:
    x (T, 2H) bf16, round_sf, no clamp (the op passes +inf); bytes x, q, sf. Every q and sf
    element is written, so the outputs start uninitialised."""
    ref = _reference("quant_swiglu", "swiglu_forward_and_per_channel_cast_and_transpose_ref")
    npt, hidden, transposed = problem["npt"], problem["hidden"], not problem["without_transpose"]

    def make(x: Inputs) -> Inputs:
        tokens = x[0].shape[0]
        q = torch.empty((hidden, tokens) if transposed else (tokens, hidden), device=DEVICE, dtype=torch.float8_e4m3fn)
        sf = torch.empty(tokens // npt, hidden, device=DEVICE, dtype=torch.float32)
        return (x[0], q, sf, float("inf"), 1)  # no clamp; 1: round_sf

    return Case(
        make=make,
        new_x=lambda: (random_matrix(TOKENS, 2 * hidden),),
        check_x=lambda: (check_matrix(TOKENS, 2 * hidden),),
        outputs=lambda args: args[1:3],
        reference=(lambda x: tuple(ref(x[0], npt, True, not transposed))) if ref else None,
        counted=lambda args: args[:3],
    )


# ---- the SwiGLU backward; inputs as cases/quant_swiglu.py ---------------------------------------------------

SWIGLU_BF16_RTOL = 2.0**-7  # tests/gpu/test_quant_swiglu.py: bf16 outputs within one bf16 ulp of torch's
SWIGLU_WGRAD_RTOL, SWIGLU_WGRAD_ATOL = 1e-5, 1e-6  # weight_grad: of sum |products|, a row sum in its own order


def swiglu_backward_case(problem: dict[str, Any]) -> Case:
    """swiglu_backward_and_per_token_cast as benchmarks/cases/quant_swiglu.py runs it: the fp8 pair
    per_token_cast_ref(randn (N, 2H), 'e4m3', npc), bf16 grad_out, top-2 weights, expert-major
    routing of 8192 tokens (16448 rows, padding rows with weight 0), round_sf, no clamp (the op
    passes +inf). Every output element is written (weight_grad entries without a row get 0), so
    the outputs start uninitialised. Variants must equal the baseline byte for byte in out, codes,
    scales and x_grad; weight_grad's row sum follows the step size (sweep 25's chunk), so every
    variant, like the baseline, must meet the reference as tests/gpu/test_quant_swiglu.py asks:
    codes and scales bit-identical, bf16 outputs within one ulp, weight_grad (summed in another
    order) to 1e-5 relative. The check input is check_matrix cast to the fp8 pair (zeros, -0.0,
    NaN and Inf rows: NaN scales), with check_matrix as grad_out. Bytes counted: every tensor
    argument."""
    hidden, npc = problem["hidden"], problem["npc"]
    routing = _reference("quant_swiglu", "expert_major_routing")
    ref = _reference("quant_swiglu", "swiglu_backward_ref")
    cast = _reference("quant", "per_token_cast_ref")
    if routing is None or cast is None:
        raise SystemExit("swiglu_backward_and_per_token_cast needs tests/reference/quant*.py for its inputs")
    _, pos_to_token_topk, token_topk_to_pos = routing(SWIGLU_TOKENS, SWIGLU_TOPK, device=DEVICE)
    weights = torch.rand(SWIGLU_TOKENS, SWIGLU_TOPK, device=DEVICE,
                         generator=torch.Generator(device=DEVICE).manual_seed(1))
    rows = pos_to_token_topk.shape[0]

    def inputs(x: torch.Tensor, g: torch.Tensor) -> Inputs:
        xq, x_sf = cast(x.float(), "e4m3", npc)
        return xq, x_sf, g

    def make(x: Inputs) -> Inputs:
        out = torch.empty(rows, hidden, device=DEVICE, dtype=torch.bfloat16)
        q = torch.empty(rows, 2 * hidden, device=DEVICE, dtype=torch.float8_e4m3fn)
        q_sf = torch.empty(rows, 2 * hidden // npc, device=DEVICE, dtype=torch.float32)
        x_grad = torch.empty(rows, 2 * hidden, device=DEVICE, dtype=torch.bfloat16)
        weight_grad = torch.empty(SWIGLU_TOKENS, SWIGLU_TOPK, device=DEVICE, dtype=torch.float32)
        return (x[0], x[1], x[2], weights, pos_to_token_topk, token_topk_to_pos,
                out, q, q_sf, x_grad, weight_grad, float("inf"), 1)  # no clamp; 1: round_sf

    def reference(x: Inputs) -> tuple[torch.Tensor, ...]:
        """The reference's out, q, q_sf and x_grad; for weight_grad, as tests/gpu/test_quant_swiglu.py
        checks it, the float64 sum of the products and its bound 1e-5 * sum |products| + 1e-6 (the
        bound of a sum in another order: relative to the value itself it fails under cancellation)."""
        assert ref is not None
        out, (q, q_sf), x_grad, _, _ = ref(x[0], x[1], x[2], weights, pos_to_token_topk, token_topk_to_pos, npc, True)
        full = x[0].float() * x[1].repeat_interleave(npc, dim=1)
        left, right = full[:, :hidden], full[:, hidden:]
        products = (x[2].float() * (left / (1 + torch.exp(-left)) * right)).double()
        exact = torch.zeros(weights.numel(), dtype=torch.float64, device=DEVICE)
        bound = torch.full_like(exact, SWIGLU_WGRAD_ATOL)
        valid = pos_to_token_topk >= 0
        exact[pos_to_token_topk[valid].long()] = products.sum(dim=1)[valid]
        bound[pos_to_token_topk[valid].long()] += SWIGLU_WGRAD_RTOL * products.abs().sum(dim=1)[valid]
        return out, q, q_sf, x_grad, exact, bound

    def matches(out: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> bool:
        error = (out[4].reshape(-1).double() - want[4]).abs()
        return (same_bytes(out[1:3], want[1:3])
                and all(torch.allclose(a.float(), b.float(), rtol=SWIGLU_BF16_RTOL, atol=1e-30)
                        for a, b in ((out[0], want[0]), (out[3], want[3])))
                and bool((error <= want[5]).all()))

    return Case(
        make=make,
        new_x=lambda: inputs(torch.randn(rows, 2 * hidden, device=DEVICE), random_matrix(rows, hidden)),
        check_x=lambda: inputs(check_matrix(rows, 2 * hidden).float(), check_matrix(rows, hidden)),
        outputs=lambda args: args[6:11],
        reference=reference if ref else None,
        matches=matches,
        order_free=lambda outputs: outputs[:4],  # weight_grad's row sum follows the step size (sweep 25)
    )


# ---- the mapped top2_sum_gate -------------------------------------------------------------------------------

MAP_COPIES, MAP_EP_RANK, MAP_EP_RANKS = 3, 1, 2  # as tests/gpu/test_moe_gate.py: 1..3 copies per expert


def mapped_gate_case(problem: dict[str, Any]) -> Case:
    """top2_sum_gate with to_physical_map / logical_count (no shared experts), EP rank 1 of 2 (so the
    hash's ep_rank term is not 0), one TP rank; the logits and bias as gate_case. The check map
    also holds -1 entries (ids masked to -1) and counts of 0 and above the copies (clamped)."""
    experts, topk = problem["num_experts"], problem["num_topk"]
    groups, top_groups = problem["num_groups"], problem["num_topk_groups"]
    plain = gate_case("top2_sum_gate", {**problem, "physical_map": False})
    ref = _reference("moe_gate", "top2_sum_gate_ref")
    per_rank = (experts + MAP_COPIES - 1) // MAP_EP_RANKS

    def physical_map(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        to_physical = torch.randperm(experts * MAP_COPIES, device=DEVICE, generator=gen).view(experts, MAP_COPIES)
        count = torch.randint(1, MAP_COPIES + 1, (experts,), device=DEVICE, dtype=torch.int32, generator=gen)
        return to_physical.int(), count

    def check_x() -> Inputs:
        to_physical, count = physical_map(4)
        rows = torch.arange(experts, device=DEVICE)
        to_physical[rows % 5 == 0, 0] = -1
        count[rows % 7 == 1] = 0
        count[rows % 7 == 2] = MAP_COPIES + 2
        return (*plain.check_x(), to_physical, count)

    def make(x: Inputs) -> Inputs:
        shape = (x[0].shape[0], topk)
        outputs = (torch.empty(shape, device=DEVICE, dtype=torch.int64), torch.empty(shape, device=DEVICE))
        # routed_scaling_factor, ep_rank, experts_per_rank, tp_rank, num_tp_ranks
        return (*x, *outputs, GATE_SCALE, MAP_EP_RANK, per_rank, 0, 1)

    return Case(
        make=make,
        new_x=lambda: (*plain.new_x(), *physical_map(5)),
        check_x=check_x,
        outputs=lambda args: args[4:6],
        reference=(lambda x: ref(x[0], x[1], topk, top_groups, groups, 0, GATE_SCALE, MAP_EP_RANK, MAP_EP_RANKS, 0, 1,
                                 "sigmoid", x[2], x[3])) if ref else None,
        matches=plain.matches,
    )


def per_token_row_case(problem: dict[str, Any]) -> Case:
    """per_token_cast with one scale per row (grid npc 0, npc = H): x (T, H) bf16 or fp32
    (the problem's in_dtype, bf16 where it has none) -> q, sf (T, 1) row-major; bytes x, q, sf as bench.py counts them
    (every input and output). The check input's special rows (zeros, -0.0, the e2m1 ties with 6 in the row, a NaN,
    an Inf) are whole rows, so each one is a scale group of its own here too."""
    assert problem["sf_layout"] == "row_major", problem
    ref = _reference("quant", "per_token_cast_ref")
    dtype = input_dtype(problem)

    def make(x: Inputs) -> Inputs:
        tokens, hidden = x[0].shape
        q = torch.empty(tokens, hidden // 2 if problem["fmt"] == "e2m1" else hidden, device=DEVICE,
                        dtype=torch.int8 if problem["fmt"] == "e2m1" else torch.float8_e4m3fn)
        sf = torch.empty(tokens, 1, device=DEVICE, dtype=torch.float32)
        return (x[0], q, sf, 0)  # mode 0: cast (q and sf)

    return Case(
        make=make,
        new_x=lambda: (random_matrix(TOKENS, HIDDEN).to(dtype),),
        check_x=lambda: (check_matrix(TOKENS, HIDDEN).to(dtype),),
        outputs=lambda args: args[1:3],
        reference=(lambda x: ref(x[0], fmt=problem["fmt"], npc=x[0].shape[1], round_sf=problem["round_sf"]))
        if ref else None,
        counted=lambda args: args[:3],
    )


# ---- normalize_weight; inputs as benchmarks/cases/moe_gate.py -----------------------------------------------

NORMALIZE_TAIL = 3  # the check input has GATE_TOKENS - 3 rows: a partial last block (and warp)


def normalize_check_weights(tokens: int, topk: int) -> torch.Tensor:
    """fp32 (tokens, topk) where a different summation order or an inexact division shows.

    Rows cycle through: zeros (denominator 1e-20), -0.0, 1 followed by 2^-24's (the sequential
    sum stays 1, any other order does not), a NaN, an Inf, 3e38's (the sum overflows), subnormals,
    +-1e8 with 1's between them (cancellation); the rest are random with magnitudes 2^-30 .. 2^30
    and random signs.
    """
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    w = torch.rand(tokens, topk, device=DEVICE, generator=gen) - 0.5
    w *= torch.exp2(torch.randint(-30, 31, (tokens, topk), device=DEVICE, generator=gen).float())
    rows = torch.arange(tokens, device=DEVICE) % 16
    col = torch.arange(topk, device=DEVICE)
    w[rows == 0] = 0.0
    w[rows == 1] = -0.0
    w[rows == 2] = torch.where(col == 0, 1.0, 2.0**-24)
    w[(rows == 3)[:, None] & (col == topk // 2)] = float("nan")
    w[(rows == 4)[:, None] & (col == topk - 1)] = float("inf")
    w[rows == 5] = 3e38
    w[rows == 6] = 1e-42
    w[rows == 7] = torch.where(col % 2 == 1, 1.0, torch.where(col % 4 == 0, 1e8, -1e8))
    return w


def normalize_case(problem: dict[str, Any]) -> Case:
    """normalize_weight(torch.rand(T, K)) at T = 16384 as benchmarks/cases/moe_gate.py runs it; bytes as
    bench.py counts them (topk_weights read, denominator and normalized_weights written). The kernel
    and tests/reference/moe_gate.py both sum ((1e-20 + w0) + w1) + ... in fp32 and divide in IEEE fp32,
    so the baseline must equal the reference byte for byte (the default same_bytes)."""
    topk = problem["num_topk"]
    ref = _reference("moe_gate", "normalize_weight_ref")
    return Case(
        make=lambda x: (x[0], torch.empty(x[0].shape[0], device=DEVICE), torch.empty_like(x[0])),
        new_x=lambda: (torch.rand(GATE_TOKENS, topk, device=DEVICE),),
        check_x=lambda: (normalize_check_weights(GATE_TOKENS - NORMALIZE_TAIL, topk),),
        outputs=lambda args: args[1:3],
        reference=(lambda x: tuple(ref(x[0]))) if ref else None,
    )


def post_bwd_case(problem: dict[str, Any]) -> Case:
    """mhc_post_bwd as in benchmarks/cases/mhc.py: T 8192 tokens, m streams of H 7168. x_grad and residual_grad
    are per element (every variant must give the baseline's bytes); post_grad and comb_grad are row sums whose
    order follows the lanes' columns, so each variant is checked against the reference (fp32 sums of 7168 products
    of unit normals: 1e-4 relative, 1e-3 absolute)."""
    m, tokens = problem["mhc_mult"], TOKENS
    ref = _reference("mhc_post", "post_bwd_formula")

    def inputs(scale: float = 1.0) -> Inputs:
        g, residual = (torch.randn(tokens, m, HIDDEN, device=DEVICE).mul(scale).bfloat16() for _ in range(2))
        x = torch.randn(tokens, HIDDEN, device=DEVICE).bfloat16()
        return g, x, residual, torch.rand(tokens, m, device=DEVICE), torch.rand(tokens, m, m, device=DEVICE)

    def make(x: Inputs) -> Inputs:
        g = x[0]
        return (*x, torch.empty_like(x[1]), torch.empty_like(g), torch.empty(tokens, m, device=DEVICE),
                torch.empty(tokens, m, m, device=DEVICE))

    def reference(x: Inputs) -> tuple[torch.Tensor, ...]:
        g, xs, residual, post, comb = x
        return ref(xs, residual, post[..., None], comb, g)

    def matches(out: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> bool:
        return same_bytes(out[:2], want[:2]) and all(
            torch.allclose(a.reshape(b.shape), b, rtol=1e-4, atol=1e-3) for a, b in zip(out[2:], want[2:]))

    return Case(make=make, new_x=inputs, check_x=lambda: inputs(1e3), outputs=lambda args: args[5:],
                reference=reference if ref else None, matches=matches, order_free=lambda out: out[:2])


def mhc_expand_case(problem: dict[str, Any]) -> Case:
    """expand_to_mhc forward as in benchmarks/cases/mhc.py: x (T 8192, H 7168) bf16 -> (T, 4, H), a copy."""
    assert problem["direction"] == "fwd", problem
    m = 4

    def inputs(x: torch.Tensor) -> Inputs:
        return (x.bfloat16(),)

    return Case(make=lambda x: (x[0], torch.empty(x[0].shape[0], m, x[0].shape[1], device=DEVICE,
                                                  dtype=torch.bfloat16)),
                new_x=lambda: inputs(random_matrix(TOKENS, HIDDEN)),
                check_x=lambda: inputs(check_matrix(TOKENS, HIDDEN)),
                outputs=lambda args: args[1:], reference=lambda x: (x[0][:, None].expand(-1, m, -1).contiguous(),))


def engram_gate_fwd_case(problem: dict[str, Any]) -> Case:
    """engram_gate_fwd as in benchmarks/cases/engram.py: T 8192, hc 4, H 7168, with or without the saved
    statistics. The knobs change no order of summation: every output must equal the baseline's bytes."""
    engram = _benchmark_case("engram")
    tokens, hc, hidden = engram.T, engram.HC, problem["hidden"]

    def inputs() -> Inputs:
        x, k = (torch.randn(tokens, hc, hidden, device=DEVICE).bfloat16() for _ in range(2))
        return x, k, torch.randn(tokens, hidden, device=DEVICE).bfloat16(), torch.randn(hc, hidden, device=DEVICE)

    outputs = 5 if problem["save"] else 1

    def make(x: Inputs) -> Inputs:
        stats = [torch.empty(tokens, hc, device=DEVICE) for _ in range(outputs - 1)]
        return (*x, torch.empty_like(x[0]), *stats, engram.EPS, engram.CLAMP)

    return Case(make=make, new_x=inputs, check_x=inputs, outputs=lambda args: args[4:4 + outputs], reference=None,
                counted=lambda args: args[:4 + outputs])


def engram_gate_bwd_case(problem: dict[str, Any]) -> Case:
    """engram_gate_bwd as in benchmarks/cases/engram.py: T 8192, hc 4, H 7168, the forward's statistics from the
    reference, grad_w_partial's rows as the op sizes them (two blocks an SM: ops/engram/gate.py's
    _BWD_BLOCKS_PER_SM). The knobs change no order of summation: every output must equal the baseline's bytes (the
    check input: the same random draw)."""
    engram = _benchmark_case("engram")
    ref = _reference("engram_gate", "engram_gate_ref")
    tokens, hc, hidden = engram.T, engram.HC, problem["hidden"]
    rows = min(tokens, torch.cuda.get_device_properties(0).multi_processor_count * 2 // hc)

    def inputs() -> Inputs:
        x, k, go = (torch.randn(tokens, hc, hidden, device=DEVICE).bfloat16() for _ in range(3))
        v, w = torch.randn(tokens, hidden, device=DEVICE).bfloat16(), torch.randn(hc, hidden, device=DEVICE)
        _, dot, gate, rstd_x, rstd_k = ref(x, k, v, w, torch.ones_like(w), engram.CLAMP, engram.EPS)
        return go, x, k, v, w, dot, gate, rstd_x, rstd_k

    def make(x: Inputs) -> Inputs:
        return (*x, torch.empty_like(x[1]), torch.empty_like(x[1]), torch.empty_like(x[3]),
                torch.empty(rows, hc, hidden, device=DEVICE), engram.CLAMP)

    return Case(make=make, new_x=inputs, check_x=inputs, outputs=lambda args: args[9:13], reference=None,
                counted=lambda args: args[:13])


def mix_case(kernel: str, problem: dict[str, Any]) -> Case:
    """The split and head mixes as in benchmarks/cases/mhc.py: T 8192 tokens of fp32 mixes (m 4), scales, bases;
    per-token arithmetic, so every variant must give the baseline's bytes."""
    m, tokens = problem["mhc_mult"], TOKENS
    if kernel == "mhc_pre_split_mixes_fwd":
        n = 2 * m + m * m

        def split() -> Inputs:
            return (torch.randn(tokens, n, device=DEVICE), torch.randn(3, device=DEVICE), torch.randn(n, device=DEVICE))

        return Case(make=lambda x: (*x, torch.empty(tokens, m, device=DEVICE), torch.empty(tokens, m, device=DEVICE),
                                    torch.empty(tokens, m * m, device=DEVICE), 2.0, 1e-6),
                    new_x=split, check_x=split, outputs=lambda args: args[3:6], reference=None,
                    counted=lambda args: args[:6])

    def head() -> Inputs:
        return torch.randn(tokens, m, device=DEVICE), torch.randn(1, device=DEVICE), torch.randn(m, device=DEVICE)

    return Case(make=lambda x: (*x, torch.empty(tokens, m, device=DEVICE), 1e-6), new_x=head, check_x=head,
                outputs=lambda args: args[3:4], reference=None, counted=lambda args: args[:4])


def same_bytes(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    """Bit-identical, NaNs included (compared as raw bytes, not as numbers)."""
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype
        and torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
        for x, y in zip(a, b, strict=True))


# ---- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    kernel: str
    problem: str
    variant: str
    knobs: str
    baseline: bool
    us: float | None
    gb_s: float | None
    pct_copy: float | None
    speedup: float | None  # baseline time / this time
    bit_exact: bool | None  # equal to the baseline's outputs on the check input
    note: str


def run_problem(timer: Any, bench: Any, copy_gb_s: float, kernel: str, problem: dict[str, Any],
                group: list[Variant]) -> list[Row]:
    c = case(kernel, problem)
    described = ", ".join(f"{k}={v}" for k, v in problem.items())
    baseline = next(v for v in group if v.is_baseline)
    check = c.check_x()
    shared = c.order_free or (lambda outputs: outputs)
    expected: tuple[torch.Tensor, ...] | None = None
    ref_note = "reference not checked"
    random_x: Inputs | None = None
    want: tuple[torch.Tensor, ...] = ()
    try:
        args = c.make(check)
        baseline.launch(*args)
        expected = tuple(t.clone() for t in shared(c.outputs(args)))
        if c.reference is not None:
            # On finite random inputs: how the references treat NaN and Inf is not this sweep's question.
            random_x = c.new_x()
            want = c.reference(random_x)
            args = c.make(random_x)
            baseline.launch(*args)
            ref_note = "baseline == reference" if c.matches(c.outputs(args), want) else \
                "BASELINE DIFFERS FROM REFERENCE"
    except Exception as exc:
        ref_note = f"baseline failed: {bench.reason(exc)}"
    inputs = bench.rotating_inputs(lambda: c.make(c.new_x()))
    nbytes = sum(bench.tensor_bytes(t) for t in c.counted(inputs[0]))
    measured: list[tuple[Variant, float | None, bool | None, str]] = []
    for v in sorted(group, key=lambda v: not v.is_baseline):
        note = ref_note if v.is_baseline else ""
        exact: bool | None = None
        us: float | None = None
        try:
            args = c.make(check)
            v.launch(*args)
            exact = expected is not None and same_bytes(expected, shared(c.outputs(args)))
            if c.order_free is not None and random_x is not None and not v.is_baseline:
                args = c.make(random_x)
                v.launch(*args)
                note = "== reference" if c.matches(c.outputs(args), want) else "DIFFERS FROM REFERENCE"
            us = timer.median_us(v.launch, inputs)
        except Exception as exc:  # one broken variant must not cost the rest of the sweep
            note = f"failed: {bench.reason(exc)}"
        measured.append((v, us, exact, note))
    base_us = next(us for v, us, _, _ in measured if v.is_baseline)
    rows = []
    for v, us, exact, note in measured:
        gb_s = nbytes / us / 1e3 if us else None
        rows.append(Row(
            kernel=kernel, problem=described, variant=v.name, knobs=v.describe_knobs(), baseline=v.is_baseline,
            us=us, gb_s=gb_s, pct_copy=100 * gb_s / copy_gb_s if gb_s else None,
            speedup=base_us / us if us and base_us else None, bit_exact=exact, note=note,
        ))
    return sorted(rows, key=lambda r: (r.us is None, r.us or 0.0))


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def markdown(meta: dict[str, Any], rows: list[Row]) -> str:
    lines = [
        f"# Tuning sweep: {meta['gpu']}, {meta['date']}",
        "",
        f"torch {meta['torch']}, {meta['package']}, copy {meta['copy_gb_s']:.0f} GB/s (1 GiB device-to-device, "
        f"read + written), median of {meta['reps']} calls. Bit-exact: outputs equal the baseline's "
        "(the default knobs, marked *) on the check input; where a case leaves reordered sums out of that "
        "comparison, the note says whether the variant meets the reference.",
    ]
    problem = None
    for r in rows:
        if (r.kernel, r.problem) != problem:
            problem = (r.kernel, r.problem)
            lines += ["", f"## {r.kernel}: {r.problem}", "",
                      "| variant | knobs | µs | GB/s | % copy | speedup | bit-exact | note |",
                      "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
        exact = "n/a" if r.bit_exact is None else ("yes" if r.bit_exact else "**NO**")
        lines.append(f"| {r.variant}{' *' if r.baseline else ''} | {r.knobs} | {fmt(r.us)} | {fmt(r.gb_s, 0)} | "
                     f"{fmt(r.pct_copy)} | {fmt(r.speedup, 2)} | {exact} | {r.note} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if "OUT" in os.environ else None,
                        help="folder for sweep.json and sweep.md (default: $OUT)")
    parser.add_argument("--reps", type=int, default=200, help="timed calls per variant (median taken)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--dry-run", action="store_true", help="list problems, baselines and variants; no GPU")
    parser.add_argument("--package", choices=sorted(SWEEPS), default=DEFAULT_PACKAGE,
                        help=f"the tuning package to sweep (default {DEFAULT_PACKAGE}; "
                             + "; ".join(f"{name}: {s.spec}" for name, s in SWEEPS.items()) + ")")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sweep = SWEEPS[args.package]
    package = importlib.import_module(sweep.package)
    groups = problems(variants(package, sweep))
    if args.dry_run:
        for (kernel, problem), group in groups.items():
            print(f"{kernel} {dict(problem)}: {len(group)} variants")
            for v in group:
                print(f"  {v.name}{' (baseline)' if v.is_baseline else ''}: {v.describe_knobs()}")
        print(f"{sum(len(g) for g in groups.values())} variants, {len(groups)} problems ({sweep.spec})")
        return 0
    if args.out is None:
        print("--out (or $OUT) is required", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("sweep.py needs a CUDA GPU", file=sys.stderr)
        return 1
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench  # benchmarks/bench.py: the same timer, input rotation and copy ceiling

    timer = bench.Timer(bench.Settings(reps=args.reps, warmup=args.warmup))
    copy_gb_s = bench.copy_bandwidth(timer)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "package": f"{sweep.package} {getattr(package, '__version__', '?')} ({getattr(package, 'TARGET', '?')})",
        "copy_gb_s": copy_gb_s,
        "reps": args.reps,
        "baseline": {kernel: dict(knobs) for kernel, knobs in sweep.baselines.items()},
        "baseline_overrides": [[kernel, key, value, dict(knobs)] for kernel, key, value, knobs in sweep.overrides],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    for (kernel, problem), group in groups.items():
        rows += run_problem(timer, bench, copy_gb_s, kernel, dict(problem), group)
        # Rewritten after every problem, so a run cut short keeps what it measured.
        (args.out / "sweep.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]},
                                                        indent=2) + "\n")
        table = markdown(meta, rows)
        (args.out / "sweep.md").write_text(table)
        torch.cuda.empty_cache()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
