"""One executor protocol (local, isolated, Dask), chosen in one place; one Job and one event
vocabulary for the isolated child and the Dask worker; the step observer passed in."""
from __future__ import annotations

import json

import pytest

from attnbench.execute import events
from attnbench.execute.dask_driver import DaskRunner
from attnbench.execute.executors import ExecutorSpec, open_runner
from attnbench.execute.isolate import IsolatedRunner
from attnbench.execute.job import Job
from attnbench.execute.runner import Runner
from attnbench.store.options import RunOptions
from attnbench.workload.scenario import load_text

from .test_cli import TINY

PROTOCOL = ("sf", "opts", "backend_names", "device_name", "environment", "todo", "rows", "notes", "close")


def _open(isolate: bool):
    sf = load_text(TINY, "tiny.yaml", ["sweep={}"])
    opts = RunOptions(backends=["sdpa", "reference"], measure_ceilings=False, timing_overrides={"measure_ms": 1})
    return sf, open_runner(sf, opts, ExecutorSpec("local", isolate=isolate, timeout=60), scenario_path="tiny.yaml",
                           overrides=["sweep={}"], backend_files=[])


def test_open_runner_picks_the_executor_and_each_answers_the_protocol():
    _, local = _open(False)
    _, isolated = _open(True)
    assert type(local) is Runner and type(isolated) is IsolatedRunner
    for ex in (local, isolated):
        missing = [a for a in PROTOCOL if not hasattr(ex, a)]
        assert not missing, (type(ex).__name__, missing)
    assert [a for a in ("todo", "rows", "close", "environment") if not callable(getattr(DaskRunner, a, None))] == []
    assert isolated.backend_names == ["sdpa", "reference"] and isolated.job.scenario_text == TINY


@pytest.mark.slow
def test_the_isolated_executor_gives_the_local_rows():
    _, isolated = _open(True)
    rows = list(isolated.rows())
    assert sorted((r.id.backend, r.status.value) for r in rows) == [("reference", "ok"), ("sdpa", "ok")]
    assert all(r.id.device for r in rows)


def test_job_round_trips_and_narrows_to_a_case_with_a_copy_of_the_options():
    opts = RunOptions(backends=["sdpa"], timing_overrides={"flush": "write"})
    job = Job("name: t", "t.yaml", ["a=1"], opts, backend_files=["/x.py"])
    case = job.for_case("c1", ["sdpa", "flex"], topic="t1")
    opts.timing_overrides["flush"] = "read"  # later changes of the run's options do not reach a sent job
    back = Job.from_json(json.loads(json.dumps(case.to_json())))
    assert back == case and back.case_id == "c1" and back.backends == ["sdpa", "flex"] and back.topic == "t1"
    assert back.options.timing_overrides == {"flush": "write"} and job.case_id is None


def test_the_step_observer_is_passed_in_and_reports_the_event_vocabulary():
    sf = load_text(TINY, "tiny.yaml", ["sweep={}", "timing.rounds=2"])
    seen = []
    runner = Runner(sf, RunOptions(backends=["sdpa", "reference"], measure_ceilings=False,
                                   timing_overrides={"measure_ms": 1}),
                    on_step=lambda row, ended: seen.append(events.step_event(row, ended)))
    rows = list(runner.rows())
    assert len(rows) == 2 and seen and {e["event"] for e in seen} == {events.START, events.END}
    # rounds: the backends take turns, every START closed by its END before the next step
    assert [e["backend"] for e in seen[::2]] == [e["backend"] for e in seen[1::2]]
    assert [e["event"] for e in seen[::2]] == [events.START] * (len(seen) // 2)
    turns = [e["backend"] for e in seen[::2]]
    assert turns.count("sdpa") >= 3 and any(a != b for a, b in zip(turns, turns[1:]))
    row = events.row_of(events.row_event(rows[0]))
    assert row.to_json() == json.loads(json.dumps(rows[0].to_json(), default=str))
