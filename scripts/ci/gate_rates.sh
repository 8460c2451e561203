#!/usr/bin/env bash
# Measures the CI gate's false-alarm rate and power on this machine, with the gate itself:
#
#   scripts/ci/gate_rates.sh [AA] [SLOW] [FACTOR]     # defaults: 30 A/A gates, 10 slowed gates, 1.3
#
# A/A: `attnbench compare commits` of HEAD against HEAD (the same code on both sides): every
# failure is a false alarm. Slowed: a throwaway commit on top of HEAD (in a temporary clone)
# makes sdpa's run FACTOR times slower by spinning on its own thread after the real call (the
# gate's CPU timer counts thread CPU time, so the spin counts exactly); every pass is a miss.
# The gate runs with the settings scripts/ci/ci_gate.sh uses. Prints each gate's verdict and
# the two rates; logs under $OUT (default a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/../.."
AA=${1:-30}; SLOW=${2:-10}; FACTOR=${3:-1.3}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/attnbench-gate-rates.XXXXXX")}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
GATE=(--max-slowdown 20% --min-delta-us 2 --confidence 99%)
REPO=$PWD

CLONE="$OUT/slowed-clone"
rm -rf "$CLONE"; git clone -q "$REPO" "$CLONE"
python3 - "$CLONE/attnbench/backends/sdpa.py" "$FACTOR" <<'EOF'
import sys
path, factor = sys.argv[1], float(sys.argv[2])
src = open(path).read()
old = "    def run(self, p: SdpaPlan) -> torch.Tensor:\n"
assert src.count(old) == 1, "sdpa.py's run() moved: update scripts/ci/gate_rates.sh"
new = (old + "        import time as _t\n        _t0 = _t.thread_time()\n        _out = self._run_unslowed(p)\n"
       f"        _stop = _t0 + {factor} * (_t.thread_time() - _t0)\n"
       "        while _t.thread_time() < _stop:\n            pass\n        return _out\n\n"
       "    def _run_unslowed(self, p: SdpaPlan) -> torch.Tensor:\n")
open(path, "w").write(src.replace(old, new))
EOF
git -C "$CLONE" -c user.name=gate-rates -c user.email=gate-rates@localhost commit -qam "sdpa ${FACTOR}x slower (gate power test)"

gate() {  # label, log, args...: prints one line, returns the gate's exit code
  local label=$1 log=$2; shift 2
  local t0=$SECONDS rc=0
  attnbench compare commits ci-gate --device cpu "${GATE[@]}" --all "$@" >"$log" 2>&1 || rc=$?
  echo "$label: exit $rc ($((SECONDS - t0)) s)"
  return $rc
}
aa_fail=0; slow_pass=0; slow_err=0
for i in $(seq 1 "$AA"); do
  rc=0; gate "A/A $i/$AA" "$OUT/aa-$i.log" --repo "$REPO" --base HEAD --head HEAD || rc=$?
  [ "$rc" -ne 0 ] && aa_fail=$((aa_fail + 1))
done
for i in $(seq 1 "$SLOW"); do
  rc=0; gate "slowed ${FACTOR}x $i/$SLOW" "$OUT/slow-$i.log" --repo "$CLONE" --base HEAD~1 --head HEAD || rc=$?
  [ "$rc" -eq 0 ] && slow_pass=$((slow_pass + 1))
  [ "$rc" -gt 1 ] && slow_err=$((slow_err + 1))
done
echo "false alarms: $aa_fail of $AA A/A gates failed"
echo "power: $((SLOW - slow_pass - slow_err)) of $SLOW gates caught sdpa ${FACTOR}x slower ($slow_err ended in a usage error)"
echo "logs: $OUT"
