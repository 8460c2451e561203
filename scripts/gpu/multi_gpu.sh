#!/bin/bash
# Several GPU jobs side by side on a machine of several GPUs, one job per GPU, spanning more than
# one device call (a call lasts at most 10 minutes; the jobs run in their own process session and
# go on between calls while the machine is held). From the repo root:
#
#   bash scripts/gpu/multi_gpu.sh start JOBS_FILE    # setup once, then job i on GPU i (background)
#   bash scripts/gpu/multi_gpu.sh wait SECONDS       # wait for every job, at most SECONDS; report
#
# JOBS_FILE: one job per line (blank lines and # comments skipped), a bash command run from the
# repo root with CUDA_VISIBLE_DEVICES=i, OUT=/tmp/mg/gI (its own output folder) and
# VERIFY_WORK=/tmp/mg/wI; line i goes to GPU i (more lines than GPUs: refused). A job may chain
# several scripts; give each its own OUT under $OUT (OUT=$OUT/a bash ...).
# `wait` prints each job's state and the last lines of its log, and leaves in the call's $OUT one
# gI.tgz per job (its output folder and log; at most 8 files come back from a call) — also when
# the jobs are still running (a snapshot), so a lost machine keeps what the last call saw.
# Setup (the carried wheels, the prebuilt flash-attn: common.sh gpu_setup) runs once in `start`,
# so that the jobs' own setup finds it done (two installs side by side would race).
# When every job is done, `wait` also packs the FlashInfer modules they built (scripts/gpu/flashinfer_cache.py)
# into the call's $OUT as fijit-N.tar: put them in .fijit/ and carry it next time (common.sh gpu_setup
# restores them: no JIT build for those kernels). FI_CACHE_ANYWAY=1 (a session's last wait): pack them even
# while jobs still run.
# DRY_RUN=1 MG_GPUS=N MG_DIR=DIR: no setup, N GPUs assumed, DIR instead of /tmp/mg (tests/test_verify_all.py).
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET_S=100000
MG=${MG_DIR:-/tmp/mg}
source scripts/gpu/common.sh

start() {
  local file=$1 n i=0 line
  [ -f "$file" ] || { echo "multi_gpu: no jobs file $file"; exit 2; }
  [ -e "$MG/started" ] && { echo "multi_gpu: jobs already started on this machine ($MG/started)"; exit 2; }
  n=${MG_GPUS:-$(python3 -c "import torch; print(torch.cuda.device_count())")}
  if [ "${DRY_RUN:-0}" = 1 ]; then el "DRY_RUN: no setup"; else gpu_setup; fi
  mkdir -p "$MG"
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in ''|'#'*) continue ;; esac
    if [ "$i" -ge "$n" ]; then echo "multi_gpu: more jobs than the $n GPUs here: '$line' not started"; break; fi
    mkdir -p "$MG/g$i"
    printf '%s\n' "$line" > "$MG/g$i/job.txt"
    CUDA_VISIBLE_DEVICES=$i OUT=$MG/g$i VERIFY_WORK=$MG/w$i JOB="$line" RC=$MG/g$i.rc \
      setsid bash -c '(eval "$JOB"); echo $? > "$RC"' < /dev/null > "$MG/g$i/job.log" 2>&1 &
    el "GPU $i: $line"
    i=$((i + 1))
  done < "$file"
  echo "$i" > "$MG/started"
}

report() {
  local i n
  n=$(cat "$MG/started" 2>/dev/null || echo 0)
  for ((i = 0; i < n; i++)); do
    if [ -f "$MG/g$i.rc" ]; then echo "== GPU $i: done, rc=$(cat "$MG/g$i.rc")"; else echo "== GPU $i: running"; fi
    cat "$MG/g$i/job.txt"
    tail -n 15 "$MG/g$i/job.log"
    [ -n "${OUT:-}" ] && tar czf "$OUT/g$i.tgz" -C "$MG" "g$i" 2>/dev/null
  done
}

wait_jobs() {
  local limit=$1 n i all
  [ -e "$MG/started" ] || { echo "multi_gpu: no jobs started on this machine (a fresh machine?)"; exit 2; }
  n=$(cat "$MG/started")
  while :; do
    all=1
    for ((i = 0; i < n; i++)); do [ -f "$MG/g$i.rc" ] || all=0; done
    [ "$all" = 1 ] && break
    [ $(( $(date +%s) - T0 )) -ge "$limit" ] && break
    sleep 1
  done
  nvidia-smi --query-gpu=index,name,memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
  report
  if [ "$all" = 1 ]; then
    el "every job done"
    save_flashinfer_modules
  else
    el "jobs still running: call wait again on this machine"
    # the session's last call: pack what is built so far (complete modules only)
    if [ "${FI_CACHE_ANYWAY:-0}" = 1 ]; then save_flashinfer_modules; fi
  fi
  return 0  # jobs still running is a state, not a failure (the call's rc said 1 for it)
}

# FlashInfer's modules the jobs built, packed for the next session's .fijit/ (flashinfer_cache.py):
# once, when every job is done, into $MG/ficache, and copied into the call's $OUT beside the job
# tarballs (at most 8 files come back: the parts fill what the jobs leave). FI_CACHE_SAVE=0: none;
# FI_JIT_DIR: another module folder than the installed FlashInfer's (tests/test_verify_all.py).
save_flashinfer_modules() {
  [ "${FI_CACHE_SAVE:-1}" = 1 ] || return 0
  # this call's shell has not run gpu_setup: the installed wheels' PYTHONPATH (installs nothing: its markers)
  # and gpu_setup's FlashInfer arch (its JIT folder is named by it: .../90/cached_ops, not the card's 90a)
  [ "${DRY_RUN:-0}" = 1 ] || source scripts/gpu/device_setup.sh
  export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0}
  [ -d "$MG/ficache" ] || python3 scripts/gpu/flashinfer_cache.py save "$MG/ficache" --prefer ${FI_CACHE_PREFER:-pod} \
    ${FI_JIT_DIR:+--jit-dir "$FI_JIT_DIR"}
  [ -n "${OUT:-}" ] && ls "$MG"/ficache/fijit-*.tar >/dev/null 2>&1 \
    && cp $(ls "$MG"/ficache/fijit-*.tar | head -n $(( 8 - $(cat "$MG/started") ))) "$OUT"/ \
    && el "FlashInfer modules for .fijit/: $(cd "$OUT" && ls fijit-*.tar | tr '\n' ' ')"
  return 0
}

case "${1:-}" in
  start) start "${2:?jobs file}" ;;
  wait) wait_jobs "${2:-540}" ;;
  *) echo "usage: multi_gpu.sh start JOBS_FILE | wait SECONDS"; exit 2 ;;
esac
