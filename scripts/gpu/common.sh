# What the GPU-machine scripts share (gpu_validate.sh, gpu_tests.sh, verify_all.sh). Source it
# from the repo root after setting T0=$(date +%s) and BUDGET_S:
#   el MSG            a line with the seconds since T0
#   left              seconds left of BUDGET_S (less a 25 s margin), 0 when none
#   gpu_setup         the carried wheels and attnbench (device_setup.sh), the environment every
#                     GPU run takes (xformers in Triton-only mode, FlashInfer built for sm_90),
#                     the prebuilt flash-attn if carried (fa2_prebuilt), FlashInfer modules carried
#                     in .fijit/ (flashinfer_cache.py restore), and the machine's facts
#   fa2_prebuilt      unpack .fa2/flash-attn-*.tar.xz (shared/device/NOTES.md: the head-dim-128,
#                     sm_90 build for torch 2.11+cu130) to /tmp/fa2site, put it on PYTHONPATH and
#                     set ATTNBENCH_FA2_HDIM128_ONLY=1; returns 1 when no tarball was carried
#   SCENARIOS         every shipped scenario file (attnbench/scenarios/*.yaml, .../gpu/*.yaml)
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { local s=$(( T0 + BUDGET_S - 25 - $(date +%s) )); [ "$s" -gt 0 ] && echo "$s" || echo 0; }

fa2_prebuilt() {
  local tb
  tb=$(ls .fa2/flash-attn-*.tar.xz 2>/dev/null | head -n 1)
  [ -n "$tb" ] || return 1
  if [ ! -d /tmp/fa2site/flash_attn ]; then
    tar xJf "$tb" -C /tmp || { echo "flash-attn: unpacking $tb failed"; return 1; }
  fi
  case ":${PYTHONPATH:-}:" in *:/tmp/fa2site:*) ;; *) export PYTHONPATH=/tmp/fa2site${PYTHONPATH:+:$PYTHONPATH} ;; esac
  export ATTNBENCH_FA2_HDIM128_ONLY=1
  el "flash-attn: the prebuilt $(basename "$tb") (head dim 128 only: ATTNBENCH_FA2_HDIM128_ONLY=1)"
}

gpu_setup() {
  source scripts/gpu/device_setup.sh
  # xformers 0.0.35's C++ extension does not load with torch 2.11: its Triton-only mode is what runs
  export ATTNBENCH_XFORMERS_TRITON_ONLY=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0}
  fa2_prebuilt || true
  # FlashInfer modules an earlier session built, carried in .fijit/ (flashinfer_cache.py): loaded, not built
  if ls .fijit/fijit-*.tar >/dev/null 2>&1 && [ ! -f /tmp/.fijit-restored ]; then
    python3 scripts/gpu/flashinfer_cache.py restore .fijit && touch /tmp/.fijit-restored
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  el "setup done (nproc $(nproc), $(free -g 2>/dev/null | awk '/Mem:/{print $2" GB RAM"}'), /dev/shm free $(df -h --output=avail /dev/shm 2>/dev/null | tail -n 1 | tr -d ' '))"
}

SCENARIOS=$(ls attnbench/scenarios/*.yaml attnbench/scenarios/gpu/*.yaml)
