#!/bin/bash
# MLA on the GPU (issue 23), one command (carry .whl and .whl2; about 4-5 minutes on an H100):
#   source scripts/gpu/device_setup.sh; bash scripts/gpu/gpu_mla.sh
# 1. builds FlashInfer's MLA modules (fa2, fa3) in the background (FLASHINFER_CUDA_ARCH_LIST=9.0);
# 2. runs the shipped MLA scenarios through sdpa and triton (every row checked against the
#    float64 reference): DeepSeek-V3 decode (16/128 heads, 4k-32k), EAGLE trees, MTP chains at
#    16k, the mixed step; then through flashinfer on its fa2 and fa3 routes; last, compiled flex
#    (under --isolate) on the tiny scenario and one EAGLE tree case;
# 3. the tiny scenario in bfloat16 and the mixed step with --save-tensors, checked by
#    scripts/gpu/check_saved.py (its own float64 code of docs/semantics.md "MLA");
# 4. triton MLA configs on the targets (8 x 16k decode, 16 and 128 heads; an EAGLE tree), by
#    attnbench's timer (scripts/gpu/gpu_mla.py sweep);
# 5. a summary: every row (time, % of the latent byte floor, % of the roofline, error), and the
#    targets (triton vs the fastest other backend per case).
# Outputs: $OUT (or /tmp/gpu_mla).
set -u
cd "$(dirname "$0")/../..
OUTDIR=${OUT:-/tmp/gpu_mla}; mkdir -p "$OUTDIR"
SAVE=/tmp/gpu_mla_tensors; rm -rf "$SAVE"
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
export FLASHINFER_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1 ATTNBENCH_CACHE_DIR=${ATTNBENCH_CACHE_DIR:-/tmp/attnbench-cache}
T="--warmup-ms 5 --measure-ms 40 -q"
run() { local name=$1; shift; python3 -m attnbench run "$@" --out "$OUTDIR/$name" $T > "$OUTDIR/$name.log" 2>&1; el "$name: rc=$?"; }
python3 scripts/gpu/gpu_mla.py jit > "$OUTDIR/jit.log" 2>&1 &
JIT=$!
run decode mla-decode-deepseek-v3 -b sdpa -b triton
run trees mla-tree-eagle-deepseek-v3 -b sdpa -b triton
run mtp mla-mtp-deepseek-v3 --set batch.0.context=16k -b sdpa -b triton
run mixed mla-mixed-deepseek-v3 -b reference -b sdpa -b triton --save-tensors "$SAVE/mixed"
python3 scripts/gpu/gpu_mla.py sweep > "$OUTDIR/sweep.log" 2>&1; el "sweep: rc=$?"
wait $JIT; el "flashinfer jit:"; cat "$OUTDIR/jit.log"
FI="-b flashinfer:route=fa2 -b flashinfer:route=fa3"
run fi-decode mla-decode-deepseek-v3 $FI
run fi-mtp mla-mtp-deepseek-v3 --set batch.0.context=16k $FI
run fi-mixed mla-mixed-deepseek-v3 $FI --save-tensors "$SAVE/fi-mixed"
run fi-trees mla-tree-eagle-deepseek-v3 --set batch.0.context=4k $FI
run fi-tiny mla-tiny --set model.dtype=bfloat16 -b reference -b sdpa -b triton $FI --save-tensors "$SAVE/tiny"
el "check_saved"
python3 scripts/gpu/check_saved.py "$SAVE"/* > "$OUTDIR/check_saved.log" 2>&1; el "check_saved: rc=$?"; tail -n 8 "$OUTDIR/check_saved.log"
el "sweep"; grep -v -i "leak" "$OUTDIR/sweep.log" | grep sweep | head -n 40
summary() { python3 scripts/gpu/gpu_mla.py summary $(ls -d "$OUTDIR"/*/ | sort) 2>&1 | grep -v -i leak > "$OUTDIR/summary.txt"
  sed -n '/^targets/,$p' "$OUTDIR/summary.txt"; }
el "summary (every row: $OUTDIR/summary.txt)"; summary
# compiled flex last (its compiles are slow): the tiny scenario and one EAGLE tree case
run flex-tiny mla-tiny --set model.dtype=bfloat16 -b flex --isolate --timeout 90
run flex-tree mla-tree-eagle-deepseek-v3 --set batch.0.context=4k --set 'batch.0.tree={preset: eagle-mc_sim_7b_63}' \
  -b flex --isolate --timeout 90
el "summary with flex"; summary
grep -h "flex" "$OUTDIR/summary.txt" | head -n 6
el "done"
