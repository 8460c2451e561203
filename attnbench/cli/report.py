"""``attnbench report RUN [RUN...] [--baseline RUN] -o report.html``: one self-contained HTML
file of runs (``analyze.report``), optionally with a history's trends (``--history DB -k EXPR``)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from attnbench.analyze.report import RunData, build_report
from attnbench.cli.app import UsageError, app, console, handle_errors
from attnbench.cli.safety import stops_on_sigterm
from attnbench.store.outputs import check_write_target
from attnbench.store.run_reader import read_run
from attnbench.store.runfolder import atomic_write


def _labels(paths: List[Path]) -> List[str]:
    """Each run's folder name, or its whole path where two runs share a name."""
    names = [p.resolve().name for p in paths]
    return [n if names.count(n) == 1 else str(p) for n, p in zip(names, paths)]


def load_runs(paths: List[Path]) -> List[RunData]:
    runs = []
    for path, label in zip(paths, _labels(paths)):
        if not path.is_dir():
            raise UsageError(f"{path}: not a run folder (no such folder); pass folders written by attnbench run")
        rf = read_run(path)  # the rows check would refuse are refused here too
        runs.append(RunData(label, rf.manifest, rf.rows))
    return runs


@app.command("report")
@handle_errors
@stops_on_sigterm  # a CI cancel: the partial page is removed, as on Ctrl-C
def report_cmd(
    runs: List[Path] = typer.Argument(..., help="run folders; without --baseline, oldest first (the first is the "
                                                "baseline the others are compared with, as in compare runs BEFORE AFTER)"),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="the run folder every run is compared with, "
                                            "as in check RUN --baseline B (ratio = run / baseline, > 1: slower)"),
    out: Path = typer.Option(Path("report.html"), "--out", "-o", help="the HTML file to write"),
    title: str = typer.Option("", help="the page title (default: the runs' names)"),
    history: Optional[Path] = typer.Option(None, "--history", help="also draw the trends of this history database"),
    select: Optional[str] = typer.Option(None, "-k", metavar="EXPR",
                                         help="with --history: which case/backend trends to draw (like pytest -k)"),
):
    """Write one self-contained HTML report of runs: the rows (sortable, filterable), the
    comparison with intervals and check's verdicts, per-case bars, the roofline, the environment,
    repro commands. Which run is the baseline: --baseline B (as check takes it), else the first."""
    if baseline is not None and any(p.resolve() == baseline.resolve() for p in runs):
        raise UsageError(f"--baseline {baseline} is also one of the runs: name it once, as --baseline "
                         "(the runs after it are compared with it)")
    paths = [baseline, *runs] if baseline is not None else list(runs)
    check_write_target(out, "--out/-o", inputs=[*paths, history], example="report.html")
    data = load_runs(paths)
    from attnbench.analyze.decide_render import report_section  # runs of weighted scenarios (attnbench decide)
    extra = [report_section(data)]
    if history is not None:
        from attnbench.cli.history import history_section  # the history command's reader
        extra.append(history_section(history, select))
    html = build_report(data, title=title, extra_sections=extra)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, html)
    console.print(f"wrote {out} ({len(html) // 1024} KiB, {sum(len(r.rows) for r in data)} rows)",
                  highlight=False, markup=False, soft_wrap=True)
