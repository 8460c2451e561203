"""Commands ``run``, ``validate``, ``schema`` and ``backends``: parse, call, render, exit code.

Exit codes: 0 every row ok or skipped; 1 a row is error/mismatch (or a regression);
2 bad input (scenario, flags), with one message naming the file, the field and the fix.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from attnbench import backend as registry
from attnbench.analyze.tables import print_profiles, print_results
from attnbench.cli.app import (
    EXECUTOR_OPT, RESOURCE_OPT, SCHEDULER_OPT, WORKERS_OPT, UsageError, app, base_manifest, console, err,
    executor_spec, handle_errors, load_backend_files, print_notes, record_rows, start_runner,
)
from attnbench.cli.safety import RESUME_KEEPS, check_writable, flags_given
from attnbench.execute.isolate import isolated_rows
from attnbench.execute.options import options_to_json
from attnbench.execute.runner import RunOptions
from attnbench.store.runfolder import RunFolder
from attnbench.workload.scenario import ScenarioError, json_schema, load


@app.command()
@handle_errors
def run(
    ctx: typer.Context,
    scenario: Optional[Path] = typer.Argument(None, help="scenario YAML file (not with --resume)"),
    set_: Optional[List[str]] = typer.Option(
        None, "--set", help="override a key: --set model.head_dim=64 (on a swept key: runs that one value)"
    ),
    backend: Optional[List[str]] = typer.Option(None, "--backend", "-b", help="backend to run (repeatable)"),
    device: Optional[str] = typer.Option(None, help="auto | cpu | cuda | cuda:N (overrides the scenario)"),
    out: Optional[Path] = typer.Option(None, help="new run folder (default: results/<UTC time>-<scenario>/)"),
    results_dir: Path = typer.Option(Path("results"), help="where new run folders go"),
    save_tensors: Optional[Path] = typer.Option(None, help="write each case's inputs and outputs here (.pt)"),
    warm_l2: bool = typer.Option(False, "--warm-l2", help="do not flush the L2 cache before timed calls"),
    no_graphs: bool = typer.Option(False, "--no-graphs", help="time with CUDA events only, never graphs"),
    warmup_ms: Optional[float] = typer.Option(None, help="warm-up budget per row (ms)"),
    measure_ms: Optional[float] = typer.Option(None, help="measurement budget per row (ms)"),
    rtol: Optional[float] = typer.Option(None, help="relative-error tolerance vs the reference"),
    threads: Optional[int] = typer.Option(
        None, "--threads", help="CPU rows: intra-op threads while backends run (default 1: steady medians)"
    ),
    profile: bool = typer.Option(False, "--profile", help="one torch.profiler pass per row (kernel table, trace)"),
    backend_file: Optional[List[Path]] = typer.Option(
        None, help="Python file defining Backend subclasses (RUNS that file's code)"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
    resume: Optional[Path] = typer.Option(
        None, "--resume", help="finish an incomplete run folder with its own scenario and options, skipping rows done"
    ),
    allow_env_change: bool = typer.Option(
        False, "--allow-env-change", help="with --resume: go on although attnbench, torch or the device changed"
    ),
    isolate: bool = typer.Option(False, "--isolate", help="run each case's backends in a child process (crash-safe)"),
    timeout: float = typer.Option(300.0, "--timeout", help="with --isolate: seconds a backend may run before it is killed"),
    executor: str = EXECUTOR_OPT,
    workers: Optional[int] = WORKERS_OPT,
    scheduler: Optional[str] = SCHEDULER_OPT,
    resource: Optional[List[str]] = RESOURCE_OPT,
):
    """Run a scenario through the backends; write a run folder; print the results table."""
    spec = executor_spec(executor, workers, scheduler, resource, isolate=isolate, writes_files=profile or bool(save_tensors))
    load_backend_files(backend_file)
    if timeout <= 0:
        raise UsageError(f"--timeout {timeout}: must be > 0")
    if resume is not None:
        return _resume(ctx, resume, isolate, allow_env_change, backend_file, quiet, spec)
    _check_new_run(ctx, scenario, isolate)
    sf = load(scenario, set_ or [])
    print_notes(sf)
    opts = _new_options(backend, device, warm_l2, no_graphs, warmup_ms, measure_ms, rtol, save_tensors, threads)
    runner = start_runner(sf, opts, spec, str(scenario), set_ or [], backend_file)
    check_writable(save_tensors, "--save-tensors")
    folder = RunFolder.create(results_dir, sf.name, out)
    if profile:
        opts.profile_dir = folder.path / "profiles"
    folder.start({**base_manifest(sf, runner, str(scenario), set_ or []), "options": options_to_json(opts),
                  "backend_files": [str(Path(f).resolve()) for f in backend_file or []],
                  "isolate": isolate, "timeout": timeout if isolate else None, "executor": spec.to_json()})
    job = dict(scenario_path=str(scenario), overrides=list(set_ or []), backend_files=backend_file, timeout=timeout)
    _execute(runner, folder, frozenset(), isolate, job, quiet, profile)


def _check_new_run(ctx, scenario: Optional[Path], isolate: bool) -> None:
    if scenario is None:
        raise UsageError("give a scenario file (attnbench run SCENARIO.yaml), or --resume RUN_DIR")
    if not isolate and flags_given(ctx, ("timeout",)):
        raise UsageError("--timeout: only an --isolate child can be stopped when a backend overruns (in this process it "
                         "cannot be); add --isolate, or drop --timeout")


def _new_options(backend, device, warm_l2, no_graphs, warmup_ms, measure_ms, rtol, save_tensors, threads) -> RunOptions:
    """The run options of the flags, checked (a bad value is a UsageError)."""
    if threads is not None and threads < 1:
        raise UsageError(f"--threads {threads}: must be >= 1")
    for name, v in (("--measure-ms", measure_ms), ("--rtol", rtol)):
        if v is not None and v <= 0:
            raise UsageError(f"{name} {v}: must be > 0")
    overrides = {k: v for k, v in (("warmup_ms", warmup_ms), ("measure_ms", measure_ms)) if v is not None}
    return RunOptions(
        backends=list(backend) if backend else None, device=device, warm_l2=warm_l2, no_graphs=no_graphs,
        timing_overrides=overrides, save_tensors=save_tensors, rtol=rtol, threads=threads,
    )


def _resume(ctx, path: Path, isolate: bool, allow_env_change: bool, backend_file, quiet: bool, spec) -> None:
    """``run --resume``: the run's own scenario and options; refuses flags that would change
    them, and a changed attnbench/torch/device unless --allow-env-change. Nothing in the
    folder is rewritten until every check passed."""
    from attnbench.execute.resume import ResumeError, begin, environment_changes, open_run

    conflicts = flags_given(ctx, RESUME_KEEPS)
    if set(conflicts) & {"SCENARIO", "--set"}:
        raise UsageError("--resume RUN_DIR takes the scenario and --set overrides from the run folder; give neither")
    try:
        prior = open_run(path)
    except ResumeError as e:
        raise UsageError(str(e)) from None
    try:
        opts, isolate = prior.options, isolate or prior.isolate
        if conflicts:
            raise UsageError(f"--resume {path} goes on with the run's own settings ({kept_settings(prior)}); "
                             f"drop {', '.join(conflicts)}, which would change them, or start a new run")
        if isolate and spec.kind != "local":
            raise UsageError(f"--resume {path}: the run was isolated (--isolate), which --executor dask does not do")
        runner = start_runner(prior.sf, opts, spec, prior.scenario_path, prior.overrides, backend_file)
        changes = environment_changes(prior, runner.device_name)
        if changes and not allow_env_change:
            raise UsageError(f"--resume {path}: this run folder was made elsewhere ({'; '.join(changes)}): its rows and "
                             "new ones would sit under one manifest. Start a new run, or pass --allow-env-change "
                             "(the manifest records the change)")
        check_writable(opts.save_tensors, "--save-tensors (from the manifest)")
        note = begin(prior, isolate, changes, spec.to_json())
    except ValueError as e:  # Runner: a recorded device that is not here
        prior.folder.unlock()
        raise UsageError(f"--resume {path}: {e}") from None
    except BaseException:
        prior.folder.unlock()
        raise
    for n in ([note] if note else []) + [f"resuming {path}: {len(prior.done)} row(s) done; kept: {kept_settings(prior)}"]:
        err.print(escape(n), highlight=False, soft_wrap=True)
    job = dict(scenario_path=prior.scenario_path, overrides=prior.overrides, backend_files=backend_file,
               timeout=prior.timeout or 300.0)
    _execute(runner, prior.folder, prior.done, isolate, job, quiet, opts.profile_dir is not None)


def kept_settings(prior) -> str:
    """The settings a resumed run keeps from its manifest, in words."""
    o = prior.options
    iso = f"--isolate with --timeout {prior.timeout or 300.0:g} s" if prior.isolate else "in process (add --isolate to isolate the rest)"
    timing = ", ".join(f"{k} {v:g}" for k, v in o.timing_overrides.items()) or "the scenario's"
    return (f"backends {', '.join(o.backends) if o.backends else 'as the scenario says'}; device {o.device or 'as the scenario says'}; "
            f"timing {timing}; --save-tensors {o.save_tensors or 'no'}; --profile {'yes' if o.profile_dir else 'no'}; {iso}")


def _execute(runner, folder: RunFolder, done: frozenset, isolate: bool, job: dict, quiet: bool, profile: bool) -> None:
    """Run the rows not ``done`` (in child processes with ``isolate``) into ``folder``; print
    the table; exit 130 if interrupted, 1 if a row failed."""
    sf = runner.sf
    todo = runner.total_rows - sum(1 for c in sf.cases for b in runner.backend_names if (c.case_id, b) in done)
    if isolate:
        rows = isolated_rows(
            runner, scenario_text=sf.text, scenario_path=job["scenario_path"], overrides=job["overrides"],
            backend_files=[str(f) for f in job["backend_files"] or []], timeout=job["timeout"], done=done,
        )
    else:
        rows = runner.rows(done=done)
    complete = record_rows(folder, rows, todo, sf.name, quiet)
    print_results(folder.rows, console, title=f"{sf.name} on {runner.device_name}")
    if profile:
        print_profiles(folder.rows, console)
    console.print(escape(f"run folder: {folder.path}  (results.csv, rows.jsonl, manifest.json)"), highlight=False)
    bad = [r for r in folder.rows if r.status in ("error", "mismatch")]
    if not complete:
        raise typer.Exit(130)
    if bad:
        console.print(f"[red]{len(bad)} row(s) failed (error or mismatch)[/]")
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
    load_backend_files(backend_file)
    failed = 0
    for f in files:
        try:
            sf = load(f)
            check_backend_names(sf)
        except ScenarioError as e:
            err.print(f"[red]✗[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            failed += 1
            continue
        reqs = len(sf.cases[0].scenario.batch_spec().requests)
        console.print(f"[green]✓[/] {escape(str(f))}: {len(sf.cases)} case(s), {reqs} request(s) in the first")
    if failed:
        raise typer.Exit(2)


def check_backend_names(sf) -> None:
    """The scenario's ``backends:`` are all registered (ScenarioError naming the file if not)."""
    known = registry.all_names()
    for i, name in enumerate(sf.scenario.backends or []):
        if name not in known:
            raise ScenarioError(f"{sf.path}: backends.{i}: {registry.unknown_backend(name)}")


@app.command()
def schema():
    """Print the JSON Schema of scenario files (for editor completion)."""
    console.print_json(json.dumps(json_schema()))


@app.command("backends")
@handle_errors
def list_backends(
    backend_file: Optional[List[Path]] = typer.Option(None, help="Python file defining Backend subclasses (RUNS it)"),
):
    """List the backends and whether each can run here."""
    from rich.markup import escape
    from rich.table import Table

    load_backend_files(backend_file)
    t = Table("backend", "available", "version / reason")
    for n in registry.all_names():
        try:
            cls = registry.get_backend_class(n)
            why = cls.unavailable()
            t.add_row(n, "yes" if why is None else "no", escape(cls.version() if why is None else why))
        except Exception as e:
            t.add_row(n, "no", f"{type(e).__name__}: {e}")
    console.print(t)
