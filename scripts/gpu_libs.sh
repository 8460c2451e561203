#!/bin/bash
# One-command GPU validation of the library backends (flash-attn, xformers, FlashInfer).
#   bash scripts/gpu_libs.sh            (from the repo root, on the GPU machine)
# Needs, carried with the checkout: .fa2/ (build_flash_attn.sh + the flash-attn sdist, see
# shared/device/build_flash_attn.sh) and .whl/ (xformers, flashinfer-python and its deps).
# 1. starts the minimal flash-attn build in the background (about 6 minutes);
# 2. installs the wheels, runs the CPU+GPU pytest of tests/test_lib_backends.py for what is
#    there, validates xformers (Triton-only opt-in) and FlashInfer (JIT) meanwhile;
# 3. waits for /tmp/fa2.done and validates flash-attn (head dim 128 only build);
# 4. if the attnbench CLI and scenarios exist, runs them through these backends.
# Logs and JSON go to $OUT (or /tmp/gpu_libs_out).
set -u
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-/tmp/gpu_libs_out}; mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }

if ! python3 -c "import flash_attn" 2>/dev/null && ls .fa2/flash_attn-*.tar.gz >/dev/null 2>&1; then
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

export ATTNBENCH_XFORMERS_TRITON_ONLY=1 ATTNBENCH_FA2_HDIM128_ONLY=1
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0}
el "xformers + flashinfer"
nice -n 5 python3 scripts/gpu_libs.py --backends xformers flashinfer --out "$OUTDIR" 2>&1 | tee "$OUTDIR/xf_fi.log"

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

if python3 -c "import attnbench.cli" 2>/dev/null && ls scenarios/*.yaml >/dev/null 2>&1; then
  for s in ${SCENARIOS:-scenarios/*.yaml}; do
    el "attnbench run $s"
    timeout 200 python3 -m attnbench.cli run "$s" --device cuda -b flash-attn -b xformers -b flashinfer 2>&1 | tail -40
  done
fi
el done
