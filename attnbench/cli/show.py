"""``attnbench show RUN``: a finished (or interrupted) run folder's results table again, as
``run`` printed it, in any ``--format``, without running anything."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from attnbench.cli.app import SELECT_HELP, UsageError, app, console, err, handle_errors
from attnbench.cli.compare import check_format, pick_rows, user_errors


@app.command("show")
@handle_errors
@user_errors
def show_cmd(
    run: Path = typer.Argument(..., help="run folder (or baseline file) to show"),
    format: str = typer.Option("table", "--format", help="table | markdown | csv | json, as `run` prints them"),
    compact: Optional[bool] = typer.Option(None, "--compact/--full", show_default=False,
                                           help="one line per row (default: from 24 rows)"),
    select: Optional[str] = typer.Option(None, "-k", metavar="EXPR", help=SELECT_HELP),
):
    """Print a run's results table again (the table, legend, notes and summary `run` printed)."""
    from attnbench.analyze.fit import print_words
    from attnbench.analyze.run_formats import render_run
    from attnbench.store.manifest import load_note
    from attnbench.cli.run import run_title
    from attnbench.store.baselines import load_rows

    fmt = check_format(format)
    loaded = load_rows(run)
    rows = pick_rows(loaded.rows, select)
    if not rows:
        raise UsageError(f"-k {select!r} picks no row of {run}" if select else f"{run}: no rows yet")
    m = loaded.manifest
    title = run_title(m.scenario or "?", (m.environment or {}).get("device", "?"), rows)
    info = console if fmt == "table" else err
    render_run(rows, fmt, console, info, title=title, compact=compact)
    if load_note(m):  # on stderr, as the other notes: stdout stays what `run` printed
        print_words(err, load_note(m))
    if run.is_dir() and not m.complete:
        info.print(escape(f"note: {run} is incomplete ({len(loaded.rows)} row(s) so far); finish it with "
                          f"`attnbench run --resume {run}`"), highlight=False, soft_wrap=True)
