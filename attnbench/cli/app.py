"""The typer app and what every command shares: consoles, user-error handling, the run
manifest, recording rows under a progress bar. Commands live in ``run.py`` and ``compare.py``.

Exit codes: 0 every row ok or skipped; 1 a row is error/mismatch (or a regression);
2 bad input (scenario, flags), with one message naming the file, the field and the fix.
"""
from __future__ import annotations

import functools
import shlex
import sys
from pathlib import Path
from typing import Iterable, List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from attnbench import __version__
from attnbench import backend as registry
from attnbench.store.rows import Row
from attnbench.store.runfolder import RunFolder, environment
from attnbench.execute.runner import Runner
from attnbench.workload.scenario import ScenarioError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Benchmark and profile paged and tree attention backends on YAML batch scenarios.",
)
# Logs and CI output are not terminals: give tables room rather than rich's 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


class UsageError(Exception):
    """Bad input from the user: printed as one message, exit code 2."""


def handle_errors(fn):
    """The one place that turns user-input exceptions into messages and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ScenarioError, UsageError, registry.UnknownBackend) as e:
            err.print(f"[bold red]error:[/] {e}", markup=True, highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        except FileNotFoundError as e:
            err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(2)

    return wrapper


def load_backend_files(files: Optional[List[Path]]) -> None:
    for f in files or []:
        if not f.is_file():
            raise UsageError(f"--backend-file {f}: no such file")
        try:
            registry.load_backend_file(f)
        except registry.UnknownBackend:
            raise
        except Exception as e:
            raise UsageError(f"--backend-file {f}: importing it failed: {type(e).__name__}: {e}") from None


def base_manifest(sf, runner: Runner, scenario_path: str, overrides: List[str]) -> dict:
    """What every run folder's manifest records about the command, scenario and machine."""
    return {
        "command": " ".join(shlex.quote(a) for a in ["attnbench", *sys.argv[1:]]),
        "attnbench": __version__,
        "scenario": sf.name,
        "scenario_path": scenario_path,
        "scenario_sha256": sf.sha256,
        "scenario_text": sf.text,
        "overrides": list(overrides),
        "seed": sf.scenario.seed,
        "cases": len(sf.cases),
        "backends_requested": runner.backend_names,
        "environment": environment(runner.device_name, runner.backend_versions()),
    }


def record_rows(folder: RunFolder, rows: Iterable[Row], total: int, label: str, quiet: bool) -> bool:
    """Write each row to the run folder as it comes, under a progress bar; mark the folder
    complete or (on Ctrl-C) incomplete. Returns whether every row was recorded."""
    complete = False
    try:
        with Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
            disable=quiet,
        ) as progress:
            task = progress.add_task(label, total=total)
            for row in rows:
                folder.add(row)
                progress.update(task, advance=1, description=f"{row.case_id} · {row.backend}: {row.status}")
        complete = True
    except KeyboardInterrupt:
        err.print(f"interrupted: {len(folder.rows)} rows kept in {folder.path}")
    finally:
        folder.finish(complete)
    return complete
