#!/bin/bash
# The GPU validation in one command, from the repo root of the GPU machine:
#
#   bash scripts/gpu/validate.sh --out "$OUT"
#
# Carry .whl/ (and .fa2/, .fijit/ when you have them: scripts/gpu/device_setup.sh says what each
# holds). Sets the machine up (device_setup.sh), then runs scripts/gpu/validate.py, whose --help
# lists the flags: the lanes (tests: `pytest -m gpu`; scenarios: every shipped scenario through
# every installed backend and route with --save-tensors and check_saved.py; draws: seeded random
# scenarios the same way), one GPU per lane where there are several, --budget-s (570: the whole
# ends inside a 10-minute call, keeping what it wrote), --resume (on the same warm machine).
# --dry-run: no setup, on the CPU (tests/test_validate_script.py).
set -u
cd "$(dirname "$0")/../.."
export ATTNBENCH_VALIDATE_T0=${ATTNBENCH_VALIDATE_T0:-$(date +%s)}  # the budget counts the setup too
case " $* " in
  *" --dry-run "*|*" -h "*|*" --help "*) ;;
  *) source scripts/gpu/device_setup.sh ;;
esac
exec python3 scripts/gpu/validate.py "$@"
