"""One pipeline for every command that runs a scenario (``run``, ``run --resume``,
``compare backends``): the options of the flags, the runner, the run folder and its manifest,
the rows (in this process, in ``--isolate`` children, or on Dask workers) each stamped with
its re-run command, written as they finish."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from attnbench.cli.app import (
    RESULTS_DIR_HELP, SELECT_HELP, UsageError, base_manifest, print_notes, record_rows, rows_per_case, start_runner,
)
from attnbench.cli.repro import repro_base, with_repro
from attnbench.cli.safety import check_writable
from attnbench.execute.lifeline import announce_run_folder
from attnbench.store.code_identity import backend_file_hashes
from attnbench.store.options import RunOptions
from attnbench.store.runfolder import LOCK_NAME, RunFolder, check_out
from attnbench.workload.timing_spec import TIMING_FLAGS, override_problem
from attnbench.workload.cost import case_seconds

if TYPE_CHECKING:  # torch: imported by the commands that need it, not for --help
    from attnbench.execute.runner import Runner

DEFAULT_TIMEOUT_S = 300.0
# The options every command that runs a scenario shares (``run``, ``compare backends``),
# declared once: the same flag reads the same and means the same in both.
FLUSH_OPT = typer.Option(None, "--flush", metavar="MODE",
                         help="how the L2 is emptied before each timed call: read | write | write+read (default: the scenario's)")
SET_OPT = typer.Option(None, "--set", metavar="KEY=VALUE",
                       help="override a key: --set model.head_dim=64 (on a swept key: runs that one value)")
DEVICE_OPT = typer.Option(None, help="auto | cpu | cuda | cuda:N (overrides the scenario)")
OUT_OPT = typer.Option(None, help="new run folder (default: <results-dir>/<UTC time>-<scenario>/)")
RESULTS_DIR_OPT = typer.Option(None, help=RESULTS_DIR_HELP)
WARM_L2_OPT = typer.Option(False, "--warm-l2", help="do not flush the L2 cache before timed calls")
NO_GRAPHS_OPT = typer.Option(False, "--no-graphs", help="time with CUDA events only, never graphs")
WARMUP_OPT = typer.Option(None, help="warm-up budget per row (ms)")
MEASURE_OPT = typer.Option(None, help="measurement budget per row (ms)")
BACKEND_FILE_OPT = typer.Option(None, metavar="FILE", help="Python file defining Backend subclasses (RUNS it)")
QUIET_OPT = typer.Option(False, "--quiet", "-q", help="no progress on stderr")
ISOLATE_OPT = typer.Option(False, "--isolate", help="run each case's backends in a child process (crash-safe)")
FORMAT_OPT = typer.Option("table", "--format", help="results on stdout as table | markdown (for a pull request) | csv | json")
SELECT_OPT = typer.Option(None, "-k", metavar="EXPR", help=SELECT_HELP)
TIMEOUT_OPT = typer.Option(DEFAULT_TIMEOUT_S, "--timeout",
                           help="with --isolate: seconds a backend may run before it is killed")


@dataclass
class Launch:
    """What a run's rows come from, as the command line gave it: recorded in the manifest and
    written into each row's re-run command (how they run is the ``ExecutorSpec``)."""

    scenario_path: str
    overrides: list[str] = field(default_factory=list)
    backend_files: list[str] = field(default_factory=list)


def new_options(backend, device, warm_l2, no_graphs, timing: dict, rtol, save_tensors, threads,
                select=None, set_=()) -> RunOptions:
    """The run options of the flags, checked (a bad value is a UsageError; the numbers were
    checked first, by ``check_numbers``). Paths are made absolute here, once: a backend that
    calls os.chdir must not move where the run writes."""
    overrides = {k: v for k, v in timing.items() if v is not None}
    both = [k for k in overrides if any(s.split("=", 1)[0].strip() == f"timing.{k}" for s in set_ or ())]
    if both:  # which one wins is nowhere obvious: the flag used to, silently
        k = both[0]
        raise UsageError(f"{TIMING_FLAGS[k]} and --set timing.{k}=... both set timing.{k}; give one of them")
    for k, v in overrides.items():
        why = override_problem(k, v)
        if why:
            raise UsageError(f"{TIMING_FLAGS.get(k, k)} {v}: {why.split(': ', 1)[-1]}")
    return RunOptions(
        backends=list(backend) if backend else None, device=device, warm_l2=warm_l2, no_graphs=no_graphs,
        timing_overrides=overrides, save_tensors=Path(save_tensors).absolute() if save_tensors else None, rtol=rtol, threads=threads, select=select,
    )


def check_reference(sf) -> None:
    """Each case's ``check.reference`` is ``reference`` or a registered backend (ScenarioError
    naming the file and the field, before anything runs; it used to be error rows)."""
    from attnbench.backend import registry
    from attnbench.workload.scenario import ScenarioError

    known = registry.all_names()
    for case in sf.cases:
        name = case.scenario.check.reference
        if name != "reference" and registry.backend_name(name) not in known:
            where = f" (case {case.case_id})" if case.params else ""
            raise ScenarioError(f"{sf.path}: check.reference{where}: {registry.unknown_backend(name)}")


def new_runner(scenario: Path, set_, opts: RunOptions, spec, backend_file) -> "Runner":
    from attnbench.workload.scenario import load

    sf = load(scenario, set_ or [])
    print_notes(sf)
    check_reference(sf)
    return start_runner(sf, opts, spec, str(scenario), set_ or [], backend_file)  # bad device, -k: UsageError


def ensure_selected(runner: "Runner", path: str) -> None:
    if runner.opts.select and not rows_per_case(runner):
        raise UsageError(
            f"-k {runner.opts.select!r} picks no row of {path} ({len(runner.sf.cases)} case(s) x "
            f"{', '.join(runner.backend_names)}); see them with: attnbench run {path} --list"
        )


def new_folder(runner: "Runner", launch: Launch, results_dir, out, profile: bool, spec) -> tuple["Runner", RunFolder]:
    """A new run folder with its manifest (profiles go inside it, with --profile), and the runner
    writing into it (``writing_to``: new options, never the ones ``runner`` was made with). Made
    after the runner, which -k is checked against first: a run that picks nothing leaves no folder."""
    opts = runner.opts
    from attnbench.store.tensors import check_tensors_folder, claim_tensors_folder

    check_tensors_folder(opts.save_tensors, out)
    if out is not None:  # before --save-tensors is made: inside --out, it must not make --out "not empty"
        check_out(Path(out), opts.save_tensors)
    check_writable(opts.save_tensors, "--save-tensors")
    existed = out is not None and Path(out).is_dir()
    folder = RunFolder.create(results_dir, runner.sf.name, out, own=opts.save_tensors)
    try:  # the run owns its tensors folder now, or another run does and this one stops before it began
        claim_tensors_folder(opts.save_tensors, str(folder.path), out)
    except BaseException:
        folder.unlock()
        with contextlib.suppress(OSError):
            (folder.path / LOCK_NAME).unlink()
            if not existed:
                folder.path.rmdir()
        raise
    announce_run_folder(folder.path)  # now: a parent that sees this process die before the manifest removes it
    # run: whose --save-tensors files a resume may merge into
    runner = runner.writing_to(str(folder.path), folder.path / "profiles" if profile else None)
    man = base_manifest(runner.sf, runner, launch.scenario_path, launch.overrides)
    man.update(backend_files=[str(Path(f).resolve()) for f in launch.backend_files],
               backend_files_sha256=backend_file_hashes(launch.backend_files), isolate=spec.isolate,
               timeout=spec.timeout if spec.isolate else None, executor=spec.to_json())
    folder.start(man)
    return runner, folder


def run_rows(runner, folder: RunFolder, done: frozenset, launch: Launch, spec, quiet: bool) -> bool:
    """Run the rows not ``done`` through the executor ``runner`` into ``folder``, each stamped
    with its re-run command; returns whether every row was recorded."""
    sf = runner.sf
    if spec.kind == "local" and not spec.isolate:
        from attnbench.execute.lifeline import report_step

        runner.on_step = report_step  # a parent that sees this process die blames the running backend
    base = repro_base(launch.scenario_path, launch.overrides, runner.opts, launch.backend_files, spec.isolate,
                      spec.timeout)
    rows = with_repro(runner.rows(done=done), base, [c.case_id for c in sf.cases])
    counts = rows_per_case(runner, done)
    costs = {c.case_id: case_seconds(c, counts[c.case_id]) for c in sf.cases if c.case_id in counts}
    return record_rows(folder, rows, counts, sf.name, quiet, costs)


def launch_of(scenario_path: str, overrides, backend_file) -> Launch:
    return Launch(str(scenario_path), list(overrides or []), [str(f) for f in backend_file or []])
