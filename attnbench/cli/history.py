"""``attnbench history add RUN`` / ``attnbench history show``: a history of runs in SQLite
(``store.history``) and its trends per case and backend (``analyze.history_trends``)."""
from __future__ import annotations

import datetime as _dt
import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from attnbench.analyze.fit import PROSE, VALUE, Col, print_fitted
from attnbench.analyze.history_trends import STEP_HEADS, history_html, step_cells, step_record, trends
from attnbench.cli.app import SELECT_HELP, UsageError, app, check_format, console, handle_errors, selector
from attnbench.store.history import HistoryError, add_run, default_db, points
from attnbench.store.outputs import check_write_target
from attnbench.store.run_reader import read_run

history_app = typer.Typer(no_args_is_help=True,
                          help="Keep runs in an SQLite history and show trends per case and backend.")
app.add_typer(history_app, name="history")

DB_HELP = "the history database (default: history.sqlite in the cache folder, $ATTNBENCH_CACHE_DIR or ~/.cache/attnbench)"


def _since(text: Optional[str]) -> Optional[str]:
    """--since as an ISO time (compared with stored start times as times; without an offset it is
    UTC, as start times are written); a bad date is a usage error."""
    if text is None:
        return None
    try:
        when = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--since {text!r}: expected a date like 2026-11-01 (or 2026-11-01T12:00, "
                         "2026-11-01T14:00+02:00; without an offset: UTC)") from None
    return when.isoformat()


def _load(db: Path, since: Optional[str], select: Optional[str]):
    pick = selector(select) if select else None
    try:
        return trends(points(db, _since(since)), pick)
    except HistoryError as e:
        raise UsageError(str(e)) from None


@history_app.command("add")
@handle_errors
def add_cmd(
    runs: List[Path] = typer.Argument(..., help="run folders to store"),
    db: Optional[Path] = typer.Option(None, "--db", metavar="PATH", help=DB_HELP),
    commit: Optional[str] = typer.Option(None, "--commit", metavar="SHA", help="the commit of the code under test (default: the git commit the run recorded)"),
):
    """Store runs' rows (device fingerprint, commit, scenario text hash, --set overrides, options) in the history."""
    db = check_write_target(db or default_db(), "--db", inputs=runs, example="results/history.db")
    folders = []
    for run in runs:  # every run checked before any is stored
        if not run.is_dir():
            raise UsageError(f"{run}: not a run folder (no such folder)")
        rf = read_run(run)  # the rows check would refuse are refused here too
        if not rf.manifest.complete:  # a point is a whole run: its partial rows would stay the point for good
            raise UsageError(f"{run}: the run is not complete (its manifest says {rf.manifest.status or 'nothing'}, "
                             f"{len(rf.rows)} rows): finish it with `attnbench run --resume {run}`, then add it")
        folders.append((run, rf))
    for run, rf in folders:
        try:
            run_id, new = add_run(db, run, rf.manifest, rf.rows, commit)
        except HistoryError as e:
            raise UsageError(str(e)) from None
        what = f"stored {len(rf.rows)} rows as point {run_id}" if new else f"already stored as point {run_id}; kept"
        console.print(f"{run}: {what} in {db}", highlight=False, markup=False)


@history_app.command("show")
@handle_errors
def show_cmd(
    db: Optional[Path] = typer.Option(None, "--db", metavar="PATH", help=DB_HELP),
    select: Optional[str] = typer.Option(None, "-k", metavar="EXPR", help=SELECT_HELP),
    since: Optional[str] = typer.Option(None, "--since", metavar="DATE", help="only runs started on or after DATE (ISO; without an offset: UTC)"),
    fmt: str = typer.Option("table", "--format", help="table | json (one object per point: its run, median, "
                                                       "and ratio, interval, p and verdict against the point before)"),
):
    """Trends per case and backend: each point against the one before by the gate's statistics
    (timing rounds as replicates, 99% interval, the check's thresholds); a point on another
    device or host, or with another scenario text or other --set overrides, is listed but not compared."""
    check_format(fmt, ("table", "json"))
    db = db or default_db()
    found = _load(db, since, select)
    if fmt == "json":
        records = [step_record(key, s) for key, steps in found.items() for s in steps]
        sys.stdout.write(json.dumps(records, indent=1) + "\n")
        return
    if not found:
        console.print(f"{db}: no stored point matches", highlight=False, markup=False)
        return
    cols = [Col(h, HEAD_KINDS.get(h, VALUE), "right" if h in ("median ms", "p") else "left", HEAD_DROPS.get(h))
            for h in STEP_HEADS]
    for (scen, case, backend), steps in found.items():
        print_fitted(console, cols, [step_cells(s) for s in steps], f"{scen} · {case} · {backend}")


#: how history's table shows its columns at a narrow width (analyze/fit.py): words that wrap,
#: and what is left out first
HEAD_KINDS = {"device": PROSE, "note": PROSE}
HEAD_DROPS = {"device": 0, "p": 1, "started": 2, "commit": 3}


def history_section(db: Path, select: Optional[str], since: Optional[str] = None) -> str:
    """The HTML report's history section (``report --history DB -k EXPR``)."""
    return history_html(_load(db, since, select), f"history {db}" + (f", -k {select}" if select else ""))
