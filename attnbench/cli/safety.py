"""What keeps a run's output honest while backends run: flags that cannot apply are refused,
the places a run writes are tried before any work, a backend's prints stay off stdout, and
SIGTERM stops a run the way Ctrl-C does (rows kept, folder marked incomplete, exit 143).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Optional

from attnbench.execute.stops import Stopped, Terminated, arm, on_stop_signal  # noqa: F401 - Stopped, Terminated: the command's

# `run` flags that shape the rows; a resumed run keeps the run's own (from its manifest)
RESUME_KEEPS = (
    "scenario", "set_", "backend", "device", "out", "results_dir", "save_tensors", "warm_l2", "no_graphs",
    "warmup_ms", "measure_ms", "flush", "rtol", "threads", "profile", "timeout", "select",
)


def flags_given(ctx, names) -> list[str]:
    """The flags among ``names`` (parameter names) given on the command line, as the user
    spells them (``--measure-ms``, ``-b/--backend``, ``SCENARIO``)."""
    given = []
    for p in ctx.command.params:
        src = getattr(ctx.get_parameter_source(p.name), "name", None)  # by name: typer may carry its own click
        if p.name in names and src not in (None, "DEFAULT", "DEFAULT_MAP"):
            given.append("/".join(sorted(p.opts, key=len)) if p.param_type_name == "option" else p.name.upper())
    return given


def check_writable(folder: Optional[Path], flag: str) -> None:
    """Create ``folder`` and write (then remove) a file in it, before any work is done:
    OSError names the flag, the folder and the reason (read-only, no space, a file there)."""
    if folder is None:
        return
    folder = Path(folder)
    try:
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(20, "a file, not a folder", str(folder))
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".attnbench-probe-"):
            pass
    except OSError as e:
        raise WriteError(f"{flag} {folder}: cannot write there ({e.strerror or e}); choose a folder you can write") from None


class WriteError(OSError):
    """A place the run must write to cannot be written; the message says which and why."""

    def __str__(self) -> str:
        return self.args[0] if self.args else "cannot write"


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """While backends run, whatever they print goes to stderr, so that stdout holds only the
    command's own output (a JSON or CSV table stays parseable). Both levels: ``print`` (sys.stdout)
    and writes to file descriptor 1 from C code."""
    sys.stdout.flush()
    try:
        out_fd, err_fd = sys.stdout.fileno(), sys.stderr.fileno()
        saved = os.dup(out_fd)
        ident = _identity(saved)
    except (AttributeError, OSError, ValueError):  # captured streams (tests) have no descriptor
        out_fd = saved = None
    if saved is not None:
        os.dup2(err_fd, out_fd)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None and _identity(saved) == ident:
            os.dup2(saved, out_fd)
            os.close(saved)
        elif saved is not None:  # a backend closed it (its number may name another file now): never written
            sys.stderr.write(f"warning: a backend closed file descriptor {saved}, attnbench's copy of its standard "
                             "output; what the command prints next goes to stderr\n")


def _identity(fd: int):
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_rdev


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` and SIGINT ``Stopped`` (a KeyboardInterrupt) in the main
    thread while the block runs, noting that a stop signal arrived (``execute.stops``: a
    backend's own KeyboardInterrupt is then told apart from a stop); outside the block, and in
    other threads, nothing changes. A SIGINT that was ignored stays ignored."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arm()
    old = signal.signal(signal.SIGTERM, on_stop_signal)
    old_int = signal.getsignal(signal.SIGINT)
    if old_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_stop_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
        if old_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, old_int)


def stops_on_sigterm(fn):
    """A command that writes files stops on SIGTERM (a CI cancel) as on Ctrl-C: the signal is
    raised where the command is (a write in progress removes its temporary file: ``atomic_write``),
    and the command ends with a message and exit 143 (the default action killed it mid-write,
    leaving the temporary file)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import typer

        try:
            with sigterm_as_interrupt():
                return fn(*args, **kwargs)
        except Terminated as e:
            print("terminated (SIGTERM): stopped before its output was complete; no partial file is left",
                  file=sys.stderr, flush=True)
            raise typer.Exit(e.exit_code) from None

    return wrapper
