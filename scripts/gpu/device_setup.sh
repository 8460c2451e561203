# The GPU machine's setup, sourced from the repo root by the two front doors
# (scripts/gpu/validate.sh, scripts/gpu/bench.sh) or by hand before a single command:
#
#   source scripts/gpu/device_setup.sh
#
# Nothing can be downloaded on the device machine, so everything comes carried (git-ignored):
#   .whl/ (and any other .whl*/ folder)  every wheel in it is installed, without its dependencies,
#        into /tmp/site, put first on PYTHONPATH: pydantic & co, pytest-xdist, execnet and
#        pytest-timeout, xformers, FlashInfer, FlashAttention-4 and whatever they need. A wheel
#        that brings its own packages folder is found too: nvidia-cutlass-dsl's
#        /tmp/site/nvidia_cutlass_dsl/dsl_packages goes on PYTHONPATH when it is there.
#   .fa2/flash-attn-*.tar.xz  a prebuilt flash-attn 2 (head dim 128, sm_90): unpacked into
#        /tmp/fa2site, on PYTHONPATH, with ATTNBENCH_FA2_HDIM128_ONLY=1
#   .fijit/fijit-*.tar  FlashInfer modules a session built (scripts/gpu/flashinfer_cache.py):
#        restored into FlashInfer's AOT folder, so they load without a JIT build
# then attnbench itself (editable, from this checkout), and the environment every GPU run takes:
# xformers in its Triton-only mode (its C++ extension does not load with torch 2.11), FlashInfer's
# JIT built for sm_90. Once per machine: a second shell sourcing this (two front doors side by
# side) finds the markers in /tmp and installs nothing again. Prints the machine's facts.
_setup_wheels() {
  local d mark
  for d in .whl*/; do
    d=${d%/}
    ls "$d"/*.whl >/dev/null 2>&1 || continue
    mark="/tmp/site/.attnbench-installed-$(ls "$d"/*.whl | md5sum | cut -c1-12)"
    if [ ! -f "$mark" ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$d"/*.whl >"/tmp/$d-install.log" 2>&1 && touch "$mark" || cat "/tmp/$d-install.log"
    fi
  done
  [ -d /tmp/site ] || return 0
  _setup_path /tmp/site
  [ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ] && _setup_path /tmp/site/nvidia_cutlass_dsl/dsl_packages
  export PATH=$PATH:/tmp/site/bin
}

_setup_path() {  # put $1 on PYTHONPATH once
  case ":${PYTHONPATH:-}:" in *":$1:"*) ;; *) export PYTHONPATH=$1${PYTHONPATH:+:$PYTHONPATH} ;; esac
}

_setup_fa2() {
  local tb
  tb=$(ls .fa2/flash-attn-*.tar.xz 2>/dev/null | head -n 1)
  [ -n "$tb" ] || return 0
  [ -d /tmp/fa2site/flash_attn ] || tar xJf "$tb" -C /tmp || { echo "flash-attn: unpacking $tb failed"; return 0; }
  _setup_path /tmp/fa2site
  export ATTNBENCH_FA2_HDIM128_ONLY=1
  echo "flash-attn: the prebuilt $(basename "$tb") (head dim 128 only: ATTNBENCH_FA2_HDIM128_ONLY=1)"
}

_setup_attnbench() {  # editable, once per machine and checkout (jobs side by side once raced in pip's dist-info)
  local mark
  mark="/tmp/.attnbench-editable-$(echo "$PWD" | md5sum | cut -c1-12)"
  [ -f "$mark" ] && return 0
  if (cd / && python3 -c "import attnbench, sys; sys.exit(0 if attnbench.__file__.startswith('$PWD/') else 1)") \
      2>/dev/null; then
    return 0
  fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/attnbench-install.log 2>&1 \
    && touch "$mark" || cat /tmp/attnbench-install.log
}

_setup_wheels
_setup_fa2
_setup_attnbench
# FlashAttention-4 / FlashInfer 0.7 wheels laid out by scripts/gpu/fetch_wheels.sh, one folder per
# transfer: each call's folders are gathered until every part is in, then joined and installed
# (after flash-attn 2's setup: install_wheels.sh links flash_attn/cute into its package)
source scripts/gpu/install_wheels.sh $(ls -d .gpuwheels/*/ 2>/dev/null)
export PYTHONUNBUFFERED=1 ATTNBENCH_CACHE_DIR=/tmp/attnbench-cache ATTNBENCH_XFORMERS_TRITON_ONLY=1
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0}
if ls .fijit/fijit-*.tar >/dev/null 2>&1 && [ ! -f /tmp/.fijit-restored ]; then
  python3 scripts/gpu/flashinfer_cache.py restore .fijit && touch /tmp/.fijit-restored
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
echo "setup done (nproc $(nproc), PYTHONPATH=${PYTHONPATH:-})"
