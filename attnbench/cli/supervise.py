"""The ``attnbench`` console command: the command runs in a child process that this one watches.

Why a second process: a backend can end the whole process with ``os._exit(0)`` (or a
segfault, or the OOM killer's SIGKILL) in the middle of a run. No ``finally``, ``atexit`` or
exit path inside that process runs then, and CI would read exit 0 as success. Only a parent
sees that end. So ``main`` forks; the child runs the command and tells the parent, on a
pipe, each run folder it starts (``folder PATH``) and, on its normal way out, its exit code
(``exit N``). The parent waits, then:

- the child said ``exit N``: the parent exits N (after checking that an exit 0 left every run
  folder it started complete);
- the child ended without saying so (``os._exit``, a signal): the run stopped before its end.
  The parent prints what happened and which run folder is incomplete (and how to resume it),
  and exits 3, or 128+N for a signal N.

The parent imports nothing heavy (the fork costs about a millisecond). It passes SIGTERM,
SIGHUP and a SIGINT sent to its pid (``kill -INT``) on to the child, which stops as on Ctrl-C
(rows kept, folder marked incomplete, exit 130); a SIGINT from the terminal (Ctrl-C) already
reaches the child, so the parent does not send it a second. A child whose handler of the
signal has not run ``STOP_GRACE_S`` later (a backend installed its own, or ignores it) is
killed with SIGKILL; the exit code is still the signal's (143, 130). The parent waits for the
child's exit, not for the pipe's end (a daemon a backend left may hold the pipe for good). The
child dies with the parent (``lifeline``). Without ``os.fork`` (Windows), or with ``ATTNBENCH_NO_SUPERVISOR=1``, the
command runs in this process and these guarantees do not hold.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Optional

from attnbench.execute.lifeline import read_reports

EXIT_STOPPED = 3  # the run stopped before its end without passing through attnbench's exit path

def _run_app() -> None:
    from attnbench.cli import app
    from attnbench.cli.app import plain_metavars
    from typer.main import get_command

    plain_metavars(get_command(app))(prog_name="attnbench")


def _child(w: int, parent: int, r: int) -> None:
    from attnbench.execute import lifeline

    lifeline.report_to(w, parent, r)
    lifeline.die_with_parent(parent)
    code = 1
    try:
        _run_app()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        raise
    finally:
        from attnbench.execute.lifeline import report

        report("exit", code)


# Commands that run no backend need no watching parent: they run in this process, without
# the fork's cost (x1.2 of `--version`). `backends --probe` and every run stay supervised.
LIGHT_COMMANDS = frozenset({"validate", "schema", "scenarios", "trees"})


def supervised(args: list[str]) -> bool:
    """Whether ``attnbench ARGS`` runs under the supervising parent: not for help, the version,
    and the commands that run no backend (a ``run --list`` only lists cases)."""
    if not args or "--help" in args or "-h" in args or args[0] in ("--version", "--install-completion", "--show-completion"):
        return False
    if args[0] in LIGHT_COMMANDS:
        return False
    if args[0] == "backends":
        return "--probe" in args
    return not (args[0] == "run" and "--list" in args)


def main() -> None:
    args = sys.argv[1:]
    if not hasattr(os, "fork") or os.environ.get("ATTNBENCH_NO_SUPERVISOR") == "1" or not supervised(args):
        _run_app()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(w, parent, r)
        return  # not reached: the app exits through SystemExit
    os.close(w)
    sys.exit(_supervise(pid, r))


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_SI_KERNEL = 0x80  # si_code of a signal the kernel sent: Ctrl-C at a terminal, to its whole process group
STOP_GRACE_S = 10.0  # a command told to stop (SIGTERM, SIGINT, SIGHUP) that still runs after this is killed


def _supervise(pid: int, r: int) -> int:
    """Wait for the child, passing signals on; then the exit code (``verdict``). The child's end
    is its exit, not the pipe's: a process a backend left behind (a daemon) may hold the pipe
    open for good. A child still running ``STOP_GRACE_S`` after a stop signal (a backend that
    ignores SIGTERM and SIGINT) is killed with SIGKILL."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # taken one by one below, with who sent them
    seen, stop, status = _Reports(), _Stop(), None
    while status is None:
        wait = 0.2 if _read(r, seen, 0.2) is None else 0  # no writer holds the pipe now: wait on signals instead
        while True:
            info = signal.sigtimedwait(_SIGNALS, wait)
            if info is None:
                break
            wait = 0
            stop.arrived(info.si_signo)
            _pass_on(pid, info)
        stop.enforce(pid, seen.stopping)
        done, st = os.waitpid(pid, os.WNOHANG)
        status = st if done else None
    for _ in range(64):  # what it wrote before it exited is in the pipe: read it, never waiting for its end
        if not _read(r, seen, 0):
            break
    code = os.waitstatus_to_exitcode(status)
    seen.feed(b"\n")
    out = verdict(code, seen.said, seen.folders, seen.step)
    return stop.exit_code(out)


def _read(r: int, seen: "_Reports", wait: float) -> Optional[bool]:
    """Feed what the pipe holds (waiting up to ``wait`` s for it): whether something came, None
    at its end (no process holds its write end)."""
    try:
        ready, _, _ = select.select([r], [], [], wait)
        if not ready:
            return False
        chunk = os.read(r, 1 << 16)
    except InterruptedError:
        return True
    seen.feed(chunk)
    return True if chunk else None


class _Stop:
    """A stop signal the command got: when, which; the SIGKILL after the grace."""

    def __init__(self):
        self.signo, self.since, self.killed = None, None, False

    def arrived(self, signo: int) -> None:
        if self.since is None:
            self.signo, self.since = signo, time.monotonic()

    def enforce(self, pid: int, stopping: bool) -> None:
        """SIGKILL once the grace is over, unless the command said it is stopping (marking its
        folder, printing what it kept: a large table may take a while)."""
        if self.since is not None and not self.killed and not stopping and time.monotonic() - self.since > STOP_GRACE_S:
            self.killed = True
            sys.stderr.write(f"error: attnbench did not stop within {STOP_GRACE_S:g} s of {_signame(self.signo)} "
                             "(a backend ignores it, or blocks it?): killed with SIGKILL\n")
            _forward(pid, signal.SIGKILL)

    def exit_code(self, out: int) -> int:
        """The signal the user sent, not the SIGKILL that carried it out."""
        return 128 + self.signo if self.killed else out


class _Reports:
    """What the child said so far: its run folders, its exit code, the step running now
    (lines are read as they come: a long run's steps are not all kept)."""

    def __init__(self):
        self.buf, self.folders, self.said, self.step = b"", [], None, None
        self.stopping = False  # its handler of a stop signal ran: it is stopping (not ignoring the signal)

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        if b"\n" not in self.buf:
            return
        done, self.buf = self.buf.rsplit(b"\n", 1)
        for kind, value in read_reports(done):
            if kind == "folder" and isinstance(value, str) and value not in self.folders:
                self.folders.append(value)
            elif kind == "exit":
                self.said = value if isinstance(value, int) and not isinstance(value, bool) else 1
            elif kind == "stopping":
                self.stopping = True
            elif kind == "step":
                self.step = value if isinstance(value, dict) else None


def _pass_on(pid: int, info) -> None:
    """SIGTERM and SIGHUP go on to the child; SIGINT too, unless the terminal sent it (Ctrl-C
    reaches the child directly then: passing it on would interrupt its cleanup)."""
    if info.si_signo == signal.SIGINT and info.si_code == _SI_KERNEL:
        return
    _forward(pid, info.si_signo)


def _forward(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _status(folder: str) -> str:
    from attnbench.store.manifest import Manifest  # small: dataclasses only

    try:
        man = Manifest.from_json(json.loads(open(os.path.join(folder, "manifest.json")).read()))
        return man.status or ""
    except (OSError, ValueError):
        return ""


def _remove_if_never_began(folder: str) -> bool:
    """Remove a run folder that holds nothing but its lock file (the process died between
    making it and writing its manifest: `--resume` could not use it); True when removed."""
    try:
        if sorted(os.listdir(folder)) != [".lock"]:
            return False
        os.unlink(os.path.join(folder, ".lock"))
        os.rmdir(folder)
    except OSError:
        return False
    return True


def _rows(folder: str) -> int:
    try:
        with open(os.path.join(folder, "rows.jsonl"), "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def verdict(code: int, said: Optional[int], folders: list[str], step: Optional[dict] = None) -> int:
    """The exit code of the command from how the child ended; prints why when it differs.
    ``step``: the row whose backend was running when the child died (it gets an error row)."""
    incomplete = [f for f in folders if _status(f) != "complete"]
    if said is not None and (said != 0 or not incomplete):
        return said
    never_began = [f for f in incomplete if _remove_if_never_began(f)]
    incomplete = [f for f in incomplete if f not in never_began]
    if code < 0:
        how, out = f"was killed by {_signame(-code)}", 128 - code
    elif said == 0:
        how, out = "exited 0 but left its run folder incomplete", EXIT_STOPPED
    else:
        how, out = f"ended with exit status {code} without finishing (a backend called os._exit or exit?)", EXIT_STOPPED
    msg = f"error: attnbench {how}; no cleanup ran."
    own_fault = code >= 0 or -code in _CRASHES  # else a kill from outside (kill -9, the OOM killer, a SIGTERM)
    if step and said is None and incomplete:
        msg += _record_culprit(incomplete[-1], step, how) if own_fault else (
            f"\n  {step.get('backend')} was running in case {step.get('case_id')}: a kill from outside is no backend's "
            "fault, so no row was recorded for it and --resume runs it again")
    for f in never_began:
        msg += f"\n  the run stopped before it began (no manifest yet): removed its empty run folder {f}"
    for f in incomplete:
        msg += (f"\n  run folder {f} is incomplete ({_rows(f)} rows recorded): finish it with `attnbench run --resume {f}`"
                + (" (add --isolate to survive the backend that did this)" if own_fault and step else ""))
    sys.stderr.write(msg + f"\n  exit code {out}\n")
    return out


# signals a process gets from its own crash (a backend's segfault, abort, bad instruction): the
# backend running is to blame. SIGKILL (kill -9, the OOM killer), SIGTERM, SIGINT, SIGHUP and the
# rest come from outside: the row that was running is not recorded, and --resume runs it again.
_CRASHES = frozenset(getattr(signal, n) for n in ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGSYS", "SIGTRAP")
                     if hasattr(signal, n))


def _record_culprit(folder: str, step: dict, how: str) -> str:
    """An ``error`` row for the backend that was running when the process died (a resumed run
    then goes on past it); returns a line saying so, or why it could not be written."""
    try:
        from attnbench.store.rows import Row, Status, checked
        from attnbench.store.runfolder import RunFolder

        row = Row.from_json(step)
        row.status = Status.ERROR
        row.reason = (f"the attnbench process {how} while this backend ran "
                      "(without --isolate: the case's other unfinished rows were lost with it; --isolate runs "
                      "each case's backends in a child process)")
        rf = RunFolder.open_locked(Path(folder))
        try:
            if any((r.id.case_id, r.id.backend) == (row.id.case_id, row.id.backend) for r in rf.rows):
                return (f"\n  {row.id.backend} in case {row.id.case_id} has its row already (its step's end never "
                        "reached this process): no error row added")
            rf.add(checked(row))
        finally:
            rf.unlock()
    except Exception as e:  # noqa: BLE001 - the message below still says what happened
        return f"\n  (could not record an error row for the backend that was running: {type(e).__name__}: {e})"
    return f"\n  recorded an error row for {row.id.backend} in case {row.id.case_id}, which was running"


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
