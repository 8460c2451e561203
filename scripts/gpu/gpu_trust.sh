#!/usr/bin/env bash
# Issue 24's GPU checks in one command, on the GPU machine:
#   source scripts/gpu/device_setup.sh; bash scripts/gpu/gpu_trust.sh
# 1. its GPU tests first: stale CUDA graphs and the warm-L2 wait (tests/test_gpu_trust.py),
#    isolation blaming the backend that faulted (tests/test_gpu_faults.py, tests/test_gpu_harness.py);
# 2. one 8x4k decode (page 16) cold and warm L2, sdpa and triton: warm should not read slower
#    than cold (the host gap the GPU-side wait keeps out of the timed region);
# 3. the kept ceilings (attnbench ceilings), measured once per device and dtype;
# 4. pytest -m gpu -rf, the whole GPU suite (GPU_PYTEST_TIMEOUT seconds at most, if set).
# Logs under $OUT (default /tmp/gpu-trust).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-trust}
mkdir -p "$OUT"
t0=$SECONDS
python3 -m pytest -m gpu -rf -q -p no:cacheprovider tests/test_gpu_trust.py tests/test_gpu_faults.py \
  tests/test_gpu_harness.py >"$OUT/pytest-trust.log" 2>&1
echo "issue-24 GPU tests: exit $? ($((SECONDS - t0)) s)"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest-trust.log" | tail -12
for l2 in cold warm; do
  flag=(); [[ $l2 == warm ]] && flag=(--warm-l2)
  attnbench run decode-llama3-8b -b sdpa -b triton --set 'sweep={}' --set batch.0.context=4k "${flag[@]}" \
    --out "$OUT/decode-$l2" -q --format csv >"$OUT/decode-$l2.csv" 2>"$OUT/decode-$l2.err"
  python3 - "$OUT/decode-$l2.csv" "$l2" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    ms = float(r["median_ms"]) if r["median_ms"] else float("nan")
    print(f"decode 8x4k page 16 {sys.argv[2]:4s} {r['backend']:7s} {r['status']:8s} median {ms * 1e3:7.1f} us "
          f"{r['timing_method']} {r['reason'][:100]}")
PY
done
attnbench ceilings 2>&1 | tail -6
t1=$SECONDS
if [[ -n "${GPU_PYTEST_TIMEOUT:-}" ]]; then
  timeout "$GPU_PYTEST_TIMEOUT" python3 -m pytest -m gpu -rf -q -p no:cacheprovider >"$OUT/pytest-gpu.log" 2>&1
else
  python3 -m pytest -m gpu -rf -q -p no:cacheprovider >"$OUT/pytest-gpu.log" 2>&1
fi
echo "pytest -m gpu -rf (whole): exit $? ($((SECONDS - t1)) s; 124: stopped by GPU_PYTEST_TIMEOUT)"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest-gpu.log" | tail -25
