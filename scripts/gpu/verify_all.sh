#!/bin/bash
# One command that verifies the GPU, on the GPU machine, from the repo root (carry .whl/: pydantic
# & co, xformers, FlashInfer and their dependencies; .fa2/: the prebuilt flash-attn tarball of
# shared/device/):
#
#   bash scripts/gpu/verify_all.sh
#   RESUME=1 bash scripts/gpu/verify_all.sh   # on the same warm machine: finish what the budget cut
#
# Every shipped scenario that fits one GPU (attnbench/scenarios/*.yaml and .../gpu/*.yaml, those
# pinned to device: cpu left out) through every installed backend and every route option of
# FlashInfer and Flex (flashinfer:route=..., flashinfer:cascade=off, flex:mask=dense), with
# --save-tensors, each saved output rechecked by scripts/gpu/check_saved.py; one table: backend
# (route) x scenario -> ok / mismatch / error / skipped (reasons) and the saved-output check.
# scripts/gpu/verify_all.py does the work (its docstring: lanes, workers, FlashInfer's JIT
# warm-up, the budget). xformers runs in its Triton-only mode (ATTNBENCH_XFORMERS_TRITON_ONLY=1),
# flash-attn is the head-dim-128 build (ATTNBENCH_FA2_HDIM128_ONLY=1); the table says so.
#
# Settings (environment): BUDGET_S (570: seconds from the start, setup included), WORKERS (4),
# WARM_S (300) and WARM_PROCS (3) for the FlashInfer warm-up, JOB_MAX_S (300), SAVE_MAX_GB (0.7),
# PICK (attnbench run -k EXPR for every run, e.g. "32k or bfloat16": finish a cut job on a fresh
# machine), VERIFY_ARGS (more verify_all.py arguments, split on spaces), HOST_COMMIT (the commit the caller sent: the table's
# header names it; the device copy's own git metadata can be older), VERIFY_WORK (/tmp/verify_work).
# Held-out batches: `python3 scripts/gpu/random_scenarios.py --n 30 --seed S --out /tmp/rand` then
# VERIFY_ARGS="--scenarios /tmp/rand/*.yaml" (two such runs side by side need their own OUT and VERIFY_WORK).
# DRY_RUN=1: on a CPU, no setup, two tiny scenarios
# (tests/test_verify_all.py runs it so).
# Leaves in $OUT: verify_table.md (the table), verify_rows.csv (every row), verify.log (all that
# was printed), verify_runs.tgz (run folders, per-job logs, check_saved records, warm-up log).
# Exit: 0 all ok; 1 failed rows or saved outputs off; 2 a scenario did not load (its message names it); 3 none
# failed but jobs were cut or not run.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET_S=${BUDGET_S:-570}
OUTDIR=${OUT:-/tmp/verify_all}; WORK=${VERIFY_WORK:-/tmp/verify_work}
mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/verify.log") 2>&1
source scripts/gpu/common.sh
ARGS=(--out "$OUTDIR" --work "$WORK" --t0 "$T0" --budget-s "$BUDGET_S" --workers "${WORKERS:-4}"
      --warm-s "${WARM_S:-300}" --warm-procs "${WARM_PROCS:-3}" --job-max-s "${JOB_MAX_S:-300}" --save-max-gb "${SAVE_MAX_GB:-0.7}")
[ "${RESUME:-0}" = 1 ] && ARGS+=(--resume)
[ -n "${PICK:-}" ] && ARGS+=(--pick "$PICK")
if [ "${DRY_RUN:-0}" = 1 ]; then
  el "DRY_RUN: on the CPU, two tiny scenarios, no setup"
  ARGS+=(--device cpu --scenarios attnbench/scenarios/quickstart.yaml attnbench/scenarios/mla-tiny.yaml)
else
  gpu_setup
fi
# shellcheck disable=SC2086
python3 scripts/gpu/verify_all.py "${ARGS[@]}" ${VERIFY_ARGS:-}
rc=$?
tar czf "$OUTDIR/verify_runs.tgz" -C "$WORK" runs logs checks 2>/dev/null
el "done (rc=$rc: 0 all ok, 1 failed rows or saved outputs off, 2 a scenario did not load, 3 jobs cut or not run); in $OUTDIR: verify_table.md, verify_rows.csv, verify.log, verify_runs.tgz"
sleep 1  # let tee write the last lines
exit $rc
