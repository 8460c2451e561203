#!/usr/bin/env bash
# The project's CPU regression gate: run attnbench/scenarios/ci-gate.yaml on the CPU and check it
# against the committed baseline results/baselines/ci-cpu.json.
#
#   scripts/ci/ci_gate.sh [ARGS]     # run + check (ARGS go to `attnbench check`, e.g. --all);
#                                 # exit 1 on a regression or a check of nothing, 2 on bad input
#   scripts/ci/ci_gate.sh --refresh  # run + rewrite the baseline (commit the result)
#   scripts/ci/ci_gate.sh --calibrate [RUNS]  # measure this gate's false-alarm rate and power here
#   CI_GATE_EXECUTOR=dask         # run the cases on a local Dask cluster (default: local);
#   CI_GATE_WORKERS=2             # its worker count (needs pip install 'attnbench[dask]')
#
# Why these settings (docs/ci.md has the method and the measured rates):
# - One intra-op thread (attnbench's CPU default; OMP_NUM_THREADS=1 for anything else): each
#   call is timed by the CPU time of the one thread doing the work (method cpu-thread), so time
#   the scheduler gives to other processes mid-call does not count.
# - Not normalized: the only other CPU backends are the float64 reference (the oracle, which
#   `check` refuses as a normalizer: it made unchanged and faster sdpa look 1.2x slower) and
#   flex (whose rounds scatter more than sdpa's, refused too). The baseline must come from
#   this machine (--refresh here); the check refuses another device.
# - --max-slowdown 20% at 99% confidence over the scenario's 20 timing rounds: what unchanged
#   code wandered by between runs here stays below it. One attempt, no retry: docs/ci.md gives
#   the false-alarm rate and the power this has.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

SCENARIO=attnbench/scenarios/ci-gate.yaml
BASELINE=${CI_GATE_BASELINE:-results/baselines/ci-cpu.json}
OUT=${CI_GATE_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/attnbench-ci-gate.XXXXXX")}
GATE=(--max-slowdown 20% --min-delta-us 2 --confidence 99%)
EXECUTOR=(--executor "${CI_GATE_EXECUTOR:-local}")
if [[ "${CI_GATE_EXECUTOR:-local}" == dask ]]; then
    EXECUTOR+=(--workers "${CI_GATE_WORKERS:-2}")
fi

if [[ "${1:-}" == "--calibrate" ]]; then
    exec attnbench calibrate "$SCENARIO" --device cpu --runs "${2:-30}" --out "$OUT/calibrate" "${GATE[@]}"
fi

if ! attnbench run "$SCENARIO" --device cpu --quiet --out "$OUT/run" "${EXECUTOR[@]}" > "$OUT/run.log" 2>&1; then
    cat "$OUT/run.log"
    echo "ci-gate: the run itself failed (rows in error/mismatch); run folder: $OUT/run" >&2
    exit 1
fi
if [[ "${1:-}" == "--refresh" ]]; then
    attnbench baseline "$OUT/run" --to "$BASELINE"
    exit 0
fi
rc=0
attnbench check "$OUT/run" --baseline "$BASELINE" "${GATE[@]}" "$@" || rc=$?
echo "ci-gate: $([[ $rc -eq 0 ]] && echo pass || echo "FAIL (exit $rc)"); run folder $OUT/run"
exit "$rc"
