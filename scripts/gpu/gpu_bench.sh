#!/bin/bash
# The full GPU benchmark behind docs/benchmarks.md: every shipped GPU scenario through every
# backend that can run on the machine, timed by attnbench itself.
#
#   bash scripts/gpu/gpu_bench.sh phase1   # starts the flash-attn build in the background, then
#                                      # sdpa, flex, triton, xformers (Triton-only opt-in)
#   bash scripts/gpu/gpu_bench.sh phase2   # once the build is done (same machine): flash-attn,
#                                      # and FlashInfer (timed with events: kept off a CPU busy
#                                      # with the build, since launch gaps would count)
# Carry .fa2/ (build_flash_attn.sh + sdist) and .whl/ (xformers, flashinfer and their
# dependencies, pydantic: scripts/gpu/device_setup.sh installs them). Run folders end up in $OUT/runs-<phase>.tgz.
# Then, on the development machine:
#   python3 scripts/report/make_benchmarks_doc.py RUN_DIRS... --command "..."
set -u
cd "$(dirname "$0")/../.."
PHASE=${1:-phase1}
OUTDIR=${OUT:-/tmp/gpu_bench}; mkdir -p "$OUTDIR/runs"
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
source scripts/gpu/device_setup.sh
export ATTNBENCH_XFORMERS_TRITON_ONLY=1
SCENARIOS="decode-llama3-8b tree-verify-llama3-8b tree-random-60-gqa8 mixed-llama3-8b prefill-llama3-8b"
TIMING="--warmup-ms 10 --measure-ms 60"

if [ "$PHASE" = phase1 ]; then
  if [ ! -e /tmp/fa2.done ] && ls .fa2/flash_attn-*.tar.gz >/dev/null 2>&1; then
    setsid bash .fa2/build_flash_attn.sh .fa2/flash_attn-*.tar.gz < /dev/null > /dev/null 2>&1 &
    el "flash-attn build started in the background"
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -m attnbench backends
  for s in $SCENARIOS; do
    el "$s: sdpa flex triton xformers"
    python3 -m attnbench run attnbench/scenarios/$s.yaml -b sdpa -b flex -b triton -b xformers \
      --out "$OUTDIR/runs/$s-a" -q $TIMING > "$OUTDIR/runs/$s-a.log" 2>&1
    el "$s: rc=$?"; tail -n 40 "$OUTDIR/runs/$s-a.log" | grep -E "│|\[[0-9]+\]"
  done
else
  for i in $(seq 1 60); do [ -e /tmp/fa2.done ] && break; sleep 5; done
  el "flash-attn build: $(tail -n 1 /tmp/fa2build.log 2>/dev/null)"
  export PYTHONPATH=/tmp/fa2site:${PYTHONPATH:-} ATTNBENCH_FA2_HDIM128_ONLY=1
  for s in $SCENARIOS; do
    el "$s: flash-attn flashinfer"
    python3 -m attnbench run attnbench/scenarios/$s.yaml -b flash-attn -b flashinfer \
      --out "$OUTDIR/runs/$s-b" -q $TIMING > "$OUTDIR/runs/$s-b.log" 2>&1
    el "$s: rc=$?"; tail -n 40 "$OUTDIR/runs/$s-b.log" | grep -E "│|\[[0-9]+\]"
  done
fi
tar czf "$OUTDIR/runs-$PHASE.tgz" -C "$OUTDIR" runs
el "done"
