#!/usr/bin/env bash
# Download, on a machine with a package index, the wheels the GPU machine needs for
# FlashAttention-4 (backend flash-attn4, flex:kernel=flash) and FlashInfer 0.7, for its Python
# (3.12, manylinux x86_64), and lay them out in folders of at most 56 MiB each (one transfer each, with room beside the checkout;
# a wheel larger than that, nvidia-cutlass-dsl-libs-cu13's 92 MB, is split into parts that
# install_wheels.sh joins and checks there). Usage, from the repository root:
#
#   scripts/gpu/fetch_wheels.sh [OUT]          # OUT: .gpuwheels (git-ignored), made afresh
#
# Then bring OUT/1, OUT/2, ... to the GPU machine one per transfer (each into the checkout, e.g.
# as the carried folder .gpuwheels/1) and run scripts/gpu/install_wheels.sh after each
# (docs/backends.md "Offline install"). Environment: PYTHON_VERSION (3.12), PLATFORMS
# (the manylinux tags tried), LIMIT_MIB (56), PART_MIB (46).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-.gpuwheels}
pyver=${PYTHON_VERSION:-3.12}
platforms=${PLATFORMS:-"manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any"}
# The exact versions read and measured (issue 61); --no-deps: their other needs (torch,
# cuda-bindings, protobuf, einops, numpy, typing-extensions) are on the GPU image.
wheels=(
  flash-attn-4==4.0.0b36
  nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1
  nvidia-cutlass-dsl-libs-cu13==4.8.1
  quack-kernels==0.6.5 torch-c-dlpack-ext==0.1.5 apache-tvm-ffi==0.1.15
  flashinfer-python==0.7.2.post1 cuda-tile==1.7.0 nccl4py==0.6.0 nvidia-cudnn-frontend==1.32.0 cuda-python==13.4.4
)
# FlashInfer's kernel sources that attention never builds (flashinfer/data/csrc/...): 62 MB -> 35 MB
trim=(cake_sampling cake_dsv4 kda fused_moe cake_fmha gdn experimental blackwell_bf16_fp4 cake_bgmv_moe
      blackwell_msa nv_internal)

dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
plat_args=()
for p in $platforms; do plat_args+=(--platform "$p"); done
for w in "${wheels[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" "${plat_args[@]}" \
    -d "$dl/raw" "$w"
done
mkdir -p "$dl/ready"
for f in "$dl"/raw/*.whl; do
  case "$(basename "$f")" in
    flashinfer_python-*) python3 "$here/wheels.py" trim "$f" "$dl/ready/$(basename "$f")" \
                           $(printf 'flashinfer/data/csrc/%s/ ' "${trim[@]}") ;;
    *) cp "$f" "$dl/ready/" ;;
  esac
done
echo "Requires-Dist of each wheel (not installed by install_wheels.sh: they must be on the GPU image):"
for f in "$dl"/ready/*.whl; do
  reqs=$(unzip -p "$f" '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: //p' | grep -v 'extra ==' | tr '\n' ';' || true)
  echo "  $(basename "$f"): ${reqs:-none}"
done
rm -rf "$out"
python3 "$here/wheels.py" layout "$dl/ready" "$out" --limit-mib "${LIMIT_MIB:-56}" --part-mib "${PART_MIB:-46}"
echo "bring each folder of $out in one transfer, then run scripts/gpu/install_wheels.sh <that folder>"
