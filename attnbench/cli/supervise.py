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

The parent imports nothing heavy (the fork costs about a millisecond); it ignores SIGINT
(Ctrl-C at a terminal reaches the child, which marks its run folder incomplete and exits
130) and passes SIGTERM and SIGHUP on to the child. The child dies with the parent
(``lifeline``). Without ``os.fork`` (Windows), or with ``ATTNBENCH_NO_SUPERVISOR=1``, the
command runs in this process and these guarantees do not hold.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import Optional

EXIT_STOPPED = 3  # the run stopped before its end without passing through attnbench's exit path

def _run_app() -> None:
    from attnbench.cli import app
    from attnbench.cli.app import plain_metavars
    from typer.main import get_command

    plain_metavars(get_command(app))(prog_name="attnbench")


def _child(w: int, parent: int) -> None:
    from attnbench.execute import lifeline

    lifeline.report_to(w)
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

        report(f"exit {code}")


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
        _child(w, parent)
        return  # not reached: the app exits through SystemExit
    os.close(w)
    sys.exit(_supervise(pid, r))


def _supervise(pid: int, r: int) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: _forward(pid, s))
    data = b""
    while True:
        try:
            chunk = os.read(r, 1 << 16)
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    folders, said = [], None
    for line in data.decode(errors="replace").splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "folder" and rest not in folders:
            folders.append(rest)
        elif kind == "exit":
            said = int(rest) if rest.lstrip("-").isdigit() else 1
    return verdict(code, said, folders)


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


def _rows(folder: str) -> int:
    try:
        with open(os.path.join(folder, "rows.jsonl"), "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def verdict(code: int, said: Optional[int], folders: list[str]) -> int:
    """The exit code of the command from how the child ended; prints why when it differs."""
    incomplete = [f for f in folders if _status(f) != "complete"]
    if said is not None and (said != 0 or not incomplete):
        return said
    if code < 0:
        how, out = f"was killed by {_signame(-code)}", 128 - code
    elif said == 0:
        how, out = "exited 0 but left its run folder incomplete", EXIT_STOPPED
    else:
        how, out = f"ended with exit status {code} without finishing (a backend called os._exit or exit?)", EXIT_STOPPED
    msg = f"error: attnbench {how}; no cleanup ran."
    for f in incomplete:
        msg += (f"\n  run folder {f} is incomplete ({_rows(f)} rows recorded): "
                f"finish it with `attnbench run --resume {f}` (add --isolate to survive the backend that did this)")
    sys.stderr.write(msg + f"\n  exit code {out}\n")
    return out


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
