"""`compare commits` cannot borrow code, hang, lose its errors or leave its work folder behind
(issue 60, items 2, 11, 18-21, 25-27).

Most tests use a throwaway git repository holding a few files of a fake attnbench (a package
whose start-up sleeps, or imports a module it does not have, or whose `run` exits 3): they
exercise the real checkout, worker and command code in seconds. The one end-to-end run of real
turns is marked slow."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.execute.checkouts import Checkout
from attnbench.execute.interleave import InterleaveError, Worker

ROOT = Path(__file__).resolve().parents[1]
cli = CliRunner()
FAKE_APP = """\
import typer
app = typer.Typer()

@app.command()
def run(args: list[str] = typer.Argument(None)):
    raise typer.Exit(3)

@app.command()
def other():
    pass
"""


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    """A git repository of one commit holding ``files`` (an attnbench package of sorts)."""
    repo = tmp_path / "repo"
    for rel, text in {"attnbench/__init__.py": "", **files}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "fake"]):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)
    return repo


def _worker(tmp_path: Path, files: dict[str, str]) -> Worker:
    root = tmp_path / "co"
    for rel, text in {"attnbench/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "work").mkdir()
    return Worker(Checkout("head", root, "", "0" * 40), 1, tmp_path / "work")


def test_a_worker_imports_only_its_checkouts_attnbench(tmp_path):
    """Item 2: a module the checkout lacks came from the installed attnbench (an editable
    install's import hook answered for it), so a commit without attnbench/measure/ ran."""
    w = _worker(tmp_path, {"attnbench/cli/__init__.py": "import attnbench.measure\n" + FAKE_APP})
    try:
        with pytest.raises(InterleaveError, match="cannot import its attnbench: ModuleNotFoundError: No module named "
                                                  "'attnbench.measure'"):
            w.ready(60)
    finally:
        w.close(kill=True)


def test_a_runs_exit_code_reaches_the_gate(tmp_path):
    """Item 20: main(standalone_mode=False) returns typer.Exit's code; every run read as exit 0."""
    w = _worker(tmp_path, {"attnbench/cli/__init__.py": FAKE_APP})
    try:
        w.ready(60)
        assert w.run(["run", "x"], 60) == 3
        assert w.run(["other"], 60) == 0
    finally:
        w.close()


@pytest.mark.slow
def test_a_worker_that_hangs_while_importing_is_stopped_by_the_timeout(tmp_path):
    """Item 11: the start-up answer was read with no limit: a hang at import hung the gate."""
    w = _worker(tmp_path, {"attnbench/__init__.py": "import time\ntime.sleep(600)\n"})
    with pytest.raises(InterleaveError, match=r"gave no answer within 1 s \(--timeout\) during start-up"):
        w.ready(1)
    assert w.proc.poll() is not None  # killed, not left behind


def test_set_timing_rounds_is_refused_for_rounds(tmp_path):
    """Item 21: --set timing.rounds=N changed the turn size, so the rounds no longer alternated."""
    for s in ("timing.rounds=10", " timing.rounds = 10", "timing={rounds: 3}"):
        r = cli.invoke(app, ["compare", "commits", "ci-gate", "--repo", str(ROOT), "--set", s])
        assert r.exit_code == 2 and "pass --rounds N" in r.output and "Traceback" not in r.output, r.output


@pytest.mark.slow
@pytest.mark.parametrize("flag, says", [
    (["-k", "nosuchcase"], "-k 'nosuchcase' picks no case and backend of ci-gate.yaml (backends: sdpa, reference)"),
    (["--normalize-by", "nosuch"], "--normalize-by nosuch: not among the backends the scenario runs (sdpa, reference)"),
    (["-k", "not and"], "-k"),
])
def test_k_and_normalize_by_are_checked_before_any_turn(tmp_path, flag, says):
    """Item 26: they were checked after every turn had run (34-130 s of the CI gate)."""
    r = cli.invoke(app, ["compare", "commits", "ci-gate", "--repo", str(ROOT), "--base", "HEAD", *flag])
    assert r.exit_code == 2 and says in " ".join(r.output.split()), r.output
    assert "turn" not in r.output


def test_a_failing_side_keeps_its_logs_where_the_message_says(tmp_path, monkeypatch):
    """Item 19: the errors pointed at a log and run folders that were deleted on the way out.
    Item 2 end to end: a commit missing a module is refused, not run with the installed one."""
    repo = _repo(tmp_path, {"attnbench/cli/__init__.py": "import attnbench.measure\n" + FAKE_APP})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    r = cli.invoke(app, ["compare", "commits", "ci-gate", "--repo", str(repo), "--base", "HEAD", "--head", "HEAD",
                         "--workers", "1"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "No module named 'attnbench.measure'" in said, r.output
    work = next((tmp_path / "tmp").iterdir())
    assert f"kept in {work}" in said and (work / "runs" / "base-worker-1.log").is_file()


@pytest.mark.slow
def test_a_full_disk_names_the_step_and_the_path(tmp_path):
    """Item 25: `error: [Errno 28] No space left on device`, naming neither path nor step. A
    file-size limit (ulimit -f) fails the checkout's writes the way a full disk does."""
    repo = _repo(tmp_path, {"attnbench/PADDING.txt": "x" * (256 << 10)})
    out = tmp_path / "out"

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    r = subprocess.run([sys.executable, "-m", "attnbench", "compare", "commits", "ci-gate", "--repo", str(repo),
                        "--base", "HEAD", "--out", str(out)], capture_output=True, text=True, preexec_fn=limit,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2, said
    assert f"checking out --base HEAD, in {out / 'src-base'}" in said and "File too large" in said, said
    assert "Traceback" not in said


@pytest.mark.slow
def test_sigterm_removes_the_work_folder_as_ctrl_c_does(tmp_path):
    """Item 27: a CI cancel (SIGTERM) left the whole work folder under $TMPDIR (5.5-7.5 MB)."""
    repo = _repo(tmp_path, {"attnbench/__init__.py": "import time\ntime.sleep(600)\n"})
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "attnbench", "compare", "commits", "ci-gate", "--repo", str(repo),
                             "--base", "HEAD", "--head", "HEAD", "--workers", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "TMPDIR": str(tmp),
                                                                      "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 300  # a bound on a hang only: the workers start in well under it
        while not list(tmp.glob("attnbench-commits-*/runs/*-worker-1.log")) and proc.poll() is None:
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "terminated (SIGTERM): compare commits stopped" in out, out
    assert list(tmp.iterdir()) == [], out


@pytest.mark.slow
def test_a_relative_out_folder_works(tmp_path, monkeypatch):
    """Item 18: a relative --out never worked (the workers run in the checkouts' folders), and the
    message blamed the base's worker."""
    monkeypatch.chdir(tmp_path)
    quick = ["--rounds", "8", "--rounds-per-turn", "8", "--workers", "1", "--confidence", "90%", "--device", "cpu",
             "--set", "timing.measure_ms=5", "--set", "timing.min_runs=3", "--repo", str(ROOT)]
    r = cli.invoke(app, ["compare", "commits", "ci-gate", "--base", "HEAD", "--head", "HEAD", *quick,
                         "--out", "rel/out"])
    assert r.exit_code in (0, 1), r.output
    assert (tmp_path / "rel" / "out" / "runs" / "head" / "turn-01" / "rows.jsonl").is_file()
    assert "8 paired" in r.output or "PASS" in r.output or "FAIL" in r.output
