"""One writer per run: the process that holds the run folder. A backend that calls ``os.fork()``
and whose child returns too (or a fork that comes back into attnbench's code some other way)
makes a copy of that process, running the same loop: it used to write every row a second time
and mark the run complete. The copy leaves at once, without a write, when it reaches the run's
files or its lifeline (``leave_if_copy``); the backend's own children that never come back
(a pool's workers, a compile server) are left alone.

The run folder's lock (``lock_file``) is let go of only while its descriptor is still the lock
file's (``release``): a backend that closed descriptors it does not own may have left that
number to another file, which closing would take from its owner.
"""
from __future__ import annotations

import os
from pathlib import Path

_ABANDONED: list = []  # lock files whose descriptor a backend closed: kept, so that nothing closes the number


class FolderBusy(OSError):
    """Another process holds the lock (``holder``: the pid it wrote, or ``?``)."""

    def __init__(self, holder: str):
        super().__init__(f"locked by pid {holder}")
        self.holder = holder


def lock_file(path: Path):
    """An exclusive, non-blocking ``flock`` on the file ``path`` (made if new) holding this
    pid; the open file (closing it, or the end of the process, releases it), None without
    ``flock`` (Windows: one writer is then up to the user). FolderBusy when another holds it."""
    try:
        import fcntl
    except ImportError:
        return None
    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise FolderBusy(holder) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    f.identity = _identity(f.fileno())
    return f


def release(f) -> None:
    """Close a lock file of ``lock_file``, unless a backend closed its descriptor (another file
    may have its number now: the file object is kept, never closed)."""
    if f is None:
        return
    if _identity(f.fileno()) == getattr(f, "identity", None):
        f.close()
    else:
        _ABANDONED.append(f)


def _identity(fd: int):
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def leave_if_copy(owner_pid: int) -> None:
    """End this process (``os._exit(0)``, nothing written) when it is not ``owner_pid``, the
    process that runs the command, but a copy of it forked by a backend."""
    pid = os.getpid()
    if owner_pid is not None and pid != owner_pid:
        try:
            os.write(2, (f"attnbench: process {pid}, a copy of the run's process {owner_pid} forked by a backend, came "
                         "back into the run; it leaves without writing (only the run's own process writes its rows)\n"
                         ).encode())
        except OSError:
            pass
        os._exit(0)
