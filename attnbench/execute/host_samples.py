"""A row's plan and convert, timed on the host: by default in one window when the row is planned (``rounds``
0: ``first`` takes every call), or with ``SPREAD_ROUNDS`` spread over the row's timing rounds.

On the GPU host the CPU's speed moves over milliseconds: a row's ~20 plan calls timed in one 2-4 ms window
read up to ~2x the plan table's median (docs/kernels.md, "The plan";
the probe ``host_timing_probe.py``, since removed). Spread, half of a row's calls are timed when it is planned (``first``,
after the warm-up: a first estimate, and all that a row ending before its rounds gets), the other half a
few after each round's kernel timing (``round``), spread evenly over the rounds; the row's plan_ms is the
median of all of them (``HostTimes.timed``, after every round). On that host the spread read higher and no
steadier (``SPREAD_ROUNDS``' comment), hence one window by default. The budget is what the single window had:
``budget_ms`` of timed calls and ``max_runs`` calls at most, after the same warm-up; a round's share of it
pays for its own untimed calls too (``ROUND_WARMUP_MS``), and a slow host call that would overrun what is
left is not made again. Each call is one engine step (``Batch.new_step`` first).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from attnbench.execute.row_build import host_timed
from attnbench.measure.timing import time_host
from attnbench.store.row_parts import RowTiming

HOST_BUDGET_MS = 50.0  # a row's timed host calls of one kind at most (less where its measure budget is)
HOST_MAX_RUNS = 20
# Untimed calls before a round's samples (at least one, 20 at most): after other work the plan's first
# calls run slower again. Triton's tree-costs plans (~75 us a call) on the 2-core CPU host this was written
# on, 3 ms of matmuls before each round, 12 cases x 4: the rounds' samples read 1.59x the one window's
# median (per row, the median ratio) after one untimed call, 1.22x after 0.5 ms of them, 1.08x after 1 ms,
# 1.06x after 2 ms. The GPU host's may differ: host_timing_probe.py --round-warmup-ms measures it there.
ROUND_WARMUP_MS = 1.0
# Whether the runner spreads the calls over the rounds (``rounds`` 0: one window after the warm-up, as before).
# Off: on the GPU host (H200 machine, thirteenth session, host_timing_probe.py on tree-costs, 12 cases x 4) the
# spread read higher and no steadier than the one window: median 157-170 us against 134-142, rows above 200 us
# 12-17 of 48 against 8-10, a case's max / median row 1.33-1.37 against 1.39-1.51.
SPREAD_ROUNDS = False


@dataclass
class HostSampler:
    """One host call's (a plan's, a convert's) samples over a row's life."""

    fn: Callable[[], object]
    device: torch.device
    budget_ms: float
    rounds: int  # the row's timing rounds (``round`` is called once after each)
    max_runs: int = HOST_MAX_RUNS
    round_warmup_ms: float = ROUND_WARMUP_MS
    samples: list = field(default_factory=list)  # ms, in the order they were taken
    spent_ms: float = 0.0  # of the budget
    rounds_seen: int = 0

    @property
    def later(self) -> int:
        """The calls left to the rounds (none without rounds: every call in ``first``'s window)."""
        return self.max_runs - self.max_runs // 2 if self.rounds > 0 else 0

    def first(self) -> None:
        """The warm-up (as long as a single window's was) and the first half of the calls and budget (all of
        them without rounds)."""
        share = 0.5 if self.later else 1.0
        got = time_host(self.fn, self.device, self.budget_ms * share, max_runs=self.max_runs - self.later,
                        max_warmup=self.max_runs)
        self.samples += got
        self.spent_ms += sum(got)

    def quota(self, i: int) -> int:
        """Calls of round ``i`` (0-based): ``later`` spread evenly, one every other round where fewer than rounds."""
        if i >= self.rounds:
            return 0
        return (i + 1) * self.later // self.rounds - i * self.later // self.rounds

    def round(self) -> None:
        """This round's share: its quota of calls within the budget left over the rounds that sample."""
        i, self.rounds_seen = self.rounds_seen, self.rounds_seen + 1
        n, est = self.quota(i), statistics.median(self.samples)
        left = self.budget_ms - self.spent_ms
        warm_ms = max(est, min(self.round_warmup_ms, HOST_MAX_RUNS * est))  # what its untimed calls cost
        if n < 1 or left < warm_ms + est:  # they and one sample must fit in what is left
            return
        sampling_left = min(self.rounds - i, self.later - i * self.later // self.rounds)
        t0 = time.perf_counter()
        self.samples += time_host(self.fn, self.device, left / sampling_left - warm_ms, max_runs=n,
                                  warmup_ms=self.round_warmup_ms, min_warmup=1, max_warmup=HOST_MAX_RUNS)
        self.spent_ms += (time.perf_counter() - t0) * 1e3


class HostTimes:
    """A row's plan (and convert, for a backend that converts) samplers; ``converted`` is what the row's
    plan was made from, kept for the plans of the rounds."""

    def __init__(self, be, batch, converted, budget_ms: float, rounds: int):
        def plan():
            batch.new_step()
            return be.plan(converted)

        def convert():
            batch.new_step()
            return be.convert(batch)

        self.plan = HostSampler(plan, batch.device, budget_ms, rounds)
        self.convert: Optional[HostSampler] = (HostSampler(convert, batch.device, budget_ms, rounds)
                                               if be.converts() else None)

    def _each(self) -> list[HostSampler]:
        return [s for s in (self.convert, self.plan) if s is not None]  # convert first, as the engine's step

    def first(self) -> None:
        for s in self._each():
            s.first()

    def round(self) -> None:
        for s in self._each():
            s.round()

    def timed(self, timing: RowTiming) -> RowTiming:
        """``timing`` with every sample so far and their medians."""
        return host_timed(timing, self.plan.samples, self.convert.samples if self.convert else [])
