"""CPU rows are timed with one intra-op thread unless --threads says otherwise; the count is
recorded in every row and in the manifest, and the process's setting is restored."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from attnbench.backends.sdpa import SdpaBackend
from attnbench.cli import app

from .test_cli import TINY

runner = CliRunner()


@pytest.mark.slow
def test_threads_default_one_and_flag(tmp_path):
    (tmp_path / "t.yaml").write_text(TINY)
    before = torch.get_num_threads()
    for flag, want in (([], 1), (["--threads", "2"], 2)):
        out = tmp_path / f"run{want}"
        r = runner.invoke(app, ["run", str(tmp_path / "t.yaml"), "--out", str(out), "-q", "-b", "sdpa", *flag])
        assert r.exit_code == 0, r.output
        df = pd.read_csv(out / "results.csv")
        assert set(df.threads) == {want}
        assert json.loads((out / "manifest.json").read_text())["options"]["threads"] == (None if not flag else 2)
        assert torch.get_num_threads() == before


def test_threads_must_be_positive(tmp_path):
    (tmp_path / "t.yaml").write_text(TINY)
    r = runner.invoke(app, ["run", str(tmp_path / "t.yaml"), "--threads", "0", "-q"])
    assert r.exit_code == 2 and "--threads 0" in r.output


def test_thread_clock_is_used_with_one_thread(tmp_path):
    """With one intra-op thread, CPU rows are timed by the thread's CPU clock (a busy machine's
    time slices do not count); with several, by the wall clock."""
    (tmp_path / "t.yaml").write_text(TINY)
    for flag, method in (([], "cpu-thread"), (["--threads", "2"], "cpu")):
        out = tmp_path / f"run{method}"
        r = runner.invoke(app, ["run", str(tmp_path / "t.yaml"), "--out", str(out), "-q", "-b", "sdpa", *flag])
        assert r.exit_code == 0, r.output
        assert set(pd.read_csv(out / "results.csv").timing_method) == {method}


def test_thread_clock_does_not_count_sleep():
    """The thread clock counts this thread's CPU work only: a call that sleeps 20 ms measures
    far less than 20 ms on it and at least 20 ms on the wall clock."""
    import time

    from attnbench.measure.timing import TimingConfig, time_run

    def sleepy():
        time.sleep(0.02)
        return torch.ones(2)

    cfg = dict(warmup_ms=0, measure_ms=1, min_runs=3, max_runs=3)
    thread = time_run(sleepy, torch.device("cpu"), TimingConfig(cpu_clock="thread", **cfg))
    wall = time_run(sleepy, torch.device("cpu"), TimingConfig(cpu_clock="wall", **cfg))
    assert thread.method == "cpu-thread" and wall.method == "cpu"
    assert max(thread.samples_ms) < 10 and min(wall.samples_ms) >= 20


def test_batch_and_reference_use_the_rows_thread_count(monkeypatch):
    """The case's batch and its float64 reference are built under the rows' thread count (on
    torch's default threads the reference spin-waited on a shared core: 2x the sweep's CPU)."""
    from attnbench.execute import runner as rn
    from attnbench.execute.options import RunOptions
    from attnbench.workload.scenario import load_text

    seen = []
    for fn in ("materialize", "reference_attention"):
        real = getattr(rn, fn)

        def spy(*a, _real=real, _fn=fn, **k):
            seen.append((_fn, torch.get_num_threads()))
            return _real(*a, **k)

        monkeypatch.setattr(rn, fn, spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        sf = load_text(TINY, "tiny.yaml", ["sweep={}"])
        for threads in (None, 2):
            seen.clear()
            rows = list(rn.Runner(sf, RunOptions(backends=["sdpa"], threads=threads)).rows())
            assert [r.status for r in rows] == ["ok"]
            assert seen == [("materialize", threads or 1), ("reference_attention", threads or 1)]
    finally:
        torch.set_num_threads(before)


def _matmul():
    a = torch.full((192, 192), 0.5)
    return lambda: a @ a


def test_work_in_other_threads_is_timed_by_the_process_clock_and_said():
    """Issue 37 item 11: the thread's CPU clock does not see work a backend hands to threads of its
    own (a pool, an OpenMP library outside torch): 0.18 ms read for 0.58 ms of work. Where other
    threads worked, the samples are the process's CPU time (all threads' work; still blind to
    other processes) and the note says so; work done inline stays on the thread clock."""
    from concurrent.futures import ThreadPoolExecutor

    from attnbench.measure.timing import TimingConfig, cpu_threads, time_run

    work = _matmul()
    cfg = dict(warmup_ms=0, measure_ms=1, min_runs=20, max_runs=20, cpu_clock="thread")
    with ThreadPoolExecutor(1) as pool:
        pooled = time_run(lambda: pool.submit(work).result(), torch.device("cpu"), TimingConfig(**cfg))
    assert pooled.method == "cpu-process", pooled
    assert "other threads of the process worked during the calls" in pooled.note
    with cpu_threads(torch.device("cpu"), 1):  # as rows run: one intra-op thread (with 2, torch's own
        inline = time_run(work, torch.device("cpu"), TimingConfig(**cfg))  # second thread counts as other work)
    assert inline.method == "cpu-thread" and inline.note == "", inline.note
    forced = time_run(work, torch.device("cpu"), TimingConfig(**{**cfg, "cpu_clock": "process"}))
    assert forced.method == "cpu-process"


@pytest.mark.slow
def test_a_backend_with_its_own_pool_gets_process_clock_rows_in_every_round(tmp_path):
    """The run's rows: the pooled backend is cpu-process with the note in every round (the first
    round that sees other threads decides for the rest), sdpa inline stays cpu-thread."""
    from pathlib import Path

    from attnbench.backend import registry

    (tmp_path / "t.yaml").write_text(TINY)
    out = tmp_path / "run"
    try:
        r = runner.invoke(app, ["run", str(tmp_path / "t.yaml"), "--out", str(out), "-q", "-b", "sdpa", "-b", "sdpa-pooled",
                                "--backend-file", str(Path(__file__).with_name("pooled_backends.py")),
                                "--set", "timing.rounds=3"])
    finally:
        registry._EXTRA.pop("sdpa-pooled", None)  # a later command in this process would take it by default
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "results.csv")
    assert set(df[df.backend == "sdpa"].timing_method) == {"cpu-thread"}
    pooled = df[df.backend == "sdpa-pooled"]
    assert set(pooled.timing_method) == {"cpu-process"} and pooled.timing_note.str.contains("other threads").all()


def test_a_call_the_thread_clock_did_not_advance_over_is_left_out_and_said(monkeypatch):
    """A call of real work once read 0.0 ms on the thread clock (a CI run of the gate, twelfth session), and the
    run folder it wrote was then refused as damaged. Such a call is no sample: left out, the row's note says how
    many; a clock that never moves leaves the wall clock's samples."""
    import time

    from attnbench.measure import timing
    from attnbench.measure.timing import TimingConfig, cpu_threads, time_run

    state = {"calls": 0, "frozen": False, "stuck": {5}}

    def stuck(real):
        last = [0]

        def clock():
            if not state["frozen"]:
                last[0] = real()
            return last[0]
        return clock

    def work():
        state["calls"] += 1
        state["frozen"] = state["calls"] in state["stuck"]  # this call's end reads its start
        x = torch.randn(64, 64)
        return x @ x

    monkeypatch.setattr(timing.time, "thread_time_ns", stuck(time.thread_time_ns))
    cfg = TimingConfig(cpu_clock="thread", warmup_ms=0, measure_ms=1, min_runs=8, max_runs=8)
    with cpu_threads(torch.device("cpu"), 1):  # as rows run: torch's second thread would be other threads' work
        res = time_run(work, torch.device("cpu"), cfg)
    assert res.method == "cpu-thread" and len(res.samples_ms) == 7 and min(res.samples_ms) > 0
    assert "1 of 8 calls read 0 ms on the thread CPU clock" in res.note
    state.update(calls=0, stuck=set(range(1, 100)))  # neither CPU clock moves (the thread's alone: the process's)
    monkeypatch.setattr(timing.time, "process_time_ns", stuck(time.process_time_ns))
    res = time_run(work, torch.device("cpu"), cfg)
    assert res.method == "cpu" and len(res.samples_ms) == 8 and min(res.samples_ms) > 0
    assert "8 of 8 calls read 0 ms" in res.note and "wall clock" in res.note


class _StuckSdpa(SdpaBackend):
    """sdpa whose calls the test's stuck thread clock does not advance over, in the rounds it names."""

    name = "sdpa-stuck"
    stuck: dict = {}  # round (1-based) -> its kernel calls (1-based) that read 0 ms
    state = {"step": 0, "calls": 0, "frozen": False}

    def run(self, p):
        s = type(self).state
        s["calls"] += 1
        s["frozen"] = s["calls"] in type(self).stuck.get(s["step"] - 1, ())  # step 1 is the prepare
        return super().run(p)


@pytest.mark.parametrize("stuck,said", [
    ({1: {5}}, "1 of 24 calls"),  # an early round's drop: the last round's note alone named nothing
    ({1: {5}, 3: {4, 6}}, "3 of 24 calls"),  # summed, said once
])
def test_calls_the_thread_clock_did_not_advance_over_are_said_over_every_round(monkeypatch, stuck, said):
    """A row timed in 3 rounds of 8 calls (one untimed estimate first): calls of its first round (and its last)
    read 0 ms on the thread clock; the row leaves them out of its samples and its note counts them all."""
    from attnbench.backend import registry
    from attnbench.execute.options import RunOptions
    from attnbench.execute.runner import Runner
    from attnbench.measure import timing
    from attnbench.workload.scenario import load_text

    real = timing.time.thread_time_ns
    last = [0]

    def clock():
        if not _StuckSdpa.state["frozen"]:
            last[0] = real()
        return last[0]

    def on_step(row, ended):
        if not ended:
            _StuckSdpa.state.update(step=_StuckSdpa.state["step"] + 1, calls=0, frozen=False)

    monkeypatch.setattr(timing.time, "thread_time_ns", clock)
    _StuckSdpa.stuck, _StuckSdpa.state = stuck, {"step": 0, "calls": 0, "frozen": False}
    registry.register(_StuckSdpa)
    sets = ["sweep={}", "timing.rounds=3", "timing.warmup_ms=0", "timing.min_runs=24", "timing.max_runs=24"]
    try:
        (row,) = Runner(load_text(TINY, "tiny.yaml", sets), RunOptions(backends=[_StuckSdpa.name]), on_step).rows()
    finally:
        registry._EXTRA.pop(_StuckSdpa.name, None)
    dropped = int(said.split()[0])
    assert row.status == "ok" and row.timing.timing_method == "cpu-thread", (row.status, row.reason)
    assert row.timing.n == 24 - dropped and min(row.timing.samples_ms) > 0
    assert f"{said} read 0 ms on the thread CPU clock" in row.timing.timing_note, row.timing.timing_note
    assert row.timing.timing_note.count("read 0 ms") == 1


def test_a_rows_note_sums_what_its_rounds_left_out_per_clock():
    """The wording over rounds: counts summed per clock, a round timed by the wall clock named, the last
    round's own note kept (or, where it said nothing, the latest earlier one)."""
    from attnbench.measure.left_out import LeftOut, left_out_note, row_note

    moved = "other threads of the process worked during the calls"
    one = "1 of 8 calls read 0 ms on the thread CPU clock (it did not advance over the call): left out"
    passes = [(one, LeftOut("thread", 8, 1)), (moved, LeftOut("process", 8, 0)), ("", LeftOut("process", 8, 2))]
    assert left_out_note([LeftOut("thread", 8, 1)]) == one
    assert row_note(passes) == f"{moved}; {one}; 2 of 16 calls read 0 ms on the process CPU clock (it did not " \
                               "advance over the call): left out"
    walled = left_out_note([LeftOut("thread", 8, 8), LeftOut("thread", 8, 1), None])
    assert walled.startswith("9 of 16 calls read 0 ms") and "the 1 of its 2 rounds where it never advanced" in walled
    assert left_out_note([LeftOut("thread", 8, 8)]).endswith("left out; timed by the wall clock")
    assert row_note([("graph capture failed", None)]) == "graph capture failed" and row_note([]) == ""
