#!/bin/bash
# Shared prefixes and what a tree costs, on the GPU, in one command (issue 17):
#   bash scripts/gpu/gpu_workloads.sh
# 1. runs attnbench/scenarios/shared-prefix-{decode,trees}-llama3-8b.yaml and tree-costs-llama3-8b.yaml
#    through every backend available here (FlashInfer takes its cascade route on the shared
#    cases), with --save-tensors;
# 2. runs the shared-prefix scenarios once more through FlashInfer with the cascade off
#    (ATTNBENCH_FLASHINFER_CASCADE=0), to compare the two routes;
# 3. checks every saved output against the float64 reference (scripts/gpu/check_saved.py);
# 4. prints, for the shared-prefix cases, each backend's time and % of the floor (the floor
#    counts shared pages once), and the tree-economics report (attnbench tree-costs --gain 1.3).
# Carry .whl/ as for scripts/gpu/gpu_bench.sh (FlashInfer, xformers, pydantic, ...); flash-attn
# joins if /tmp/fa2site holds a build. Outputs: $OUT (or /tmp/gpu_workloads).
set -u
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-/tmp/gpu_workloads}; mkdir -p "$OUTDIR"
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 ATTNBENCH_CACHE_DIR=/tmp/attnbench-cache ATTNBENCH_XFORMERS_TRITON_ONLY=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v -i warning
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=$PATH:/tmp/site/bin
fi
[ -d /tmp/fa2site/flash_attn ] && export PYTHONPATH=/tmp/fa2site:${PYTHONPATH:-} ATTNBENCH_FA2_HDIM128_ONLY=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUTDIR/pip_e.log" 2>&1 || cat "$OUTDIR/pip_e.log"
TIMING="--warmup-ms 10 --measure-ms 60"
SAVE=/tmp/gpu_workloads_tensors  # GBs of caches: kept off $OUT
rm -rf "$SAVE"  # a new run refuses a tensors folder holding the case files of a run folder that still exists
python3 -m attnbench backends
for s in shared-prefix-decode-llama3-8b shared-prefix-trees-llama3-8b tree-costs-llama3-8b; do
  el "$s: every backend"
  python3 -m attnbench run attnbench/scenarios/$s.yaml --out "$OUTDIR/$s" --save-tensors "$SAVE/$s" -q $TIMING \
    > "$OUTDIR/$s.log" 2>&1
  el "$s: rc=$?"
done
for s in shared-prefix-decode-llama3-8b shared-prefix-trees-llama3-8b; do
  el "$s: flashinfer without the cascade"
  ATTNBENCH_FLASHINFER_CASCADE=0 python3 -m attnbench run attnbench/scenarios/$s.yaml -b flashinfer \
    --out "$OUTDIR/$s-nocascade" -q $TIMING > "$OUTDIR/$s-nocascade.log" 2>&1
  el "$s (no cascade): rc=$?"
done
el "checking the saved tensors"
python3 scripts/gpu/check_saved.py "$SAVE"/* | tee "$OUTDIR/check_saved.log" | tail -n 40
el "shared prefixes: time and % of the floor (shared pages counted once)"
python3 - "$OUTDIR" <<'PY'
import sys, pathlib
from attnbench.store.runfolder import RunFolder
out = pathlib.Path(sys.argv[1])
print(f"{'scenario':32} {'case':20} {'backend':12} {'mode':22} {'median us':>10} {'floor us':>9} {'% floor':>8} status")
for d in sorted(out.glob("shared-prefix-*")):
    if not d.is_dir():
        continue
    for r in RunFolder.load(d).rows:
        tag = d.name.replace("-llama3-8b", "")
        print(f"{tag:32} {r.id.case_id:20} {r.id.backend:12} {r.id.mode[:22]:22} {r.timing.median_ms * 1e3:10.1f} "
              f"{r.roofline.floor_ms * 1e3:9.1f} {r.roofline.pct_of_ceiling:8.1f} {r.status.value} {r.reason[:60]}")
PY
el "tree economics"
python3 -m attnbench tree-costs "$OUTDIR/tree-costs-llama3-8b" --gain 1.3 --format markdown | tee "$OUTDIR/tree-costs.md"
el "done"
