"""scripts/dev/triton_plan_paired.py: the paired before/after table of alternating plan runs, and
each case's median over runs (what gpu_triton_plan.sh PLAN_ROUNDS=N reports for issue 33's
<= 200 us plan target): one run's slow second must not decide a case."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "dev" / "triton_plan_paired.py"


def _runs(tmp_path, name: str, runs: list[dict[str, float]]) -> list[str]:
    paths = []
    for i, r in enumerate(runs):
        p = tmp_path / f"{name}{i}.json"
        p.write_text(json.dumps({k: [k.split("/")[0], v] for k, v in r.items()}))
        paths.append(str(p))
    return paths


def test_a_case_slow_in_one_run_only_is_not_over_the_target(tmp_path):
    after = _runs(tmp_path, "a", [{"s/a": 95.0, "s/b": 120.0}, {"s/a": 208.0, "s/b": 118.0}, {"s/a": 97.0, "s/b": 260.0}])
    out = subprocess.run([sys.executable, str(SCRIPT), "--after", *after], capture_output=True, text=True, check=True).stdout
    assert "median over 3 runs" in out and "max 120 us (s/b), 2 of 2 <= 200 us" in out, out


def test_paired_ratio_and_both_summaries(tmp_path):
    before = _runs(tmp_path, "b", [{"s/a": 200.0, "s/b": 300.0}, {"s/a": 100.0, "s/b": 150.0}])
    after = _runs(tmp_path, "a", [{"s/a": 100.0, "s/b": 150.0}, {"s/a": 50.0, "s/b": 75.0}])
    out = subprocess.run([sys.executable, str(SCRIPT), "--before", *before, "--after", *after, "--cases",
                          str(tmp_path / "c.txt")], capture_output=True, text=True, check=True).stdout
    assert "| every shipped case (2) |" in out and "median 0.500" in out, out
    assert "before, each case's median over 2 runs: median 188 us, max 225 us (s/b), 1 of 2 <= 200 us" in out, out
    assert "after, each case's median over 2 runs" in out and (tmp_path / "c.txt").read_text().count("\n") == 3
    bad = subprocess.run([sys.executable, str(SCRIPT), "--before", before[0], "--after", *after],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "as many runs before as after" in bad.stderr
