"""``attnbench run --isolate``: each case's backends run in a child process.

The parent starts ``python -m attnbench.execute.isolate --fd N`` per case, sends it a
``Job`` on stdin (``execute.job``: the scenario text and overrides, the case id, the backends
still to run, the run options and the ``--backend-file`` files to load) and reads events
(``execute.events``, the vocabulary a Dask worker uses too) back on pipe ``N``, one JSON
object a line: ``ready`` once the child has loaded everything, ``start`` and ``end`` around
each step of a backend (its plan and checks, each timing round, its statistics and profile),
``row`` with each finished row. Steps are reported one by one even when ``timing.rounds > 1`` makes the
backends of a case take turns and their rows come out together at the end of the case, so a
crash is always blamed on the backend whose step was running. The child rebuilds the batch
from the scenario and its seed, so its inputs are the ones an in-process run would use. Rows
are written by the parent's run folder, each through ``store.rows.checked``.

When the child dies (segfault, abort, ``os._exit``) or a backend runs longer than
``--timeout`` seconds (counted from its first step; with ``timing.rounds``, from its first
step of each turn), the parent kills it (its whole process group), records an ``error`` row
for the backend that was running (the signal or exit code, and the last lines of the child's
stderr: with faulthandler on, the Python frame that crashed) and starts a fresh child for the
case's remaining backends. On a CUDA device the child also exits after any ``error`` (after
the row, or after the step, in rounds), since an illegal memory access leaves the CUDA
context unusable.
The child's stdout and stderr go to a temporary file, not to the terminal.
"""
from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

from attnbench.execute import events as ev_
from attnbench.execute.job import Job
from attnbench.execute.options import SaveTensorsError
from attnbench.execute.stops import RowsLeft
from attnbench.store.rows import Row, Status, checked

SETUP_GRACE_S = 120.0  # loading torch, the scenario and the backend files, on top of --timeout


# -- parent side ------------------------------------------------------------------------------
_TIMEOUT = object()


class _Child:
    def __init__(self, job: Job):
        r, w = os.pipe()
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ)
        pkg_parent = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONFAULTHANDLER"] = "1"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "attnbench.execute.isolate", "--fd", str(w), "--parent", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=self.log,
                stderr=self.log,
                pass_fds=(w,),
                start_new_session=True,  # Ctrl-C reaches the parent only; kill takes the group; dies with the parent (lifeline)
                env=env,
            )
        finally:
            os.close(w)
        self.fd = r
        self.buf = b""
        self.timed_out = False  # killed by the parent (--timeout), not from outside
        try:
            self.proc.stdin.write(json.dumps(job.to_json(), default=str).encode())
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the child died at once: its exit status says why

    def next_event(self, deadline: float):
        """The next message, None at end of stream (the child exited), or _TIMEOUT."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return _TIMEOUT
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return {"event": "junk", "text": line[:200].decode(errors="replace")}

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.proc.wait()

    def exit_text(self) -> str:
        rc = self.proc.wait()
        if rc < 0:
            try:
                sig = signal.Signals(-rc)
                desc = signal.strsignal(sig) or ""
                return f"killed by {sig.name}" + (f" ({desc.lower()})" if desc else "")
            except ValueError:
                return f"killed by signal {-rc}"
        return f"exited with code {rc}"

    def stderr_tail(self, max_chars: int = 400) -> str:
        """The child's last words: the crashing frame (faulthandler), else the last lines."""
        try:
            self.log.flush()
            self.log.seek(0)
            text = self.log.read()[-(1 << 16):].decode(errors="replace")
        except (OSError, ValueError):
            return ""
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if not lines:
            return ""
        for i, ln in enumerate(lines):
            if ln.startswith("Fatal Python error"):
                frames = [x for x in lines[i + 1:] if x.startswith("File ")]
                picked = [ln] + frames[:1]
                break
        else:
            picked = lines[-3:]
        return " | ".join(picked)[-max_chars:]

    def close(self) -> None:
        self.kill()
        try:
            os.close(self.fd)
        except OSError:
            pass
        self.log.close()


def _describe(child: _Child, how: str) -> str:
    tail = child.stderr_tail()
    return f"{how}; last stderr: {tail}" if tail else how


class IsolatedRunner:
    """The isolated executor: a local ``Runner``'s cases, each case's backends in child
    processes. Everything but ``rows`` is the local runner's (its backends, device, -k)."""

    def __init__(self, runner, job: Job, timeout: float):
        self.runner, self.job, self.timeout = runner, job, timeout

    def __getattr__(self, name: str):
        return getattr(self.runner, name)

    def writing_to(self, run: str, profile_dir=None) -> "IsolatedRunner":
        """See ``Runner.writing_to``: the children run with those options too."""
        inner = self.runner.writing_to(run, profile_dir)
        return IsolatedRunner(inner, dataclasses.replace(self.job, options=inner.opts), self.timeout)

    def rows(self, done: frozenset = frozenset()) -> Iterator[Row]:
        return isolated_rows(self.runner, self.job, self.timeout, done)


def isolated_rows(runner, job: Job, timeout: float, done: frozenset = frozenset()) -> Iterator[Row]:
    """Like ``Runner.rows`` with each case's backends in child processes. A child killed from
    outside (SIGKILL: ``kill -9``, the OOM killer; SIGTERM, SIGINT, SIGHUP) is no backend's
    fault: no row is recorded for the backend that ran, the others go on, and the run ends
    with ``RowsLeft`` (marked incomplete: ``--resume`` measures it again)."""
    left: list[tuple[str, int]] = []  # (what was left, the signal)
    for case in runner.sf.cases:
        remaining = runner.todo(case, done)
        while remaining:
            # the runner's options: the backend specs it resolved, the run folder it writes
            case_job = job.for_case(case.case_id, remaining, options=runner.opts)
            for row in _run_child(runner, case, remaining, case_job, timeout, left):
                yield checked(row)
    if left:
        raise RowsLeft("; ".join(text for text, _ in left), 128 + left[0][1])


def _failed_row(runner, case, name: str, reason: str) -> Row:
    row = runner.base_row(case, case.scenario.batch_spec(), name)
    row.status, row.reason = Status.ERROR, reason[:600]
    return row


def _run_child(runner, case, remaining: list[str], job: Job, timeout: float, left: list) -> Iterator[Row]:
    """One child for the case's ``remaining`` backends; removes each finished one from the list
    (and each one a kill from outside stopped, named in ``left``)."""
    child = _Child(job)
    current: Optional[str] = None  # the backend whose step is running
    last: Optional[str] = None  # the backend that started a step last
    ready = False
    restarting = False  # the child said it exits on purpose (a CUDA error): a fresh one goes on
    failure: Optional[str] = None
    try:
        deadline = time.monotonic() + timeout + SETUP_GRACE_S
        while True:
            ev = child.next_event(deadline)
            if ev is _TIMEOUT:
                failure = _timed_out(child, timeout, current, last)
                break
            if ev is None:
                if remaining and not (restarting and child.proc.wait() == 0):
                    failure = _describe(child, f"child process {child.exit_text()}")
                break
            kind = ev.get("event")
            if kind == ev_.READY:
                ready = True
            elif kind == ev_.START:
                if ev["backend"] != last:  # --timeout is per backend (per turn, with timing.rounds)
                    deadline = time.monotonic() + timeout
                current = last = ev["backend"]
            elif kind == ev_.END:
                current = None
            elif kind == ev_.ROW:
                row = ev_.row_of(ev)
                if row.id.backend in remaining:
                    remaining.remove(row.id.backend)
                current = None
                yield row
            elif kind == ev_.SAVE_FAILED:  # after every row: the run stops, saying why
                raise SaveTensorsError(ev.get("reason", "--save-tensors: could not write"))
            elif kind == ev_.FATAL:
                failure = f"the isolated child could not set up the case: {ev.get('reason', '')}"
                current = None
                ready = False
            elif kind == ev_.DONE and not remaining:  # its end: a process it left behind may hold the pipe for good
                break
            elif kind == ev_.RESTART:  # (DONE too: the end of stream follows)
                restarting, current = True, None  # the backends left are not to blame
    finally:
        child.close()
    if failure is not None:  # else every backend is done, or a restart: a fresh child takes the ones left
        # the backend whose step was running; else the one whose steps ended last without its row (a
        # fault reported after its step, e.g. while freeing its memory): the ones after it never ran
        culprit = (current if current is not None else last if last in remaining else None) if ready else None
        if _killed_from_outside(child):
            _leave_for_resume(case, remaining, culprit, child, left)
        else:
            yield from _blame(runner, case, remaining, failure, culprit)


def _timed_out(child: _Child, timeout: float, current: Optional[str], last: Optional[str]) -> str:
    """Kill the child that overran --timeout; the failure's text (what it was doing)."""
    child.timed_out = True
    child.kill()
    what = (
        f"while running {current}" if current
        else "between backends (saving tensors or freeing memory)" if last
        else "while loading (before any backend ran)"
    )
    return _describe(child, f"timed out: no result after {timeout:g} s (--timeout) {what}; child process killed")


_OUTSIDE = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})  # kills no crash makes


def _killed_from_outside(child: _Child) -> bool:
    """The child ended by a signal from outside (not by its own crash, nor by our --timeout kill)."""
    return not getattr(child, "timed_out", False) and -child.proc.wait() in _OUTSIDE


def _leave_for_resume(case, remaining: list[str], culprit: Optional[str], child: _Child, left: list) -> None:
    """No row for the backend a kill from outside stopped (every backend left, when none had
    started): it is named in ``left``, and --resume runs it again."""
    for n in [culprit] if culprit is not None else list(remaining):
        remaining.remove(n)
        left.append((f"{n} in case {case.case_id}: its --isolate child process was {child.exit_text()} from outside "
                     "(kill -9, the OOM killer?), no backend's fault, so no row was recorded for it", -child.proc.wait()))


def _blame(runner, case, remaining: list[str], failure: str, culprit: Optional[str]) -> Iterator[Row]:
    """The error row(s) of a child's failure: the culprit's, or (none) every remaining backend's."""
    for n in [culprit] if culprit is not None else list(remaining):
        remaining.remove(n)
        yield _failed_row(runner, case, n, failure)


# -- child side -------------------------------------------------------------------------------
def _die_with_parent(argv: list[str]) -> None:
    """A killed parent takes this child with it: a hung backend must not run on (holding a GPU)."""
    if "--parent" in argv:
        from attnbench.execute.lifeline import die_with_parent

        die_with_parent(int(argv[argv.index("--parent") + 1]))


def _child_main(argv: list[str]) -> int:
    faulthandler.enable()
    _die_with_parent(argv)
    fd = int(argv[argv.index("--fd") + 1])
    out = os.fdopen(fd, "w", buffering=1)

    def send(obj: dict) -> None:
        out.write(json.dumps(obj, default=str) + "\n")
        out.flush()

    try:
        job = Job.from_json(json.loads(sys.stdin.read()))
        sent: set[str] = set()
        step = _StepReporter(send, sent, out)
        runner = job.runner(on_step=step)
        case = job.case(runner)
        step.arm(runner, case, job.backends)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which records rows
        send(ev_.event(ev_.FATAL, reason=f"{type(e).__name__}: {str(e).strip()[:300]}"))
        return 1
    send(ev_.event(ev_.READY))
    try:
        for row in runner.run_case(case, list(job.backends)):  # the case's epilogue (--save-tensors) runs too
            send(ev_.row_event(row))
            sent.add(row.id.backend)
            step.restart_if_poisoned(row)
    except SaveTensorsError as e:
        send(ev_.event(ev_.SAVE_FAILED, reason=str(e)))
        return 1
    send(ev_.event(ev_.DONE))
    out.close()
    return 0


class _StepReporter:
    """The child's step observer: each step's START/END to the parent; in rounds mode, after
    an error on a GPU, the restart (the CUDA context may be unusable)."""

    def __init__(self, send, sent: set, out):
        self.send, self.sent, self.out = send, sent, out
        self.runner, self.names, self.rounds = None, [], 1

    def arm(self, runner, case, names: list[str]) -> None:
        self.runner, self.names, self.rounds = runner, list(names), runner.timing_config(case).rounds

    def __call__(self, row: Row, ended: bool) -> None:
        self.send(ev_.step_event(row, ended))
        if ended and self.rounds > 1:  # the other backends' steps come before this row is done
            self.restart_if_poisoned(row)

    def restart_if_poisoned(self, row: Row) -> None:
        """After an error on a GPU the CUDA context may be unusable: send the row (if it was
        not), exit, and let a fresh process run the backends left (if any)."""
        others = [n for n in self.names if n not in self.sent and n != row.id.backend]
        if row.status is Status.ERROR and self.runner.device.type == "cuda" and others:
            if row.id.backend not in self.sent:
                self.send(ev_.row_event(checked(row)))
            self.send(ev_.event(ev_.RESTART))
            self.out.close()
            os._exit(0)


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv))
