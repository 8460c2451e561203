#!/usr/bin/env bash
# The project's CPU regression gate: the submitted code against its base commit, both measured
# here, in this job, in turns (`attnbench compare commits`), on attnbench/scenarios/ci-gate.yaml.
# No stored numbers decide: a baseline from another host (another CPU model, another load) said
# "regressed 1.5x" of unchanged code, so every machine now compares the two commits itself.
#
#   scripts/ci/ci_gate.sh [ARGS]     # working tree vs HEAD~1, every case listed (ARGS go to `compare commits`);
#                                    # exit 1 on a regression or a broken case, 2 on bad input
#   CI_GATE_BASE=REV                 # compare against REV instead (e.g. origin/main in a PR job)
#   scripts/ci/gate_rates.sh [AA] [SLOW]   # measure this gate's false-alarm rate and power here
#
# Why these settings (docs/ci.md has the method and the measured rates):
# - One intra-op thread (OMP_NUM_THREADS=1), each call timed by the CPU time of the thread doing
#   the work (method cpu-thread): time the scheduler gives to other processes does not count.
# - Both sides run the same scenario text (head's), 20 timing rounds each, one process per round,
#   base and head alternating (ABBA): a slow spell of the machine hits both, and a process's own
#   luck (memory placement) is one round among 20, not a whole side. Round k of head is judged
#   against round k of base (paired signed ranks).
# - --max-slowdown 20% at 99% confidence; one attempt, no retry.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
BASE=${CI_GATE_BASE:-HEAD~1}
if ! git rev-parse --verify --quiet "$BASE^{commit}" >/dev/null; then
    echo "ci-gate: no commit $BASE to compare against (a first commit, or a shallow clone: fetch more history," \
         "or set CI_GATE_BASE)" >&2
    exit 2
fi
rc=0
attnbench compare commits attnbench/scenarios/ci-gate.yaml --base "$BASE" --device cpu \
    --max-slowdown 20% --min-delta-us 2 --confidence 99% --all "$@" || rc=$?
echo "ci-gate: $([[ $rc -eq 0 ]] && echo pass || echo "FAIL (exit $rc)") against $BASE ($(git rev-parse --short "$BASE"))"
exit "$rc"
