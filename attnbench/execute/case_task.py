"""What a Dask worker does for ``--executor dask``: one case with all its backends, on the
worker's one device.

A task gets a ``Job`` (``execute.job``, as an ``--isolate`` child does): the scenario's text
and ``--set`` overrides, the case id, the backends still to run, the run options and the
sources of the ``--backend-file`` plugins. The worker
needs nothing but attnbench installed: it rebuilds the scenario from the text, writes each
plugin source into a private temporary folder under its own file name and imports it from
there, and rebuilds the batch from the seed, so its inputs equal a local run's.

While the case runs, the task logs events (``execute.events``, the vocabulary of an
``--isolate`` child too) on the job's topic through the scheduler (each call waits for the
scheduler's acknowledgement, so what was logged survives the worker): ``ready`` (the worker,
its process), ``device``, ``setup`` (the case begins: building the batch and the reference),
``start`` and ``end`` of each backend's step (prepare, a timing round, finish, the input
check: the runner's step observer) and ``row`` (a finished row). The driver records each row
as it comes and, if the worker dies, knows which rows were finished and which backend was
running. After an ``error`` row on a CUDA device the task probes the device; if the CUDA
context is broken (an illegal memory access poisons it for the process), it logs ``restart``
and the worker exits once every row is logged; its nanny starts a fresh process for the next case.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
from pathlib import Path

from attnbench import __version__
from attnbench.backend.files import load_backend_file
from attnbench.execute import events as ev_
from attnbench.execute.job import Job

MAX_PLUGIN_BYTES = 2 << 20
_LOADED: set[str] = set()  # plugin digests imported by this worker process


class PluginError(ValueError):
    """A ``--backend-file`` that cannot travel to the workers; the message says why."""


def plugin_sources(paths: list[str]) -> list[dict]:
    """The sources of ``--backend-file`` plugins as they travel with each task: one file
    each, UTF-8 text. A plugin that imports sibling modules of its own does not travel:
    install it as a package on the workers instead (the message of the failing import says so)."""
    out = []
    for p in paths:
        path = Path(p)
        data = path.read_bytes()
        if len(data) > MAX_PLUGIN_BYTES:
            raise PluginError(f"--backend-file {p}: {len(data)} bytes; a plugin that travels to Dask workers "
                              f"is at most {MAX_PLUGIN_BYTES} bytes (install a large one on the workers as a package)")
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise PluginError(f"--backend-file {p}: not UTF-8 text; only Python source travels to Dask workers") from None
        out.append({"name": path.name, "text": text, "sha256": hashlib.sha256(data).hexdigest()})
    return out


def make_job(sf, opts, *, scenario_path: str, overrides: list[str], backend_files: list[str]) -> Job:
    """The part of a task that every case of a run shares (the plugins travel as their sources)."""
    return Job(sf.text, scenario_path, list(overrides), opts, plugins=plugin_sources(backend_files))


def _load_plugins(plugins: list[dict]) -> None:
    for p in plugins:
        if p["sha256"] in _LOADED:
            continue
        folder = Path(tempfile.gettempdir()) / "attnbench-plugins" / p["sha256"][:20]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / p["name"]
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != p["sha256"]:
            tmp = folder / f".{p['name']}.{os.getpid()}.tmp"
            tmp.write_text(p["text"])
            os.replace(tmp, path)
        try:
            load_backend_file(path)
        except ImportError as e:
            raise PluginError(
                f"--backend-file {p['name']}: importing it on the worker failed: {type(e).__name__}: {e}. "
                "Only the file itself travels to Dask workers; install what it imports on the workers"
            ) from None
        _LOADED.add(p["sha256"])


def _runner(job: Job, on_step=None):
    threads = os.environ.get("ATTNBENCH_THREADS")
    if threads and threads.isdigit():
        import torch

        torch.set_num_threads(int(threads))
    return job.runner(on_step=on_step, load_plugin=_load_plugins)


def worker_identity() -> dict:
    """This worker: its address and name in the cluster, host and process."""
    try:
        from distributed import get_worker

        w = get_worker()
        address, name = w.address, str(w.name)
    except (ImportError, ValueError):
        address, name = "", ""
    return {"address": address, "name": name, "host": socket.gethostname(), "pid": os.getpid()}


def preflight(job: dict) -> dict:
    """Run on each worker before any case: can it load the scenario and the plugins, and on
    which device would it run? Raises what a bad job (``Job.to_json``) raises (the driver reports it)."""
    from attnbench.execute.cases import default_backends

    job = Job.from_json(job)
    runner = _runner(job)
    return {
        **worker_identity(),
        "device": runner.device_name,
        "device_id": runner.device_id,
        "attnbench": __version__,
        "available": [] if job.backends else default_backends(runner.device.type),  # what a run without -b takes, on the worker's device type
        "environment": runner.environment(),
    }


def _emitter(topic: str):
    from distributed import get_client

    client = get_client()

    def emit(event: dict) -> None:
        client.log_event(topic, event)  # returns once the scheduler has it

    return emit


def run_case(job: dict) -> list[str]:
    """The task: run one case's backends (``job``: ``Job.to_json``); log each event; return the rows (JSON texts)."""
    job = Job.from_json(job)
    emit = _emitter(job.topic)
    emit(ev_.event(ev_.READY, **worker_identity()))
    # each backend's step (prepare, a timing round, finish, the input check) as it starts and ends
    runner = _runner(job, on_step=lambda row, ended: emit(ev_.step_event(row, ended)))
    emit(ev_.event(ev_.DEVICE, device=runner.device_name, device_id=runner.device_id))
    case = job.case(runner)
    emit(ev_.event(ev_.SETUP, backends=list(job.backends)))
    rows = []
    for row in runner.run_case(case, list(job.backends)):
        rows.append(json.dumps(row.to_json(), default=str))
        emit(ev_.row_event(row))
    if runner.device.type == "cuda" and any(json.loads(t)["status"] == "error" for t in rows) and not _device_works(runner.device):
        emit(ev_.event(ev_.RESTART))
        os._exit(70)  # every row is logged; the nanny starts a fresh worker with a clean context
    return rows


def _device_works(device) -> bool:
    import torch

    try:
        x = torch.ones(8, device=device)
        return float((x + x).sum().item()) == 16.0
    except Exception:  # noqa: BLE001 - any failure means the context is unusable
        return False
