"""scripts/gpu/gpu_triton_plan.sh (issue 33's plan row) in its DRY_RUN mode on the CPU: the plan
timed alone per case, then `attnbench run -b triton` rows under the interpreter with their plan_ms."""
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_dry_run_prints_the_plan_times(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), DRY_RUN="1",
               OUT=str(tmp_path / "out"))
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "gpu_triton_plan.sh")], env=env, capture_output=True,
                       text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log = (tmp_path / "out" / "triton_plan.log").read_text()
    # the plan alone (plan, p20-p80, new-shape and serving columns): quickstart's plans split no
    # row block, so one device copy and the output's allocation (the partials are shared)
    assert re.search(r"quickstart/page_size=16 .* static +[\d.]+ +\d+-\d+ +[\d.]+ +[\d.]+ +2 +1\n", log), log
    assert "torch calls of a plan, alone" in log  # --primitives
    assert re.search(r"\nquickstart +2 +[\d.]+ +[\d.]+\n", log), log  # per scenario: median, max
    rows = re.findall(r"quickstart/page_size=\d+ +plan +([\d.]+) us .* ok", log)
    assert len(rows) == 2 and all(float(x) > 0 for x in rows), log
    assert "done; in" in log and (tmp_path / "out" / "plan_runs.tgz").stat().st_size > 0
