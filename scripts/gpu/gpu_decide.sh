#!/bin/bash
# attnbench decide on the GPU (issue 36), from the repo root of the GPU machine (carry .whl/):
#
#   bash scripts/gpu/gpu_decide.sh
#   DECIDE_FLASHINFER=1 bash scripts/gpu/gpu_decide.sh   # FlashInfer too (its JIT: 30-250 s a kernel on a fresh machine)
#
# Runs the shipped trace scenarios (trace-eagle-serving: EAGLE tree verifies beside decodes and
# chunked prefills, llama3-8b heads, bf16; trace-synthetic-serving: chains of 3 drafts, run in
# bf16 here so that every GPU backend can take it) through the default GPU backends at page 16
# (sdpa, flex, triton; flash-attn and xformers need pages of 256 / 64; every row is checked
# against the float64 reference whether or not it is timed) with
# timing.rounds=$ROUNDS (8: intervals need 6 at 95%), then `attnbench decide` on each run and
# `attnbench report` on both. A run the budget cuts is stopped (SIGTERM: its finished rows stay)
# and decided over what it finished.
#
# Settings (environment): BUDGET_S (230: seconds from the start, setup included), ROUNDS (8),
# DECIDE_FLASHINFER (0), DECIDE_BACKENDS ("sdpa flex triton"; Flex compiles each new
# shape, a few seconds each), DECIDE_SCENARIOS (the two, in this order: the tree trace first),
# DECIDE_ARGS (more `attnbench run` arguments), DECIDE_WORK (where the run folders go: a new
# folder; default a fresh /tmp/decide_work.*). DRY_RUN=1: on the CPU, no
# setup, the same scenarios shrunk (4 query heads, head dim 16, float32; the shapes without a
# prefill), sdpa and flex (tests/test_gpu_decide_script.py runs it so). With FlashInfer, raise
# BUDGET_S (its JIT counts against it; a command may run 600 s).
# Exit: 0 when every scenario ran and was decided, 1 when a decide failed or a scenario was not run.
# Leaves in $OUT: decide-<scenario>.json (the engine's dispatch document), decide-<scenario>.md
# (the tables), decide-report.html, decide.log (all that was printed), decide_runs.tgz (run folders and logs).
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET_S=${BUDGET_S:-230}
OUTDIR=${OUT:-/tmp/gpu_decide}; WORK=${DECIDE_WORK:-$(mktemp -d /tmp/decide_work.XXXXXX)}
mkdir -p "$OUTDIR" "$WORK"
exec > >(tee "$OUTDIR/decide.log") 2>&1
source scripts/gpu/common.sh
SCENARIOS=${DECIDE_SCENARIOS:-trace-eagle-serving trace-synthetic-serving}
BACKENDS=(); for b in ${DECIDE_BACKENDS:-sdpa flex triton}; do BACKENDS+=(-b "$b"); done
RUN_ARGS=(--set "timing.rounds=${ROUNDS:-8}")
if [ "${DRY_RUN:-0}" = 1 ]; then
  el "DRY_RUN: on the CPU, the trace scenarios shrunk, sdpa and flex, no setup"
  BACKENDS=(-b sdpa -b flex)
  RUN_ARGS+=(--device cpu --set model.num_q_heads=4 --set model.num_kv_heads=2 --set model.head_dim=16
             --set model.dtype=float32 --set timing.measure_ms=4 --set timing.warmup_ms=1 -k "not prefill")
else
  gpu_setup
  [ "${DECIDE_FLASHINFER:-0}" = 1 ] && BACKENDS+=(-b flashinfer)
fi
el "backends: ${BACKENDS[*]}"
fail=0
for s in $SCENARIOS; do
  extra=()
  [ "$s" = trace-synthetic-serving ] && [ "${DRY_RUN:-0}" != 1 ] && extra=(--set model.dtype=bfloat16)
  t=$(left)
  if [ "$t" -lt 20 ]; then el "$s: not run, the budget is spent"; fail=1; continue; fi
  el "$s: run (at most ${t}s)"
  # shellcheck disable=SC2086
  timeout "$t" python3 -m attnbench run "$s" "${BACKENDS[@]}" "${RUN_ARGS[@]}" "${extra[@]}" ${DECIDE_ARGS:-} \
    --out "$WORK/$s" -q > "$WORK/$s.log" 2>&1
  el "$s: run rc=$? (0 all ok, 1 some row failed, 124/143 cut by the budget)"
  grep -E "│|fastest|slower" "$WORK/$s.log" | tail -n 40
  python3 -m attnbench decide "$WORK/$s" --export-json "$OUTDIR/decide-$s.json" --export-markdown "$OUTDIR/decide-$s.md"
  rc=$?; el "$s: decide rc=$rc"; [ "$rc" = 0 ] || fail=1
done
runs=$(ls -d "$WORK"/trace-*/ 2>/dev/null)
# shellcheck disable=SC2086
[ -n "$runs" ] && python3 -m attnbench report $runs -o "$OUTDIR/decide-report.html"
tar czf "$OUTDIR/decide_runs.tgz" -C "$WORK" . 2>/dev/null
el "done; in $OUTDIR: decide-*.json, decide-*.md, decide-report.html, decide.log, decide_runs.tgz"
sleep 1  # let tee write the last lines
exit $fail
