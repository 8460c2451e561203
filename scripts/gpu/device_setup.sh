# Source this at the top of a GPU-machine command, from the repo root (scripts/gpu/gpu_validate.sh and gpu_bench.sh do):
#   source scripts/gpu/device_setup.sh
# Installs the carried wheels, .whl/ and .whl2/ (what the machine's image lacks: pydantic,
# pydantic-core, annotated-types, typing-inspection; xformers, flashinfer-python and their
# dependencies to validate those), into /tmp/site on PYTHONPATH, then attnbench itself
# (editable, no downloads: nothing can be downloaded there).
# Once per machine: a second script sourcing this (two verify runs side by side) finds the marker
# and installs nothing (reinstalling under a running process can break its imports).
for d in .whl .whl2; do
  if ls "$d"/*.whl >/dev/null 2>&1; then
    mark="/tmp/site/.attnbench-installed-$(ls "$d"/*.whl | md5sum | cut -c1-12)"
    [ -f "$mark" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$d"/*.whl \
      >"/tmp/$d-install.log" 2>&1 && touch "$mark" || cat "/tmp/$d-install.log"
    case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} ;; esac
    export PATH=$PATH:/tmp/site/bin
  fi
done
# attnbench itself, once per machine and checkout (a marker, as for the wheels: four jobs of
# scripts/gpu/multi_gpu.sh sourcing this side by side once raced in pip's dist-info)
mark="/tmp/.attnbench-editable-$(echo "$PWD" | md5sum | cut -c1-12)"
if [ ! -f "$mark" ] && ! (cd / && python3 -c "import attnbench, sys; sys.exit(0 if attnbench.__file__.startswith('$PWD/') else 1)") 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/attnbench-install.log 2>&1 && touch "$mark" \
    || cat /tmp/attnbench-install.log
fi
export PYTHONUNBUFFERED=1 ATTNBENCH_CACHE_DIR=/tmp/attnbench-cache
