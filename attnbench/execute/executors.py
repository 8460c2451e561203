"""Where a run's cases execute: ``local`` (this process, or ``--isolate`` children) or ``dask``
(a local cluster of one worker per GPU, or the cluster behind ``--scheduler``).

``open_runner`` is the one place that picks the executor, and every executor answers the same
questions (the protocol the command line uses): ``sf``, ``opts``, ``backend_names``,
``device_name``, ``environment()``, ``todo(case, done)``, ``rows(done)`` (each row as it is
finished), ``notes`` and ``close()``. ``Runner`` runs cases here; ``IsolatedRunner`` runs each
case's backends in child processes; ``DaskRunner`` sends each case, with all its backends, to
one worker and its one device. The child and the worker get the same ``Job`` and report the
same events (``execute.job``, ``execute.events``); the step observer is passed to the runner
that runs the case (``Runner(..., on_step=...)``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from attnbench.execute.dask_cluster import ExecutorError, require_dask

EXECUTORS = ("local", "dask")


@dataclass
class ExecutorSpec:
    kind: str = "local"
    workers: Optional[int] = None  # local cluster size (default: one per visible GPU)
    scheduler: Optional[str] = None  # address of a running scheduler
    resources: dict = field(default_factory=dict)  # worker resources every case needs
    isolate: bool = False  # local: each case's backends in child processes
    timeout: float = 300.0  # with isolate: seconds a backend may run before its child is killed
    oversubscribe: bool = False  # --oversubscribe: more CPU workers than cores, as asked

    def to_json(self) -> dict:  # what the manifest records as "executor" (isolate and timeout have keys of their own)
        return {"kind": self.kind, "workers": self.workers, "scheduler": self.scheduler, "resources": self.resources,
                "oversubscribe": self.oversubscribe}


def parse_resources(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, _, amount = item.partition("=")
        try:
            value = float(amount) if amount else 1.0
        except ValueError:
            value = -1.0
        if not name.strip() or value <= 0:
            raise ExecutorError(f"--resource {item}: give NAME or NAME=AMOUNT (a positive number), e.g. --resource H200=1")
        out[name.strip()] = value
    return out


def check_spec(spec: ExecutorSpec, *, writes_files: bool = False) -> None:
    """Refuse flags that do not go together, before anything starts."""
    if spec.kind not in EXECUTORS:
        raise ExecutorError(f"--executor {spec.kind}: choose one of {', '.join(EXECUTORS)}")
    if spec.kind == "local":
        extra = [f for f, v in (("--workers", spec.workers), ("--scheduler", spec.scheduler),
                                ("--resource", spec.resources), ("--oversubscribe", spec.oversubscribe)) if v]
        if extra:
            raise ExecutorError(f"{extra[0]} goes with --executor dask (the local executor runs here, in one process)")
        return
    require_dask()
    if spec.workers is not None and spec.scheduler:
        raise ExecutorError("--workers starts a local cluster; --scheduler uses a running one: give one of them")
    if spec.isolate:
        raise ExecutorError("--isolate runs child processes on this machine; with --executor dask a worker that "
                            "crashes already becomes error rows (drop --isolate)")
    if writes_files and spec.scheduler:
        raise ExecutorError("--profile and --save-tensors write files on the workers' machines: use them with a "
                            "local cluster (--workers) or --executor local, not with --scheduler")


def open_runner(sf, opts, spec: ExecutorSpec, *, scenario_path: str, overrides: list[str], backend_files: list[str]):
    """The executor of the spec: ``Runner``, ``IsolatedRunner`` or ``DaskRunner`` (close it when done)."""
    if spec.kind == "local":
        from attnbench.execute.runner import Runner

        runner = Runner(sf, opts)
        if not spec.isolate:
            return runner
        from attnbench.execute.isolate import IsolatedRunner
        from attnbench.execute.job import Job

        files = [str(Path(f).resolve()) for f in backend_files]  # the child loads them from this machine
        return IsolatedRunner(runner, Job(sf.text, scenario_path, list(overrides), opts, backend_files=files), spec.timeout)
    from attnbench.execute.case_task import PluginError, make_job
    from attnbench.execute.dask_cluster import connect, plan_local_workers, start_local
    from attnbench.execute.dask_driver import DaskRunner

    try:
        job = make_job(sf, opts, scenario_path=scenario_path, overrides=overrides, backend_files=backend_files)
    except PluginError as e:
        raise ExecutorError(str(e)) from None
    if spec.scheduler:
        cluster = connect(spec.scheduler)
    else:
        plans = plan_local_workers(opts.device or sf.scenario.device, spec.workers, spec.oversubscribe)
        cluster = start_local(plans, spec.resources)
    try:
        return DaskRunner(sf, opts, job, cluster, spec.resources)
    except BaseException:
        cluster.close()
        raise
