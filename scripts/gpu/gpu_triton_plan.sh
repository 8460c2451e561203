#!/bin/bash
# The triton backend's plan (host metadata per engine step) on the GPU machine (issue 33's last
# row: <= 200 us on every shipped case), from the repo root (carry .whl/):
#
#   bash scripts/gpu/gpu_triton_plan.sh
#
# 1. `scripts/dev/triton_plan_time.py --device cuda`: the plan alone on every shipped case
#    (cpu-sweep left out), batches on the GPU with uninitialized caches, attnbench's host timer
#    (synchronized), so each row holds the real host-to-device copy and allocations; ~20 s.
#    With a baseline, the same table first for the baseline's attnbench, then this tree's with
#    the baseline's per-case medians beside its own per scenario (median and max), measured
#    on the same machine in the same call. The baseline: PLAN_BASE=<directory holding an
#    attnbench/ package> (e.g. `git archive <rev> attnbench | tar -x -C .plan_base` before the
#    call; .plan_base/ is git-ignored: carry it), PLAN_BASE=<git revision> (needs git
#    history on the machine), or, unset, .plan_base/ when it holds attnbench/.
#    Before this tree's table, tests/test_plan_reuse.py's GPU test (the tables each plan sends, pageable
#    and pinned; ~10 s), and the torch calls of a plan timed alone (--primitives).
# 2. `attnbench run SCENARIO -b triton` with small budgets on the tree and decode scenarios of
#    the issue, and their plan_ms per row (what a results table reports), until BUDGET_S.
#
# PLAN_ROUNDS=N (default 1): N tables of this tree (and of the baseline, alternating), then
# scripts/dev/triton_plan_paired.py: per case the median over the rounds (max, count <= 200 us) and
# the paired ratio; per-case numbers in $OUT/plan_cases.txt (~15 s a table on the GPU host).
# Settings (environment): PROFILE_CASE (a case-name substring: cProfile of 200 of its plans in this
# tree's table, e.g. ragged-prefill/page_size=256, the large-N cases the GPU host read 3-5x the
# CPU's time on), BUDGET_S (170: seconds from the start, setup included), PLAN_BASE
# (above; unset and no .plan_base/: no baseline), PLAN_SCENARIOS (the `attnbench run` part's scenarios). DRY_RUN=1:
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
fail=0; DEV=cuda; TIMED=(); RUN_ARGS=(--warmup-ms 2 --measure-ms 10)
SCEN=${PLAN_SCENARIOS:-tree-verify-llama3-8b tree-eagle-g8 tree-random-60-gqa8 mla-tree-eagle-deepseek-v3 decode-llama3-8b tree-costs-llama3-8b}
if [ "${DRY_RUN:-0}" = 1 ]; then
  el "DRY_RUN: on the CPU, quickstart only, shrunk, no setup"
  DEV=cpu; TIMED=(attnbench/scenarios/quickstart.yaml); SCEN=quickstart; export TRITON_INTERPRET=1
  RUN_ARGS=(--device cpu --set model.num_q_heads=4 --set model.num_kv_heads=2 --set model.head_dim=32
            --set model.dtype=float32 --warmup-ms 1 --measure-ms 2)
else
  gpu_setup
fi
budget() { local t; t=$(left); [ "$t" -gt 0 ] && echo "$t" || echo 1; }  # timeout 0 would mean none
BASE_DIR=; CMP=()
[ -z "${PLAN_BASE:-}" ] && [ -d .plan_base/attnbench ] && PLAN_BASE=.plan_base
if [ -n "${PLAN_BASE:-}" ]; then
  if [ -d "$PLAN_BASE/attnbench" ]; then
    BASE_DIR=$(cd "$PLAN_BASE" && pwd)
  else
    rm -rf /tmp/plan_base && mkdir -p /tmp/plan_base
    git archive "$PLAN_BASE" attnbench | tar -x -C /tmp/plan_base && BASE_DIR=/tmp/plan_base \
      || { el "PLAN_BASE=$PLAN_BASE: neither a folder with attnbench/ nor a revision git can archive here"; fail=1; }
  fi
fi
if [ -n "$BASE_DIR" ]; then
  el "plan alone, every shipped case, the baseline's attnbench ($PLAN_BASE)"
  PYTHONPATH=$BASE_DIR${PYTHONPATH:+:$PYTHONPATH} timeout "$(budget)" python3 scripts/dev/triton_plan_time.py --device $DEV \
    --no-ops --save "$WORK/base.json" "${TIMED[@]}" && CMP=(--compare "$WORK/base.json") || fail=1
fi
if [ "$DEV" = cuda ]; then  # the tables each plan sends (pageable and pinned staging), checked before they are timed
  el "tests/test_plan_reuse.py -m gpu: the plan's tables on the device equal the reference"
  timeout "$(budget)" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_plan_reuse.py 2>&1 | tail -n 3
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
fi
el "plan alone, every shipped case, this tree (us; ops/h2d: device operators and copies per plan)"
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout "$(budget)" python3 scripts/dev/triton_plan_time.py --device $DEV \
  --primitives ${PROFILE_CASE:+--profile "$PROFILE_CASE"} --save "$WORK/this.json" ${CMP[@]+"${CMP[@]}"} "${TIMED[@]}" || fail=1
ROUNDS=${PLAN_ROUNDS:-1}
if [ "$ROUNDS" -gt 1 ]; then  # more tables, alternating with the baseline's: each case's median over the rounds
  el "plan alone, $ROUNDS rounds (this table and $((ROUNDS - 1)) more${BASE_DIR:+, each after one of the baseline}): per case the median over rounds"
  for r in $(seq 2 "$ROUNDS"); do
    [ -n "$BASE_DIR" ] && [ -f "$WORK/base.json" ] && { PYTHONPATH=$BASE_DIR${PYTHONPATH:+:$PYTHONPATH} timeout "$(budget)" \
      python3 scripts/dev/triton_plan_time.py --device $DEV --no-ops --save "$WORK/base$r.json" "${TIMED[@]}" > /dev/null || fail=1; }
    PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout "$(budget)" python3 scripts/dev/triton_plan_time.py --device $DEV \
      --no-ops --save "$WORK/this$r.json" "${TIMED[@]}" > /dev/null || fail=1
  done
  BEFORE=(); [ -n "$BASE_DIR" ] && [ -f "$WORK/base.json" ] && BEFORE=(--before "$WORK"/base.json "$WORK"/base[0-9]*.json)
  python3 scripts/dev/triton_plan_paired.py ${BEFORE[@]+"${BEFORE[@]}"} --after "$WORK"/this.json "$WORK"/this[0-9]*.json \
    --cases "$OUTDIR/plan_cases.txt" || fail=1
fi
if [ "$DEV" = cuda ]; then
  el "the same with pinned staging (ATTNBENCH_TRITON_PINNED_STAGING=1; off by default until timed here)"
  ATTNBENCH_TRITON_PINNED_STAGING=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout "$(budget)" \
    python3 scripts/dev/triton_plan_time.py --device $DEV --no-ops ${CMP[@]+"${CMP[@]}"} "${TIMED[@]}" || fail=1
fi
for s in $SCEN; do
  t=$(left)
  if [ "$t" -lt 15 ]; then el "$s: not run, the budget is spent"; fail=1; continue; fi
  el "$s: attnbench run -b triton (at most ${t}s)"
  d=$WORK/${s//\//-}  # gpu/tree-shapes: one folder, not a subfolder that does not exist
  timeout "$t" python3 -m attnbench run "$s" -b triton "${RUN_ARGS[@]}" --out "$d" -q > "$d.log" 2>&1
  rc=$?; [ "$rc" = 0 ] || { el "$s: rc=$rc (1 a row failed, 124 cut by the budget)"; tail -n 5 "$d.log"; fail=1; }
  [ -f "$d/results.csv" ] && python3 - "$d/results.csv" <<'EOF'
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
