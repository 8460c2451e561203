"""Host timing (plan, convert) warms up before it measures (issue 24 item 3): the first calls
of host work in a process run slower, and timing them inflated the first case's convert
(2.8-9.7 ms against 1.0-1.3 ms later). A scripted clock stands in for the wall clock."""
from __future__ import annotations

import torch

from attnbench.measure import timing


class _Clock:
    """Each call of ``fn`` advances the clock: 100 ms for the first ``slow`` calls, then 1 ms."""

    def __init__(self, slow: int):
        self.now, self.calls, self.slow = 0.0, 0, slow

    def perf_counter(self) -> float:
        return self.now

    def fn(self) -> None:
        self.calls += 1
        self.now += 0.1 if self.calls <= self.slow else 0.001


def test_the_first_calls_are_not_timed(monkeypatch):
    clock = _Clock(slow=2)
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    samples = timing.time_host(clock.fn, torch.device("cpu"))
    assert samples and max(samples) < 2.0  # ms: the two slow first calls (100 ms) were warm-up
    assert clock.calls == len(samples) + 2


def test_warm_up_goes_on_for_its_budget(monkeypatch):
    clock = _Clock(slow=0)
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    samples = timing.time_host(clock.fn, torch.device("cpu"), warmup_ms=10.0, min_warmup=2)
    assert clock.calls - len(samples) == 10  # 10 calls of 1 ms fill the 10 ms warm-up budget
