#!/bin/bash
# issue 21, the triton backend's attention variants on one GPU, in one device call:
#   source scripts/gpu/device_setup.sh; bash scripts/gpu/gpu_triton_variants.sh
# 1) every variant against the reference in bf16 and fp16 (scripts/gpu/gpu_triton_variants_check.py);
# 2) the targets, timed by attnbench's own timer (CUDA-graph replays, read flush, every row
#    checked against the reference): FP8 decode 8 x 16k vs the FP8 byte floor
#    (scripts/gpu/scenarios/triton-fp8-decode.yaml), a W=128 windowed decode from 4k to 32k
#    (triton-window-decode.yaml), 40-node trees on FP8 vs bf16 (triton-fp8-trees.yaml).
# Logs, run folders (tarred) and summary.txt land in $OUT. DECODE_EXTRA adds backends to the FP8
# decode run, e.g. DECODE_EXTRA="-b triton-bn32 --backend-file scripts/dev/triton_variants.py".
set -u
OUTDIR=${OUT:-/tmp/triton_variants}; RUNS=/tmp/triton_variants_runs; mkdir -p "$OUTDIR" "$RUNS"
export PYTHONUNBUFFERED=1 ATTNBENCH_CACHE_DIR=/tmp/attnbench-cache TRITON_CACHE_DIR=/tmp/triton-cache
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUTDIR/summary.txt"
el "correctness (bf16, fp16)"
python3 scripts/gpu/gpu_triton_variants_check.py --workers "${WORKERS:-8}" 2>&1 | tee "$OUTDIR/check.txt" | grep -v "^ok "
el "check rc=${PIPESTATUS[0]}"; grep "VARIANT CHECKS" "$OUTDIR/check.txt" >> "$OUTDIR/summary.txt"
for s in triton-fp8-decode triton-window-decode triton-fp8-trees; do
  el "$s"
  extra=""; [ "$s" = triton-fp8-decode ] && extra=${DECODE_EXTRA:-}  # e.g. tile variants, see below
  python3 -m attnbench run "scripts/gpu/scenarios/$s.yaml" -b triton $extra --out "$RUNS/$s" -q \
    --warmup-ms 10 --measure-ms 60 > "$RUNS/$s.log" 2>&1
  el "$s: rc=$?"; grep -E "Error|error|Traceback" "$RUNS/$s.log" | head -5
  python3 scripts/report/triton_summary.py /tmp/attnbench-cache/ceilings.json "$RUNS/$s" | tee -a "$OUTDIR/summary.txt"
done
python3 - "$RUNS" <<'PY' | tee -a "$OUTDIR/summary.txt"
# the three targets' verdicts from the run folders
import csv, json, sys
from pathlib import Path
runs = Path(sys.argv[1])
copy = next(iter(json.loads(Path("/tmp/attnbench-cache/ceilings.json").read_text()).values()))["copy_tbps"]
def rows(name):
    return [r for r in csv.DictReader(open(runs / name / "results.csv")) if r["backend"] == "triton" and r["status"] == "ok"]
for r in rows("triton-fp8-decode"):
    t = float(r["median_ms"]) * 1e3
    print(f"TARGET fp8 decode {r['case_id']}: {t:.1f} us, floor {int(r['bytes']) / copy / 1e6:.1f} us = "
          f"{100 * int(r['bytes']) / copy / 1e6 / t:.1f}% (target >= 85% for fp8)")
w = {r["case_id"]: float(r["median_ms"]) * 1e3 for r in rows("triton-window-decode")}
if w:
    print(f"TARGET window decode: {', '.join(f'{k} {v:.1f} us' for k, v in w.items())}; "
          f"max/min {max(w.values()) / min(w.values()):.3f} (target <= 1.10)")
tr = {r["case_id"]: float(r["median_ms"]) * 1e3 for r in rows("triton-fp8-trees")}
for ctx in ("4k", "16k"):
    b, f = tr.get(f"context={ctx},dtype=bfloat16"), tr.get(f"context={ctx},dtype=fp8-e4m3")
    if b and f:
        print(f"TARGET trees {ctx}: bf16 {b:.1f} us, fp8 {f:.1f} us, fp8/bf16 {f / b:.3f} (target <= 1.00)")
PY
tar czf "$OUTDIR/runs.tgz" -C "$RUNS/.." "$(basename "$RUNS")"
el done
