"""With ``host_samples.SPREAD_ROUNDS`` a row's plan calls are timed in part when it is planned and in part after
each timing round's kernel pass (execute/host_samples.py: one 2-4 ms window read up to ~2x the plan table's median
on the GPU host, issue 33, twelfth session); plan_ms is the median of all of them, within the budget one window
had. Off by default (the GPU host read the spread higher and no steadier, thirteenth session): one window, the
rounds plan nothing.

Through the Runner with sdpa on the CPU: a subclass counts its plan calls, and a scripted clock stands in for
the host timer's wall clock (each plan call advances it by ``PlanCounted.ms``), so that the counts do not
depend on how busy the machine is. The runner's step observer tells the rounds apart."""
from __future__ import annotations

import statistics
import time

import pytest
import torch

from attnbench.backend import registry
from attnbench.backends.sdpa import SdpaBackend
from attnbench.execute import host_samples
from attnbench.execute.runner import RunOptions, Runner
from attnbench.measure import timing
from attnbench.workload.scenario import load_text

from .test_cli import TINY


class _Clock:
    """The host timer's ``time`` module: a scripted ``perf_counter``, every other clock the real one."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


CLOCK = _Clock()


class PlanCounted(SdpaBackend):
    name = "sdpa-plan-counted"
    plans = convert_calls = 0
    ms = 0.1  # what each plan call reads on the scripted clock
    failing = False  # its kernel raises (a row that ends in its first round)

    def plan(self, dense):
        type(self).plans += 1
        CLOCK.now += type(self).ms / 1e3
        return super().plan(dense)

    def convert(self, batch):
        type(self).convert_calls += 1
        return super().convert(batch)

    def run(self, p):
        if type(self).failing:
            raise RuntimeError("the kernel failed")
        return super().run(p)


def _steps(monkeypatch, rounds: int, measure_ms: float, prepared=lambda: None, ms: float = 0.1):
    """The counted row, and per step of it (prepare, each round, finish, input check) the plan calls made in
    it and its plan samples when it ended. ``prepared`` runs when the row's prepare step ends."""
    monkeypatch.setattr(timing, "time", CLOCK)
    monkeypatch.setattr(host_samples, "time", CLOCK)
    registry.register(PlanCounted)
    PlanCounted.plans, PlanCounted.convert_calls, PlanCounted.ms, PlanCounted.failing = 0, 0, ms, False
    steps = []

    def on_step(row, ended):
        if row.id.backend != PlanCounted.name:
            return
        if not ended:
            steps.append({"start": PlanCounted.plans, "converts_start": PlanCounted.convert_calls})
            return
        steps[-1].update(calls=PlanCounted.plans - steps[-1]["start"], samples=list(row.timing.plan_samples_ms),
                         converts=PlanCounted.convert_calls - steps[-1]["converts_start"],
                         convert_samples=list(row.timing.convert_samples_ms))
        if len(steps) == 1:
            prepared()

    sets = ["sweep={}", f"timing.rounds={rounds}", f"timing.measure_ms={measure_ms}", "timing.warmup_ms=0"]
    try:
        rows = list(Runner(load_text(TINY, "tiny.yaml", sets),
                           RunOptions(backends=[PlanCounted.name, "sdpa"], measure_ceilings=False), on_step).rows())
    finally:
        registry._EXTRA.pop(PlanCounted.name, None)
    return next(r for r in rows if r.id.backend == PlanCounted.name), steps


@pytest.fixture
def spread(monkeypatch):
    monkeypatch.setattr(host_samples, "SPREAD_ROUNDS", True)


def test_by_default_the_plan_is_timed_in_one_window_when_the_row_is_planned(monkeypatch):
    """The default: every plan sample (20: a cheap plan) in the prepare step, none in the rounds, plan_ms their
    median."""
    row, steps = _steps(monkeypatch, 4, measure_ms=20)
    assert row.status == "ok", row.reason
    first = steps[0]["samples"]
    assert len(first) == host_samples.HOST_MAX_RUNS and row.timing.plan_samples_ms == first
    assert all(r["calls"] == 0 and r["samples"] == first for r in steps[1:])
    assert row.timing.plan_ms == pytest.approx(statistics.median(first))


@pytest.mark.usefixtures("spread")
@pytest.mark.parametrize("rounds", [1, 4])
def test_plan_samples_are_taken_in_every_round_and_plan_ms_is_their_median(monkeypatch, rounds):
    def slower():  # the rounds' calls read 4x the first ones: a median of the first ones alone is off
        PlanCounted.ms = 0.4

    row, steps = _steps(monkeypatch, rounds, measure_ms=20, prepared=slower)
    assert row.status == "ok", row.reason
    assert len(steps) == rounds + 3  # prepare, the rounds, finish, the input check
    first = steps[0]["samples"]
    assert len(first) == host_samples.HOST_MAX_RUNS // 2  # a cheap plan: the first half's count, not its time
    for r in steps[1: rounds + 1]:
        new = len(r["samples"]) - len(first)
        assert new >= 1 and r["calls"] > new  # untimed calls, then its share of the samples
        assert r["samples"][: len(first)] == first  # added, in order
        first = r["samples"]
    samples = row.timing.plan_samples_ms
    assert samples == first and len(samples) == host_samples.HOST_MAX_RUNS  # the budget's count, all of it
    assert all(s == pytest.approx(0.1) for s in samples[:10]) and all(s == pytest.approx(0.4) for s in samples[10:])
    assert row.timing.plan_ms == pytest.approx(statistics.median(samples)) == pytest.approx(0.25)
    assert row.timing.step_ms == pytest.approx(row.timing.plan_ms + row.timing.median_ms)
    assert steps[-2]["calls"] == steps[-1]["calls"] == 0  # finish and the input check plan nothing


@pytest.mark.slow
@pytest.mark.usefixtures("spread")
@pytest.mark.parametrize("ms", [0.1, 3.0, 8.0, 40.0])
def test_the_plan_timing_stays_within_one_windows_budget(monkeypatch, ms):
    """Whatever a plan call costs, the calls timed after the warm-up (and the rounds' untimed ones) stay
    within the budget a single window had (min(50 ms, measure_ms)), one call over at most, and 20 calls."""
    row, steps = _steps(monkeypatch, rounds=4, measure_ms=100, ms=ms)
    assert row.status == "ok", row.reason
    n = len(row.timing.plan_samples_ms)
    assert 1 <= n <= host_samples.HOST_MAX_RUNS
    warm_up = steps[0]["calls"] - 1 - len(steps[0]["samples"])  # the first call is the row's checked plan
    assert warm_up >= 2
    after_warm_up = sum(s.get("calls", 0) for s in steps) - 1 - warm_up
    assert after_warm_up * ms <= min(host_samples.HOST_BUDGET_MS, 100) + ms
    sampled = sum(len(b["samples"]) > len(a["samples"]) for a, b in zip(steps[:4], steps[1:5]))  # rounds that did
    if ms < 1:
        assert sampled == 4  # a cheap plan: its share of the count in every round
    elif ms <= 3.0:
        assert sampled >= 2  # a 3 ms plan spends the budget's time before its count: in most rounds
    else:
        assert sampled <= 1  # a slow one (what one window had: 2-6 samples) is not made again past the budget


@pytest.mark.usefixtures("spread")
def test_a_row_that_fails_in_its_first_round_keeps_the_plan_samples_of_its_prepare(monkeypatch):
    def fail():
        PlanCounted.failing = True

    row, steps = _steps(monkeypatch, rounds=3, measure_ms=20, prepared=fail)
    assert row.status == "error" and "the kernel failed" in row.reason
    assert row.timing.plan_samples_ms == steps[0]["samples"] and row.timing.plan_samples_ms
    assert row.timing.plan_ms == pytest.approx(statistics.median(row.timing.plan_samples_ms))


@pytest.mark.usefixtures("spread")
def test_the_convert_is_spread_alike(monkeypatch):
    """sdpa converts (its K/V gather): its convert calls are timed in the rounds too (untimed ones, then
    samples), within the same count."""
    row, steps = _steps(monkeypatch, rounds=4, measure_ms=20)
    first = steps[0]["convert_samples"]
    assert 1 <= len(first) <= host_samples.HOST_MAX_RUNS // 2
    for r in steps[1:5]:
        new = len(r["convert_samples"]) - len(first)
        assert new >= 1 and r["converts"] > new and r["convert_samples"][: len(first)] == first
        first = r["convert_samples"]
    assert row.timing.convert_samples_ms == first and len(first) <= host_samples.HOST_MAX_RUNS


@pytest.mark.usefixtures("spread")
def test_more_rounds_than_calls_left_spread_them_evenly(monkeypatch):
    """20 rounds (the gate's) and 10 calls left after the first half: one every other round, through the last
    round, not all in the first ten."""
    monkeypatch.setattr(timing, "time", CLOCK)
    monkeypatch.setattr(host_samples, "time", CLOCK)

    def plan():
        CLOCK.now += 0.1e-3

    sampler = host_samples.HostSampler(plan, torch.device("cpu"), budget_ms=50.0, rounds=20)
    sampler.first()
    counts = []
    for _ in range(20):
        n = len(sampler.samples)
        sampler.round()
        counts.append(len(sampler.samples) - n)
    assert counts == [0, 1] * 10 and len(sampler.samples) == host_samples.HOST_MAX_RUNS
