#!/bin/bash
# Issue 33's Gluon tree rounds in one device call (docs/triton_notes.md, "Tree round 1"), from the repo root
# (carry .whl):
#
#   bash scripts/gpu/gpu_gluon_tree_round.sh
#
# 1. the Gluon tree kernel's GPU tests (TESTS, default tests/test_gluon_tree_gpu.py: every launch shape against
#    the reference, FP8 caches included; TEST_K selects: on a fresh H200 the file compiled and ran 53 tests in
#    170 s, so its 152 take more than one call: TEST_K=pipe (68), then TEST_K="not pipe" (84));
# 2. attnbench rows of the 8 x 40-node trees (tree-verify-llama3-8b: 1k/4k/16k, pages 16 and 256) and of
#    gpu/tree-shapes: the default triton (the Gluon tree kernel since round 1) and the variants of
#    scripts/dev/triton_variants.py (VARIANTS, triton-tr-r0: the one-launch kernel;
#    default below), with the summary tables;
# 3. FP8 trees (tree round 2): gpu/fp8-tree40 (8 x 40 trees at 4k / 16k on a bf16 and an FP8 e4m3 cache) through
#    the default triton, triton-tr-r0 and FP8_VARIANTS (FP8_S seconds; 0 skips it; RUN_S=0 skips 2).
# Output in $OUT: tree_tests.log, tree_run.log, shapes_run.log, fp8_run.log, the run folders tr/, shapes/ and
# fp8/, summary.txt.
set -u
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-/tmp/gluon_tree_round}; mkdir -p "$OUTDIR"
source scripts/gpu/device_setup.sh
export TRITON_CACHE_DIR=/tmp/triton-cache
VARIANTS=${VARIANTS:-"triton-tr-r0"}
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
timeout "${TEST_S:-240}" python3 -m pytest -q -p no:cacheprovider --maxfail=6 -m gpu ${TESTS:-tests/test_gluon_tree_gpu.py} \
  ${TEST_N:+-n "$TEST_N"} ${TEST_K:+-k "$TEST_K"} \
  > "$OUTDIR/tree_tests.log" 2>&1
echo "gluon tree GPU tests rc=$?"; tail -n 25 "$OUTDIR/tree_tests.log"
if [ "${RUN_S:-200}" != 0 ]; then
  args=(-b triton); for v in $VARIANTS; do args+=(-b "$v"); done
  timeout "${RUN_S:-200}" python3 -m attnbench run attnbench/scenarios/tree-verify-llama3-8b.yaml ${ROWS_K:+-k "$ROWS_K"} \
    "${args[@]}" --backend-file scripts/dev/triton_variants.py --out "$OUTDIR/tr" -q --warmup-ms 10 --measure-ms 60 \
    > "$OUTDIR/tree_run.log" 2>&1
  echo "run rc=$?"; grep -iE "error|skipped|wrong|mismatch" "$OUTDIR/tree_run.log" | head -n 8
  python3 scripts/report/triton_summary.py /tmp/attnbench-cache/ceilings.json "$OUTDIR/tr" | tee "$OUTDIR/summary.txt"
  timeout "${SHAPES_S:-90}" python3 -m attnbench run attnbench/scenarios/gpu/tree-shapes.yaml -b triton -b triton-tr-r0 \
    --backend-file scripts/dev/triton_variants.py --out "$OUTDIR/shapes" -q --warmup-ms 10 --measure-ms 40 \
    > "$OUTDIR/shapes_run.log" 2>&1
  echo "shapes rc=$?"; grep -iE "error|skipped|wrong|mismatch" "$OUTDIR/shapes_run.log" | head -n 8
  python3 scripts/report/triton_summary.py /tmp/attnbench-cache/ceilings.json "$OUTDIR/shapes" | tee -a "$OUTDIR/summary.txt"
fi
if [ "${FP8_S:-120}" != 0 ]; then
  args=(-b triton -b triton-tr-r0); for v in ${FP8_VARIANTS:-}; do args+=(-b "$v"); done
  timeout "${FP8_S:-120}" python3 -m attnbench run attnbench/scenarios/gpu/fp8-tree40.yaml "${args[@]}" \
    --backend-file scripts/dev/triton_variants.py --out "$OUTDIR/fp8" -q --warmup-ms 10 --measure-ms 60 \
    > "$OUTDIR/fp8_run.log" 2>&1
  echo "fp8 rc=$?"; grep -iE "error|skipped|wrong|mismatch" "$OUTDIR/fp8_run.log" | head -n 8
  python3 scripts/report/triton_summary.py /tmp/attnbench-cache/ceilings.json "$OUTDIR/fp8" | tee -a "$OUTDIR/summary.txt"
fi
