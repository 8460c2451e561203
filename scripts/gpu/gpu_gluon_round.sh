#!/bin/bash
# Issue 33's Gluon prefill rounds in one device call (docs/triton_notes.md, "Prefill round 5"), from the
# repo root (carry .whl):
#
#   bash scripts/gpu/gpu_gluon_round.sh
#
# 1. the Gluon kernel's GPU tests (tests/test_gluon_prefill_gpu.py: every launch shape against the reference);
# 2. attnbench rows of the 4 causal 1k prefills at page 256 (context 0 and 3k): sdpa, the shipped triton and
#    the Gluon variants of scripts/dev/triton_variants.py (VARIANTS, default below), with the summary table.
# Output in $OUT: gluon_tests.log, gluon_run.log, the run folder gl/ and summary.txt.
set -u
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-/tmp/gluon_round}; mkdir -p "$OUTDIR"
source scripts/gpu/device_setup.sh
export TRITON_CACHE_DIR=/tmp/triton-cache
VARIANTS=${VARIANTS:-"triton-pf-gl triton-pf-gl-d1 triton-pf-gl-item"}
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
timeout "${TEST_S:-240}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gluon_prefill_gpu.py \
  > "$OUTDIR/gluon_tests.log" 2>&1
echo "gluon GPU tests rc=$?"; tail -n 5 "$OUTDIR/gluon_tests.log"
args=(-b sdpa -b triton); for v in $VARIANTS; do args+=(-b "$v"); done
timeout "${RUN_S:-200}" python3 -m attnbench run attnbench/scenarios/prefill-llama3-8b.yaml -k "page_size=256" "${args[@]}" \
  --backend-file scripts/dev/triton_variants.py --out "$OUTDIR/gl" -q --warmup-ms 10 --measure-ms 60 > "$OUTDIR/gluon_run.log" 2>&1
echo "run rc=$?"; grep -iE "error|skipped" "$OUTDIR/gluon_run.log" | head -n 5
python3 scripts/report/triton_summary.py /tmp/attnbench-cache/ceilings.json "$OUTDIR/gl" | tee "$OUTDIR/summary.txt"
