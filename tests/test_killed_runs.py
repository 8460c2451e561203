"""Issue 37 items 5 and 24: a kill from outside is no backend's fault. SIGKILL of the running
command used to make the supervising parent record a permanent `error` row for the backend
that happened to run ("killed by SIGKILL while this backend ran"): --resume never measured it
again and its saved output stayed missing. Now no row is recorded for it and --resume runs it;
--resume also removes the `.pt.*.tmp` a kill inside torch.save leaves. Signals are sent only
after observable progress (a marker file the backend writes as it starts), with generous waits."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from .test_cli import TINY

CMD = [sys.executable, "-m", "attnbench"]
KILLED_FILE = str(Path(__file__).with_name("killed_backends.py"))
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]


def _wait_for(path: Path, proc, limit: float = 300) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < limit, f"no {path} after {limit} s"
        time.sleep(0.05)


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(x) for x in text.split()]


def test_sigkill_of_the_command_blames_no_backend_and_resume_reruns_the_row(tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY)
    out, marker = tmp_path / "run", tmp_path / "marker"
    env = {**os.environ, "ATTNBENCH_TEST_MARKER": str(marker)}
    args = ["--backend-file", KILLED_FILE, "-q"]
    p = subprocess.Popen([*CMD, "run", str(scenario), "--out", str(out), "-b", "sdpa", "-b", "sleeps_once",
                          "--save-tensors", str(tmp_path / "tensors"), *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _wait_for(marker, p)  # sleeps_once is inside its step of the second case
    (command,) = _children(p.pid)  # the supervising parent's one child runs the command
    os.kill(command, signal.SIGKILL)
    _, stderr = p.communicate(timeout=300)
    assert p.returncode == 137, stderr
    assert "a kill from outside is no backend's fault" in stderr and "recorded an error row" not in stderr
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines() if x.strip()]
    assert {r["status"] for r in rows} == {"ok"}, rows  # nothing blamed
    assert ("page_size=8", "sleeps_once") not in {(r["case_id"], r["backend"]) for r in rows}
    stale = tmp_path / "tensors" / ".page_size=8.pt.k1ll3d.tmp"  # what a SIGKILL inside torch.save leaves
    stale.write_bytes(b"half a file")
    r = subprocess.run([*CMD, "run", "--resume", str(out), *args], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "removed 1 temporary file(s)" in r.stderr and not stale.exists()
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}, rows
    saved = torch.load(tmp_path / "tensors" / "page_size=8.pt", weights_only=True)
    assert set(saved["outputs"]) == {"sdpa", "sleeps_once"}


def test_sigkill_of_an_isolated_child_blames_no_backend_and_resume_reruns_the_row(tmp_path):
    """Issue 60 item 22: the same kill of an --isolate child (kill -9, the OOM killer) used to be
    a permanent `error` row that --resume never measured again, its output missing."""
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY)
    out, marker = tmp_path / "run", tmp_path / "marker"
    env = {**os.environ, "ATTNBENCH_TEST_MARKER": str(marker)}
    args = ["--backend-file", KILLED_FILE, "-q"]
    p = subprocess.Popen([*CMD, "run", str(scenario), "--out", str(out), "-b", "sdpa", "-b", "sleeps_once", "--isolate",
                          "--save-tensors", str(tmp_path / "tensors"), *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _wait_for(marker, p)  # sleeps_once is inside its step of the second case, in its child process
    while not marker.read_text():
        time.sleep(0.05)
    os.kill(int(marker.read_text()), signal.SIGKILL)
    _, stderr = p.communicate(timeout=300)
    assert p.returncode == 137, stderr
    assert "sleeps_once in case page_size=8: its --isolate child process was killed by SIGKILL" in stderr, stderr
    assert "no backend's fault" in stderr and f"attnbench run --resume {out}" in stderr
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines() if x.strip()]
    assert {r["status"] for r in rows} == {"ok"} and len(rows) == 3, rows
    assert json.loads((out / "manifest.json").read_text())["status"] == "incomplete"
    r = subprocess.run([*CMD, "run", "--resume", str(out), *args], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}, rows
    saved = torch.load(tmp_path / "tensors" / "page_size=8.pt", weights_only=True)
    assert set(saved["outputs"]) == {"sdpa", "sleeps_once"}
