#!/bin/bash
# The whole GPU validation in one command, on the GPU machine, from the repo root:
#
#   bash scripts/gpu/gpu_validate.sh          # carry .whl/ (pydantic & co; xformers, FlashInfer
#                                         # and their dependencies if those are to be validated)
#
# 1. installs the carried wheels and attnbench (scripts/gpu/device_setup.sh); if .fa2/ is carried
#    too, starts the head-dim-128 flash-attn build in the background (about 6 minutes);
# 2. runs scripts/gpu/gpu_checks.py alone on the GPU (the timer against the profiler, repeatability,
#    cold vs warm L2, the L2 flush kinds, decode bandwidth against the measured ceiling);
# 3. then, side by side: `pytest -m gpu`, and every shipped scenario (attnbench/scenarios/*.yaml and
#    attnbench/scenarios/gpu/*.yaml) through every backend with `attnbench run` (no --save-tensors), in
#    lanes of backends that compile separately (reference+sdpa+triton | flex | xformers+flashinfer;
#    flash-attn last, if its build finished). The lanes share the GPU: their statuses are the
#    point, not their times (docs/benchmarks.md comes from scripts/gpu/gpu_bench.sh);
# 4. prints a summary (statuses per scenario and backend, every error/mismatch row with its
#    reason) and leaves in $OUT: summary.txt, gpu_validate.log (everything) and
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
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { local s=$(( T0 + BUDGET_S - 25 - $(date +%s) )); [ "$s" -gt 0 ] && echo "$s" || echo 0; }

if [ ! -e /tmp/fa2.done ] && ls .fa2/flash_attn-*.tar.gz >/dev/null 2>&1; then
  setsid bash .fa2/build_flash_attn.sh .fa2/flash_attn-*.tar.gz < /dev/null > /dev/null 2>&1 &
  el "flash-attn build started in the background"
fi
source scripts/gpu/device_setup.sh
export ATTNBENCH_XFORMERS_TRITON_ONLY=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
python3 -m attnbench backends

if [ "${CHECKS_S:-240}" -gt 0 ]; then  # CHECKS_S=0: skip the checks (all the time to the lanes)
  el "gpu_checks.py (alone on the GPU)"
  timeout "${CHECKS_S:-240}" python3 scripts/gpu/gpu_checks.py --out "$WORK/checks" > "$WORK/logs/gpu_checks.log" 2>&1
  echo "gpu_checks rc=$? (124: cut at ${CHECKS_S:-240} s)" | tee -a "$WORK/logs/gpu_checks.log"
  grep -E "^(verdict|gpu_checks)" "$WORK/logs/gpu_checks.log"
else
  echo "gpu_checks skipped (CHECKS_S=0)" > "$WORK/logs/gpu_checks.log"
fi

SCENARIOS=$(ls attnbench/scenarios/*.yaml attnbench/scenarios/gpu/*.yaml)
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
lane libs xformers flashinfer & L3=$!
wait $L1 $L2 $L3
if [ -e /tmp/fa2build.log ] || [ -e /tmp/fa2.done ]; then
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
import collections, sys
from pathlib import Path
from attnbench.store.runfolder import RunFolder

not_run = Path(sys.argv[2])
table, bad = collections.defaultdict(collections.Counter), []
cut = not_run.read_text().splitlines() if not_run.is_file() else []
for p in sorted(Path(sys.argv[1]).iterdir()):
    if not (p / "rows.jsonl").is_file():
        cut.append(f"{p.name}: no rows (see logs/{p.name}.log)")
        continue
    rf = RunFolder.load(p)
    if not rf.manifest.complete:
        cut.append(f"{p.name}: incomplete ({len(rf.rows)} rows)")
    for r in rf.rows:
        table[(r.scenario, r.backend)][r.status.value] += 1
        if r.status.failed:
            bad.append(f"{r.scenario} | {r.case_id} | {r.backend}: {r.status.value}: {r.reason}")
total = collections.Counter()
for (scenario, backend), c in sorted(table.items()):
    total.update(c)
    print(f"{scenario:28s} {backend:11s} " + "  ".join(f"{k} {v}" for k, v in sorted(c.items())))
print("all rows:", ", ".join(f"{k} {v}" for k, v in sorted(total.items())))
print("\n".join(["failed rows:"] + bad) if bad else "failed rows: none")
print("\n".join(["cut short or not run:"] + cut) if cut else "every scenario ran to the end in every lane")
PY
cp "$WORK/logs/gpu_checks.log" "$OUTDIR/gpu_checks.log"
tar czf "$OUTDIR/gpu_validate.tgz" -C "$WORK" runs logs checks
el "done; in $OUTDIR: summary.txt, gpu_checks.log, gpu_validate.log, gpu_validate.tgz"
sleep 1  # let tee write the last lines of gpu_validate.log
