"""Issue 25, the process and its inputs: SIGINT to the command's pid stops it like Ctrl-C, a
backend that kills the process without --isolate gets an error row and takes no finished row
with it, a backend file that calls sys.exit or reuses a name is refused, an --out with a newline
completes, duplicate YAML keys are refused."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.runfolder import RunFolder

from .test_cli import TINY
from .conftest import wait_rows

cli = CliRunner()
BAD_FILE = str(Path(__file__).with_name("misbehaving_backends.py"))
CMD = [sys.executable, "-m", "attnbench"]


@pytest.mark.slow
def test_sigint_to_the_command_pid_stops_it_like_ctrl_c(tiny, tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen([*CMD, "run", str(tiny), "--out", str(out), "--backend-file", BAD_FILE, "-b", "sdpa", "-b", "sleepy",
                          # 24 cases of >= 3 s each: the SIGINT lands mid-run even when this process is
                          # descheduled for many seconds (a loaded CI machine finished 6 cases before it
                          # once; with 0.4 s cases a loaded 2-core machine finished all 24 before it)
                          "--set", "sweep={kv_cache.page_size: [4, 8, 16, 32, 64, 128], seed: [0, 1, 2, 3]}", "-q"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "ATTNBENCH_TEST_SLEEPY_S": "3"},
                         # a pytest started in the background by a non-interactive shell (`cmd &`) has
                         # SIGINT ignored, and a child inherits that: the run then never sees the signal
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_rows(out, 2)
    os.kill(p.pid, signal.SIGINT)  # the supervising parent's pid, not the process group
    _, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr
    assert "interrupted" in stderr and f"--resume {out}" in stderr and "Traceback" not in stderr
    rf = RunFolder.load(out)
    assert rf.manifest.status == "incomplete" and 2 <= len(rf.rows) < 48


@pytest.mark.slow
@pytest.mark.parametrize("rounds", [1, 3])
def test_a_backend_that_aborts_without_isolate_takes_no_finished_row_along(tiny, tmp_path, rounds):
    out = tmp_path / "run"
    args = ["--backend-file", BAD_FILE, "-q"]
    p = subprocess.run([*CMD, "run", str(tiny), "--out", str(out), "--set", "sweep={}", "--set", f"timing.rounds={rounds}",
                        "-b", "blank", "-b", "sdpa", "-b", "aborts", "-b", "reference", *args],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 128 + signal.SIGABRT, p.stderr
    rows = {r.id.backend: r for r in RunFolder.load(out).rows}
    assert rows["blank"].status == "error"  # finished before the abort (in rounds mode too)
    assert rows["aborts"].status == "error" and "SIGABRT" in rows["aborts"].reason
    if rounds == 1:
        assert rows["sdpa"].status == "ok"
    assert "recorded an error row for aborts" in p.stderr
    # the resumed run goes on past the backend that killed the process
    p = subprocess.run([*CMD, "run", "--resume", str(out), *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    rows = RunFolder.load(out).rows
    assert sorted(r.id.backend for r in rows) == ["aborts", "blank", "reference", "sdpa"]
    assert {r.id.backend: r.status for r in rows}["reference"] == "ok"


def test_a_backend_file_that_exits_at_import_is_an_error(tiny, tmp_path):
    f = tmp_path / "quits.py"
    f.write_text("import sys\nsys.exit(0)\n")
    r = cli.invoke(app, ["run", str(tiny), "--backend-file", str(f), "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and "sys.exit(0)" in r.output and str(f) in r.output, r.output
    assert not (tmp_path / "run").exists()


def test_two_backend_files_registering_one_name_are_refused(tiny, tmp_path):
    body = "from attnbench.backend import Backend\nclass A(Backend):\n    name = 'twin'\n    def plan(self, b): return b\n" \
           "    def run(self, p): return None\n"
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text(body)
    b.write_text(body)
    r = cli.invoke(app, ["run", str(tiny), "--backend-file", str(a), "--backend-file", str(b), "-b", "twin", "--list"])
    assert r.exit_code == 2 and "'twin'" in r.output and str(a.resolve()) in r.output, r.output
    r = cli.invoke(app, ["validate", str(tiny), "--backend-file", str(a), "--backend-file", str(a)])  # the same file twice
    assert r.exit_code == 0, r.output
    # one command per file: a later command is not blamed for an earlier command's file (tests run
    # several commands in one process; the GPU fault tests each write their own copy of a file)
    r = cli.invoke(app, ["validate", str(tiny), "--backend-file", str(b)])
    assert r.exit_code == 0, r.output


@pytest.mark.slow
def test_out_with_a_newline_completes_with_exit_0(tiny, tmp_path):
    out = tmp_path / "two\nlines"
    p = subprocess.run([*CMD, "run", str(tiny), "--out", str(out), "--set", "sweep={}", "-b", "sdpa", "-q"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"


def test_duplicate_yaml_keys_are_refused_by_validate_and_run(tmp_path):
    f = tmp_path / "dup.yaml"
    f.write_text(TINY + "batch: [{kind: decode, count: 9, context: 4}]\n")
    r = cli.invoke(app, ["validate", str(f)])
    assert r.exit_code == 2 and "'batch' appears twice" in r.output, r.output
    r = cli.invoke(app, ["run", str(f), "--list"])
    assert r.exit_code == 2 and "'batch' appears twice" in r.output, r.output
