"""Sub-commands ``compare backends``, ``compare runs``, ``baseline`` and ``plot`` (``check``
and ``calibrate`` are in ``gate.py``).

Registered onto the main typer app when ``attnbench.cli.app`` imports this module. Like cli.py:
parse, call, render, exit code (0 fine, 1 failed rows or regressions, 2 bad input).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from attnbench.cli.numbers import check_numbers
from attnbench.cli.safety import stops_on_sigterm
from attnbench.store.baselines import BaselineError, load_rows, write_baseline
from attnbench.cli.app import (
    EXECUTOR_OPT, OVERSUBSCRIBE_OPT, RESOURCE_OPT, SCENARIO_HELP, SCHEDULER_OPT, SELECT_HELP, WORKERS_OPT, UsageError, app,
    console, err, backend_among, check_format, executor_spec, handle_errors, load_backend_files, selector,
)
from attnbench.cli.pipeline import (
    BACKEND_FILE_OPT, DEVICE_OPT, FLUSH_OPT, FORMAT_OPT, ISOLATE_OPT, MEASURE_OPT, NO_GRAPHS_OPT, OUT_OPT, QUIET_OPT, RESULTS_DIR_OPT,
    SELECT_OPT, SET_OPT, TIMEOUT_OPT, WARM_L2_OPT, WARMUP_OPT, Launch, ensure_selected, launch_of, new_folder,
    new_options, new_runner, run_rows,
)
from attnbench.analyze.compare import (
    CompareError, compare_backends, report_runs, ensure_rows_same_device, ensure_same_device,
)
from attnbench.analyze.significance import GATE_CONFIDENCE, REPORT_CONFIDENCE, rounds_needed
from attnbench.analyze.verdict import rule_text, thresholds_for
from attnbench.analyze.compare_tables import (
    backend_columns, backend_records, check_records, check_summary, render, run_pair_columns,
)
from attnbench.analyze.plots import PlotError, default_plot_dir, plot_run
from attnbench.cli.rounds import with_enough_rounds
from attnbench.backend import canonical_spec
from attnbench.store.rows import Status
from attnbench.store.run_reader import read_run
from attnbench.store.runfolder import RunFolder
from attnbench.store.options import RunOptions

compare_app = typer.Typer(
    no_args_is_help=True,
    help="Compare backends on a scenario, or two runs, with ratios and uncertainty intervals.",
)
app.add_typer(compare_app, name="compare")

FORMAT_HELP = "table | markdown (for a pull request) | csv | json"


def user_errors(fn):
    """CompareError / PlotError / bad flag values -> UsageError (exit 2, via handle_errors)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (CompareError, BaselineError, PlotError) as e:
            raise UsageError(str(e)) from None  # handle_errors prints it as text

    return wrapper


def info_console(fmt: str):
    """Where notes go: the terminal for tables/markdown, stderr when stdout is CSV/JSON."""
    return console if fmt in ("table", "markdown") else err


def _run_scenario(scenario, set_, opts: RunOptions, launch: Launch, results_dir, out, quiet, spec,
                  backend_file) -> RunFolder:
    """Run a scenario into a run folder through the pipeline of ``attnbench run`` (without its table)."""
    if opts.select and spec.kind != "local":
        raise UsageError("-k runs with --executor local only (a Dask worker runs every backend of its case)")
    runner = new_runner(scenario, set_, opts, spec, backend_file)
    ensure_selected(runner, str(scenario))
    runner, folder = new_folder(runner, launch, results_dir, out, False, spec)
    if not run_rows(runner, folder, frozenset(), launch, spec, quiet):
        raise typer.Exit(130)
    return folder


@compare_app.command("backends")
@handle_errors
@user_errors
def compare_backends_cmd(
    scenario: Path = typer.Argument(..., help=SCENARIO_HELP),
    backend: List[str] = typer.Option(..., "--backend", "-b", help="backend to compare (repeat: -b a -b b)"),
    baseline: Optional[str] = typer.Option(None, help="compare against this backend (default: each case's fastest)"),
    set_: Optional[List[str]] = SET_OPT,
    device: Optional[str] = DEVICE_OPT,
    warmup_ms: Optional[float] = WARMUP_OPT,
    measure_ms: Optional[float] = MEASURE_OPT,
    flush: Optional[str] = FLUSH_OPT,
    warm_l2: bool = WARM_L2_OPT,
    no_graphs: bool = NO_GRAPHS_OPT,
    isolate: bool = ISOLATE_OPT,
    timeout: float = TIMEOUT_OPT,
    results_dir: Optional[Path] = RESULTS_DIR_OPT,
    out: Optional[Path] = OUT_OPT,
    format: str = FORMAT_OPT,
    select: Optional[str] = SELECT_OPT,
    backend_file: Optional[List[Path]] = BACKEND_FILE_OPT,
    quiet: bool = QUIET_OPT,
    executor: str = EXECUTOR_OPT,
    workers: Optional[int] = WORKERS_OPT,
    oversubscribe: bool = OVERSUBSCRIBE_OPT,
    scheduler: Optional[str] = SCHEDULER_OPT,
    resource: Optional[List[str]] = RESOURCE_OPT,
):
    """Run a scenario for some backends and compare them, case by case.

    Per case: each backend's time relative to the baseline backend (or the fastest), paired by
    timing round, with an exact 95% signed-rank interval over the rounds; '≈ same' only where
    that interval lies within ±5%, 'unclear' where it is wider."""
    check_numbers(warmup_ms=warmup_ms, measure_ms=measure_ms, timeout=timeout, workers=workers)
    fmt = check_format(format)
    spec = executor_spec(executor, workers, scheduler, resource, isolate=isolate, timeout=timeout,
                         oversubscribe=oversubscribe)
    load_backend_files(backend_file)
    names = list(dict.fromkeys(backend))
    if len(names) < 2:
        raise UsageError("compare backends needs at least two backends: -b a -b b")
    if baseline is not None:  # rows carry canonical specs: flex:mask=blocks (the default) is `flex`
        baseline = backend_among(baseline, [canonical_spec(n) for n in names], "--baseline", "the compared backends",
                                 f"; add -b {baseline}")
    set_, rounds_note = with_enough_rounds(scenario, list(set_ or []), rounds_needed(REPORT_CONFIDENCE, paired=True))
    if rounds_note:
        err.print(f"note: {rounds_note}", highlight=False, markup=False)
    timing = dict(warmup_ms=warmup_ms, measure_ms=measure_ms, flush=flush)
    opts = new_options(names, device, warm_l2, no_graphs, timing, None, None, None, select, set_)
    launch = launch_of(str(scenario), set_, backend_file)
    folder = _run_scenario(scenario, set_, opts, launch, results_dir, out, quiet, spec, backend_file)
    _report_backends(folder, baseline, fmt)


def _report_backends(folder: RunFolder, baseline: Optional[str], fmt: str) -> None:
    """The comparison table, its legend and notes; exit 1 when a row failed."""
    comps = compare_backends(folder.rows, baseline)
    title = f"{folder.manifest.scenario or ''} on {folder.manifest.device}: vs {baseline or 'the fastest'}"
    render(backend_records(comps), backend_columns(REPORT_CONFIDENCE), fmt, console, title)
    info = info_console(fmt)
    info.print(
        "time = median per call; ratio = this backend over the compared one, paired by timing round (> 1: slower), "
        f"with its {REPORT_CONFIDENCE:.0%} interval and the signed-rank p over rounds; ≈ same: the interval lies within ±5%; "
        "unclear: it contains 1 but is wider (more timing.rounds narrow it)",
        style="dim", highlight=False,
    )
    for r in folder.rows:
        if r.status is not Status.OK:
            info.print(f"{r.id.case_id} · {r.id.backend}: {r.status}: {r.reason}", highlight=False, markup=False)
    if baseline:
        missing = sorted({c.case_id for c in comps} - {c.case_id for c in comps if c.backend == baseline and c.status == "ok"})
        if missing:
            info.print(f"[yellow]note:[/] --baseline {baseline} has no ok row in {len(missing)} case(s) ({', '.join(missing)}): "
                       "no ratios there", highlight=False)
    few = min((len(r.timing.round_medians_ms) for r in folder.rows if r.status == "ok"), default=0)
    if 0 < few < rounds_needed(REPORT_CONFIDENCE, paired=True):
        info.print(f"[yellow]note:[/] {few} timing round(s) per row: no ratio can be significant with fewer than "
                   f"{rounds_needed(REPORT_CONFIDENCE, paired=True)}; add --set timing.rounds=10", highlight=False)
    info.print(f"run folder: {folder.path}", highlight=False, markup=False, soft_wrap=True)
    if any(r.status.failed for r in folder.rows):
        raise typer.Exit(1)


def load_pair(run: Path, base: Path, allow_cross_device: bool, fmt: str, need_rounds: bool = False):
    cur, ref = load_rows(run, need_rounds), load_rows(base, need_rounds)
    if not cur.rows or not ref.rows:  # nothing to compare: the caller says so, not "another device '?'"
        return cur, ref
    diffs = ensure_same_device(cur.fingerprint, ref.fingerprint, allow_cross_device)
    ensure_rows_same_device(cur.rows, ref.rows, allow_cross_device)
    info = info_console(fmt)
    for d in diffs:
        info.print("[yellow]note:[/] " + escape(d), highlight=False)
    return cur, ref


def pick_rows(rows: list, select: Optional[str], keep: Optional[str] = None) -> list:
    """The rows -k picks (all without -k), and those of ``keep`` (the normalizer)."""
    if not select:
        return rows
    picks = selector(select)
    return [r for r in rows if picks(r.id.case_id, r.id.backend, r.workload.params) or r.id.backend == keep]


@compare_app.command("runs")
@handle_errors
@user_errors
def compare_runs_cmd(
    run_a: Path = typer.Argument(..., help="the 'before' run folder or baseline file"),
    run_b: Path = typer.Argument(..., help="the 'after' run folder or baseline file"),
    normalize_by: Optional[str] = typer.Option(None, help="divide each time by this backend's, same case, same run"),
    allow_cross_device: bool = typer.Option(False, "--allow-cross-device", help="compare runs from different devices"),
    format: str = typer.Option("table", "--format", help=FORMAT_HELP),
    select: Optional[str] = typer.Option(None, "-k", metavar="EXPR", help=SELECT_HELP),
):
    """The same rows of two runs side by side, with ratios and intervals.

    Rows are matched by scenario, case and backend, never by order; ratio = after/before with
    an exact 99% Mann-Whitney interval over the two runs' timing rounds, and the verdict check
    gives without flags (regressed, slower, faster, same, unclear); rows on one side only are
    listed. The exit code stays 0: check is the gate."""
    fmt = check_format(format)
    b, a = load_pair(run_b, run_a, allow_cross_device, fmt)
    if normalize_by:
        normalize_by = backend_among(normalize_by, [r.id.backend for r in b.rows + a.rows], "--normalize-by",
                                     "the rows' backends")
    b.rows, a.rows = pick_rows(b.rows, select, normalize_by), pick_rows(a.rows, select, normalize_by)
    th = thresholds_for(b.rows, a.rows)  # the verdicts check gives without flags (analyze/verdict.py)
    res = report_runs(b.rows, a.rows, normalize_by)
    render(check_records(res.cases), run_pair_columns(bool(normalize_by), th.confidence), fmt, console,
           f"{a.label} (baseline) → {b.label}")
    info = info_console(fmt)
    info.print(
        f"ratio = after / before over timing rounds (> 1: slower), {th.confidence:.0%} interval and Mann-Whitney p "
        f"over the rounds' medians; verdicts as check's without flags: {rule_text(th)}"
        + (f"; each round divided by {normalize_by}'s in the same round" if normalize_by else ""),
        style="dim", highlight=False,
    )
    info.print(check_summary(res), highlight=False, markup=False)


@app.command("baseline")
@handle_errors
@stops_on_sigterm
@user_errors
def baseline_cmd(
    run: Path = typer.Argument(..., help="run folder to make the baseline from"),
    to: Path = typer.Option(..., help="baseline file to write, e.g. results/baselines/NAME.json"),
    allow_few_rounds: bool = typer.Option(
        False, "--allow-few-rounds",
        help="write it even when its ok rows have fewer timing rounds than check needs at its default "
             "99% confidence (5; check it then at a lower --confidence)"),
):
    """Write a baseline file (rows with raw samples, device fingerprint, manifest) from a run.
    Refused (exit 2) when its ok rows have fewer timing rounds than check needs (a run with
    --set timing.rounds=10 has enough) unless --allow-few-rounds."""
    if not run.is_dir():
        raise UsageError(f"{run}: not a run folder")
    doc = write_baseline(run, to, 0 if allow_few_rounds else rounds_needed(GATE_CONFIDENCE))
    fp = doc["fingerprint"]
    ok = sum(r["status"] == Status.OK for r in doc["rows"])
    console.print(f"baseline: {to}  ({len(doc['rows'])} rows, {ok} ok; device {fp['device']}, torch {fp['torch']})", markup=False,
                  highlight=False, soft_wrap=True)
    bad = [r for r in doc["rows"] if Status(r["status"]).failed]
    if bad:
        err.print(f"[yellow]note:[/] {len(bad)} row(s) of the baseline are error/mismatch; they cannot regress further")


@app.command("plot")
@handle_errors
@user_errors
def plot_cmd(
    run: Path = typer.Argument(..., help="run folder"),
    x: str = typer.Option(..., "--x", metavar="KEY", help="swept key for the x axis: batch.0.context, or context"),
    by: str = typer.Option("backend", "--by", metavar="KEY", help="one line per value of this (backend, or a swept key)"),
    out: Optional[Path] = typer.Option(None, "--out", metavar="DIR", help="folder for the PNGs (default: RUN/plots)"),
):
    """PNGs: median kernel time and % of the roofline ceiling vs a swept key (a panel per fixed
    combination of the other swept keys, seeds summarised), and the roofline chart."""
    rf = read_run(run)  # the rows check would refuse are refused here too
    paths = plot_run(rf.rows, x, out or default_plot_dir(run), by=by, title="")
    for p in paths:
        console.print(f"wrote {p}", highlight=False, markup=False, soft_wrap=True)
