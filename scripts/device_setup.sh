# Source this at the top of a GPU-machine command: installs the carried wheels (.whl2: what the
# machine's image lacks, e.g. pydantic) and attnbench itself (editable, no downloads).
#   source scripts/device_setup.sh
if [ -d .whl2 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site2 .whl2/*.whl >/tmp/whl2.log 2>&1 || cat /tmp/whl2.log
  export PYTHONPATH=/tmp/site2${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/attnbench-install.log 2>&1 || cat /tmp/attnbench-install.log
export PYTHONUNBUFFERED=1 ATTNBENCH_CACHE_DIR=/tmp/attnbench-cache
