"""``attnbench compare commits``: the regression gate that needs no stored numbers. The base
commit and the head (the working tree, or a commit) run one scenario on this machine, in this
job, in turns; head is judged against base round by round with ``check``'s statistics and
thresholds. Exit 0 pass, 1 a regression or a broken case, 2 bad input or a side that could
not run. Like ``asv continuous BASE HEAD``; docs/ci.md gives its measured false-alarm rate
and power on a 2-core CPU."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, List, Optional

import typer

from attnbench.analyze.compare import check as run_check
from attnbench.analyze.coverage import run_problems
from attnbench.analyze.significance import rounds_needed
from attnbench.backend import registry
from attnbench.cli.app import SELECT_HELP, UsageError, backend_among, check_format, err, handle_errors, selector
from attnbench.cli.compare import FORMAT_HELP, compare_app, info_console, pick_rows, user_errors
from attnbench.cli.gate import CONFIDENCE, MAX_SLOWDOWN, MIN_DELTA_US, NORMALIZE_BY, gate_options, report_check
from attnbench.cli.numbers import check_numbers
from attnbench.cli.safety import sigterm_as_interrupt
from attnbench.execute.checkouts import CheckoutError, checkout, repo_root
from attnbench.execute.interleave import InterleaveError, Plan, Turn, run_interleaved
from attnbench.store.baselines import BaselineError, load_rows
from attnbench.store.merge import MergeError, merge_rows
from attnbench.workload.builtin import resolve


def _scenario_copy(scenario: str, into: Path) -> Path:
    path = resolve(scenario)
    if path is None:
        raise UsageError(f"{scenario}: no such scenario file or built-in scenario (attnbench scenarios lists them)")
    into.mkdir(parents=True, exist_ok=True)
    copy = into / path.name
    shutil.copyfile(path, copy)
    return copy


class SideError(UsageError):
    """A side that could not run, or rows that cannot be merged: the command adds where the
    workers' logs and run folders are."""


def _rounds_of(scenario: Path, sets: List[str], backends: List[str], select: Optional[str],
               normalize_by: Optional[str]) -> int:
    """The fewest timing rounds a case of the scenario asks for (with ``sets`` applied); -k and
    --normalize-by checked against its cases and backends before any turn runs."""
    from attnbench.workload.scenario import load  # pydantic: not for --help

    sf = load(scenario, sets)
    names = list(dict.fromkeys([*(backends or sf.scenario.backends or registry.all_names()), "reference"]))
    if normalize_by:
        normalize_by = backend_among(normalize_by, names, "--normalize-by", "the backends the scenario runs")
    if select:
        picks = selector(select)
        if not any(picks(c.case_id, b, c.params) for c in sf.cases for b in names if b != normalize_by):
            raise UsageError(f"-k {select!r} picks no case and backend of {scenario.name} (backends: "
                             f"{', '.join(names)}): nothing would be compared")
    return min((c.scenario.timing.rounds for c in sf.cases), default=1)


def _own_rounds(sets: List[str]) -> None:
    """--set timing.rounds would change the size of a turn, not the rounds: refused."""
    for s in sets:
        key = s.partition("=")[0].strip()
        if key in ("timing.rounds", "timing"):
            raise UsageError(f"--set {s}: compare commits gives each run its timing.rounds itself (--rounds-per-turn, "
                             "so that the two sides' rounds alternate); pass --rounds N for the rounds per side"
                             + (", and set other timing keys one by one (--set timing.measure_ms=20)" if key == "timing"
                                else ""))


@contextlib.contextmanager
def _step(what: str, where: Path) -> Iterator[None]:
    """An OSError of this step (a full disk) as a message naming the step and the path."""
    try:
        yield
    except OSError as e:
        path = f" ({e.filename})" if e.filename and str(e.filename) != str(where) else ""
        raise UsageError(f"{what}, in {where}{path}: {e.strerror or e}; the work folder is --out or under $TMPDIR: "
                         "free space there, or pass --out DIR on another disk") from None


def _side(folders: List[Path], need_rounds: bool = True):
    loaded = [load_rows(f, need_rounds=need_rounds) for f in folders]
    rows = merge_rows([x.rows for x in loaded], [x.label for x in loaded])
    return rows, loaded


@compare_app.command("commits")
@handle_errors
@user_errors
def compare_commits_cmd(
    scenario: str = typer.Argument(..., help="scenario file or built-in name (both sides run this text)"),
    base: str = typer.Option("HEAD~1", "--base", help="the commit to compare against (default: the parent of HEAD)"),
    head: Optional[str] = typer.Option(None, "--head", help="the commit to judge (default: the working tree as it is)"),
    repo: Optional[Path] = typer.Option(None, "--repo", help="attnbench's git checkout (default: the one holding the current folder)"),
    rounds: Optional[int] = typer.Option(None, "--rounds", help="timing rounds per side (default: the scenario's timing.rounds)"),
    per_turn: int = typer.Option(1, "--rounds-per-turn", help="timing rounds each side runs before the other's turn"),
    workers: int = typer.Option(4, "--workers", help="worker processes per side (turns go to them in rotation)"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a scenario key for both sides"),
    backend: Optional[List[str]] = typer.Option(None, "--backend", "-b", help="backends to run (default: the scenario's)"),
    device: Optional[str] = typer.Option(None, help="auto | cpu | cuda | cuda:N (overrides the scenario)"),
    max_slowdown: str = MAX_SLOWDOWN,
    min_delta_us: float = MIN_DELTA_US,
    confidence: str = CONFIDENCE,
    normalize_by: Optional[str] = NORMALIZE_BY,
    out: Optional[Path] = typer.Option(None, "--out", help="keep the checkouts' run folders here (default: a temporary folder, removed)"),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds a worker may take to start (import its attnbench) or to run one turn"),
    all_: bool = typer.Option(False, "--all", help="list every case, not only the failing ones"),
    format: str = typer.Option("table", "--format", help=FORMAT_HELP),
    select: Optional[str] = typer.Option(None, "-k", metavar="EXPR", help=SELECT_HELP),
):
    """The regression gate against a commit, measured here and now: exit 1 when head is slower
    than base beyond the thresholds, or a case broke.

    Checks out --base (and --head, if given) from git, runs SCENARIO from both checkouts in
    turns (base, head, head, base, ...; --rounds-per-turn timing rounds each, on --workers
    processes per side started once), merges each side's rounds and judges head against base
    pair by pair (round k of head was measured next to round k of base), with `check`'s
    thresholds and interval. No stored numbers decide."""
    fmt = check_format(format)
    check_numbers(timeout=timeout, rounds=rounds, rounds_per_turn=per_turn, workers=workers)
    opts = gate_options(max_slowdown, min_delta_us, confidence, normalize_by)
    _own_rounds(list(set_ or []))
    out = Path(os.path.abspath(out)) if out is not None else None  # the workers run in the checkouts' folders
    if out is not None and out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: not empty; compare commits writes fresh run folders into a folder of its own")
    with _step("making the work folder", out or Path(tempfile.gettempdir())):
        work = Path(tempfile.mkdtemp(prefix="attnbench-commits-")) if out is None else out
    kept = False
    try:
        with sigterm_as_interrupt():  # a CI cancel cleans up as Ctrl-C does
            _compare(scenario, base, head, repo, rounds, per_turn, workers, list(set_ or []), list(backend or []),
                     device, opts, normalize_by, timeout, all_, fmt, select, work)
    except SideError as e:
        kept = out is None
        raise UsageError(f"{e} (the workers' logs and run folders are kept in {work}: remove it when done)" if kept
                         else f"{e} (the workers' logs and run folders are in {work})") from None
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Terminated)
        code = getattr(e, "exit_code", 130)
        err.print(f"{'terminated (SIGTERM)' if code != 130 else 'interrupted'}: compare commits stopped; "
                  + (f"the run folders so far are in {work}" if out is not None else f"removed its work folder {work}"),
                  highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(code) from None
    finally:
        if out is None and not kept:
            shutil.rmtree(work, ignore_errors=True)


def _compare(scenario, base, head, repo, rounds, per_turn, workers, sets, backends, device, opts, normalize_by, timeout,
             all_, fmt, select, work: Path) -> None:
    info = info_console(fmt)
    try:
        root = repo_root(repo or Path.cwd())
        with _step(f"checking out --base {base}", work / "src-base"):
            co_base = checkout(root, base, work / "src-base", "base")
        with _step(f"checking out --head {head or '(the working tree)'}", work / "src-head"):
            sides = (co_base, checkout(root, head, work / "src-head", "head"))
    except CheckoutError as e:
        raise UsageError(str(e)) from None
    with _step("copying the scenario", work / "scenario"):
        copy = _scenario_copy(scenario, work / "scenario")
    least = _rounds_of(copy, sets, backends, select, normalize_by)
    total = rounds if rounds is not None else least
    need = rounds_needed(opts.thresholds.confidence, paired=True)
    if total < need:
        raise UsageError(f"--rounds {total}: at {opts.thresholds.confidence:.0%} confidence a paired comparison needs "
                         f"at least {need} rounds per side; pass --rounds {max(need, 20)}")
    turns = -(-total // per_turn)
    plan = Plan(copy, turns, per_turn, min(workers, turns), sets, backends, device, timeout)
    info.print(f"compare commits: {sides[1].label} (head) against {sides[0].label} (base), {scenario}: "
               f"{turns} turns per side of {per_turn} round(s), alternating, on {plan.workers} worker process(es) "
               "per side", highlight=False, markup=False)

    def progress(t: Turn, i: int, n: int) -> None:
        err.print(f"[{i}/{n}] {t.side} turn {t.index} (worker {t.worker}): {t.seconds:.1f} s", highlight=False)

    try:
        with _step("running the turns", work / "runs"):
            res = run_interleaved(sides, plan, work / "runs", progress)
        (hrows, hl), (brows, bl) = _side(res.folders["head"]), _side(res.folders["base"])
    except (InterleaveError, MergeError, BaselineError) as e:
        raise SideError(str(e)) from None
    opts.default_for(hrows, brows)
    normalize_by = opts.normalize_by
    picked = pick_rows(hrows, select, normalize_by), pick_rows(brows, select, normalize_by)
    result = run_check(*picked, opts.thresholds, normalize_by, paired=True)
    for h, b in zip(hl, bl):
        result.problems += [p for p in run_problems(h.rows, h.manifest, b.rows, b.manifest) if p not in result.problems]
    if select and not [r for r in picked[0] if r.id.backend != normalize_by]:
        result.problems.append(f"-k {select!r} picks no row: nothing was compared")
    labels = (f"head {sides[1].label}", f"base {sides[0].label}")
    report_check(result, opts, fmt, all_, labels)
    if result.failed:
        raise typer.Exit(1)
