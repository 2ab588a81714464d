#!/usr/bin/env bash
# One planned call on a GPU machine that has torch but no TileLang and no nvcc (the real use case):
# install the sm90 wheels from dist/ (shipped kernels), dist/loader/ (loader test
# kernels: tkc build --specs tests/data/specs/loader.yaml --templates tests/data/kernels
# --dist dist/loader) and dist/examples/ (the example project: tkc build --specs
# examples/rmsnorm/kernel_specs --templates examples/rmsnorm/kernels --dist dist/examples)
# with --no-deps, run the GPU tests, then the benchmarks.
# Logs and results go under $OUT (the device tool's output folder) or ./gpu-out.
# Usage: COMMIT=<sha> [BENCH=all|none|<sections>] [OVERHEAD=0] [OVERHEAD_BEFORE=<wheel dir>] [GVS=1] [TK_JIT=<tar.xz>] [COLD=1] [BASELINE=<results.json>] [BENCH_DEADLINE=<s>] [BENCH_INTO=<results.json>] [TK_SUITE_S=<seconds> [TK_SUITE_FILES="tests/quant/..."]] benchmarks/gpu_session.sh
#        [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
site=$(mktemp -d /tmp/tkc-site.XXXX)
python3 -m pip install -q --no-deps --no-index --target "$site" dist/*+sm90-*.whl dist/loader/*+sm90-*.whl \
  dist/examples/*+sm90-*.whl || exit 1
export PYTHONPATH="$site" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, tile_kernels_aot as tk; print('torch', torch.__version__, 'package', tk.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider -rfE --junitxml="$OUT/gpu-tests.xml" "$@" > "$OUT/gpu-tests.log" 2>&1
tests=$?
tail -n 25 "$OUT/gpu-tests.log"
# TileKernels' JIT kernels beside ours in the benchmark (TK_JIT=<tar.xz of TileLang 0.1.15, its dependencies and
# TileKernels 1.0.0 as unpacked wheels; benchmarks/peer.py says how to make it), COLD=1 adds the cold-start section,
# BASELINE=<results.json> makes bench.py fail on ops more than 5% slower than there twice in a row.
bench_path=$site bench_args=()
if [ -n "${TK_JIT:-}" ]; then
  jit=$(mktemp -d /tmp/tk-jit.XXXX)
  xz -dc "$TK_JIT" | tar xf - -C "$jit" && bench_path="$site:$jit" bench_args+=(--tilekernels)
fi
[ "${COLD:-0}" = 1 ] && bench_args+=(--cold-start)
[ -n "${BASELINE:-}" ] && bench_args+=(--baseline "$BASELINE")
# A run longer than one call, in parts: BENCH_DEADLINE=<s> starts no section after that many seconds and names the
# sections left; the next call runs them with BENCH=<those> BENCH_INTO=<the first part's results.json>.
[ -n "${BENCH_DEADLINE:-}" ] && bench_args+=(--deadline "$BENCH_DEADLINE")
[ -n "${BENCH_INTO:-}" ] && bench_args+=(--into "$BENCH_INTO")
# BENCH=none skips the benchmarks, BENCH=<sections> (bench.py --only) runs some of them.
bench=0
if [ "${BENCH:-all}" != none ]; then
  [ "${BENCH:-all}" != all ] && bench_args+=(--only "$BENCH")
  PYTHONPATH="$bench_path" python3 benchmarks/bench.py --out "$OUT" --commit "${COMMIT:-unknown}" "${bench_args[@]}" \
    > "$OUT/bench.log" 2>&1
  bench=$?
fi
overhead=0
if [ "${OVERHEAD:-1}" = 1 ]; then
  python3 benchmarks/runtime_overhead.py --out "$OUT" > "$OUT/runtime_overhead.log" 2>&1
  overhead=$?
fi
# The same host-time table for an earlier build of the package (OVERHEAD_BEFORE=<folder of its sm90 wheel>), timed
# right after this one's on the same machine: a before/after of a runtime change.
if [ -n "${OVERHEAD_BEFORE:-}" ]; then
  before_site=$(mktemp -d /tmp/tkc-before.XXXX) before_out=$(mktemp -d /tmp/tkc-before-out.XXXX)
  python3 -m pip install -q --no-deps --no-index --target "$before_site" "$OVERHEAD_BEFORE"/*+sm90-*.whl &&
    PYTHONPATH="$before_site" python3 benchmarks/runtime_overhead.py --out "$before_out" \
      > "$OUT/runtime_overhead_before.log" 2>&1
  cp "$before_out/runtime_overhead.md" "$OUT/runtime_overhead_before.md" 2>/dev/null
fi
# Hardware counters of the kernels named in $NCU_CASES (space-separated profile_kernel.py cases).
for case in ${NCU_CASES:-}; do
  ncu --clock-control none --launch-skip 2 --launch-count 1 -k "regex:${case%_e*}" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
    --section WarpStateStats --section SchedulerStats python3 benchmarks/profile_kernel.py "$case" \
    > "$OUT/ncu-$case.txt" 2>&1
done
# The per-token cast's variants for any hidden against those built per hidden (GVS=1).
if [ "${GVS:-0}" = 1 ]; then
  python3 benchmarks/generic_vs_specialized.py time --site "$site" --generic --label generic --out "$OUT/generic.json"
  python3 benchmarks/generic_vs_specialized.py time --site "$site" --label specialized --out "$OUT/specialized.json"
  python3 benchmarks/generic_vs_specialized.py table "$OUT/specialized.json" "$OUT/generic.json" \
    > "$OUT/generic_vs_specialized.md"
fi
# TileKernels' own tests through the import alias, for $TK_SUITE_S seconds (benchmarks/tilekernels_suite.py;
# prepare build/tilekernels first and carry it). Its per-file reports go into one archive ($OUT takes few files).
if [ "${TK_SUITE_S:-0}" -gt 0 ]; then
  suite=$(mktemp -d /tmp/tk-suite.XXXX)
  timeout "$TK_SUITE_S" python3 benchmarks/tilekernels_suite.py run --root build/tilekernels --out "$suite" \
    --deadline "$((TK_SUITE_S - 15))" ${TK_SUITE_FILES:-} > "$OUT/tilekernels-suite.log" 2>&1
  cp "$suite/tilekernels-suite.md" "$OUT/" 2>/dev/null
  tar czf "$OUT/tilekernels-suite.tgz" -C "$suite" .
fi
tail -n 30 "$OUT/bench.log" 2>/dev/null; tail -n 12 "$OUT/runtime_overhead.log" 2>/dev/null
echo "exit codes: tests $tests, bench $bench, runtime_overhead $overhead"
exit $((tests || bench || overhead))
