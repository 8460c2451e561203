#!/bin/bash
# The triton backend's plan (host metadata per engine step) on the GPU machine (issue 33's last
# row: <= 200 us on every shipped case), from the repo root (carry .whl/):
#
#   bash scripts/gpu/gpu_triton_plan.sh
#
# 1. `scripts/dev/triton_plan_time.py --device cuda`: the plan alone on every shipped case
#    (cpu-sweep left out), batches on the GPU with uninitialized caches, attnbench's host timer
#    (synchronized), so each row holds the real host-to-device copy and allocations; ~20 s.
#    With PLAN_BASE=<git revision> (needs git history on the machine) the same table first for
#    that revision's attnbench (exported to /tmp/plan_base), to compare on the same machine.
# 2. `attnbench run SCENARIO -b triton` with small budgets on the tree and decode scenarios of
#    the issue, and their plan_ms per row (what a results table reports), until BUDGET_S.
#
# Settings (environment): BUDGET_S (170: seconds from the start, setup included), PLAN_BASE
# (unset: no baseline table), PLAN_SCENARIOS (the `attnbench run` part's scenarios). DRY_RUN=1:
# on the CPU, no setup, the timing on quickstart and the runs of quickstart under the Triton
# interpreter, shrunk (tests/test_gpu_scripts.py runs it so).
# Leaves in $OUT: triton_plan.log (all that was printed), plan_runs.tgz (the run folders).
# Exit: 0 when every part ran, 1 otherwise.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET_S=${BUDGET_S:-170}
OUTDIR=${OUT:-/tmp/gpu_triton_plan}; WORK=$(mktemp -d /tmp/plan_work.XXXXXX)
mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/triton_plan.log") 2>&1
source scripts/gpu/common.sh
DEV=cuda; TIMED=(); RUN_ARGS=(--warmup-ms 2 --measure-ms 10)
SCEN=${PLAN_SCENARIOS:-tree-verify-llama3-8b tree-eagle-g8 tree-random-60-gqa8 mla-tree-eagle-deepseek-v3 decode-llama3-8b tree-costs-llama3-8b}
if [ "${DRY_RUN:-0}" = 1 ]; then
  el "DRY_RUN: on the CPU, quickstart only, shrunk, no setup"
  DEV=cpu; TIMED=(attnbench/scenarios/quickstart.yaml); SCEN=quickstart; export TRITON_INTERPRET=1
  RUN_ARGS=(--device cpu --set model.num_q_heads=4 --set model.num_kv_heads=2 --set model.head_dim=32
            --set model.dtype=float32 --warmup-ms 1 --measure-ms 2)
else
  gpu_setup
fi
fail=0
budget() { local t; t=$(left); [ "$t" -gt 0 ] && echo "$t" || echo 1; }  # timeout 0 would mean none
if [ -n "${PLAN_BASE:-}" ]; then
  rm -rf /tmp/plan_base && mkdir -p /tmp/plan_base
  if git archive "$PLAN_BASE" attnbench | tar -x -C /tmp/plan_base; then
    el "plan alone, every shipped case, attnbench at $PLAN_BASE (baseline)"
    PYTHONPATH=/tmp/plan_base${PYTHONPATH:+:$PYTHONPATH} timeout "$(budget)" python3 scripts/dev/triton_plan_time.py --device $DEV --no-ops "${TIMED[@]}" || fail=1
  else
    el "PLAN_BASE=$PLAN_BASE: git archive failed (no history here?), no baseline"; fail=1
  fi
fi
el "plan alone, every shipped case, this tree (us; ops/h2d: device operators and copies per plan)"
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout "$(budget)" python3 scripts/dev/triton_plan_time.py --device $DEV "${TIMED[@]}" || fail=1
for s in $SCEN; do
  t=$(left)
  if [ "$t" -lt 15 ]; then el "$s: not run, the budget is spent"; fail=1; continue; fi
  el "$s: attnbench run -b triton (at most ${t}s)"
  timeout "$t" python3 -m attnbench run "$s" -b triton "${RUN_ARGS[@]}" --out "$WORK/$s" -q \
    > "$WORK/$s.log" 2>&1
  rc=$?; [ "$rc" = 0 ] || { el "$s: rc=$rc (1 a row failed, 124 cut by the budget)"; tail -n 5 "$WORK/$s.log"; fail=1; }
  [ -f "$WORK/$s/results.csv" ] && python3 - "$WORK/$s/results.csv" <<'EOF'
import sys
import pandas as pd
d = pd.read_csv(sys.argv[1])
d = d[d.backend == "triton"]
for r in d.itertuples():
    print(f"  {r.scenario}/{r.case_id:52s} plan {r.plan_ms * 1e3:7.1f} us  kernel {r.median_ms * 1e3:8.1f} us  {r.status}")
EOF
done
tar czf "$OUTDIR/plan_runs.tgz" -C "$WORK" . 2>/dev/null
el "done; in $OUTDIR: triton_plan.log, plan_runs.tgz"
sleep 1  # let tee write the last lines
exit $fail
