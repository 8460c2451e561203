"""Commands ``run``, ``validate`` and ``schema``: parse, call, render, exit code.

Exit codes: 0 every row ok or skipped; 1 a row is error/mismatch (or a regression);
2 bad input (scenario, flags), with one message naming the file, the field and the fix.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.markup import escape

from attnbench.backend import registry
from attnbench.analyze.run_formats import render_run
from attnbench.analyze.tables import print_profiles
from attnbench.cli.app import (
    EXECUTOR_OPT, OVERSUBSCRIBE_OPT, RESOURCE_OPT, SCENARIO_HELP, SCHEDULER_OPT, WORKERS_OPT, UsageError, app,
    console, err, check_format, executor_spec, handle_errors, load_backend_files, start_runner,
)
from attnbench.cli.pipeline import (
    DEFAULT_TIMEOUT_S, BACKEND_FILE_OPT, DEVICE_OPT, FLUSH_OPT, FORMAT_OPT, ISOLATE_OPT, MEASURE_OPT, NO_GRAPHS_OPT, OUT_OPT, QUIET_OPT, RESULTS_DIR_OPT,
    SELECT_OPT, SET_OPT, TIMEOUT_OPT, WARM_L2_OPT, WARMUP_OPT, Launch, check_reference, ensure_selected, launch_of,
    new_folder, new_options, new_runner, run_rows,
)
from attnbench.cli.numbers import check_numbers
from attnbench.cli.safety import RESUME_KEEPS, check_writable, flags_given
from attnbench.workload.timing_spec import flag_text
from attnbench.store.runfolder import RunFolder
from attnbench.store.safe_text import term_text

if TYPE_CHECKING:  # torch and pydantic: imported by the commands that need them, not for --help
    from attnbench.execute.runner import Runner


@app.command()
@handle_errors
def run(
    ctx: typer.Context,
    scenario: Optional[Path] = typer.Argument(None, help=SCENARIO_HELP + " (not with --resume)"),
    set_: Optional[List[str]] = SET_OPT,
    backend: Optional[List[str]] = typer.Option(
        None, "--backend", "-b", metavar="NAME", help="backend to run (repeatable; default: those that can run here)"
    ),
    select: Optional[str] = SELECT_OPT,
    list_: bool = typer.Option(False, "--list", help="print the cases (and backends) the scenario expands to; run nothing"),
    format: str = FORMAT_OPT,
    compact: Optional[bool] = typer.Option(None, "--compact/--full", show_default=False, help="one line per row (default: from 24 rows)"),
    device: Optional[str] = DEVICE_OPT,
    out: Optional[Path] = OUT_OPT,
    results_dir: Optional[Path] = RESULTS_DIR_OPT,
    save_tensors: Optional[Path] = typer.Option(None, help="write each case's inputs and outputs here (.pt)"),
    warm_l2: bool = WARM_L2_OPT,
    no_graphs: bool = NO_GRAPHS_OPT,
    warmup_ms: Optional[float] = WARMUP_OPT,
    measure_ms: Optional[float] = MEASURE_OPT,
    flush: Optional[str] = FLUSH_OPT,
    rtol: Optional[float] = typer.Option(None, help="relative-error tolerance vs the reference"),
    threads: Optional[int] = typer.Option(
        None, "--threads", help="CPU rows: intra-op threads while backends run (default 1: steady medians)"
    ),
    profile: bool = typer.Option(False, "--profile", help="one torch.profiler pass per row (kernel table, trace)"),
    backend_file: Optional[List[Path]] = BACKEND_FILE_OPT,
    quiet: bool = QUIET_OPT,
    resume: Optional[Path] = typer.Option(
        None, "--resume", help="finish an incomplete run folder with its own scenario and options, skipping rows done"
    ),
    allow_env_change: bool = typer.Option(
        False, "--allow-env-change", help="with --resume: go on although attnbench (its version, commit, edits or --backend-file), torch or the device changed"
    ),
    isolate: bool = ISOLATE_OPT,
    timeout: float = TIMEOUT_OPT,
    executor: str = EXECUTOR_OPT,
    workers: Optional[int] = WORKERS_OPT,
    oversubscribe: bool = OVERSUBSCRIBE_OPT,
    scheduler: Optional[str] = SCHEDULER_OPT,
    resource: Optional[List[str]] = RESOURCE_OPT,
):
    """Run a scenario through the backends; write a run folder; print the results (stdout: --format; progress: stderr)."""
    check_numbers(warmup_ms=warmup_ms, measure_ms=measure_ms, rtol=rtol, threads=threads, timeout=timeout, workers=workers)
    show = dict(fmt=check_format(format), compact=compact, quiet=quiet)
    spec = executor_spec(executor, workers, scheduler, resource, isolate=isolate, timeout=timeout,
                         writes_files=profile or bool(save_tensors), oversubscribe=oversubscribe)
    load_backend_files(backend_file)
    if resume is not None:
        return _resume(ctx, resume, isolate, allow_env_change, backend_file, dict(show, list=list_), spec)
    _check_new_run(ctx, scenario, isolate, select, spec)
    opts = new_options(backend, device, warm_l2, no_graphs, dict(warmup_ms=warmup_ms, measure_ms=measure_ms, flush=flush),
                       rtol, save_tensors, threads, select, set_)
    if list_:
        return _print_cases(scenario, set_, opts, show["fmt"])
    runner = new_runner(scenario, set_, opts, spec, backend_file)
    ensure_selected(runner, str(scenario))
    launch = launch_of(str(scenario), set_, backend_file)
    runner, folder = new_folder(runner, launch, results_dir, out, profile, spec)
    _execute(runner, folder, frozenset(), launch, spec, show, profile)


def _print_cases(scenario: Path, set_, opts, fmt: str) -> None:
    """--list: the cases and their backends, without a runner (no torch: well under a second)."""
    from attnbench.cli.app import print_notes, selector
    from attnbench.cli.caselist import case_records, listed_backends, print_case_list
    from attnbench.execute.device import DEVICE_NAMES
    from attnbench.workload.scenario import load

    sf = load(scenario, set_ or [])
    print_notes(sf)
    device = opts.device or sf.scenario.device
    if not DEVICE_NAMES.match(device):
        raise UsageError(f"device {device!r}: not a device name; use auto, cpu, cuda or cuda:N (N a number)")
    picks = selector(opts.select) if opts.select else (lambda *_row: True)
    backends = listed_backends(sf, opts)
    recs = case_records(sf, backends, picks)
    if opts.select and not recs:  # as `run -k` says it: a -k that picks nothing is a mistake, not an empty list
        raise UsageError(f"-k {opts.select!r} picks no row of {scenario} ({len(sf.cases)} case(s) x "
                         f"{', '.join(backends)}); see them with: attnbench run {scenario} --list")
    print_case_list(recs, fmt, console)
    if fmt in ("table", "markdown"):
        from attnbench.workload.cost import size_words

        picked = {r["case_id"] for r in recs}
        console.out(size_words([c for c in sf.cases if c.case_id in picked], len(backends)) + " (a rough estimate)",
                    highlight=False)


def _check_new_run(ctx, scenario: Optional[Path], isolate: bool, select: Optional[str], spec) -> None:
    if select and spec.kind != "local":
        raise UsageError("-k runs with --executor local only (a Dask worker runs every backend of its case)")
    if scenario is None:
        raise UsageError("give a scenario file (attnbench run SCENARIO.yaml), or --resume RUN_DIR")
    if not isolate and flags_given(ctx, ("timeout",)):
        raise UsageError("--timeout: only an --isolate child can be stopped when a backend overruns (in this process it "
                         "cannot be); add --isolate, or drop --timeout")


def _resume(ctx, path: Path, isolate: bool, allow_env_change: bool, backend_file, show: dict, spec) -> None:
    """``run --resume``: the run's own scenario and options; refuses flags that would change
    them, and a changed attnbench version, torch or device unless --allow-env-change. Nothing in the
    folder is rewritten until every check passed."""
    from attnbench.execute.resume import ResumeError, begin, code_now, environment_changes, open_run
    from attnbench.store.code_identity import backend_file_hashes
    from attnbench.store.tensors import claim_tensors_folder

    conflicts = flags_given(ctx, RESUME_KEEPS)
    if set(conflicts) & {"SCENARIO", "--set"}:
        raise UsageError("--resume RUN_DIR takes the scenario and --set overrides from the run folder; give neither")
    try:
        prior = open_run(path)
    except ResumeError as e:
        raise UsageError(str(e)) from None
    try:
        opts, isolate = prior.options, isolate or prior.isolate  # frozen: the runner's specs make new options
        if conflicts:
            raise UsageError(f"--resume {path} goes on with the run's own settings ({kept_settings(prior)}); "
                             f"drop {', '.join(conflicts)}, which would change them, or start a new run")
        if isolate and spec.kind != "local":
            raise UsageError(f"--resume {path}: the run was isolated (--isolate), which --executor dask does not do")
        spec = dataclasses.replace(spec, isolate=isolate, timeout=prior.timeout or DEFAULT_TIMEOUT_S)
        runner = start_runner(prior.sf, opts, spec, prior.scenario_path, prior.overrides, backend_file)
        code = dict(code_now(), backend_files_sha256=backend_file_hashes(backend_file or []))
        changes = environment_changes(prior, runner.device_name, backend_file or [], code)
        check_same_backends(path, prior, runner.backend_names)
        if changes and not allow_env_change:
            raise UsageError(f"--resume {path}: this run folder was made elsewhere or by other code ({'; '.join(changes)}): "
                             "its rows and new ones would sit under one manifest. Start a new run, or pass "
                             "--allow-env-change (the manifest records the change)")
        if show.get("list"):  # what the resume would run, and nothing else: the folder is not touched
            from attnbench.cli.caselist import case_records, print_case_list

            prior.folder.unlock()
            left = lambda case_id, b, params: runner.picks(case_id, b, params) and (case_id, b) not in prior.done  # noqa: E731
            return print_case_list(case_records(prior.sf, runner.backend_names, left), show["fmt"], console)
        check_writable(opts.save_tensors, "--save-tensors (from the manifest)")
        claim_tensors_folder(opts.save_tensors, str(prior.folder.path))  # a run of an older attnbench: owned from now
        note = begin(prior, isolate, changes, spec.to_json(), code)
    except ValueError as e:  # Runner: a recorded device that is not here
        prior.folder.unlock()
        raise UsageError(f"--resume {path}: {e}") from None
    except BaseException:
        prior.folder.unlock()
        raise
    for n in ([note] if note else []) + [f"resuming {path}: {len(prior.done)} row(s) done; kept: {kept_settings(prior, isolate)}"]:
        err.print(escape(n), highlight=False, soft_wrap=True)
    _execute(runner, prior.folder, prior.done, launch_of(prior.scenario_path, prior.overrides, backend_file), spec, show,
             opts.profile_dir is not None)


def check_same_backends(path: Path, prior, names: list[str]) -> None:
    """A run whose manifest records no resolved backend specs (made before they were recorded)
    resolves its backends again here: refused when that gives other specs than the run's (an
    environment variable such as ATTNBENCH_FLASHINFER_BACKEND set only now, or only then)."""
    ran = prior.folder.manifest.backends_requested
    if ran and sorted(names) != sorted(ran):
        raise UsageError(f"--resume {path}: the run's backends resolve to {', '.join(names)} here, but it ran "
                         f"{', '.join(ran)} (an environment variable that sets a backend option, set only now or only "
                         "then?): rows of both would be mixed; set the environment as it was, or start a new run")


def kept_settings(prior, isolate: Optional[bool] = None) -> str:
    """The settings a resumed run keeps from its manifest, in words (``isolate``: whether the
    rest runs isolated, when this resume decided it: its own --isolate or the run's)."""
    o = prior.options
    isolated = prior.isolate if isolate is None else isolate
    iso = (f"--isolate with --timeout {prior.timeout or DEFAULT_TIMEOUT_S:g} s" if isolated
           else "in process (add --isolate to isolate the rest)")
    timing = ", ".join(f"{k} {flag_text(k, v)}" for k, v in o.timing_overrides.items()) or "the scenario's"
    return (f"backends {', '.join(o.backends) if o.backends else 'as the scenario says'}; device {o.device or 'as the scenario says'}; "
            f"timing {timing}; --save-tensors {o.save_tensors or 'no'}; --profile {'yes' if o.profile_dir else 'no'}; {iso}")


def _execute(runner, folder: RunFolder, done: frozenset, launch: Launch, spec, show: dict, profile: bool) -> None:
    """Run the rows not ``done`` into ``folder``; print the results; exit 130 if interrupted,
    1 if a row failed."""
    complete = run_rows(runner, folder, done, launch, spec, show["quiet"])
    title = run_title(runner.sf.name, runner.device_name, folder.rows)
    _render_and_exit(folder, show["fmt"], show["compact"], title, profile, complete)


def run_title(scenario: str, device: str, rows) -> str:
    """``quickstart on cpu x86_64 (2 threads)``, and for CPU rows the threads they ran on:
    ``..., rows timed on 1 thread`` (the device's count is the machine's, not the rows')."""
    threads = sorted({r.timing.threads for r in rows if r.timing.threads})
    scenario = term_text(scenario)  # a name of one line, without escape sequences
    if not threads:
        return f"{scenario} on {device}"
    return f"{scenario} on {device}, rows timed on {'/'.join(map(str, threads))} thread{'s' if threads != [1] else ''}"


def _render_and_exit(folder: RunFolder, fmt: str, compact: Optional[bool], title: str, profile: bool,
                     complete: bool) -> None:
    """Results on stdout in the asked format, notes beside them (stderr but for the table:
    the markdown carries its own notes, and stdout stays what can be pasted)."""
    info = console if fmt == "table" else err
    render_run(folder.rows, fmt, console, info, title=title, compact=compact)
    if profile:
        print_profiles(folder.rows, info)
    info.print(escape(f"run folder: {folder.path}  (results.csv, rows.jsonl, manifest.json)"), highlight=False,
               soft_wrap=True)  # one line: grep 'run folder:' in a log finds the whole path
    bad = [r for r in folder.rows if r.status.failed]
    if not complete:
        raise typer.Exit(130)
    if bad:
        info.print(f"[red]{len(bad)} row(s) failed (error or mismatch)[/]")
        raise typer.Exit(1)


@app.command()
@handle_errors
def validate(
    files: List[Path] = typer.Argument(..., help="scenario files to check"),
    backend_file: Optional[List[Path]] = typer.Option(
        None, help="Python file defining Backend subclasses, whose names the scenarios may use (RUNS it)"
    ),
):
    """Check scenario files (and the backend names they ask for) without running anything."""
    from attnbench.workload.scenario import ScenarioError, load

    load_backend_files(backend_file)
    failed = 0
    for f in files:
        try:  # every problem at once: the scenario's, then its backend names (read even when it fails)
            sf, problems = load(f), []
        except ScenarioError as e:
            sf, problems = None, [str(e)]
        problems += backend_name_problems(str(f), sf.scenario.backends if sf else raw_backends(f))
        problems += reference_problems(sf) if sf else []
        if problems:
            err.print(f"[red]✗[/] {escape(chr(10).join(problems))}", highlight=False, soft_wrap=True)
            failed += 1
            continue
        reqs = len(sf.cases[0].scenario.batch_spec().requests)
        console.print(f"[green]✓[/] {escape(str(f))}: {len(sf.cases)} case(s), {reqs} request(s) in the first")
    if failed:
        raise typer.Exit(2)


def reference_problems(sf) -> list[str]:
    """The scenario's ``check.reference`` names no backend (``check_reference``'s message), or []."""
    from attnbench.workload.scenario import ScenarioError

    try:
        check_reference(sf)
    except ScenarioError as e:
        return [str(e)]
    return []


def backend_name_problems(path: str, names) -> list[str]:
    """One message per ``backends:`` entry that is not registered or has bad options."""
    known, out = registry.all_names(), []
    for i, name in enumerate(names or []):
        if not isinstance(name, str):
            continue  # the schema check said so already
        if registry.backend_name(name) not in known:
            out.append(f"{path}: backends.{i}: {registry.unknown_backend(name)}")
            continue
        try:
            registry.canonical_spec(name)  # its options, validated against the backend's declaration
        except registry.UnknownBackend as e:
            out.append(f"{path}: backends.{i}: {e}")
    return out


def raw_backends(path) -> list:
    """The ``backends:`` list of a scenario file that did not load ([] when unreadable)."""
    import yaml

    from attnbench.workload.builtin import resolve
    from attnbench.workload.dotted import read_file
    from attnbench.workload.scenario import MAX_TEXT_BYTES

    try:
        doc = yaml.safe_load(read_file(resolve(path), str(path), MAX_TEXT_BYTES))
    except Exception:  # the load error says why already
        return []
    names = doc.get("backends") if isinstance(doc, dict) else None
    return names if isinstance(names, list) else []


@app.command()
def schema():
    """Print the JSON Schema of scenario files (for editor completion)."""
    from attnbench.workload.scenario import json_schema

    console.print_json(json.dumps(json_schema()))
