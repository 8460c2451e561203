#!/bin/bash
# GPU validation of --executor dask (issue 15), on a host with >= 2 GPUs (the device tool's
# nvidia-h200-x2 kind). Carry .whl/ (dask, distributed and what the image lacks: pydantic,
# tornado, tblib, zict, partd, locket, ...). Three runs of one sweep (decode on Llama-3-8B
# shapes, 32 decodes a batch, CONTEXTS x 2 page sizes = 16 cases by default; sdpa and triton, each row timed for
# MEASURE_MS of kernel time, so that the cases' work, which 2 GPUs share, outweighs what each
# process pays once: Python and torch start, CUDA init, Triton JIT, the ceilings measurement):
#   1. --executor local on one GPU (CUDA_VISIBLE_DEVICES=0)
#   2. --executor dask --workers 2 (one worker per GPU)
#   3. --executor dask --workers 2 with shorter budgets; one worker is SIGKILLed mid-run
# and prints: wall times and their ratio (target <= 0.6), the statuses of runs 1 and 2 (must
# be equal), per-row medians of run 2 over run 1 (attnbench compare runs: ratio and 95%
# interval), and for run 3 that every row written before the kill is still there, unchanged,
# that the killed worker's case has error rows naming it, and that the run completed.
# Each run starts with empty compile caches (Triton, Inductor, attnbench's ceilings), so no run
# reuses another's JIT work. Files in $OUT: gpu_dask.log, summary.md, runs.tgz.
#   bash scripts/gpu/gpu_dask.sh                      # all three
#   MEASURE_MS=500 CONTEXTS='[1k, 4k, 16k, 64k]' bash scripts/gpu/gpu_dask.sh   # a smaller sweep
#   # a dry run of the script's logic on a CPU machine:
#   SCENARIO=attnbench/scenarios/ci-gate.yaml CONTEXTS='[64, 256]' BACKENDS='sdpa reference' MEASURE_MS=20 bash scripts/gpu/gpu_dask.sh
set -u
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-/tmp/gpu_dask}; mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/gpu_dask.log") 2>&1
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -vi warning
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > /tmp/pip_e.log 2>&1 || cat /tmp/pip_e.log
export PYTHONUNBUFFERED=1
python3 -c "import dask, distributed, torch; print('dask', dask.__version__, 'distributed', distributed.__version__, 'torch', torch.__version__, 'GPUs', torch.cuda.device_count())" || exit 1
nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv,noheader

SCENARIO=${SCENARIO:-scenarios/decode-llama3-8b.yaml}
CONTEXTS=${CONTEXTS:-'[1k, 2k, 4k, 8k, 16k, 32k, 64k, 128k]'}
BACKENDS=${BACKENDS:-sdpa triton}
MEASURE_MS=${MEASURE_MS:-6000}
RUNS=${RUNS:-/tmp/gpu_dask_runs}; rm -rf "$RUNS"; mkdir -p "$RUNS"
SWEEP=("$SCENARIO" --set "sweep={batch.0.context: $CONTEXTS, kv_cache.page_size: [16, 256]}"
       --set batch.0.count=${COUNT:-32} --set timing.max_runs=30000 --warmup-ms 200 -q)
for b in $BACKENDS; do SWEEP+=(-b "$b"); done

fresh_caches() {  # $1: run name; nothing compiled or measured by an earlier run is reused
  export TRITON_CACHE_DIR=$RUNS/cache-$1/triton TORCHINDUCTOR_CACHE_DIR=$RUNS/cache-$1/inductor \
         ATTNBENCH_CACHE_DIR=$RUNS/cache-$1/attnbench
}

timed_run() {  # $1: name, $2: time limit (s); the rest: flags. Prints the wall time; output in $RUNS/$1.log
  local name=$1 limit=$2; shift 2
  fresh_caches "$name"
  local t0; t0=$(date +%s.%N)
  timeout "$limit" python3 -m attnbench run "${SWEEP[@]}" --measure-ms "$MEASURE_MS" --out "$RUNS/$name" "$@" > "$RUNS/$name.log" 2>&1
  local rc=$?
  local t1; t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.1f}')" > "$RUNS/$name.wall"
  el "$name: rc=$rc wall=$(cat "$RUNS/$name.wall") s"
  tail -n 4 "$RUNS/$name.log"
}

el "run 1: --executor local on GPU 0"
CUDA_VISIBLE_DEVICES=0 timed_run local 330 --executor local
el "run 2: --executor dask --workers 2"
timed_run dask 240 --executor dask --workers 2

el "compare runs: the dask run's medians over the local run's (same device model, another GPU)"
python3 -m attnbench compare runs "$RUNS/local" "$RUNS/dask" --format markdown > "$RUNS/compare.md" 2>&1
cat "$RUNS/compare.md"
report() {  # the summary so far (a later step cut off by the time limit leaves this one)
  python3 scripts/report/gpu_dask_report.py "$RUNS" "${VICTIM#* }" "${VICTIM% *}" > "$OUTDIR/summary.md" 2>&1
  python3 - "$RUNS" <<'PY'  # run folders without the raw samples (30000 a row), to stay small
import json, shutil, sys; from pathlib import Path
runs = Path(sys.argv[1]); slim = runs.parent / "gpu_dask_slim"; shutil.rmtree(slim, ignore_errors=True); slim.mkdir()
for f in runs.iterdir():
    if f.is_dir() and not f.name.startswith("cache-"):
        (slim / f.name).mkdir()
        for g in f.iterdir():
            if g.name == "rows.jsonl":
                rows = [json.loads(x) for x in g.read_text().splitlines() if x.strip()]
                g2 = slim / f.name / g.name
                g2.write_text("".join(json.dumps({**r, "samples_ms": r["samples_ms"][:50]}) + "\n" for r in rows))
            elif g.is_file():
                shutil.copy(g, slim / f.name / g.name)
    elif f.is_file() and f.suffix != ".jsonl":
        shutil.copy(f, slim / f.name)
PY
  tar czf "$OUTDIR/runs.tgz" -C "$RUNS/../gpu_dask_slim" .
}
VICTIM="? ?"; report

el "run 3: --executor dask --workers 2, one worker SIGKILLed mid-run"
fresh_caches kill
( timeout 170 python3 -m attnbench run "${SWEEP[@]}" --measure-ms $(( MEASURE_MS / 4 )) --out "$RUNS/kill" \
    --executor dask --workers 2 > "$RUNS/kill.log" 2>&1; echo $? > "$RUNS/kill.rc" ) &
KILLRUN=$!
for _ in $(seq 1 240); do  # until 4 rows are written (a case or more finished on each side)
  [ -f "$RUNS/kill/rows.jsonl" ] && [ "$(wc -l < "$RUNS/kill/rows.jsonl")" -ge 4 ] && break
  sleep 0.5
done
VICTIM=$(python3 -c "import json; w=json.load(open('$RUNS/kill/manifest.json'))['environment']['workers']; print(w[0]['pid'], w[0]['name'])")
cp "$RUNS/kill/rows.jsonl" "$RUNS/kill-before.jsonl"
kill -9 "${VICTIM% *}" && el "killed worker ${VICTIM#* } (pid ${VICTIM% *}) with $(wc -l < "$RUNS/kill-before.jsonl") rows written"
wait "$KILLRUN"  # (a bare wait would also wait for the tee of this script's output)
el "run 3 ended: rc=$(cat "$RUNS/kill.rc") (1 = some rows are errors, as expected)"
tail -n 4 "$RUNS/kill.log"

report; cat "$OUTDIR/summary.md"
el "done"
