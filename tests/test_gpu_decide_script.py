"""scripts/gpu/gpu_decide.sh (issue 36) in its DRY_RUN mode on the CPU: both trace scenarios run,
decided, exported and reported, everything the lead's GPU run leaves in $OUT."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_dry_run_leaves_the_decisions_in_out(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), DRY_RUN="1",
               OUT=str(tmp_path / "out"), DECIDE_WORK=str(tmp_path / "work"), ROUNDS="6")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "gpu_decide.sh")], env=env, capture_output=True,
                       text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "out"
    for s in ("trace-eagle-serving", "trace-synthetic-serving"):
        doc = json.loads((out / f"decide-{s}.json").read_text())
        assert doc["scenario"] == s and doc["rounds"] == 6 and doc["dispatch"]
        assert set(doc["dispatch"].values()) <= {"sdpa", "flex"} and doc["best_single"] in ("sdpa", "flex")
        assert {t["backend"] for t in doc["backends"]} == {"sdpa", "flex"}
        md = (out / f"decide-{s}.md").read_text()
        assert "dispatching buys" in md or "is the pick for every shape" in md
    assert any("tree(26)" in k for k in json.loads((out / "decide-trace-eagle-serving.json").read_text())["dispatch"])
    assert (out / "decide-report.html").read_text().count("<h3>decision for") == 2
    log = (out / "decide.log").read_text()
    assert "decide rc=0" in log and "done; in" in log and (out / "decide_runs.tgz").stat().st_size > 0
