"""Processes that die with their parent, so that nothing attnbench starts outlives it.

On Linux the kernel does it: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` sends SIGKILL to this
process the moment its parent dies (a hung backend in an ``--isolate`` child would otherwise
run on, holding its GPU memory). Elsewhere a daemon thread polls the parent's pid once a
second. Either way, a parent that died before the call is noticed at once.

The other way round, a child tells its supervising parent (``attnbench.cli.supervise``) what
it is doing, one line at a time on a pipe: ``report("folder", PATH)``, ``report("exit", 0)``.
The pipe is this process's alone: a process a backend forks (a daemon, a fork whose child
returns too) closes it at once (``os.register_at_fork``) and never reports; a write end that a
backend closed (or whose number now names another file) is never written to: on Linux it is
opened again through the parent's read end (``/proc/PARENT/fd/N``).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Optional

from attnbench.store.writer import leave_if_copy

PR_SET_PDEATHSIG = 1
_pipe: Optional[int] = None  # the write end of the pipe to a supervising parent (None: not supervised)
_OWN: dict = {}  # pid: the process that reports; pipe: the pipe's (st_dev, st_ino); parent, read_fd: its other end


def report_to(fd: int, parent: Optional[int] = None, read_fd: Optional[int] = None) -> None:
    """Report on the pipe ``fd`` from now on (``parent``, ``read_fd``: the supervising process and
    its read end, through which a write end a backend closed is opened again)."""
    global _pipe
    st = os.fstat(fd)
    _pipe = fd
    if not _OWN:
        os.register_at_fork(after_in_child=_forked)
    _OWN.update(pid=os.getpid(), pipe=(st.st_dev, st.st_ino), parent=parent, read_fd=read_fd)


def _forked() -> None:
    """In a process forked from this one (by a backend): let go of the pipe; it is not ours."""
    global _pipe
    if _pipe is not None and _same_pipe(_pipe):
        try:
            os.close(_pipe)
        except OSError:
            pass
    _pipe = None


def _same_pipe(fd: int) -> bool:
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == _OWN.get("pipe")


def _writable_pipe() -> Optional[int]:
    """The write end, checked to still be the pipe (a backend may have closed it, and another
    file may have taken its number); else opened again through the parent's read end (Linux)."""
    global _pipe
    if _pipe is not None and _same_pipe(_pipe):
        return _pipe
    parent, read_fd = _OWN.get("parent"), _OWN.get("read_fd")
    if parent is None or read_fd is None:
        return None
    try:
        fd = os.open(f"/proc/{parent}/fd/{read_fd}", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if not _same_pipe(fd):
        os.close(fd)
        return None
    _pipe = fd
    return fd


def report(kind: str, value) -> None:
    """One message to the supervising parent, if there is one (never raises): a line
    ``KIND JSON``, the value JSON-encoded so that a path with a newline stays one line. Only
    the process that was told ``report_to`` reports (not a process a backend forked)."""
    if _pipe is None and not _OWN.get("parent") or os.getpid() != _OWN.get("pid"):
        return
    try:
        fd = _writable_pipe()
        if fd is not None:
            os.write(fd, f"{kind} {json.dumps(value)}\n".encode())
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
    ``error`` row for the backend that killed it. A copy of the process that a backend forked
    and that comes back here leaves (``store.writer``)."""
    if not _OWN:
        return
    leave_if_copy(_OWN["pid"])
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
