"""The driver's book of a distributed run: which rows are recorded, what each submitted case
is doing, and what becomes of a case whose worker died. No Dask in here: the driver feeds it
the events that workers log (``execute.events``: ``ready``, ``device``, ``setup``, ``start``,
``end``, ``row``, ``restart``) and the
end of each task, and it answers with rows to record and backends to submit again.

A worker that dies while a case runs:
- before the task started (it was only queued there): the case is submitted again, as is;
- while it loaded the scenario and plugins, or built the batch and reference: every
  unfinished row of the case becomes an ``error`` row naming the worker and the stage;
- while a backend's step ran: that backend's row is an ``error`` naming the worker; the
  case's other unfinished backends go to a fresh task (in ``timing.rounds`` mode too);
- between two steps: no backend is blamed; the unfinished ones go to a fresh task.
A case is submitted at most ``MAX_ATTEMPTS`` times; then its unfinished rows are errors.
Rows arrive in any order and at most once each: a row already recorded is never replaced.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

from attnbench.execute import events as ev_
from attnbench.execute.cases import case_base_row
from attnbench.store.rows import Row, Status
from attnbench.workload.scenario import Case

MAX_ATTEMPTS = 3


@dataclass
class Attempt:
    """One submitted task: a case and the backends asked of it."""

    case: Case
    backends: list[str]
    number: int  # 1 for the first submission of the case
    topic: str
    worker: dict = field(default_factory=dict)  # from the "ready" event: address, name, host, pid
    device: str = ""
    device_id: str = ""
    stage: str = "queued"  # queued | loading | setup | running | poisoned
    running: list[str] = field(default_factory=list)


def describe_worker(worker: dict, device: str = "", fallback: str = "") -> str:
    """``worker 'gpu1' (tcp://10.0.0.5:4711, pid 812 on node7, NVIDIA H200)``."""
    if not worker:
        return f"worker {fallback}" if fallback else "a worker"
    bits = [b for b in (worker.get("address"), f"pid {worker.get('pid')} on {worker.get('host')}", device) if b]
    name = f"worker {worker['name']!r}" if worker.get("name") else "worker"
    return f"{name} ({', '.join(bits)})"


class CaseBook:
    def __init__(self, scenario: str, done: frozenset = frozenset()):
        self.scenario = scenario
        self.recorded: set[tuple[str, str]] = set(done)

    def todo(self, case: Case, names: list[str]) -> list[str]:
        return [b for b in names if (case.case_id, b) not in self.recorded]

    def accept(self, row: Row) -> Optional[Row]:
        """The row if it is new (to be recorded), None if that (case, backend) already is."""
        key = (row.id.case_id, row.id.backend)
        if key in self.recorded:
            return None
        self.recorded.add(key)
        return row

    def on_event(self, attempt: Attempt, msg: dict) -> Optional[Row]:
        """Apply one logged event; a finished row comes back when it is new."""
        kind = msg.get("event")
        if kind == ev_.READY:
            attempt.worker = {k: msg.get(k) for k in ("address", "name", "host", "pid")}
            attempt.stage, attempt.running = "loading", []
        elif kind == ev_.DEVICE:
            attempt.device, attempt.device_id = msg.get("device", ""), msg.get("device_id", "")
        elif kind == ev_.SETUP:
            attempt.stage, attempt.running = "setup", []
        elif kind == ev_.START:
            attempt.stage, attempt.running = "running", [msg["backend"]]
        elif kind == ev_.END:
            attempt.stage, attempt.running = "running", []  # between steps: nothing to blame
        elif kind == ev_.RESTART:
            attempt.stage = "poisoned"
        elif kind == ev_.ROW:
            row = ev_.row_of(msg)
            attempt.running = [b for b in attempt.running if b != row.id.backend]
            return self.accept(row)
        return None

    def unfinished(self, attempt: Attempt) -> list[str]:
        return [b for b in attempt.backends if (attempt.case.case_id, b) not in self.recorded]

    def error_row(self, attempt: Attempt, backend: str, reason: str) -> Optional[Row]:
        row = case_base_row(self.scenario, attempt.case, backend, attempt.device, attempt.device_id)
        row.status, row.reason = Status.ERROR, reason[:600]
        return self.accept(row)

    def fail(self, attempt: Attempt, reason: str) -> list[Row]:
        """The task ended with an exception (not a dead worker): its unfinished rows say why."""
        who = describe_worker(attempt.worker, attempt.device)
        rows = [self.error_row(attempt, b, f"on {who}: {reason}") for b in self.unfinished(attempt)]
        return [r for r in rows if r is not None]

    def finish(self, attempt: Attempt, row_texts: list[str]) -> list[Row]:
        """The task returned its rows: those not yet recorded, then errors for any it lacks."""
        out = []
        for text in row_texts:
            row = self.accept(Row.from_json(json.loads(text)))
            if row is not None:
                out.append(row)
        return out + self.fail(attempt, "the task ended without a row for this backend")

    def lost(self, attempt: Attempt, fallback_worker: str = "") -> tuple[list[Row], list[str]]:
        """The worker died under the task. -> (error rows, backends to submit again)."""
        left = self.unfinished(attempt)
        if not left:
            return [], []  # every row was logged first (e.g. a worker that exits on a broken CUDA context)
        if attempt.stage == "queued":
            if attempt.number < MAX_ATTEMPTS:
                return [], left
            reason = f"the case was submitted {attempt.number} times and its worker died each time before it started"
            return self._errors(attempt, left, reason, fallback_worker), []
        died = f"{describe_worker(attempt.worker, attempt.device, fallback_worker)} died"
        how = "(the process ended: a crash, os._exit, the OOM killer, or a lost connection)"
        if attempt.stage == "loading":
            return self._errors(attempt, left, f"{died} while loading the scenario and --backend-file plugins {how}"), []
        if attempt.stage == "setup":
            return self._errors(attempt, left, f"{died} while building the case's batch and reference {how}"), []
        culprits = [b for b in attempt.running if b in left]
        if len(culprits) > 1:
            reason = f"{died} while {', '.join(culprits)} took turns measuring (timing.rounds) {how}"
        else:
            reason = f"{died} while running this backend {how}"
        rows = self._errors(attempt, culprits, reason)
        rest = [b for b in left if b not in culprits]
        if rest and attempt.number >= MAX_ATTEMPTS:
            after = f"{died} during the case's attempt {attempt.number} of {MAX_ATTEMPTS}; this backend had not run {how}"
            return rows + self._errors(attempt, rest, after), []
        return rows, rest

    def _errors(self, attempt: Attempt, names: list[str], reason: str, fallback_worker: str = "") -> list[Row]:
        if fallback_worker and not attempt.worker:
            reason = f"worker {fallback_worker}: {reason}"
        rows = [self.error_row(attempt, b, reason) for b in names]
        return [r for r in rows if r is not None]
