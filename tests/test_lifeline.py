"""Issue 60 items 5, 6, 12 and 28: the supervising parent owns the lifeline, and the run is
written by its own process only. A backend that forks (the child returns too) used to double
the run; one that closes descriptors it does not own made the parent append an error row for a
row already recorded `ok`; one that leaves a daemon holding the pipe kept `attnbench run` from
returning until the daemon ended; one that ignores SIGTERM and SIGINT made the run stoppable
only by SIGKILL. Each backend is a file written to tmp_path, run by the real command (its
supervising parent included); waits are generous bounds, never measured."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from attnbench.store.runfolder import RunFolder

from .test_cli import TINY

CMD = [sys.executable, "-m", "attnbench"]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes")]

PLUGINS = '''
import ctypes, os, signal, time
from pathlib import Path
from attnbench.backends.sdpa import SdpaBackend


class Forks(SdpaBackend):
    """os.fork() in its first call, and the child returns too."""
    name = "forks"
    forked = False

    def run(self, plan):
        if not Forks.forked:
            Forks.forked = True
            os.fork()
        return super().run(plan)


class Closes(SdpaBackend):
    """Closes every descriptor above stderr in its first call."""
    name = "closes"
    closed = False

    def run(self, plan):
        if not Closes.closed:
            Closes.closed = True
            os.closerange(3, 4096)
        return super().run(plan)


class LeavesDaemon(SdpaBackend):
    """Starts a daemon in its first call, forked by C (no Python fork hook runs), that keeps
    every descriptor but 0-2 and lives 600 s; its pid goes to $ATTNBENCH_TEST_DAEMON."""
    name = "leaves_daemon"
    started = False

    def run(self, plan):
        if not LeavesDaemon.started:
            LeavesDaemon.started = True
            pid = ctypes.CDLL(None).fork()
            if pid == 0:
                os.setsid()
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                time.sleep(600)
                os._exit(0)
            Path(os.environ["ATTNBENCH_TEST_DAEMON"]).write_text(str(pid))
        return super().run(plan)


class Deaf(SdpaBackend):
    """Ignores SIGTERM and SIGINT, says so in $ATTNBENCH_TEST_DEAF, then works 600 s."""
    name = "deaf"

    def run(self, plan):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        Path(os.environ["ATTNBENCH_TEST_DEAF"]).write_text("deaf")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 600:
            time.sleep(0.05)
        return super().run(plan)
'''


@pytest.fixture
def setup(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "plugins.py").write_text(textwrap.dedent(PLUGINS))
    return tmp_path


def _run(tmp_path, *backends, env=None, stdout_to=None):
    args = [*CMD, "run", str(tmp_path / "tiny.yaml"), "--out", str(tmp_path / "run"), "--backend-file",
            str(tmp_path / "plugins.py"), "--set", "sweep={}", "-q", *[x for b in backends for x in ("-b", b)]]
    out = stdout_to or subprocess.PIPE
    return subprocess.Popen(args, stdout=out, stderr=stdout_to or subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def _pairs(folder) -> list:
    rows = [json.loads(x) for x in (folder / "rows.jsonl").read_text().splitlines() if x.strip()]
    return sorted((r["case_id"], r["backend"], r["status"]) for r in rows)


@pytest.mark.parametrize("supervised", [True, False])
def test_a_backend_that_forks_and_returns_twice_writes_each_row_once(setup, supervised):
    p = _run(setup, "forks", "sdpa", env={} if supervised else {"ATTNBENCH_NO_SUPERVISOR": "1"})
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert _pairs(setup / "run") == [("default", "forks", "ok"), ("default", "sdpa", "ok")]  # once each, not twice
    assert RunFolder.load(setup / "run").manifest.status == "complete"
    assert "came back into the run; it leaves without writing" in err


def test_a_backend_that_closes_descriptors_it_does_not_own_corrupts_nothing(setup):
    p = _run(setup, "sdpa", "closes")
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert "recorded an error row" not in err and "without finishing" not in err, err
    assert _pairs(setup / "run") == [("default", "closes", "ok"), ("default", "sdpa", "ok")]
    assert RunFolder.load(setup / "run").manifest.status == "complete"


def test_a_daemon_holding_the_lifeline_does_not_keep_the_run_from_returning(setup):
    daemon, log = setup / "daemon", setup / "log"
    with open(log, "w") as f:  # not a pipe: the daemon keeps a copy of the command's stdout, as it would a terminal
        p = _run(setup, "leaves_daemon", "sdpa", env={"ATTNBENCH_TEST_DAEMON": str(daemon)}, stdout_to=f)
    try:
        assert p.wait(timeout=240) == 0, log.read_text()  # the daemon lives 600 s
        assert RunFolder.load(setup / "run").manifest.status == "complete"
    finally:
        p.kill()
        if daemon.exists():
            try:
                os.kill(int(daemon.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_backend_that_ignores_sigterm_is_killed_after_the_grace(setup):
    deaf = setup / "deaf"
    p = _run(setup, "sdpa", "deaf", env={"ATTNBENCH_TEST_DEAF": str(deaf)})
    try:
        t0 = time.monotonic()
        while not deaf.exists():
            assert p.poll() is None and time.monotonic() - t0 < 300, p.communicate()
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)  # to the supervising parent, which passes it on
        _, err = p.communicate(timeout=240)  # the backend works 600 s
    finally:
        p.kill()
    assert p.returncode == 143, err
    assert "did not stop within 10 s of SIGTERM" in err and f"attnbench run --resume {setup / 'run'}" in err, err
    assert RunFolder.load(setup / "run").manifest.status == "incomplete"
    assert _pairs(setup / "run") == [("default", "sdpa", "ok")]
