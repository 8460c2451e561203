#!/bin/bash
# Issue 33's MLA round 2 in one device call (docs/triton_notes.md, "the thirteenth session"), from the repo root
# (carry .whl):
#
#   bash scripts/gpu/gpu_gluon_mla_round.sh
#
# 1. the Gluon MLA kernel's GPU tests (TESTS, default tests/test_gluon_mla_gpu.py: 128/16/96/1 heads, odd key
#    counts, pages 8-256, forced splits, five builds, against the reference; TEST_K selects, TEST_S seconds);
# 2. attnbench rows of the decodes of scripts/gpu/scenarios/triton-mla-16k.yaml (8 x 16k, 128 and 16 heads, page
#    64; ROWS_K, default "decode"; RUN_S seconds, default 240, 0 skips it): the shipped triton and VARIANTS of
#    scripts/dev/triton_variants.py (default below), with the summary table.
# Output in $OUT: mla_tests.log, mla_run.log, the run folder mla/, summary.txt.
set -u
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-/tmp/gluon_mla_round}; mkdir -p "$OUTDIR"
source scripts/gpu/device_setup.sh
export PYTHONPATH=.:${PYTHONPATH:-} TRITON_CACHE_DIR=/tmp/triton-cache
VARIANTS=${VARIANTS:-"triton-mla-gluon triton-mla-gluon-epv triton-mla-gluon-n32s4 triton-mla-gluon-n32s4-ps triton-mla-gluon-n32s4-ps-epv triton-mla-gluon-w2"}
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
timeout "${TEST_S:-270}" python3 -m pytest -q -p no:cacheprovider --maxfail=6 -m gpu ${TESTS:-tests/test_gluon_mla_gpu.py} \
  ${TEST_K:+-k "$TEST_K"} > "$OUTDIR/mla_tests.log" 2>&1
echo "gluon MLA GPU tests rc=$?"; tail -n 25 "$OUTDIR/mla_tests.log"
if [ "${RUN_S:-240}" != 0 ]; then
  args=(-b triton); for v in $VARIANTS; do args+=(-b "$v"); done
  timeout "${RUN_S:-240}" python3 -m attnbench run scripts/gpu/scenarios/triton-mla-16k.yaml -k "${ROWS_K:-decode}" \
    "${args[@]}" --backend-file scripts/dev/triton_variants.py --out "$OUTDIR/mla" -q --warmup-ms 10 --measure-ms 60 \
    > "$OUTDIR/mla_run.log" 2>&1
  echo "run rc=$?"; grep -iE "error|skipped|wrong|mismatch|ran as" "$OUTDIR/mla_run.log" | head -n 12
  tail -n 20 "$OUTDIR/mla_run.log"
  python3 scripts/report/triton_summary.py /tmp/attnbench-cache/ceilings.json "$OUTDIR/mla" | tee "$OUTDIR/summary.txt"
fi
