"""One event vocabulary for the two places a case runs away from the process that records its
rows: an ``--isolate`` child (JSON lines on a pipe, ``execute.isolate``) and a Dask worker
(events logged through the scheduler, ``execute.case_task``). Each event is a JSON object
``{"event": KIND, ...}``; the recorder (``isolate``'s parent, ``case_book.CaseBook``) learns
from them which backend was running when the process died.
"""
from __future__ import annotations

import json

from attnbench.store.rows import Row

READY = "ready"  # the process has loaded the scenario and plugins (a worker adds who it is: name, address, host, pid)
DEVICE = "device"  # the device it runs on: device, device_id
SETUP = "setup"  # the case begins (its batch and reference are built): backends
START = "start"  # a backend's step starts (prepare, a timing round, finish, the input check): backend
END = "end"  # that step ended: backend
ROW = "row"  # a finished row: row (its JSON object)
FATAL = "fatal"  # the case could not be set up: reason
SAVE_FAILED = "save_failed"  # --save-tensors could not write: reason (the run stops)
RESTART = "restart"  # the process exits after an error on a GPU (its CUDA context may be broken); a fresh one goes on
DONE = "done"  # every backend asked of it has its row
KINDS = (READY, DEVICE, SETUP, START, END, ROW, FATAL, SAVE_FAILED, RESTART, DONE)


def event(kind: str, **fields) -> dict:
    if kind not in KINDS:
        raise ValueError(f"unknown event {kind!r}")
    return {"event": kind, **fields}


def step_event(row: Row, ended: bool) -> dict:
    """START or END of a step of ``row``'s backend (the runner's step observer reports these)."""
    return event(END if ended else START, backend=row.id.backend)


def row_event(row: Row) -> dict:
    return event(ROW, row=json.loads(json.dumps(row.to_json(), default=str)))  # plain JSON values only


def row_of(ev: dict) -> Row:
    """The row a ROW event carries."""
    return Row.from_json(ev["row"])
