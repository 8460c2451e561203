#!/bin/bash
# One device call of a triton tuning round (docs/triton_notes.md): attnbench runs of the given
# scenarios with sdpa, the shipped triton and the variants of scripts/dev/triton_variants.py.
#   bash scripts/gpu/gpu_triton_round.sh "SCENARIO:BACKEND,BACKEND,..." ...
# SCENARIO: a name under attnbench/scenarios/ (e.g. gpu/fp8-decode-16k) or a path to a .yaml.
# Run folders (tarred) and a summary land in $OUT (runs.tgz, summary.txt).
set -u
OUTDIR=${OUT:-/tmp/triton_round}; RUNS=/tmp/triton_round/runs; mkdir -p "$OUTDIR" "$RUNS"
export PYTHONUNBUFFERED=1 ATTNBENCH_CACHE_DIR=/tmp/attnbench-cache TRITON_CACHE_DIR=/tmp/triton-cache
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
for job in "$@"; do
  s=${job%%:*}; bs=${job#*:}; y="attnbench/scenarios/$s.yaml"; [ -f "$s" ] && y=$s; s=$(basename "$s" .yaml)
  # a run folder belongs to one run: the same scenario again (another group of backends) gets its own
  n=1; base=$s; while [ -e "$RUNS/$s" ]; do n=$((n + 1)); s=$base-$n; done
  args=(); for b in ${bs//,/ }; do args+=(-b "$b"); done
  el "$s: $bs"
  python3 -m attnbench run "$y" "${args[@]}" --backend-file scripts/dev/triton_variants.py \
    --out "$RUNS/$s" -q --warmup-ms 10 --measure-ms 60 > "$RUNS/$s.log" 2>&1
  el "$s: rc=$?"; grep -E "Error|error|Traceback" "$RUNS/$s.log" | head -5
  python3 scripts/report/triton_summary.py /tmp/attnbench-cache/ceilings.json "$RUNS/$s" | tee -a "$OUTDIR/summary.txt"
  tar czf "$OUTDIR/runs.tgz" -C "$RUNS/.." runs
done
el done
