#!/bin/bash
# The GPU benchmark behind docs/benchmarks.md: the shipped GPU scenarios through every backend on
# its default route, timed by attnbench itself, in one device call. From the repo root (carry
# .whl/: pydantic & co, xformers, FlashInfer; .fa2/: the prebuilt flash-attn of shared/device/):
#
#   bash scripts/gpu/gpu_bench.sh
#
# Setup (common.sh gpu_setup: xformers in its Triton-only mode, the prebuilt head-dim-128
# flash-attn); FlashInfer's JIT modules for these batches built first (flashinfer_warmup.py,
# WARM_PROCS processes, at most WARM_S seconds), so no build runs beside a timed row; then one
# `attnbench run` per scenario with every backend. Run folders land in $OUT/runs.tgz. Then, on the
# development machine:
#   python3 scripts/report/make_benchmarks_doc.py RUN_DIRS... --command "..." --commit HOST_COMMIT
# Settings: BENCH (the five scenarios below; not SCENARIOS, which common.sh sets to every shipped file), TIMING (--warmup-ms 10 --measure-ms 60), WARM_S (300),
# WARM_PROCS (8).
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET_S=${BUDGET_S:-570}
OUTDIR=${OUT:-/tmp/gpu_bench}; RUNS=/tmp/gpu_bench_runs; mkdir -p "$OUTDIR" "$RUNS"
source scripts/gpu/common.sh
gpu_setup
BENCH=${BENCH:-decode-llama3-8b tree-verify-llama3-8b tree-random-60-gqa8 mixed-llama3-8b prefill-llama3-8b}
TIMING=${TIMING:---warmup-ms 10 --measure-ms 60}
FILES=(); for s in $BENCH; do FILES+=("attnbench/scenarios/$s.yaml"); done
el "FlashInfer JIT warm-up for these batches (at most ${WARM_S:-300} s)"
python3 scripts/gpu/flashinfer_warmup.py --scenarios "${FILES[@]}" --specs flashinfer --procs "${WARM_PROCS:-8}" \
  --budget-s "${WARM_S:-300}" | tail -n 3
python3 -m attnbench backends
for s in $BENCH; do
  el "$s"
  python3 -m attnbench run "attnbench/scenarios/$s.yaml" -b sdpa -b flex -b triton -b xformers -b flash-attn -b flashinfer \
    --out "$RUNS/$s" -q $TIMING > "$RUNS/$s.log" 2>&1
  el "$s: rc=$?"; grep -E "│|\[[0-9]+\]" "$RUNS/$s.log" | tail -n 60
  tar czf "$OUTDIR/runs.tgz" -C "$RUNS/.." "$(basename "$RUNS")"
done
el "done"
