#!/bin/bash
# Nsight Compute on the kernels behind issue 33's targets (docs/triton_notes.md): one attnbench row
# per case under ncu, one launch of the named kernel profiled (cold L2: ncu flushes the caches
# before each replay pass, as attnbench's timer flushes before each timed call), then one table of
# the counters that say which limit a kernel is at (scripts/gpu/ncu_table.py). From the repo root:
#
#   bash scripts/gpu/gpu_triton_ncu.sh [CASE ...]
#
# CASE: "LABEL|SCENARIO|ROWS|BACKEND|KERNEL_REGEX" (SCENARIO as gpu_triton_round.sh takes it, ROWS
# an attnbench -k expression picking one row, BACKEND a shipped backend or a variant of
# scripts/dev/triton_variants.py); none given: the default list below. Output in $OUT:
# ncu_raw.tgz (each case's report, raw CSV and log) and ncu_table.txt. Settings: NCU_SKIP (launches of
# the kernel skipped before the profiled one: 3, past the compile and the first calls), BUDGET_S
# (cases not started once it is spent are listed).
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET_S=${BUDGET_S:-400}
OUTDIR=${OUT:-/tmp/triton_ncu}; RAW=/tmp/triton_ncu_raw; mkdir -p "$OUTDIR" "$RAW"
source scripts/gpu/common.sh
[ -n "${ATTNBENCH_XFORMERS_TRITON_ONLY:-}" ] || gpu_setup
export PYTHONUNBUFFERED=1 ATTNBENCH_CACHE_DIR=/tmp/attnbench-cache TRITON_CACHE_DIR=/tmp/triton-cache
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
[ -n "$NCU" ] || { el "no ncu on this machine"; exit 2; }
MAIN="paged_attention_kernel|prefill_attention_kernel|prefill_gluon_kernel|tree_gluon_kernel|mla_attention_kernel|decode_gluon_kernel"
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(
  "fp8-decode-8x16k|gpu/fp8-decode-16k|fp8|triton|$MAIN"
  "fp8-decode-p64|scripts/gpu/scenarios/triton-fp8-decode-pages.yaml|page_size=64|triton|$MAIN"
  "fp8-decode-d64-p16|scripts/gpu/scenarios/triton-fp8-decode-d64.yaml|page_size=16|triton|$MAIN"
  "fp8-decode-d64-p64|scripts/gpu/scenarios/triton-fp8-decode-d64.yaml|page_size=64|triton|$MAIN"
  "bf16-decode-8x16k|gpu/fp8-decode-16k|bfloat16|triton|$MAIN"
  "tree-8x40-4k-p16|tree-verify-llama3-8b|context=4k and page_size=16|triton|$MAIN"
  "tree-8x40-16k-p256|tree-verify-llama3-8b|context=16k and page_size=256|triton|$MAIN"
  "fp8-tree-8x40-4k|gpu/fp8-tree40|context=4k and fp8|triton|$MAIN"
  "bf16-tree-8x40-16k-p16|gpu/fp8-tree40|context=16k and bfloat16|triton|$MAIN"
  "fp8-tree-8x40-16k-p16|gpu/fp8-tree40|context=16k and fp8|triton|$MAIN"
  "prefill-4x1k-p256|prefill-llama3-8b|context=0 and page_size=256|triton|$MAIN"
  "prefill-4x1k-p256-sdpa|prefill-llama3-8b|context=0 and page_size=256|sdpa|flash|attention|fmha"
  "mla-128h-decode-8x16k|scripts/gpu/scenarios/triton-mla-16k.yaml|decode and num_q_heads=128|triton|$MAIN"
)
SECTIONS=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
          --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats)
el "ncu: $NCU ($("$NCU" --version | tail -n 1)); ${#CASES[@]} cases"
for c in "${CASES[@]}"; do
  IFS='|' read -r label scen rows backend regex <<< "$c"
  regex=${c#*|*|*|*|}  # the regex may hold '|'
  if [ "$(left)" -lt 60 ]; then el "$label: not started (budget)"; continue; fi
  y="attnbench/scenarios/$scen.yaml"; [ -f "$scen" ] && y=$scen
  el "$label: $y -k '$rows' -b $backend, kernel ~ $regex"
  timeout "$(left)" "$NCU" --clock-control none --target-processes all --kernel-name "regex:$regex" \
    --launch-skip "${NCU_SKIP:-3}" --launch-count 1 "${SECTIONS[@]}" -f -o "$RAW/$label" \
    python3 -m attnbench run "$y" -b "$backend" -k "$rows" --backend-file scripts/dev/triton_variants.py \
      --no-graphs --warmup-ms 2 --measure-ms 5 -q \
      --out "$RAW/run-$label" > "$RAW/$label.log" 2>&1
  el "$label: rc=$?"
  grep -E "==ERROR==|==WARNING==|Error" "$RAW/$label.log" | head -n 3
  [ -f "$RAW/$label.ncu-rep" ] && "$NCU" --import "$RAW/$label.ncu-rep" --page raw --csv --print-units base \
    > "$RAW/$label.csv" 2>> "$RAW/$label.log"
  tar czf "$OUTDIR/ncu_raw.tgz" -C "$RAW" . 2>/dev/null
done
python3 scripts/gpu/ncu_table.py "$RAW"/*.csv | tee "$OUTDIR/ncu_table.txt"
el done
