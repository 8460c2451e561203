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
# (unset: no baseline table), PLAN_SCENARIOS (the `attnbench run` part's scenarios).
# Leaves in $OUT: triton_plan.log (all that was printed), plan_runs.tgz (the run folders).
# Exit: 0 when every part ran, 1 otherwise.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET_S=${BUDGET_S:-170}
OUTDIR=${OUT:-/tmp/gpu_triton_plan}; WORK=$(mktemp -d /tmp/plan_work.XXXXXX)
mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/triton_plan.log") 2>&1
source scripts/gpu/common.sh
gpu_setup
fail=0
budget() { local t; t=$(left); [ "$t" -gt 0 ] && echo "$t" || echo 1; }  # timeout 0 would mean none
if [ -n "${PLAN_BASE:-}" ]; then
  rm -rf /tmp/plan_base && mkdir -p /tmp/plan_base
  if git archive "$PLAN_BASE" attnbench | tar -x -C /tmp/plan_base; then
    el "plan alone, every shipped case, attnbench at $PLAN_BASE (baseline)"
    PYTHONPATH=/tmp/plan_base timeout "$(budget)" python3 scripts/dev/triton_plan_time.py --device cuda --no-ops || fail=1
  else
    el "PLAN_BASE=$PLAN_BASE: git archive failed (no history here?), no baseline"; fail=1
  fi
fi
el "plan alone, every shipped case, this tree (us; ops/h2d: device operators and copies per plan)"
PYTHONPATH=$PWD timeout "$(budget)" python3 scripts/dev/triton_plan_time.py --device cuda || fail=1
for s in ${PLAN_SCENARIOS:-tree-verify-llama3-8b tree-eagle-g8 tree-random-60-gqa8 mla-tree-eagle-deepseek-v3 decode-llama3-8b tree-costs-llama3-8b}; do
  t=$(left)
  if [ "$t" -lt 15 ]; then el "$s: not run, the budget is spent"; fail=1; continue; fi
  el "$s: attnbench run -b triton (at most ${t}s)"
  timeout "$t" python3 -m attnbench run "$s" -b triton --warmup-ms 2 --measure-ms 10 --out "$WORK/$s" -q \
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
