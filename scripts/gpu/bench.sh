#!/bin/bash
# The benchmark table of docs/benchmarks.md in one command, from the repo root of the GPU machine:
#
#   bash scripts/gpu/bench.sh --out "$OUT"
#
# Carry .whl/ (and .fa2/, .fijit/: scripts/gpu/device_setup.sh). Sets the machine up, builds
# FlashInfer's JIT modules for these batches first (flashinfer_warmup.py), so that no build runs
# beside a timed row, then one `attnbench run` per scenario with every backend on its default
# route, timed by attnbench itself; nothing else runs on the GPU meanwhile. Each run folder is
# packed into OUT/runs.tgz as soon as it ends, so a run cut short keeps every finished scenario.
# Last, the triton backend's plan (host work per engine step) alone on every shipped case
# (scripts/dev/triton_plan_time.py --device cuda: OUT/plan.txt, per-case medians in OUT/plan.json).
# Then, on the development machine, from the unpacked runs:
#   python3 scripts/report/make_benchmarks_doc.py runs/* --command "<this command>" --commit <sha>
#
# Flags:
#   --out DIR          bench.log and runs.tgz (default: $OUT, else ./gpu-bench)
#   --budget-s S       seconds for everything, setup included (570): a scenario still running at
#                      the end is interrupted and keeps its finished rows (its folder incomplete)
#   --scenarios "A B"  shipped scenario names (default: the five of docs/benchmarks.md)
#   --backends "A B"   backend specs (default: sdpa flex flex:kernel=flash triton xformers flash-attn
#                      flash-attn4 flashinfer)
#   --timing "..."     attnbench run timing flags (default: --warmup-ms 10 --measure-ms 60)
#   --work DIR         the run folders while they run (/tmp/attnbench-bench)
#   --no-plan          leave the plan table out
#   --resume           finish the scenarios an earlier call on this machine cut (same --work)
#   --dry-run          on the CPU, no setup (tests/test_validate_script.py)
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s)
OUTDIR=${OUT:-gpu-bench}; BUDGET_S=570; WORK=/tmp/attnbench-bench; RESUME=0; DRY=0; PLAN=1
SCEN="decode-llama3-8b tree-verify-llama3-8b tree-random-60-gqa8 mixed-llama3-8b prefill-llama3-8b"
BACKENDS="sdpa flex flex:kernel=flash triton xformers flash-attn flash-attn4 flashinfer"; TIMING="--warmup-ms 10 --measure-ms 60"
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUTDIR=$2; shift 2 ;;
    --budget-s) BUDGET_S=$2; shift 2 ;;
    --scenarios) SCEN=$2; shift 2 ;;
    --backends) BACKENDS=$2; shift 2 ;;
    --timing) TIMING=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --resume) RESUME=1; shift ;;
    --no-plan) PLAN=0; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench.sh: unknown flag '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
case "$BUDGET_S" in ''|*[!0-9]*) echo "bench.sh: --budget-s '$BUDGET_S': a whole number of seconds" >&2; exit 2 ;; esac
FILES=()
for s in $SCEN; do
  f=attnbench/scenarios/$s.yaml
  [ -f "$f" ] || { echo "bench.sh: --scenarios: no shipped scenario '$s' ($f does not exist)" >&2; exit 2; }
  FILES+=("$f")
done
mkdir -p "$OUTDIR" "$WORK"
OUTDIR=$(cd "$OUTDIR" && pwd)
exec > >(tee -a "$OUTDIR/bench.log") 2>&1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( T0 + BUDGET_S - 15 - $(date +%s) )); }
[ "$RESUME" = 1 ] || rm -rf "${WORK:?}"/*
if [ "$DRY" = 1 ]; then
  el "dry run: on the CPU, no setup"
  DEVICE=(--device cpu)
else
  source scripts/gpu/device_setup.sh
  DEVICE=()
  case " $BACKENDS " in
    *" flashinfer"*) el "FlashInfer JIT warm-up for these batches (at most $(( $(left) / 2 )) s)"
      python3 scripts/gpu/flashinfer_warmup.py --scenarios "${FILES[@]}" --specs flashinfer --procs 8 \
        --budget-s $(( $(left) / 2 )) | tail -n 3 ;;
  esac
fi
python3 -m attnbench backends
BS=(); for b in $BACKENDS; do BS+=(-b "$b"); done
rc=0
for s in $SCEN; do
  run=$WORK/$s; t=$(left)
  if [ "$RESUME" = 1 ] && python3 -c "import json, sys; sys.exit(json.load(open(sys.argv[1])).get('status') != 'complete')" "$run/manifest.json" 2>/dev/null; then
    el "$s: finished in an earlier call"; continue
  fi
  if [ "$t" -lt 20 ]; then el "$s: not run (out of time)"; rc=3; continue; fi
  if [ "$RESUME" = 1 ] && [ -f "$run/manifest.json" ]; then
    cmd=(python3 -m attnbench run --resume "$run" -q)
  else
    rm -rf "$run"
    # shellcheck disable=SC2086
    cmd=(python3 -m attnbench run "attnbench/scenarios/$s.yaml" "${BS[@]}" "${DEVICE[@]}" --out "$run" -q $TIMING)
  fi
  el "$s: ${cmd[*]}"
  # SIGINT at the budget: the run keeps its finished rows and marks its folder incomplete
  timeout -s INT -k 20 "$t" "${cmd[@]}" > "$WORK/$s.log" 2>&1
  r=$?; el "$s: rc=$r (124: cut at the budget)"
  [ "$r" -gt 1 ] && rc=3
  grep -E "│|\[[0-9]+\]" "$WORK/$s.log" | tail -n 60
  tar czf "$OUTDIR/runs.tgz" -C "$WORK" .
done
if [ "$PLAN" = 1 ]; then
  t=$(left); PLAN_ARGS=(--device cuda)
  [ "$DRY" = 1 ] && PLAN_ARGS=(--device cpu --runs 5 quickstart)
  if [ "$t" -lt 20 ]; then el "plan table: not run (out of time)"; rc=3
  else
    el "the triton plan alone on every shipped case"
    timeout -k 10 "$t" python3 scripts/dev/triton_plan_time.py "${PLAN_ARGS[@]}" --save "$OUTDIR/plan.json" \
      > "$OUTDIR/plan.txt" 2>&1 || { el "plan table: rc=$? (124: cut at the budget)"; rc=3; }
    tail -n 8 "$OUTDIR/plan.txt"
  fi
fi
el "done (rc=$rc: 0 everything ran, 3 something was cut or not run); in $OUTDIR: bench.log, runs.tgz, plan.txt"
sleep 1  # let tee write the last lines
exit $rc
