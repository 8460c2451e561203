#!/bin/bash
# The whole GPU validation in one command, on the GPU machine, from the repo root:
#
#   bash scripts/gpu/gpu_validate.sh          # carry .whl/ (pydantic & co; xformers, FlashInfer
#                                         # and their dependencies if those are to be validated)
#
# 1. installs the carried wheels and attnbench (scripts/gpu/common.sh gpu_setup); flash-attn: the
#    prebuilt tarball if .fa2/ carries one (shared/device/), else the head-dim-128 build from the
#    sdist in .fa2/, in the background (about 6 minutes);
# 2. runs scripts/gpu/gpu_checks.py alone on the GPU (the timer against the profiler, repeatability,
#    cold vs warm L2, the L2 flush kinds, decode bandwidth against the measured ceiling);
# 3. then, side by side: `pytest -m gpu`, and every shipped scenario (attnbench/scenarios/*.yaml and
#    attnbench/scenarios/gpu/*.yaml) through every backend with `attnbench run` (no --save-tensors), in
#    lanes of backends that compile separately (reference+sdpa+triton | flex | xformers+flashinfer;
#    flash-attn with them when prebuilt, else last if its build finished). The lanes share the
#    GPU: their statuses are the point, not their times (docs/benchmarks.md comes from
#    scripts/gpu/gpu_bench.sh). scripts/gpu/verify_all.sh does the same for every route option,
#    with --save-tensors rechecked; scripts/gpu/gpu_tests.sh runs pytest -m gpu alone;
# 4. prints a summary (the status table of scripts/gpu/gpulib.py per backend and scenario, every
#    error/mismatch row with its reason) and leaves in $OUT: summary.txt, gpu_validate.log (everything) and
#    gpu_validate.tgz (run folders, per-step logs, the checks' rows and profiles).
# Every step is bounded so that the whole stays under BUDGET_S (default 570) seconds; a lane
# cut short leaves an incomplete run folder, and the summary says which. CHECKS_S (default 240)
# bounds the checks; CHECKS_S=0 skips them, leaving all the time to pytest and the lanes.
set -u
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-/tmp/gpu_validate}
WORK=/tmp/gpu_validate_work
rm -rf "$WORK"; mkdir -p "$OUTDIR" "$WORK/runs" "$WORK/logs" "$WORK/checks"
exec > >(tee "$OUTDIR/gpu_validate.log") 2>&1
T0=$(date +%s); BUDGET_S=${BUDGET_S:-570}
source scripts/gpu/common.sh

if ! ls .fa2/flash-attn-*.tar.xz >/dev/null 2>&1 && [ ! -e /tmp/fa2.done ] && ls .fa2/flash_attn-*.tar.gz >/dev/null 2>&1; then
  setsid bash .fa2/build_flash_attn.sh .fa2/flash_attn-*.tar.gz < /dev/null > /dev/null 2>&1 &
  el "flash-attn build started in the background"
fi
gpu_setup
FA2_LANE=; [ -n "${ATTNBENCH_FA2_HDIM128_ONLY:-}" ] && [ -d /tmp/fa2site/flash_attn ] && FA2_LANE=flash-attn
python3 -m attnbench backends

if [ "${CHECKS_S:-240}" -gt 0 ]; then  # CHECKS_S=0: skip the checks (all the time to the lanes)
  el "gpu_checks.py (alone on the GPU)"
  timeout "${CHECKS_S:-240}" python3 scripts/gpu/gpu_checks.py --out "$WORK/checks" > "$WORK/logs/gpu_checks.log" 2>&1
  echo "gpu_checks rc=$? (124: cut at ${CHECKS_S:-240} s)" | tee -a "$WORK/logs/gpu_checks.log"
  grep -E "^(verdict|gpu_checks)" "$WORK/logs/gpu_checks.log"
else
  echo "gpu_checks skipped (CHECKS_S=0)" > "$WORK/logs/gpu_checks.log"
fi

lane() {  # lane NAME BACKEND...: every scenario through these backends, one after another
  local name=$1; shift
  local bs=(); for b in "$@"; do bs+=(-b "$b"); done
  for s in $SCENARIOS; do
    local stem t rc; stem=$(basename "$s" .yaml); t=$(left)
    if [ "$t" -lt 10 ]; then echo "$stem--$name: not run (out of time)" >> "$WORK/logs/not_run.txt"; continue; fi
    # SIGINT at the limit: the run keeps its finished rows and marks its folder incomplete
    timeout -s INT -k 15 "$t" python3 -m attnbench run "$s" "${bs[@]}" --warmup-ms 5 --measure-ms 20 -q \
      --out "$WORK/runs/$stem--$name" > "$WORK/logs/$stem--$name.log" 2>&1
    rc=$?; el "lane $name: $stem rc=$rc"
    [ "$rc" -gt 1 ] && echo "$stem--$name: cut or failed to start (rc=$rc; logs/$stem--$name.log)" >> "$WORK/logs/not_run.txt"
  done
}
el "pytest -m gpu and the scenario lanes, side by side"
timeout -k 15 "$(left)" python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$WORK/logs/pytest_gpu.log" 2>&1 &
PYTEST=$!
lane main reference sdpa triton & L1=$!
lane flex flex & L2=$!
lane libs xformers flashinfer $FA2_LANE & L3=$!
wait $L1 $L2 $L3
if [ -z "$FA2_LANE" ] && { [ -e /tmp/fa2build.log ] || [ -e /tmp/fa2.done ]; }; then
  while [ ! -e /tmp/fa2.done ] && [ "$(left)" -gt 60 ]; do sleep 5; done
  if [ -e /tmp/fa2.done ]; then
    el "flash-attn build: $(tail -n 1 /tmp/fa2build.log)"
    export PYTHONPATH=/tmp/fa2site:${PYTHONPATH:-} ATTNBENCH_FA2_HDIM128_ONLY=1
    lane fa flash-attn
  else
    el "flash-attn build not finished in time: flash-attn not validated"
  fi
fi
wait $PYTEST; echo "pytest -m gpu rc=$?" >> "$WORK/logs/pytest_gpu.log"
el "pytest -m gpu:"; tail -n 15 "$WORK/logs/pytest_gpu.log"

python3 - "$WORK/runs" "$WORK/logs/not_run.txt" <<'PY' | tee "$OUTDIR/summary.txt"
import sys
from pathlib import Path
sys.path.insert(0, "scripts/gpu")
import gpulib  # the status table verify_all.py prints too

not_run = Path(sys.argv[2])
rows, cut = gpulib.read_rows(sorted(Path(sys.argv[1]).iterdir()))
cut = (not_run.read_text().splitlines() if not_run.is_file() else []) + cut
lines, ids = gpulib.status_table(gpulib.cells_of(rows))
failed = gpulib.failed_rows(rows)
print("\n".join(lines + ["", "skip reasons:"] + (gpulib.legend(ids) or ["- none"])))
print("\n".join(["failed rows:"] + failed) if failed else "failed rows: none")
print("\n".join(["cut short or not run:"] + cut) if cut else "every scenario ran to the end in every lane")
PY
cp "$WORK/logs/gpu_checks.log" "$OUTDIR/gpu_checks.log"
tar czf "$OUTDIR/gpu_validate.tgz" -C "$WORK" runs logs checks
el "done; in $OUTDIR: summary.txt, gpu_checks.log, gpu_validate.log, gpu_validate.tgz"
sleep 1  # let tee write the last lines of gpu_validate.log
