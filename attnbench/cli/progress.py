"""Progress of a run on stderr: a bar with an ETA on a terminal; elsewhere (CI logs, pipes)
one plain line per finished case, so that a log shows the run moving.

    [ 12/100] 0:14 elapsed, ETA 1:42  context=128,page_size=16,seed=2: reference ok, sdpa ok, flex ok
"""
from __future__ import annotations

import time
from typing import Optional

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
)

from attnbench.store.safe_text import term_text


def clock(seconds: float) -> str:
    """``75.2`` -> ``1:15``; ``3725`` -> ``1:02:05``."""
    s = int(round(max(seconds, 0.0)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def eta(elapsed: float, done: float, total: float) -> Optional[float]:
    """Seconds left, from the time per unit of work so far (None before the first row). Units are
    rows, or each case's estimated cost (``workload.cost``): a 16k-context case is not a 1k one."""
    if done <= 0:
        return None
    return elapsed / done * max(total - done, 0)


class Work:
    """How much of a run's estimated work is done: each case weighs its estimated cost (``costs``,
    seconds; default: its row count), shared out among its rows as they finish."""

    def __init__(self, rows_per_case: dict[str, int], costs: Optional[dict[str, float]] = None):
        self.per_row = {c: (costs[c] / n if costs and costs.get(c, 0) > 0 else 1.0) for c, n in rows_per_case.items()}
        self.total = sum(self.per_row[c] * n for c, n in rows_per_case.items())
        self.done = 0.0
        self.t0 = time.monotonic()

    def advance(self, case_id: str) -> None:
        self.done += self.per_row.get(case_id, 1.0)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> Optional[float]:
        return eta(self.elapsed(), self.done, self.total)


class CaseLines:
    """Non-terminal progress: one line per finished case on stderr."""

    def __init__(self, console: Console, rows_per_case: dict[str, int], label: str,
                 costs: Optional[dict[str, float]] = None):
        self.console = console
        self.expected = dict(rows_per_case)
        self.total_rows = sum(self.expected.values())
        self.total_cases = len(self.expected)
        self.work = Work(self.expected, costs)
        self.cases_done = 0
        self.pending: dict[str, list[str]] = {}
        console.print(f"{label}: {self.total_cases} case(s), {self.total_rows} row(s)", highlight=False, markup=False)

    def __enter__(self) -> "CaseLines":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def advance(self, case_id: str, backend: str, status: str) -> None:
        self.work.advance(case_id)
        got = self.pending.setdefault(case_id, [])
        got.append(f"{backend} {status}")
        if len(got) >= self.expected.get(case_id, 1):
            self.cases_done += 1
            self.console.print(self.line(case_id, self.pending.pop(case_id)), highlight=False, markup=False,
                               soft_wrap=True)

    def line(self, case_id: str, rows: list[str]) -> str:
        elapsed, left = self.work.elapsed(), self.work.left()
        width = len(str(self.total_cases))
        when = f"{clock(elapsed)} elapsed" + (f", ETA {clock(left)}" if left is not None else "")
        return f"[{self.cases_done:>{width}}/{self.total_cases}] {when}  {case_id}: {', '.join(rows)}"


class CaseBar:
    """Terminal progress: a transient bar with done/total, elapsed time and ETA, redrawn when a
    row finishes. Never by rich's refresh thread: it drew the bar 10 times a second while rows
    were timed in this process, and the CPU timer, which reads the process's clock to see
    whether other threads worked in a call (measure/timing.py), moved 7 of cpu-sweep's 60 rows
    onto the process clock only when stdout was a terminal."""

    def __init__(self, console: Console, rows_per_case: dict[str, int], label: str,
                 costs: Optional[dict[str, float]] = None):
        self.progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),  # by estimated work, not rows (rich's own counts rows)
            console=console,
            transient=True,
            auto_refresh=False,
        )
        self.work = Work(rows_per_case, costs)
        self.task = self.progress.add_task(escape(label), total=sum(rows_per_case.values()), eta="-:--")

    def __enter__(self) -> "CaseBar":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def advance(self, case_id: str, backend: str, status: str) -> None:
        self.work.advance(case_id)
        left = self.work.left()
        self.progress.update(self.task, advance=1, description=escape(f"{case_id} · {backend}: {status}"),
                             eta=clock(left) if left is not None else "-:--")
        self.progress.refresh()


class Silent:
    def __enter__(self) -> "Silent":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def advance(self, case_id: str, backend: str, status: str) -> None:
        return None


def progress_for(console: Console, rows_per_case: dict[str, int], label: str, quiet: bool,
                 costs: Optional[dict[str, float]] = None):
    """The bar on a terminal, lines elsewhere, nothing with --quiet; ETAs weigh each case by
    ``costs`` (estimated seconds per case) where given."""
    if quiet:
        return Silent()
    label = term_text(label)  # the scenario's name: one line, no escape sequence
    if console.is_terminal:
        return CaseBar(console, rows_per_case, label, costs)
    return CaseLines(console, rows_per_case, label, costs)
