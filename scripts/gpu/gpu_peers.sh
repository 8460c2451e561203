#!/bin/bash
# FlashAttention-4 (flash-attn4, flex:kernel=flash) and FlashInfer 0.7 on the GPU machine, from the
# repository root, once the wheels of scripts/gpu/fetch_wheels.sh are in (install_wheels.sh;
# docs/backends.md "Offline install"):
#
#   bash scripts/gpu/gpu_peers.sh fa4          # pytest -m gpu: tests/test_flash_attn4.py and the
#                                              # flash-attn4 cases of tests/test_variants_gpu.py
#   bash scripts/gpu/gpu_peers.sh flashinfer   # FlashInfer's GPU tests (every route, on 0.7)
#   bash scripts/gpu/gpu_peers.sh runs         # scenarios with --save-tensors, rechecked
#
# runs: every attnbench/scenarios/gpu/*.yaml and the shipped tree and decode scenarios
# (SCENARIOS to change them) through flash-attn4 (both tree routes), flex:kernel=flash, flex, flashinfer, sdpa and
# triton (BACKENDS to change them; PICK: attnbench run -k EXPR), each case's tensors saved and
# every saved output recomputed by scripts/gpu/check_saved.py. Leaves in $OUT (/tmp/peers) the
# run folders, the logs and check_saved.jsonl. BUDGET_S (570): seconds for the whole command.
# Exit: 0 all passed; 1 a test failed or a saved output is off.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); BUDGET_S=${BUDGET_S:-570}
OUT=${OUT:-/tmp/peers}
mkdir -p "$OUT"
source scripts/gpu/common.sh
gpu_setup
source scripts/gpu/install_wheels.sh
python3 -m attnbench backends --probe 2>&1 | grep -E "flash-attn4|flashinfer|^.*flex" || true
PYTEST=(python3 -m pytest -m gpu -q -p no:cacheprovider)
python3 -c "import xdist, pytest_timeout" 2>/dev/null && PYTEST+=(-n "${WORKERS:-4}" --timeout 300)
rc=0
case "${1:-fa4}" in
  fa4)
    timeout "$(left)" "${PYTEST[@]}" tests/test_flash_attn4.py tests/test_variants_gpu.py -k "flash_attn4 or flash-attn4" \
      2>&1 | tee "$OUT/pytest_fa4.log" | tail -40
    rc=${PIPESTATUS[0]} ;;
  flashinfer)
    timeout "$(left)" "${PYTEST[@]}" tests/test_flashinfer_wiring_gpu.py tests/test_flashinfer_alibi_gpu.py \
      tests/test_issue32_gpu.py tests/test_lib_backends.py tests/test_variants_gpu.py -k flashinfer \
      2>&1 | tee "$OUT/pytest_flashinfer.log" | tail -40
    rc=${PIPESTATUS[0]} ;;
  runs)
    scen=${SCENARIOS:-"$(ls attnbench/scenarios/gpu/*.yaml) attnbench/scenarios/tree-verify-llama3-8b.yaml attnbench/scenarios/decode-llama3-8b.yaml"}
    bargs=()
    for b in ${BACKENDS:-flash-attn4 flash-attn4:trees=split flex:kernel=flash flex flashinfer sdpa triton}; do bargs+=(-b "$b"); done
    for s in $scen; do
      name=$(basename "$s" .yaml)
      [ "$(left)" -gt 60 ] || { el "out of budget before $name"; rc=1; break; }
      el "run $name"
      timeout "$(left)" python3 -m attnbench run "$s" "${bargs[@]}" ${PICK:+-k "$PICK"} -q \
        --out "$OUT/runs/$name" --save-tensors "$OUT/tensors/$name" >"$OUT/$name.log" 2>&1 || rc=1
      tail -n 30 "$OUT/$name.log"
    done
    python3 scripts/gpu/check_saved.py "$OUT"/tensors/* --jsonl "$OUT/check_saved.jsonl" >"$OUT/check_saved.log" 2>&1 \
      || rc=1
    tail -n 40 "$OUT/check_saved.log" ;;
  *) echo "usage: bash scripts/gpu/gpu_peers.sh fa4|flashinfer|runs" >&2; exit 2 ;;
esac
el "done (exit $rc)"
exit "$rc"
