"""Where ``--executor dask`` runs: a local cluster started for the run, or a running one.

A local cluster has one worker process per device, each with one task thread (one case at a
time, so nothing else runs on its device while it measures) and a nanny that starts a fresh
process when the worker dies:
- GPUs: one worker per visible GPU (``--workers N``: the first N), each pinned to its GPU
  through ``CUDA_VISIBLE_DEVICES`` (the driver's own ``CUDA_VISIBLE_DEVICES`` is honoured);
  the worker sees it as ``cuda:0``;
- CPU: N workers (default one per 8 cores, at least 1), each with ``cores / N`` torch threads
  (at most ``OMP_NUM_THREADS`` when that is set).
The scheduler gives a task up after the first worker that dies under it
(``allowed-failures: 0``) and sends a worker one task at a time (``worker-saturation: 1.0``):
the driver decides what happens next (attnbench.execute.case_book).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Optional

INSTALL_HINT = "pip install 'attnbench[dask]'"


class ExecutorError(ValueError):
    """Bad executor flags or an unusable cluster: one message, exit 2."""


class ExecutorLost(RuntimeError):
    """The cluster went away mid-run: the rows so far are kept, the run is incomplete."""


def require_dask() -> None:
    """Raise ExecutorError with the install command when dask/distributed are missing."""
    try:
        import dask  # noqa: F401
        import distributed  # noqa: F401
    except ImportError as e:
        raise ExecutorError(
            f"--executor dask needs the packages dask and distributed, which are not installed here "
            f"({type(e).__name__}: {e}). Install them with: {INSTALL_HINT}"
        ) from None


@dataclass
class WorkerPlan:
    name: str
    env: dict = field(default_factory=dict)
    threads: int = 1  # torch intra-op threads


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [v.strip() for v in env.split(",") if v.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def plan_local_workers(device: str, workers: Optional[int], oversubscribe: bool = False) -> list[WorkerPlan]:
    """The workers of a local cluster for a run on ``device`` (the scenario's or --device):
    at most one per GPU, or on a CPU one per core unless ``oversubscribe``."""
    cores = os.cpu_count() or 1
    if workers is not None and workers < 1:
        raise ExecutorError(f"--workers {workers}: must be >= 1")
    gpus = visible_gpus() if device.split(":")[0] in ("auto", "cuda") else []
    if device.startswith("cuda:"):
        raise ExecutorError(f"--device {device}: with --executor dask each worker sees its own GPU as cuda:0; "
                            "use --device cuda (and CUDA_VISIBLE_DEVICES to choose the GPUs)")
    if device == "cuda" and not gpus:
        raise ExecutorError("device cuda: no CUDA device is visible here; use --device cpu for CPU workers")
    if gpus:
        n = len(gpus) if workers is None else workers
        if n > len(gpus):
            raise ExecutorError(
                f"--workers {n}: only {len(gpus)} GPU(s) visible; a local cluster runs one worker per GPU, "
                "so that no two cases share a device while they are timed"
            )
        threads = max(1, cores // n)
        return [WorkerPlan(f"gpu{g}", {"CUDA_VISIBLE_DEVICES": g, "ATTNBENCH_THREADS": str(threads)}, threads)
                for g in gpus[:n]]
    n = workers if workers is not None else max(1, cores // 8)
    if n > cores and not oversubscribe:
        raise ExecutorError(
            f"--workers {n}: this machine has {cores} CPU core(s); more CPU workers than cores time each other's "
            f"interference and take memory per process. Use --workers {cores} or fewer, or add --oversubscribe")
    threads = max(1, cores // n)
    asked = os.environ.get("OMP_NUM_THREADS", "")
    if asked.isdigit() and int(asked) > 0:  # the caller's own limit stands
        threads = min(threads, int(asked))
    return [WorkerPlan(f"cpu{i}", {"CUDA_VISIBLE_DEVICES": "", "ATTNBENCH_THREADS": str(threads)}, threads)
            for i in range(n)]


CLUSTER_CONFIG = {
    "distributed.scheduler.allowed-failures": 0,
    "distributed.scheduler.worker-saturation": 1.0,
}


class Cluster:
    """A client, and the local cluster when this run started one; ``close()`` ends both."""

    def __init__(self, client, cluster=None, expected: int = 1):
        self.client, self.cluster, self.expected = client, cluster, expected

    @property
    def local(self) -> bool:
        return self.cluster is not None

    def close(self) -> None:
        for closer in (self.client, self.cluster):
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # noqa: BLE001 - closing what may already be gone
                    pass


def start_local(plans: list[WorkerPlan], resources: dict) -> Cluster:
    import dask
    from distributed import Client, Nanny, Scheduler, SpecCluster

    saved = dict(os.environ)  # a nanny writes its pre-spawn variables into this process
    with dask.config.set(CLUSTER_CONFIG):
        workers = {
            p.name: {"cls": Nanny, "options": {
                "nthreads": 1, "env": p.env, "host": "127.0.0.1", "resources": dict(resources) or None,
                "dashboard_address": None, "silence_logs": logging.ERROR,
            }}
            for p in plans
        }
        scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard": False, "dashboard_address": "127.0.0.1:0"}}
        cluster = SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logging.ERROR, name="attnbench")
        try:
            client = Client(cluster)
            client.wait_for_workers(len(plans), timeout=300)
        except BaseException:
            cluster.close()
            raise
    os.environ.clear()
    os.environ.update(saved)
    return Cluster(client, cluster, len(plans))


def connect(address: str, timeout: float = 60.0) -> Cluster:
    from distributed import Client

    try:
        client = Client(address, timeout=timeout)
    except (OSError, TimeoutError) as e:
        raise ExecutorError(f"--scheduler {address}: cannot reach a Dask scheduler there ({type(e).__name__}: {e})") from None
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        client.close()
        raise ExecutorError(f"--scheduler {address}: no worker joined the scheduler within {timeout:g} s") from None
    return Cluster(client, None, 1)
