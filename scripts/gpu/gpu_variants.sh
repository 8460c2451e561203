#!/bin/bash
# Attention variants on the GPU (issue 21), in one command:
#   source scripts/gpu/device_setup.sh; bash scripts/gpu/gpu_variants.sh          (carry .whl, .whl2)
# 1. pytest -m gpu tests/test_variants_gpu.py: every installed backend, each feature alone and
#    all together (FP8 e4m3/e5m2, per-head scales, HND, window, sinks, soft-cap, ALiBi,
#    non-causal), head dims 64/128/256, against the float64 reference on CUDA (skips = reasons);
# 2. runs the shipped variant scenarios through every backend available here;
# 3. re-runs each scenario's smallest cases with --save-tensors and checks every saved output
#    with scripts/gpu/check_saved.py (its own float64 code, from the saved file alone);
# 4. prints per row: status, mode, kernel time, byte/FLOP floor, % of floor, error or reason.
# Env: OUT (output folder), BACKENDS (e.g. "reference sdpa": -b for each; default every
# available backend), SCENARIOS (names; default all below), FAST=1 (fewer cases, short timing),
# PYTEST=0 (skip step 1). The whole of it may take longer than one 600 s device call: split it
# (PYTEST=1 SCENARIOS=" " for the tests alone, then PYTEST=0 with a few scenarios a call).
set -u
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-/tmp/gpu_variants}; mkdir -p "$OUTDIR"
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 ATTNBENCH_CACHE_DIR=${ATTNBENCH_CACHE_DIR:-/tmp/attnbench-cache}
SCENARIOS=${SCENARIOS:-"variants-cpu llama3-70b-tp8-fp8-decode tree-eagle-fp8 gpt-oss-sliding-layer gpt-oss-full-layer gemma2-local-layer head-dim-sweep"}
BFLAGS=""; for b in ${BACKENDS:-}; do BFLAGS="$BFLAGS -b $b"; done
TIMING="--warmup-ms 10 --measure-ms 60"
PYSEL=()
if [ "${FAST:-0}" = 1 ]; then
  TIMING="--warmup-ms 5 --measure-ms 20"
  PYSEL=(-k "(sdpa or reference) and (128 or 64)")
fi
small() { case $1 in variants-cpu) echo window;; head-dim-sweep) echo head_dim;; llama3-70b*) echo 16k;; *) echo "context=4k or context=2k";; esac; }
SAVE=/tmp/gpu_variants_tensors  # GBs of caches: kept off $OUT
rm -rf "$SAVE"
python3 -m attnbench backends
if [ "${PYTEST:-1}" = 1 ]; then
  el "pytest -m gpu tests/test_variants_gpu.py"
  python3 -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_variants_gpu.py "${PYSEL[@]}" > "$OUTDIR/pytest_gpu.log" 2>&1
  el "pytest rc=$?"; grep -E "passed|failed" "$OUTDIR/pytest_gpu.log" | tail -n 3; grep -E "^FAILED" "$OUTDIR/pytest_gpu.log" | head -n 20
fi
for s in $SCENARIOS; do
  el "$s: run"
  python3 -m attnbench run "$s" $BFLAGS --out "$OUTDIR/$s" -q $TIMING > "$OUTDIR/$s.log" 2>&1
  el "$s: rc=$?"
  # the smallest cases again with their tensors saved
  python3 -m attnbench run "$s" $BFLAGS --out "$OUTDIR/$s-saved" -q --warmup-ms 1 --measure-ms 2 \
    -k "$(small "$s")" --save-tensors "$SAVE/$s" > "$OUTDIR/$s-saved.log" 2>&1
  el "$s (saved): rc=$?"
done
el "independent check of the saved outputs"
python3 scripts/gpu/check_saved.py "$SAVE"/* > "$OUTDIR/check_saved.log" 2>&1; echo "check_saved rc=$?"
tail -n 1 "$OUTDIR/check_saved.log"; grep OFF "$OUTDIR/check_saved.log" | head -n 20
el "rows"
python3 - "$OUTDIR" $SCENARIOS <<'PY'
import sys, pathlib
from attnbench.store.runfolder import RunFolder
out = pathlib.Path(sys.argv[1])
print(f"{'scenario':26} {'case':32} {'backend':11} {'status':8} {'mode':14} {'us':>9} {'floor':>8} {'%fl':>5} {'err':>8} reason")
for s in sys.argv[2:]:
    d = out / s
    if not (d / "rows.jsonl").exists():
        print(f"{s}: no run folder"); continue
    for r in RunFolder.load(d).rows:
        us = r.timing.median_ms * 1e3
        print(f"{s[:26]:26} {r.id.case_id[:32]:32} {r.id.backend[:11]:11} {r.status.value:8} {r.id.mode[:14]:14} {us:9.1f} "
              f"{r.roofline.floor_ms * 1e3:8.1f} {r.roofline.pct_of_ceiling:5.0f} {r.correctness.rel_err:8.1e} {r.reason[:70]}")
PY
el "done"
