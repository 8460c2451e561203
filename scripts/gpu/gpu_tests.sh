#!/bin/bash
# The whole GPU test suite (`pytest -m gpu`) in one command on the GPU machine, from the repo root
# (carry .whl/: pydantic & co, xformers, FlashInfer, pytest-xdist/execnet/pytest-timeout if the
# image lacks them; .fa2/: the prebuilt flash-attn tarball of shared/device/):
#
#   bash scripts/gpu/gpu_tests.sh [more pytest arguments]
#
# 1. setup (common.sh gpu_setup): the wheels and attnbench; ATTNBENCH_XFORMERS_TRITON_ONLY=1
#    (xformers' C++ extension does not load with torch 2.11: its Triton-only mode is what the
#    tests run, and they say so), the prebuilt flash-attn with ATTNBENCH_FA2_HDIM128_ONLY=1,
#    FLASHINFER_CUDA_ARCH_LIST=9.0;
# 2. FlashInfer's JIT modules for the tests' batches built once, in the background, by
#    WARM_PROCS processes (scripts/gpu/flashinfer_warmup.py --tests, at most WARM_S seconds),
#    while the other tests run: FlashInfer's tests go last (ATTNBENCH_FLASHINFER_LAST=1,
#    tests/conftest.py), a module still building when one needs it is waited for (its lock);
# 3. pytest -m gpu -n WORKERS (pytest-xdist) --timeout TEST_TIMEOUT_S (sized for a JIT build
#    waited for: 480), -rs (every skip reason), junit xml; cut by SIGINT at the budget (BUDGET_S,
#    default 575 from the start) so that the summary and the xml are still written;
# 4. the note: counts, failures and every skip reason with its count (skips.txt).
# DRY_RUN=1: no setup (tests/test_verify_all.py runs it on a CPU, where every GPU test skips).
# Leaves in $OUT: gpu_tests.log (all), pytest_gpu.xml, skips.txt, warmup.log.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET_S=${BUDGET_S:-575}
OUTDIR=${OUT:-/tmp/gpu_tests}; mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/gpu_tests.log") 2>&1
source scripts/gpu/common.sh
if [ "${DRY_RUN:-0}" = 1 ]; then el "DRY_RUN: no setup (a CPU: every GPU test skips)"; else gpu_setup; fi
python3 -c "import xdist, pytest_timeout" 2>/dev/null || echo "WARNING: pytest-xdist or pytest-timeout is missing (carry their wheels in .whl/): one process, no test timeout"
WPID=
if python3 -c "import flashinfer" >/dev/null 2>&1; then
  el "FlashInfer JIT warm-up for the tests' batches, in the background"
  python3 scripts/gpu/flashinfer_warmup.py --tests --procs "${WARM_PROCS:-4}" --budget-s "${WARM_S:-360}" \
    --log /tmp/flashinfer_warmup_builds.log > "$OUTDIR/warmup.log" 2>&1 &
  WPID=$!
  export ATTNBENCH_FLASHINFER_LAST=1
fi
PYARGS=(-m gpu -rs -q -p no:cacheprovider --junitxml "$OUTDIR/pytest_gpu.xml")
python3 -c "import xdist" 2>/dev/null && PYARGS+=(-n "${WORKERS:-6}")
python3 -c "import pytest_timeout" 2>/dev/null && PYARGS+=(--timeout "${TEST_TIMEOUT_S:-480}")
el "pytest ${PYARGS[*]} (cut at $(left) s)"
timeout -s INT -k 30 "$(left)" python3 -m pytest "${PYARGS[@]}" tests "$@"
rc=$?
el "pytest rc=$rc (124/130: cut at the budget)"
if [ -n "$WPID" ]; then
  kill -TERM "$WPID" 2>/dev/null; wait "$WPID" 2>/dev/null
  el "warm-up: $(grep '^flashinfer warm-up' "$OUTDIR/warmup.log" | tail -n 1)"
fi
if [ -s "$OUTDIR/pytest_gpu.xml" ]; then
  python3 - "$OUTDIR/pytest_gpu.xml" <<'PY' | tee "$OUTDIR/skips.txt"
import sys
sys.path.insert(0, "scripts/gpu")
import gpulib
print("\n".join(gpulib.junit_summary(sys.argv[1])))
PY
else
  echo "no junit xml (pytest did not get to its summary)" | tee "$OUTDIR/skips.txt"
fi
el "done; in $OUTDIR: gpu_tests.log, pytest_gpu.xml, skips.txt, warmup.log"
sleep 1
exit $rc
