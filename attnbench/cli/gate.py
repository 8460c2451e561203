"""The regression gate: ``check`` (a run against a baseline) and ``calibrate`` (how often
that check cries wolf, and what it catches, on this machine). Parse, call, render, exit."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from attnbench.analyze.calibration import calibrate, summary_records, wander_records
from attnbench.analyze.compare import CheckResult, Thresholds, check as run_check, parse_fraction
from attnbench.analyze.gate_defaults import CPU_MAX_SLOWDOWN, GPU_MAX_SLOWDOWN, default_max_slowdown
from attnbench.analyze.compare_tables import (
    Column, check_columns, check_records, check_summary, fmt_ratio, json_value, render,
)
from attnbench.analyze.coverage import run_problems
from attnbench.analyze.significance import GATE_CONFIDENCE, rounds_needed
from attnbench.cli.app import (
    SCENARIO_HELP, SELECT_HELP, UsageError, app, backend_among, check_format, console, err, handle_errors,
)
from attnbench.cli.rounds import with_enough_rounds
from attnbench.cli.numbers import check_numbers
from attnbench.execute.interleave import run_command
from attnbench.cli.compare import FORMAT_HELP, info_console, load_pair, pick_rows, user_errors
from attnbench.store.baselines import load_rows
from attnbench.store.runfolder import results_root
from attnbench.store.safe_text import md_text
from attnbench.workload.units import safe_name


@dataclass
class GateOptions:
    """The check's settings as given on the command line, validated."""

    thresholds: Thresholds
    normalize_by: Optional[str]
    allow_scenario_change: bool = False
    max_slowdown_given: bool = True  # False: --max-slowdown was not passed (default_for picks it)
    default_why: str = ""  # which default applied and why (the gate line says it)

    def default_for(self, *sides) -> None:
        """What the rows decide: without --max-slowdown, the default for the device they were
        measured on (20% on a CPU, 10% else); --normalize-by as the rows spell it (resolved as
        -b is, a usage error when no row has it: ``backend_among``)."""
        if self.normalize_by:
            self.normalize_by = backend_among(self.normalize_by, [r.id.backend for rows in sides for r in rows],
                                              "--normalize-by", "the rows' backends")
        if not self.max_slowdown_given:
            self.thresholds.max_slowdown, self.default_why = default_max_slowdown(*sides)

    def describe(self) -> str:
        th = self.thresholds
        why = f" ({self.default_why})" if self.default_why else ""
        text = (f"slower by > {th.max_slowdown:.0%}{why} and > {th.min_delta_ms * 1e3:g} µs, "
                f"with the {th.confidence * 100:.4g}% interval over timing rounds above 1")
        if self.normalize_by:
            text += f"; each round relative to {self.normalize_by} in the same round"
        return text


def gate_options(max_slowdown: Optional[str], min_delta_us: float, confidence: str, normalize_by: Optional[str],
                 strict: bool = False, allow_scenario_change: bool = False) -> GateOptions:
    """``max_slowdown`` None: not given; ``GateOptions.default_for(rows)`` then picks it."""
    check_numbers(min_delta_us=min_delta_us)
    try:
        slowdown = parse_fraction(max_slowdown) if max_slowdown is not None else GPU_MAX_SLOWDOWN
    except ValueError as e:
        raise UsageError(f"--max-slowdown {e}") from None
    check_numbers(max_slowdown=slowdown)
    try:
        conf = parse_fraction(confidence)
    except ValueError as e:
        raise UsageError(f"--confidence {e}") from None
    if not 0.5 <= conf < 1:
        raise UsageError(f"--confidence {confidence}: must be at least 50% and below 100% (e.g. 99% or 0.99)")
    th = Thresholds(max_slowdown=slowdown, min_delta_ms=min_delta_us / 1e3, strict=strict, confidence=conf)
    return GateOptions(th, normalize_by, allow_scenario_change, max_slowdown_given=max_slowdown is not None)


MAX_SLOWDOWN = typer.Option(
    None, show_default=False,
    help=f"relative slowdown allowed: 10% or 0.1 (default: {CPU_MAX_SLOWDOWN:.0%} on a CPU, {GPU_MAX_SLOWDOWN:.0%} on a GPU)")
MIN_DELTA_US = typer.Option(2.0, help="absolute slowdown allowed, µs")
CONFIDENCE = typer.Option(f"{GATE_CONFIDENCE:.0%}", help="a slowdown counts when this interval over rounds lies above 1")
NORMALIZE_BY = typer.Option(
    None, help="divide each round's time by this backend's in the same round (shared or different machines)"
)


def report_check(res: CheckResult, opts: GateOptions, fmt: str, all_: bool, labels: tuple[str, str]) -> None:
    fails = res.failures
    info = info_console(fmt)
    say = md_text if fmt == "markdown" else str  # names and paths in Markdown: text, never markup
    shown = res.cases if (all_ or fmt in ("csv", "json")) else fails
    th = opts.thresholds
    if fmt == "json":  # one object: the gate's verdict and why, then every case
        console.print_json(json.dumps(verdict_record(res, opts, labels, check_records(shown))))
    elif shown:
        title = f"{len(fails)} failing case(s)" if shown is fails else f"{labels[0]} vs {labels[1]}"
        render(check_records(shown), check_columns(bool(opts.normalize_by), th.confidence), fmt, console, title)
    info.print(f"gate: {opts.describe()}", style="dim", highlight=False)
    for verdict, where in (("new", "only in this run"), ("vanished", "only in the baseline, not measured now")):
        keys = [f"{c.case_id} · {c.backend}" for c in res.cases if c.verdict == verdict]
        if keys:
            info.print(f"{verdict} ({where}): " + say(", ".join(keys)), highlight=False, markup=False)
    noisy = [c for c in res.cases if c.noisy]
    if noisy:
        listed = ", ".join(f"{c.case_id} · {c.backend} {c.spread:.1%}" for c in noisy[:5]) + (", ..." if noisy[5:] else "")
        info.print(f"[yellow]note:[/] {len(noisy)} case(s) scatter too much between timing rounds for this threshold: "
                   f"{escape(say(listed))} (robust spread of the round times); unchanged code is likely to fail there now "
                   f"and then: measure how often with `attnbench calibrate {escape(say(noisy[0].scenario or 'SCENARIO'))} "
                   "--runs 20`", highlight=False)
    blind = [c for c in res.cases if c.verdict == "unclear" and c.ratio.hi > 1 + th.max_slowdown]
    if blind:
        worst = max(c.ratio.hi for c in blind)
        info.print(f"[yellow]note:[/] {len(blind)} case(s) unclear, with intervals reaching {worst:.2f}×: a slowdown "
                   "beyond --max-slowdown could hide there; more timing.rounds narrow them", highlight=False)
    info.print(check_summary(res), highlight=False)
    for p in res.problems:
        info.print(f"[bold red]FAIL[/]: {escape(say(p))}", highlight=False, markup=True)
    if fails:
        info.print(f"[bold red]FAIL[/]: {len(fails)} case(s) regressed, broke or were not measured against {escape(say(labels[1]))}",
                   highlight=False)
    if not res.failed:
        compared = sum(c.ratio is not None for c in res.cases)
        info.print(f"[green]PASS[/]: no regression against {escape(say(labels[1]))} ({compared} cases compared)", highlight=False)


def verdict_record(res: CheckResult, opts: GateOptions, labels: tuple[str, str], cases: list[dict]) -> dict:
    """``check --format json``: ``verdict`` pass or fail (exit 0 or 1), the ``reasons`` it failed
    (run-level problems, then a line per failing case), the gate's settings and every case."""
    reasons = list(res.problems) + [f"{c.case_id} · {c.backend}: {c.verdict}" for c in res.failures]
    return {"verdict": "fail" if res.failed else "pass", "exit_code": 1 if res.failed else 0, "reasons": reasons,
            "summary": check_summary(res), "gate": opts.describe(), "run": labels[0], "baseline": labels[1],
            "cases": [{k: json_value(v) for k, v in r.items()} for r in cases]}


@app.command("check")
@handle_errors
@user_errors
def check_cmd(
    run: Path = typer.Argument(..., help="run folder (or baseline file) to check"),
    baseline: Path = typer.Option(..., help="baseline file or run folder to check against"),
    max_slowdown: Optional[str] = MAX_SLOWDOWN,
    min_delta_us: float = MIN_DELTA_US,
    confidence: str = CONFIDENCE,
    normalize_by: Optional[str] = NORMALIZE_BY,
    allow_cross_device: bool = typer.Option(False, "--allow-cross-device", help="check against a baseline from another device"),
    allow_scenario_change: bool = typer.Option(
        False, "--allow-scenario-change", help="check even though the scenario text or --set overrides differ"
    ),
    strict: bool = typer.Option(False, "--strict", help="new cases (not in the baseline) fail too"),
    all_: bool = typer.Option(False, "--all", help="list every case, not only the failing ones"),
    format: str = typer.Option("table", "--format", help=FORMAT_HELP),
    select: Optional[str] = typer.Option(None, "-k", metavar="EXPR", help=SELECT_HELP),
):
    """The regression gate: exit 1 on a real slowdown, a broken case, or a check of nothing.

    A case fails when it is slower than the baseline beyond --max-slowdown and --min-delta-us
    and the interval over timing rounds (--confidence) lies above 1; when it was ok and is now
    mismatch, error or skipped; or when it is missing from the run. The check fails as a whole
    when no case matches, the scenario differs, or either side is incomplete."""
    fmt = check_format(format)
    opts = gate_options(max_slowdown, min_delta_us, confidence, normalize_by, strict, allow_scenario_change)
    cur, ref = load_pair(run, baseline, allow_cross_device, fmt, need_rounds=True)
    opts.default_for(cur.rows, ref.rows)
    normalize_by = opts.normalize_by
    picked = pick_rows(cur.rows, select, normalize_by), pick_rows(ref.rows, select, normalize_by)
    res = run_check(*picked, opts.thresholds, normalize_by)
    res.problems = run_problems(cur.rows, cur.manifest, ref.rows, ref.manifest, allow_scenario_change)
    for rows, label in zip(picked, (cur.label, ref.label)):
        if select and not [r for r in rows if r.id.backend != normalize_by]:
            res.problems.append(f"-k {select!r} picks no row of {label}: nothing was compared")
    report_check(res, opts, fmt, all_, (cur.label, ref.label))
    if res.failed:
        raise typer.Exit(1)


# ---------------------------------------------------------------------------- calibrate
def _spawn_run(scenario: Path, folder: Path, sets: List[str], backends: List[str], device: Optional[str]) -> float:
    """One ``attnbench run`` in a fresh process (runs of a gate are separate processes too)."""
    cmd = [sys.executable, "-m", "attnbench", *run_command(scenario, folder, sets, backends, device)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode not in (0, 1):  # 1: some row error/mismatch; the check reports it
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise UsageError(f"calibration run {folder} failed (exit {proc.returncode}): " + " | ".join(tail))
    return time.perf_counter() - t0


def _collect_runs(scenario: Path, out: Path, count: int, sets: List[str], backends: List[str],
                  device: Optional[str], need_rounds: int = 1) -> list:
    """``count`` complete runs under ``out`` (run-001, ...): those already there are reused
    when they ran the same scenario text with the same overrides; the rest are made. With
    fewer than ``need_rounds`` timing rounds in the scenario, the runs take 10 (a note says so)."""
    from attnbench.workload.scenario import load  # pydantic: not for --help

    sets, note = with_enough_rounds(scenario, sets, need_rounds)
    if note:
        err.print(f"note: {note}", highlight=False, markup=False)
    sf = load(scenario, sets)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for k in range(1, count + 1):
        folder = out / f"run-{k:03d}"
        if not (folder / "rows.jsonl").is_file():
            secs = _spawn_run(scenario, folder, sets, backends, device)
            err.print(f"run {k}/{count}: {secs:.1f} s", highlight=False)
        loaded = load_rows(folder, need_rounds=True)
        m = loaded.manifest
        if m.scenario_sha256 != sf.sha256 or m.overrides != list(sets):
            raise UsageError(f"{folder}: a run of another scenario text or other --set overrides; "
                             f"calibrate into another --out, or delete {out}")
        own = (list(sf.scenario.backends or []) or None, sf.scenario.device)  # what a run takes without -b, --device
        ran = (m.options.backends or own[0], m.options.device or own[1]) if m.options else None
        if ran != (list(backends) or own[0], device or own[1]):
            said = (f"-b {' -b '.join(ran[0])}" if ran and ran[0] else "every backend") + (f", device {ran[1]}" if ran else "")
            raise UsageError(f"{folder}: a run made with other backends or device ({said if ran else 'not recorded'}); "
                             f"its numbers are not this calibration's: calibrate into another --out, or delete {out}")
        if not m.complete:
            raise UsageError(f"{folder}: incomplete run (interrupted?); delete it and calibrate again")
        runs.append(loaded.rows)
    return runs


SUMMARY_COLUMNS = [
    Column("slowdown", "injected slowdown"),
    Column("checks", "checks", justify="right"),
    Column("checks_failed", "checks failed", justify="right"),
    Column("check_rate", "rate", lambda x: f"{x:.1%}", "right"),
    Column("cases", "cases", justify="right"),
    Column("cases_failed", "cases failed", justify="right"),
    Column("case_rate", "rate", lambda x: f"{x:.1%}", "right"),
]
WANDER_COLUMNS = [
    Column("case", "case · backend"),
    Column("checks", "A/A checks", justify="right"),
    Column("median", "median ratio", fmt_ratio, "right"),
    Column("p1", "1st pct", fmt_ratio, "right"),
    Column("p99", "99th pct", fmt_ratio, "right"),
    Column("max", "max", fmt_ratio, "right"),
]


@app.command("calibrate")
@handle_errors
@user_errors
def calibrate_cmd(
    scenario: Path = typer.Argument(..., help=SCENARIO_HELP + " (the one the gate runs)"),
    runs: int = typer.Option(20, "--runs", help="runs of the scenario (each checked against each other)"),
    out: Optional[Path] = typer.Option(None, help="folder for the runs (default <$ATTNBENCH_RESULTS_DIR or results>/calibrate-<scenario>); runs there are reused"),
    slowdown: Optional[List[float]] = typer.Option(None, "--slowdown", help="injected slowdown (repeat; default 1.05 1.1 1.2 1.3 1.5 2)"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a key: --set timing.rounds=20"),
    backend: Optional[List[str]] = typer.Option(None, "--backend", "-b", help="backends to run (default: the scenario's)"),
    device: Optional[str] = typer.Option(None, help="auto | cpu | cuda | cuda:N (overrides the scenario)"),
    max_slowdown: Optional[str] = MAX_SLOWDOWN,
    min_delta_us: float = MIN_DELTA_US,
    confidence: str = CONFIDENCE,
    normalize_by: Optional[str] = NORMALIZE_BY,
    format: str = typer.Option("table", "--format", help=FORMAT_HELP),
):
    """How often `check` with these settings fails unchanged code, and what slowdowns it catches.

    Runs the scenario --runs times (separate processes), then checks every run against every
    other one (A/A: a failure is a false alarm) and again with the checked run's times
    multiplied by each --slowdown (A/B: a failure is a catch). Re-run with other gate
    settings to tune them: the runs in --out are reused."""
    check_numbers(runs=runs, slowdown=list(slowdown or []))  # --runs 2 or more: one run checked against another
    fmt = check_format(format)
    opts = gate_options(max_slowdown, min_delta_us, confidence, normalize_by)
    factors = slowdown or [1.05, 1.1, 1.2, 1.3, 1.5, 2.0]
    folder = out or results_root() / f"calibrate-{safe_name(scenario.stem)}"
    rows = _collect_runs(scenario, folder, runs, list(set_ or []), list(backend or []), device,
                         rounds_needed(opts.thresholds.confidence))
    opts.default_for(*rows)
    cal = calibrate(rows, opts.thresholds, opts.normalize_by, factors)
    info = info_console(fmt)
    info.print(f"gate: {opts.describe()}", style="dim", highlight=False)
    render(summary_records(cal), SUMMARY_COLUMNS, fmt, console,
           f"{scenario}: {cal.runs} runs in {folder}, each checked against each other")
    render(wander_records(cal), WANDER_COLUMNS, fmt, console, "A/A ratios of unchanged code, per case")
    if cal.aa.checks_failed:
        info.print(f"false alarms involve runs {', '.join(str(k + 1) for k in sorted(cal.aa_runs_failing))} "
                   f"of {cal.runs}", highlight=False)
    info.print("checks = ordered pairs of runs (baseline, checked run); a check fails when any case fails. "
               "Slowdowns are injected by multiplying the checked run's times (all but the normalizer's) by the factor.",
               style="dim", highlight=False)
