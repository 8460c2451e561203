#!/usr/bin/env bash
# Every test file passes alone (issue 58 item 7): each file of tests/ runs in a pytest of its
# own, two at a time, on the quick subset (the slow tests run once, in random order, in CI's
# whole-suite run: ATTNBENCH_TEST_ORDER=random in .ci/run). A file that fails alone is listed
# with the command that repeats it; exit 1 if any did.
#
#   scripts/ci/tests_alone.sh [PYTEST MARK EXPRESSION]   # default: "not slow and not gpu"
set -uo pipefail
cd "$(dirname "$0")/../.."
MARK=${1:-not slow and not gpu}
log=$(mktemp -d "${TMPDIR:-/tmp}/attnbench-alone.XXXXXX")
ls tests/test_*.py | xargs -P 2 -I{} sh -c \
  'python3 -m pytest -q -p no:cacheprovider -m "$1" "$2" > "$3/$(basename "$2").log" 2>&1; rc=$?;
   [ $rc -eq 0 ] || [ $rc -eq 5 ] || echo "$2" >> "$3/failed"' _ "$MARK" {} "$log"
if [ -s "$log/failed" ]; then
  while read -r f; do
    echo "fails alone: python3 -m pytest -q -m \"$MARK\" $f" >&2
    tail -n 15 "$log/$(basename "$f").log" >&2
  done < "$log/failed"
  exit 1
fi
echo "every test file passes alone ($(ls tests/test_*.py | wc -l) files, -m \"$MARK\")"
