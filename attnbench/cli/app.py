"""The typer app and what every command shares: consoles, user-error handling, the run
manifest, recording rows under a progress bar. Commands live in ``run.py`` and ``compare.py``.

Exit codes: 0 every row ok or skipped; 1 a row is error/mismatch (or a regression);
2 bad input (scenario, flags), with one message naming the file, the field and the fix.
"""
from __future__ import annotations

import contextlib
import functools
import os
import shlex
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, List, Optional

import typer
from rich.markup import escape

from attnbench import __version__
from attnbench.backend import registry
from attnbench.backend.files import begin_command, load_backend_file
from attnbench.cli.progress import progress_for
from attnbench.store.manifest import Manifest
from attnbench.store.rows import Row
from attnbench.store.safe_text import safe_console_class
from attnbench.store.runfolder import RowsFileWarning, RunFolder, RunFolderError
from attnbench.execute.dask_cluster import ExecutorError, ExecutorLost
from attnbench.execute.executors import ExecutorSpec, check_spec, open_runner, parse_resources

if TYPE_CHECKING:  # the runner imports torch: commands import it when they run
    from attnbench.execute.runner import Runner

app = typer.Typer(
    rich_markup_mode=None,  # plain click help: flags without a "<bool>" beside them
    no_args_is_help=True,
    help="Benchmark and profile paged and tree attention backends on YAML batch scenarios.",
)
def console_width(stream) -> Optional[int]:
    """None (rich decides: an explicit COLUMNS, else the terminal's width) on a terminal or where
    COLUMNS is set; else 160: logs and CI output are not terminals, give tables room rather than
    rich's 80 columns. Lines naming a path are printed with soft_wrap (never broken)."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        tty = False
    return None if tty or os.environ.get("COLUMNS", "").isdigit() else 160


# every printed text passes store.safe_text.term_text: a name cannot carry an escape sequence
console = safe_console_class()(width=console_width(sys.stdout))
err = safe_console_class()(stderr=True, width=console_width(sys.stderr))


def fit_consoles() -> None:
    """Size both consoles for the command about to run, from its environment now: an explicit
    COLUMNS, else the terminal's width, else 160. Made at import only, a console kept whatever
    COLUMNS said then (rich reads it once): a process running several commands (a test session,
    a notebook) printed every later table at that width."""
    for c, stream in ((console, sys.stdout), (err, sys.stderr)):
        c.width = console_width(stream)  # None: rich reads COLUMNS (or the terminal) when it prints


_CLOSE_AT_END: list = []  # closers of what a command started (a Dask cluster): handle_errors runs them


def _print_version(value: bool) -> None:
    if value:
        print(f"attnbench {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    """Benchmark and profile paged and tree attention backends on YAML batch scenarios."""
    fit_consoles()


#: typer's type labels -> the metavars help shows instead (``--resource <list[str]>`` reads
#: ``--resource TEXT``, ``--min-gain <float range>`` reads ``--min-gain FLOAT``)
_METAVARS = {"str": "TEXT", "int": "INT", "float": "FLOAT", "path": "PATH", "Path": "PATH", "bool": "BOOL"}


def plain_metavars(command):
    """Give every option and argument of ``command`` (and its sub-commands) without a
    metavar one in click's plain style; returns ``command``."""
    import re

    for sub in getattr(command, "commands", {}).values():
        plain_metavars(sub)
    for p in command.params:
        if p.metavar is not None or getattr(p, "is_flag", False) or getattr(p, "count", False):
            continue
        try:
            label = p.display_type(None).strip("<>")
        except Exception:  # a parameter typer describes differently: leave it as is
            continue
        label = re.sub(r"^list\[(.*)\]$", r"\1", label).removesuffix(" range")
        name = _METAVARS.get(label, label.upper() if re.fullmatch(r"[a-z]+", label) else None)
        if name:
            p.metavar = p.name.upper() if p.param_type_name == "argument" else name
            if p.param_type_name == "argument":  # its name says it: no "<list[Path]>" beside it
                p.display_type_rich = lambda ctx: None
    return command


class UsageError(Exception):
    """Bad input from the user: printed as one message, exit code 2."""


def handle_errors(fn):
    """The one place that turns user-input exceptions into messages and exit code 2: bad
    input, and places that cannot be written (a read-only folder, a full disk, a file where
    a folder should be). Messages are printed as text (a ``[bf16]`` in a name stays). Warnings
    about files read (rows.jsonl lines that are not rows) are printed as they come."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from attnbench.workload.scenario import ScenarioError  # pydantic: not for --help

        try:
            with _printed_warnings():
                return fn(*args, **kwargs)
        except (ScenarioError, UsageError, registry.UnknownBackend, RunFolderError, ExecutorError) as e:
            _error(str(e))
        except OSError as e:  # FileNotFoundError, PermissionError, no space left, read-only...
            _error(_os_error_text(e))
        except ExecutorLost as e:
            err.print("[bold red]error:[/] " + escape(f"{e}; the run folder keeps the rows so far: finish it with --resume"),
                      highlight=False, soft_wrap=True)
            raise typer.Exit(1)
        finally:
            while _CLOSE_AT_END:  # clusters started for this command
                _CLOSE_AT_END.pop()()

    return wrapper


def _error(text: str):
    err.print("[bold red]error:[/] " + escape(text), highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _os_error_text(e: OSError) -> str:
    """``PATH: reason`` for an OSError (its own text when it carries no file name)."""
    if e.filename is None or not e.strerror:
        return str(e)
    where = f"{e.filename} -> {e.filename2}" if e.filename2 else str(e.filename)
    return f"{where}: {e.strerror}"


@contextlib.contextmanager
def _printed_warnings():
    """RowsFileWarning (and other warnings of attnbench's) as yellow lines on stderr."""
    def show(message, category, filename, lineno, file=None, line=None):
        err.print("[yellow]warning:[/] " + escape(str(message)), highlight=False, soft_wrap=True)

    with warnings.catch_warnings():
        warnings.simplefilter("always", RowsFileWarning)
        warnings.showwarning = show
        yield


SCENARIO_HELP = "scenario YAML file, or a built-in scenario's name (attnbench scenarios lists them)"
RESULTS_DIR_HELP = "where new run folders go (default: $ATTNBENCH_RESULTS_DIR, else results/ in the current folder)"
SELECT_HELP = "pick rows: words matched in 'case_id backend', with and/or/not (like pytest -k)"


def selector(text: str):
    """A parsed -k expression; a malformed one is a usage error (exit 2)."""
    from attnbench.execute.cases import select_rows
    from attnbench.workload.select import SelectError

    try:
        return select_rows(text)
    except SelectError as e:
        raise UsageError(str(e)) from None


def check_format(fmt: str, choices: Optional[tuple] = None) -> str:
    """``--format``'s value when it is one of ``choices`` (default: table, markdown, csv, json),
    else a usage error listing them: the one check of every command's --format."""
    from attnbench.analyze.tables import FORMATS

    choices = choices or FORMATS
    if fmt not in choices:
        raise UsageError(f"--format {fmt}: choose one of {', '.join(choices)}")
    return fmt


def backend_among(text: str, present: Iterable[str], flag: str, where: str, hint: str = "") -> str:
    """The one of ``present`` (rows' backends) that a user's ``text`` names, resolved as ``-b``
    resolves it and compared by value (``flex:mask=blocks`` is the rows' ``flex``); text that
    names none of them is a usage error, never a fallback (issue 34)."""
    from attnbench.backend.options import pick_backend

    hit = pick_backend(registry.user_backend_id(text), present)
    if hit is None:
        have = ", ".join(dict.fromkeys(present)) or "none"
        raise UsageError(f"{flag} {text}: not among {where} ({have}){hint}")
    return hit


def load_backend_files(files: Optional[List[Path]]) -> None:
    """Import each ``--backend-file`` (it runs its code), in the working folder the command
    started in: one that changes it (``os.chdir`` at import) gets it set back, so that the
    scenario, ``--out`` and every other relative path still mean what the user typed."""
    begin_command()
    for f in files or []:
        if not f.is_file():
            raise UsageError(f"--backend-file {f}: no such file")
        try:
            with _same_working_folder(f):
                load_backend_file(f)
        except registry.UnknownBackend:
            raise
        except SystemExit as e:  # sys.exit() at import: nothing would run, and exit 0 would say all went well
            raise UsageError(f"--backend-file {f}: importing it called sys.exit({e.code!r}); a backend file must only "
                             "define (and register) backends") from None
        except Exception as e:
            raise UsageError(f"--backend-file {f}: importing it failed: {type(e).__name__}: {e}") from None


@contextlib.contextmanager
def _same_working_folder(f: Path):
    cwd = os.getcwd()
    try:
        yield
    finally:
        try:
            moved = os.getcwd()
        except OSError:  # it removed the folder it moved to
            moved = None
        if moved != cwd:
            os.chdir(cwd)
            err.print(escape(f"note: --backend-file {f} changed the working folder (to {moved}) while imported; "
                             f"set back to {cwd}"), highlight=False, soft_wrap=True)


def print_notes(sf) -> None:
    """What loading the scenario decided that the user should know (a --set that replaced
    the values of a swept key)."""
    for note in getattr(sf, "notes", ()):
        err.print("[yellow]note:[/] " + escape(note), highlight=False, soft_wrap=True)


# --executor and its options: shared by `run` and `compare backends`
EXECUTOR_OPT = typer.Option(
    "local", "--executor", help="local: cases run in this process; dask: on Dask workers, one case per worker and device"
)
WORKERS_OPT = typer.Option(
    None, "--workers", help="with --executor dask: start a local cluster of N workers (default: one per visible GPU)"
)
SCHEDULER_OPT = typer.Option(None, "--scheduler", help="with --executor dask: use the running cluster at this address")
RESOURCE_OPT = typer.Option(
    None, "--resource", help="with --executor dask: run only on workers with this resource, NAME or NAME=AMOUNT (repeatable)"
)


OVERSUBSCRIBE_OPT = typer.Option(
    False, "--oversubscribe", help="with --executor dask --workers N: start N CPU workers even beyond this machine's cores"
)


def executor_spec(executor: str, workers, scheduler, resource, *, isolate=False, timeout=300.0,
                  writes_files=False, oversubscribe: bool = False) -> ExecutorSpec:
    """The --executor flags (and --isolate, --timeout, --oversubscribe), checked (exit 2 with the reason)."""
    if timeout <= 0:
        raise UsageError(f"--timeout {timeout}: must be > 0")
    spec = ExecutorSpec(executor, workers, scheduler, parse_resources(list(resource or [])), isolate, timeout,
                        oversubscribe)
    check_spec(spec, writes_files=writes_files)
    return spec


def start_runner(sf, opts, spec: ExecutorSpec, scenario_path: str, overrides, backend_files):
    """The executor of the spec (``execute.executors``: local, isolated or Dask), closed when the command ends."""
    try:
        runner = open_runner(sf, opts, spec, scenario_path=scenario_path, overrides=list(overrides or []),
                             backend_files=[str(f) for f in backend_files or []])
    except ExecutorError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from None
    _CLOSE_AT_END.append(runner.close)
    for note in runner.notes:
        err.print("[yellow]note:[/] " + escape(note), highlight=False, soft_wrap=True)
    return runner


def base_manifest(sf, runner: "Runner", scenario_path: str, overrides: List[str]) -> Manifest:
    """What every run folder's manifest records about the command, scenario, options and machine."""
    return Manifest(
        command=" ".join(shlex.quote(a) for a in ["attnbench", *sys.argv[1:]]),
        attnbench=__version__,
        scenario=sf.name,
        scenario_path=scenario_path,
        scenario_sha256=sf.sha256,
        scenario_text=sf.text,
        overrides=list(overrides),
        seed=sf.scenario.seed,
        cases=len(sf.cases),
        backends_requested=list(runner.backend_names),
        select=runner.opts.select,  # -k: the run holds only the rows it picked
        rows_expected=sum(rows_per_case(runner).values()),
        environment=runner.environment(),
        options=runner.opts,  # frozen: what the rows ran with
    )


def record_rows(folder: RunFolder, rows: Iterable[Row], counts: dict[str, int], label: str, quiet: bool,
                costs: Optional[dict[str, float]] = None) -> bool:
    """Write each row to the run folder as it comes, with progress on stderr (a bar with an ETA
    on a terminal, a line per finished case elsewhere, ``counts``: rows per case, ``costs``: each
    case's estimated seconds, for the ETA); mark the folder
    complete, or incomplete when interrupted (Ctrl-C: returns False; SIGTERM: exit 143) or
    when a write fails (the error goes on to ``handle_errors``). Returns whether every row
    was recorded. While backends run, what they print goes to stderr, not stdout."""
    from attnbench.cli.safety import Terminated, WriteError, sigterm_as_interrupt, stdout_to_stderr
    from attnbench.execute.stops import RowsLeft
    from attnbench.execute.lifeline import announce_run_folder

    announce_run_folder(folder.path)
    complete = False
    try:
        with sigterm_as_interrupt(), stdout_to_stderr(), progress_for(err, counts, label, quiet, costs) as progress:
            for row in rows:
                folder.add(row)
                progress.advance(row.id.case_id, row.id.backend, getattr(row.status, "value", row.status))
        complete = True
    except (Terminated, RowsLeft) as e:
        _hold_interrupts()
        _stopped(folder, e.how)
        raise typer.Exit(e.exit_code)
    except KeyboardInterrupt:
        _hold_interrupts()
        _stopped(folder, "interrupted")
    except OSError as e:  # a full disk, a folder made read-only under us, --save-tensors failing
        raise WriteError(
            f"{_os_error_text(e)}; the {len(folder.rows)} rows finished before are in {folder.path} "
            f"(marked incomplete): fix that, then `attnbench run --resume {folder.path}`"
        ) from None
    finally:
        _finish_quietly(folder, complete)
        _release_interrupts()
    return complete


_HELD: list = []  # the SIGINT handler to put back once a stopped run's folder is marked


def _hold_interrupts() -> None:
    """Stopping: a second Ctrl-C (or a SIGINT sent both to the group and the pid) must not cut
    the folder's marking short; ``_release_interrupts`` puts the handler back."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        _HELD.append(signal.signal(signal.SIGINT, signal.SIG_IGN))


def _release_interrupts() -> None:
    import signal

    while _HELD:
        signal.signal(signal.SIGINT, _HELD.pop())


def _stopped(folder: RunFolder, how: str) -> None:
    err.print(escape(f"{how}: {len(folder.rows)} rows kept in {folder.path}; finish the run with "
                     f"`attnbench run --resume {folder.path}`"), highlight=False, soft_wrap=True)


def _finish_quietly(folder: RunFolder, complete: bool) -> None:
    """Mark the folder; if even that write fails (a full disk), the manifest already says
    incomplete (written at the start) and the first error is the one reported: a note only
    when the manifest on disk says otherwise."""
    try:
        folder.finish(complete)
    except OSError as e:
        if complete:
            raise
        from attnbench.store.runfolder import read_manifest

        status = read_manifest(folder.path / "manifest.json").get("status")
        if status != "incomplete":
            err.print(escape(f"note: could not mark {folder.path} incomplete (its manifest says {status or 'nothing'}): "
                             f"{e}"), highlight=False, soft_wrap=True)


def rows_per_case(runner: "Runner", done: frozenset = frozenset()) -> dict[str, int]:
    """How many rows each case will yield (for the progress); cases with none are left out."""
    counts = {c.case_id: len(runner.todo(c, done)) for c in runner.sf.cases}
    return {cid: n for cid, n in counts.items() if n}
