"""Issue 13, the process: exits that tell the truth however the run ends (os._exit inside a
backend, SIGTERM, a killed parent), stdout that holds only the command's output, a full disk,
names with rich markup, and flags that used to be ignored."""
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.runfolder import RunFolder

from .test_cli import TINY
from .conftest import wait_rows

cli = CliRunner()
BAD_FILE = str(Path(__file__).with_name("misbehaving_backends.py"))
CMD = [sys.executable, "-m", "attnbench"]  # the console command: runs under its supervising parent


@pytest.mark.slow
def test_os_exit_0_in_a_backend_never_exits_0(tiny, tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([*CMD, "run", str(tiny), "--out", str(out), "--backend-file", BAD_FILE, "-b", "sdpa", "-b", "exits0",
                        "--set", "sweep={}", "-q"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert "without finishing" in p.stderr and f"run folder {out} is incomplete (2 rows recorded)" in p.stderr
    assert "recorded an error row for exits0" in p.stderr  # the supervising parent blames the running backend
    assert f"attnbench run --resume {out}" in p.stderr
    assert json.loads((out / "manifest.json").read_text())["status"] == "incomplete"
    rows = {r.id.backend: r for r in RunFolder.load(out).rows}
    assert rows["sdpa"].status == "ok"
    assert rows["exits0"].status == "error" and "exit status 0 without finishing" in rows["exits0"].reason
    # resumed, the backend that ended the process is not run again; the run completes
    p = subprocess.run([*CMD, "run", "--resume", str(out), "--backend-file", BAD_FILE, "-q"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    assert len(RunFolder.load(out).rows) == 2
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"


@pytest.mark.slow
def test_sigterm_exits_143_with_a_message_and_keeps_the_rows(tiny, tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen([*CMD, "run", str(tiny), "--out", str(out), "--backend-file", BAD_FILE, "-b", "sdpa", "-b", "sleepy",
                          "--set", "sweep={kv_cache.page_size: [4, 8, 16, 32, 64, 128]}", "-q"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "ATTNBENCH_TEST_SLEEPY_S": "3"})  # lands mid-run on a loaded machine
    wait_rows(out, 2)
    p.send_signal(signal.SIGTERM)  # to the supervising parent: it passes it on
    _, stderr = p.communicate(timeout=120)
    assert p.returncode == 143, stderr
    assert "terminated (SIGTERM)" in stderr and f"--resume {out}" in stderr
    rf = RunFolder.load(out)
    assert rf.manifest.status == "incomplete" and 2 <= len(rf.rows) < 12


def _descendants(pid: int) -> list[int]:
    kids = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_isolate_children_die_with_the_run(tiny, tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen([*CMD, "run", str(tiny), "--out", str(out), "--backend-file", BAD_FILE, "-b", "sleeps",
                          "--isolate", "--timeout", "600", "--set", "sweep={}", "-q"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t0, kids = time.monotonic(), []
        while time.monotonic() - t0 < 120:  # the supervised run process, and its isolate child running `sleeps`
            kids = _descendants(p.pid)
            if any(b"attnbench.execute.isolate" in Path(f"/proc/{k}/cmdline").read_bytes() for k in kids if _alive(k)):
                break
            time.sleep(0.1)
        assert len(kids) >= 2, kids
        time.sleep(1.0)  # the child is past its start-up, inside the backend's sleep
        p.kill()  # SIGKILL: nothing in the parent runs
        p.wait()
        t0 = time.monotonic()
        while any(_alive(k) for k in kids) and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        assert not [k for k in kids if _alive(k)], "processes outlived their parent"
    finally:
        for k in _descendants(p.pid):
            os.kill(k, signal.SIGKILL)


@pytest.mark.slow
def test_a_chatty_backend_leaves_json_and_csv_on_stdout_intact(tiny, tmp_path):
    for fmt in ("json", "csv"):
        p = subprocess.run([*CMD, "compare", "backends", str(tiny), "-b", "prints", "-b", "reference", "--backend-file", BAD_FILE,
                            "--format", fmt, "--set", "sweep={}", "--out", str(tmp_path / fmt), "-q"],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        assert "hello from the backend" in p.stderr and "raw bytes on fd 1" in p.stderr
        assert "hello" not in p.stdout and "raw bytes" not in p.stdout
        if fmt == "json":
            assert {r["backend"] for r in json.loads(p.stdout)} == {"prints", "reference"}
        else:
            assert p.stdout.splitlines()[0].startswith("case,") or "backend" in p.stdout.splitlines()[0]


@pytest.mark.slow
def test_a_full_disk_is_a_message_and_the_rows_before_stay(tiny, tmp_path):
    """RLIMIT_FSIZE makes every write past 16 KiB fail the way a full disk does (an OSError)."""
    out = tmp_path / "run"

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 14, 1 << 14))

    p = subprocess.run([*CMD, "run", str(tiny), "--out", str(out), "--set", "sweep={kv_cache.page_size: [4, 8, 16, 32]}",
                        "--set", "timing.min_runs=400", "--set", "timing.max_runs=400", "-q"],
                       capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "File too large" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert f"attnbench run --resume {out}" in p.stderr and "marked incomplete" in p.stderr
    assert json.loads((out / "manifest.json").read_text())["status"] == "incomplete"
    assert not [f for f in out.iterdir() if f.name.endswith(".tmp")]


def test_names_with_rich_markup_are_printed_as_written(tmp_path):
    s = tmp_path / "m.yaml"
    s.write_text(TINY.replace("name: tiny", 'name: "[/x] tiny [bf16]"'))
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(s), "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert "[/x] tiny [bf16] on" in r.output
    r = cli.invoke(app, ["compare", "backends", str(s), "-b", "sdpa", "-b", "reference", "--out", str(tmp_path / "c"), "-q"])
    assert r.exit_code == 0 and "[/x] tiny [bf16] on" in r.output, r.output


def test_set_on_a_swept_key_runs_that_value_and_says_so(tiny, tmp_path):
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(tiny), "--out", str(out), "--set", "kv_cache.page_size=16", "-q"])
    assert r.exit_code == 0, r.output
    assert "replaces the scenario's sweep of kv_cache.page_size ([4, 8])" in r.output.replace("\n", "")
    rf = RunFolder.load(out)
    assert {row.id.case_id for row in rf.rows} == {"page_size=16"}
    assert {row.workload.page_size for row in rf.rows} == {16}
    r = cli.invoke(app, ["run", str(tiny), "--out", str(tmp_path / "r2"), "--set", "sweep={kv_cache: [{page_size: 4}]}",
                         "--set", "kv_cache.page_size=16", "-q"])
    assert r.exit_code == 2 and "the scenario sweeps kv_cache" in r.output and "would overwrite" in r.output, r.output


def test_timeout_without_isolate_is_refused(tiny, tmp_path):
    r = cli.invoke(app, ["run", str(tiny), "--out", str(tmp_path / "o"), "--timeout", "5", "-q"])
    assert r.exit_code == 2 and "--timeout" in r.output and "add --isolate" in r.output, r.output
    assert not (tmp_path / "o").exists()
