"""Every numeric flag: a finite number in its range, or exit 2 naming the flag.

One table (``RANGES``) says what each flag takes; commands call ``check_numbers`` first
thing, before a scenario is read or anything runs, so that ``--measure-ms nan`` is a usage
error and never an error row blamed on a backend, and ``--min-delta-us nan`` never turns a
slowdown into a pass (a NaN compares false with every threshold).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

from attnbench.cli.app import UsageError


class Range(NamedTuple):
    lo: float
    hi: float
    lo_open: bool = False  # lo itself is refused
    unit: str = ""

    def describe(self) -> str:
        lo = f"> {self.lo:g}" if self.lo_open else f">= {self.lo:g}"
        return f"{lo} and <= {self.hi:g}{' ' + self.unit if self.unit else ''} (a finite number)"


HOUR_MS = 3_600_000.0
RANGES = {
    "--warmup-ms": Range(0, HOUR_MS, unit="ms"),
    "--measure-ms": Range(0, HOUR_MS, lo_open=True, unit="ms"),
    "--rtol": Range(0, 1, lo_open=True),
    "--threads": Range(1, 4096),
    "--timeout": Range(0, 7 * 24 * 3600, lo_open=True, unit="s"),
    "--workers": Range(1, 4096),
    "--min-delta-us": Range(0, 1e9, unit="µs"),
    "--runs": Range(2, 100_000),
    "--rounds": Range(1, 100_000),
    "--rounds-per-turn": Range(1, 100_000),
    "--slowdown": Range(1, 1000, lo_open=True),
    "--gain": Range(0, 1e6, lo_open=True),
    "--max-slowdown": Range(0, 100),
    # import: the scenario fields they become (workload/scenario.py's limits)
    "--num-q-heads": Range(1, 1024),
    "--num-kv-heads": Range(1, 1024),
    "--head-dim": Range(1, 1024),
    "--page-size": Range(1, 4096),
    "--round-context": Range(1, 1 << 24),
    "--max-cases": Range(1, 10000),
}


def check_number(flag: str, value: Optional[float]) -> None:
    """UsageError (exit 2) naming ``flag`` when ``value`` (None: not given) is out of RANGES."""
    if value is None:
        return
    r = RANGES[flag]
    ok = isinstance(value, (int, float)) and math.isfinite(value) and r.lo <= value <= r.hi
    if not ok or (r.lo_open and value == r.lo):
        raise UsageError(f"{flag} {value}: must be {r.describe()}")


def check_numbers(**flags) -> None:
    """``check_numbers(measure_ms=..., rtol=...)``: each keyword is a flag's name (``_`` for ``-``);
    a list (a repeatable flag) is checked value by value."""
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        for v in value if isinstance(value, (list, tuple)) else [value]:
            check_number(flag, v)
