"""The driver of ``--executor dask``: the cases of a scenario as Dask tasks, their rows back.

``DaskRunner`` stands where ``Runner`` stands for the command line (``backend_names``,
``device_name``, ``environment()``, ``todo(case, done)``, ``rows(done)``, ``close()``), but runs nothing itself:
it asks every worker first whether it can load the scenario and plugins and on which device
it runs (a worker that cannot is reported before any case is queued), then submits one task
per case (attnbench.execute.case_task.run_case) and yields each row as a worker logs it, in
whatever order they finish. The caller (the run folder) is the only writer. Ctrl-C cancels
what is queued; the rows yielded so far are the caller's. What a dead worker leaves behind is
decided by attnbench.execute.case_book.
"""
from __future__ import annotations

import copy
import dataclasses
import queue
import uuid
from typing import Iterator

from attnbench import __version__
from attnbench.execute import case_task
from attnbench.execute.case_book import Attempt, CaseBook
from attnbench.execute.cases import resolved_backends, with_specs
from attnbench.execute.job import Job
from attnbench.execute.dask_cluster import Cluster, ExecutorError, ExecutorLost
from attnbench.execute.error_text import error_text
from attnbench.store.rows import Row

PREFLIGHT_TIMEOUT_S = 600.0


def _drop_topics(dask_scheduler=None, topics=()):
    """(runs on the scheduler) forget the events of finished tasks: they hold whole rows."""
    broker = getattr(dask_scheduler, "_broker", None)
    for t in topics:
        getattr(broker, "_topics", {}).pop(t, None)


class DaskRunner:
    def __init__(self, sf, opts, job: Job, cluster: Cluster, resources: dict | None = None):
        self.sf, self.opts, self.job, self.cluster = sf, opts, job, cluster  # its specs: below, once resolved
        self.resources = dict(resources or {})
        self.run_id = uuid.uuid4().hex[:12]
        self.notes: list[str] = []
        self.submitted: list[tuple[str, list[str]]] = []  # (case_id, backends) per task, in order
        self.workers = self._preflight()
        available: list[str] = []
        for w in self.workers:
            available += [b for b in w["available"] if b not in available]
        specs = resolved_backends(sf, opts, available)
        self.opts = with_specs(opts, specs)  # what the manifest records and every worker makes its backends from
        self.backend_names = list(specs)
        devices = list(dict.fromkeys(w["device"] for w in self.workers))
        self.device_name = " + ".join(devices)
        if len(devices) > 1:
            self.notes.append(f"the workers run on different devices ({', '.join(devices)}): each case runs on one "
                              "of them; compare backends within a case, and runs only against runs of the same devices")
        old = sorted({w["attnbench"] for w in self.workers if w["attnbench"] != __version__})
        if old:
            self.notes.append(f"workers run attnbench {', '.join(old)}, this driver {__version__}")

    # -- what the command line asks of a runner ----------------------------------------------
    @property
    def client(self):
        return self.cluster.client

    def backend_versions(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for w in self.workers:
            for k, v in (w["environment"].get("backends") or {}).items():
                out.setdefault(k, v)
        return {n: out.get(n, "") for n in self.backend_names}

    def environment(self) -> dict:
        env = dict(self.workers[0]["environment"])
        env.update(device=self.device_name, backends=self.backend_versions(), executor="dask")
        hosts = [w["environment"].get("host") or {} for w in self.workers]
        # the host fields every worker agrees on (a check compares only those)
        env["host"] = {k: v for k, v in hosts[0].items() if all(h.get(k) == v for h in hosts[1:])}
        env["workers"] = [
            {k: w.get(k) for k in ("name", "address", "host", "pid", "device", "device_id", "attnbench")}
            for w in self.workers
        ]
        return env

    def todo(self, case, done: frozenset = frozenset()) -> list[str]:
        """The backends of ``case`` still to run (no -k here: a worker runs every backend of its case)."""
        return [b for b in self.backend_names if (case.case_id, b) not in done]

    def writing_to(self, run: str, profile_dir=None) -> "DaskRunner":
        """See ``Runner.writing_to``: every worker's job carries those options (one cluster for both)."""
        new = copy.copy(self)
        new.opts = dataclasses.replace(self.opts, run=run, profile_dir=profile_dir)
        new.job = dataclasses.replace(self.job, options=new.opts)
        return new

    def close(self) -> None:
        self.cluster.close()

    # -- the preflight ---------------------------------------------------------------------
    def _eligible_workers(self) -> dict[str, dict]:
        info = self.client.scheduler_info()["workers"]
        return {a: w for a, w in info.items()
                if all((w.get("resources") or {}).get(r, 0) >= q for r, q in self.resources.items())}

    def _preflight(self) -> list[dict]:
        from distributed import wait

        workers = self._eligible_workers()
        if not workers:
            want = ", ".join(f"{k}={v:g}" for k, v in self.resources.items())
            raise ExecutorError(f"no worker of the cluster has the resources {want} (--resource)")
        backends = self.opts.backends or self.sf.scenario.backends or None
        job = dataclasses.replace(self.job, backends=list(backends or [])).to_json()
        futs = {a: self.client.submit(case_task.preflight, job, workers=[a], allow_other_workers=False,
                                      resources=self.resources or None, pure=False,
                                      key=f"attnbench-preflight-{self.run_id}-{i}")
                for i, a in enumerate(workers)}
        wait(list(futs.values()), timeout=PREFLIGHT_TIMEOUT_S)
        out = []
        for a, f in futs.items():
            name = workers[a].get("name", a)
            exc = f.exception()
            if exc is not None:
                raise ExecutorError(f"worker {name!r} ({a}) cannot run this scenario: {_exc_text(exc)}"
                                    f"{_install_hint(exc)}")
            out.append(f.result())
        return out

    # -- the run ---------------------------------------------------------------------------
    def rows(self, done: frozenset = frozenset()) -> Iterator[Row]:
        book = CaseBook(self.sf.name, done)
        inbox: queue.Queue = queue.Queue()
        live: dict[str, tuple[Attempt, object]] = {}
        for case in self.sf.cases:
            todo = book.todo(case, self.backend_names)
            if todo:
                self._submit(Attempt(case, todo, 1, self._topic()), live, inbox)
        try:
            while live:
                try:
                    kind, topic, payload = inbox.get(timeout=0.5)
                except queue.Empty:
                    continue
                if topic not in live:
                    continue  # an event that came after its task ended: already accounted for
                attempt, fut = live[topic]
                if kind == "event":
                    row = book.on_event(attempt, payload)
                    if row is not None:
                        yield row
                    continue
                del live[topic]
                yield from self._ended(book, attempt, fut, live, inbox)
        finally:
            self._abandon(live)

    def _topic(self) -> str:
        return f"attnbench-{self.run_id}-{uuid.uuid4().hex[:8]}"

    def _submit(self, attempt: Attempt, live: dict, inbox: queue.Queue) -> None:
        # the runner's options: the backend specs it resolved, the run folder it writes
        job = self.job.for_case(attempt.case.case_id, attempt.backends, options=self.opts, topic=attempt.topic).to_json()
        self.client.subscribe_topic(attempt.topic, lambda ev, t=attempt.topic: inbox.put(("event", t, ev[1])))
        fut = self.client.submit(case_task.run_case, job, key=attempt.topic, pure=False, retries=0,
                                 resources=self.resources or None)
        live[attempt.topic] = (attempt, fut)
        self.submitted.append((attempt.case.case_id, list(attempt.backends)))
        fut.add_done_callback(lambda f, t=attempt.topic: inbox.put(("done", t, f)))

    def _ended(self, book: CaseBook, attempt: Attempt, fut, live: dict, inbox) -> Iterator[Row]:
        from distributed import KilledWorker

        self.client.unsubscribe_topic(attempt.topic)
        if fut.status == "finished":
            yield from book.finish(attempt, fut.result())
        elif fut.status == "error":
            for _, msg in self.client.get_events(attempt.topic):  # what the scheduler got, in order
                row = book.on_event(attempt, msg)
                if row is not None:
                    yield row
            exc = fut.exception()
            if isinstance(exc, KilledWorker):
                rows, again = book.lost(attempt, str(getattr(exc, "last_worker", "") or ""))
                yield from rows
                if again:
                    self._submit(Attempt(attempt.case, again, attempt.number + 1, self._topic()), live, inbox)
            else:
                yield from book.fail(attempt, _exc_text(exc))
        else:
            raise ExecutorLost(f"the Dask task of case {attempt.case.case_id} was {fut.status} "
                               "(the scheduler went away, or the cluster was shut down)")
        self._forget([attempt.topic])

    def _forget(self, topics: list[str]) -> None:
        try:
            self.client.run_on_scheduler(_drop_topics, topics=topics)
        except Exception:  # noqa: BLE001 - a scheduler that refuses leaves the events; harmless
            pass

    def _abandon(self, live: dict) -> None:
        """Ctrl-C or an error: cancel what is queued or running; forget its events."""
        if not live:
            return
        try:
            self.client.cancel([f for _, f in live.values()], force=True)
            for topic in live:
                self.client.unsubscribe_topic(topic)
            self._forget(list(live))
        except Exception:  # noqa: BLE001 - the cluster may be gone already
            pass
        live.clear()


def _exc_text(exc: BaseException) -> str:
    return error_text(exc, 400)


def _install_hint(exc: BaseException) -> str:
    if isinstance(exc, ModuleNotFoundError) and "attnbench" in str(exc) or "No module named 'attnbench" in str(exc):
        return " (every worker needs attnbench installed: pip install attnbench, with the backends' packages)"
    return ""
