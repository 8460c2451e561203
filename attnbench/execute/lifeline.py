"""Processes that die with their parent, so that nothing attnbench starts outlives it.

On Linux the kernel does it: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` sends SIGKILL to this
process the moment its parent dies (a hung backend in an ``--isolate`` child would otherwise
run on, holding its GPU memory). Elsewhere a daemon thread polls the parent's pid once a
second. Either way, a parent that died before the call is noticed at once.

The other way round, a child tells its supervising parent (``attnbench.cli.supervise``) what
it is doing, one line at a time on a pipe: ``report("folder", PATH)``, ``report("exit", 0)``.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Optional

PR_SET_PDEATHSIG = 1
_pipe: Optional[int] = None  # the write end of the pipe to a supervising parent (None: not supervised)


def report_to(fd: int) -> None:
    global _pipe
    _pipe = fd


def report(kind: str, value) -> None:
    """One message to the supervising parent, if there is one (never raises): a line
    ``KIND JSON``, the value JSON-encoded so that a path with a newline stays one line."""
    if _pipe is None:
        return
    try:
        os.write(_pipe, f"{kind} {json.dumps(value)}\n".encode())
    except (OSError, TypeError, ValueError):
        pass


def read_reports(data: bytes) -> list[tuple[str, object]]:
    """The parent's side of ``report``: (kind, value) per line; a line that does not decode is skipped."""
    out = []
    for line in data.decode(errors="surrogateescape").split("\n"):
        kind, _, rest = line.partition(" ")
        try:
            out.append((kind, json.loads(rest)))
        except ValueError:
            continue
    return out


_IDENTITY = ("scenario", "case_id", "backend", "device", "device_id", "dtype", "page_size", "layout", "batch",
             "num_requests", "num_tokens", "params", "repro")


def report_step(row, ended: bool) -> None:
    """``Runner.on_step`` of an in-process run: the row whose step is running (its identity),
    or None between steps, so that a parent that sees this process die can record an
    ``error`` row for the backend that killed it."""
    if _pipe is None:
        return
    flat = row.flat()  # the on-disk names: the parent reads it back with Row.from_json
    report("step", None if ended else {k: flat[k] for k in _IDENTITY})


def announce_run_folder(path) -> None:
    """Tell the supervising parent that this process writes the run folder ``path``."""
    report("folder", os.path.abspath(str(path)))


def _prctl_pdeathsig(sig: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(1.0)


def die_with_parent(parent_pid: int) -> None:
    """Be killed (SIGKILL) when the process ``parent_pid``, this process's parent, ends."""
    if not (sys.platform.startswith("linux") and _prctl_pdeathsig(signal.SIGKILL)):
        threading.Thread(target=_watch, args=(parent_pid,), name="attnbench-lifeline", daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the kernel (or the thread) watched
        os.kill(os.getpid(), signal.SIGKILL)
