"""A stop of the run (Ctrl-C, SIGINT, SIGTERM) told apart from a backend's own ``sys.exit()``
or ``KeyboardInterrupt``.

While rows are recorded, the command's handlers (``cli.safety.sigterm_as_interrupt``) raise
``Stopped`` for SIGINT and ``Terminated`` for SIGTERM, and note that a stop signal arrived.
A ``SystemExit``, or a ``KeyboardInterrupt`` no signal caused (a library raising it itself),
escaping a backend's step is that backend's failure: an ``error`` row naming it, and the run
goes on (it used to stop the whole run, naming nobody, and came back on every ``--resume``).
"""
from __future__ import annotations

import signal

_ARRIVED = [False]  # a stop signal arrived in this process (the run is stopping)


class Stopped(KeyboardInterrupt):
    """SIGINT (Ctrl-C, ``kill -INT``) arrived: the run stops, its rows kept, exit 130."""

    exit_code, how = 130, "interrupted"


class Terminated(Stopped):
    """SIGTERM arrived: handled like Ctrl-C (the rows so far are kept), exit 143."""

    exit_code, how = 128 + signal.SIGTERM, "terminated (SIGTERM)"


class RowsLeft(Exception):
    """The run went through every case, but rows a kill from outside stopped (an ``--isolate``
    child's SIGKILL) were not recorded: the run is incomplete, ``--resume`` runs them. ``how``
    names them; exit 128 + the signal."""

    def __init__(self, how: str, exit_code: int):
        super().__init__(how)
        self.how, self.exit_code = how, exit_code


def arm() -> None:
    """A run starts recording rows: no stop signal has arrived for it yet."""
    _ARRIVED[0] = False


def on_stop_signal(signum, frame) -> None:
    """The signal handler: note the stop (and tell the supervising parent that the command is
    stopping: it kills only a command that does not), then raise ``Terminated`` or ``Stopped``."""
    from attnbench.execute.lifeline import report

    _ARRIVED[0] = True
    report("stopping", int(signum))
    raise Terminated() if signum == signal.SIGTERM else Stopped()


def backend_exit_reason(e: BaseException) -> str:
    """The ``error`` reason of a ``SystemExit`` or ``KeyboardInterrupt`` that a backend's step
    raised; re-raises ``e`` when it is (or follows) a stop signal, which must stop the run."""
    if isinstance(e, Stopped) or (isinstance(e, KeyboardInterrupt) and _ARRIVED[0]):
        raise e
    if isinstance(e, SystemExit):
        return (f"the backend called sys.exit({e.code!r}) (SystemExit): a backend reports a failure by raising an "
                "exception, never by ending the process")
    text = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    return (f"the backend raised KeyboardInterrupt{f' ({text})' if text else ''} with no Ctrl-C or SIGINT sent to "
            "attnbench (a library's own?): taken as this backend's error, not as a stop of the run")
