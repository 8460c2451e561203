#!/bin/bash
# One-command GPU validation of the library backends (flash-attn, xformers, FlashInfer).
#   bash scripts/gpu_libs.sh            (from the repo root, on the GPU machine)
# Needs, carried with the checkout: .fa2/ (build_flash_attn.sh + the flash-attn sdist, see
# shared/device/build_flash_attn.sh) and .whl/ (xformers 0.0.35, flashinfer-python 0.5.3 and
# its deps: apache-tvm-ffi, einops, tabulate, nvidia-ml-py, requests (+urllib3, idna,
# charset-normalizer, certifi), tqdm, click, packaging, ninja; and for `attnbench run`,
# which the GPU image lacks: pydantic, pydantic-core, annotated-types, typing-inspection,
# typing-extensions). One version of each.
# 1. starts the minimal flash-attn build in the background (about 6 minutes);
# 2. installs the wheels, runs the CPU+GPU pytest of tests/test_lib_backends.py for what is
#    there, validates xformers (Triton-only opt-in) and FlashInfer (JIT) meanwhile;
# 3. waits for /tmp/fa2.done and validates flash-attn (head dim 128 only build);
# 4. if the attnbench CLI exists, runs the shipped scenarios and three bf16/d128 ones through
#    these backends (while the build runs for xformers/FlashInfer/SDPA, after it for flash-attn).
# Logs and JSON go to $OUT (or /tmp/gpu_libs_out).
set -u
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-/tmp/gpu_libs_out}; mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }

if [ -e /tmp/fa2.done ] && [ -d /tmp/fa2site/flash_attn ]; then
  el "flash-attn already built in /tmp/fa2site"
elif ! python3 -c "import flash_attn" 2>/dev/null && ls .fa2/flash_attn-*.tar.gz >/dev/null 2>&1; then
  rm -f /tmp/fa2.done
  setsid bash .fa2/build_flash_attn.sh .fa2/flash_attn-*.tar.gz < /dev/null > /dev/null 2>&1 &
  el "flash-attn build started"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v -i warning
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=$PATH:/tmp/site/bin
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUTDIR/pip_e.log" 2>&1 || el "pip -e failed (scripts map attnbench.backends themselves)"

# attnbench run (the harness) over the shipped scenarios and three on NOTES.md's shape.
AB="import sys; from attnbench.cli.app import app; sys.argv[0] = 'attnbench'; app()"
write_scenarios() {
  cat > /tmp/libs.yaml <<'YAML'
name: libs-h100
description: the library backends on NOTES.md's shape (bf16, 32/8 heads, d=128), three page sizes
seed: 0
device: cuda
model: {num_q_heads: 32, num_kv_heads: 8, head_dim: 128, dtype: bfloat16}
kv_cache: {page_size: 256, layout: shuffled}
batch:
  - {kind: decode, count: 8, context: 4096}
sweep:
  kv_cache.page_size: [16, 64, 256]
timing: {warmup_ms: 20, measure_ms: 100}
YAML
  sed -e 's/name: libs-h100/name: libs-h100-tree/' -e 's/{kind: decode, count: 8, context: 4096}/{kind: tree, count: 8, context: 4096, tree: {full: {depth: 3, branching: 3}}}/' /tmp/libs.yaml > /tmp/libs_tree.yaml
  sed -e 's/name: libs-h100/name: libs-h100-mixed/' -e 's/{kind: decode, count: 8, context: 4096}/{kind: decode, count: 6, context: 3000}\n  - {kind: prefill, count: 1, query: 512, context: 1024}/' /tmp/libs.yaml > /tmp/libs_mixed.yaml
}
run_scenarios() {  # args: -b NAME ...
  python3 -c "import attnbench.cli.app" 2>&1 | tail -3
  python3 -c "import attnbench.cli.app" 2>/dev/null || return 0
  write_scenarios
  for s in ${SCENARIOS:-scenarios/*.yaml} /tmp/libs.yaml /tmp/libs_tree.yaml /tmp/libs_mixed.yaml; do
    el "attnbench run $s $*"
    timeout 80 python3 -c "$AB" run "$s" --device cuda "$@" -q 2>&1 | grep -v -i "xformers\|reinstall\|won't be available\|^\s*$" | tail -22
  done
}

export ATTNBENCH_XFORMERS_TRITON_ONLY=1 ATTNBENCH_FA2_HDIM128_ONLY=1
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0}
el "xformers + flashinfer"
nice -n 5 python3 scripts/gpu_libs.py --backends xformers flashinfer --out "$OUTDIR" 2>&1 | tee "$OUTDIR/xf_fi.log"

[ -z "${NO_SCENARIOS:-}" ] && run_scenarios -b xformers -b flashinfer -b sdpa

if [ -e /tmp/fa2build.log ] || [ -e /tmp/fa2.done ]; then
  el "waiting for the flash-attn build"
  for i in $(seq 1 ${FA2_WAIT_S:-480}); do [ -e /tmp/fa2.done ] && break; sleep 1; done
  tail -2 /tmp/fa2build.log
  export PYTHONPATH=/tmp/fa2site:$PYTHONPATH
fi
el "flash-attn"
python3 scripts/gpu_libs.py --backends flash-attn --out "$OUTDIR" 2>&1 | tee "$OUTDIR/fa.log"

el "pytest -m gpu tests/test_lib_backends.py"
timeout 240 python3 -m pytest -q -m gpu tests/test_lib_backends.py -p no:cacheprovider 2>&1 | tail -15

[ -z "${NO_SCENARIOS:-}" ] && run_scenarios -b flash-attn
el done
