"""How each row is timed: one model, with its defaults written once. The scenario's ``timing:``
validates into it (``workload.scenario.Timing`` takes its defaults from here), the command line
overrides fields of it (``TIMING_FLAGS``: ``--warmup-ms``, ``--measure-ms``, ``--flush``), the
manifest records those overrides (``RunOptions.timing_overrides``, checked by
``override_problem`` when read back), the timer (``measure.timing``) reads it, and each row
records the flush that emptied the L2 before its timed calls (``Row.timing.flush``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

FLUSH_MODES = ("read", "write", "write+read")  # how the L2 is emptied (measure.timing.L2Flusher)
CPU_CLOCK_NAMES = ("wall", "thread", "process")  # measure.timing.time_cpu


@dataclass(kw_only=True)  # keywords only: a field added in the middle must not shift callers' values
class TimingConfig:
    warmup_ms: float = 25.0  # warm-up budget per row
    measure_ms: float = 100.0  # measurement budget per row
    # timed calls at least; None: SOFT_MIN_RUNS, but only as many as fit in twice measure_ms
    # (a 40 ms call under a 10 ms budget is timed once, not 5 times); a number: a hard floor
    min_runs: Optional[int] = None
    max_runs: int = 2000
    cold_l2: bool = True  # flush the GPU's L2 before every timed call
    cuda_graphs: bool = True  # time CUDA-graph replays where the backend allows
    flush: str = "read"  # how the L2 is emptied before each timed call (one of FLUSH_MODES)
    cpu_clock: str = "wall"  # CPU rows: "wall", "thread" or "process" (the runner picks it from --threads)
    rounds: int = 1  # the runner splits the budgets into rounds taken in turn by a case's backends


DEFAULTS = TimingConfig()
SOFT_MIN_RUNS = 5  # the floor of timed calls when min_runs is not set (measure.timing._counts)

# the fields the command line sets, and their flags (run, compare backends, each row's repro command)
TIMING_FLAGS = {"warmup_ms": "--warmup-ms", "measure_ms": "--measure-ms", "flush": "--flush"}

_FIELDS = {f.name: f for f in dataclasses.fields(TimingConfig)}
_CHOICES = {"flush": FLUSH_MODES, "cpu_clock": CPU_CLOCK_NAMES}


def override_problem(key: Any, value: Any) -> Optional[str]:
    """What is wrong with overriding timing field ``key`` with ``value`` (None: nothing)."""
    if key not in _FIELDS:
        return f"{key!r} is not a timing setting (one of {', '.join(_FIELDS)})"
    default = getattr(DEFAULTS, key)
    if default is None and value is None:
        return None
    kind = int if default is None else type(default)  # min_runs: an integer or unset
    if key in _CHOICES:
        return None if value in _CHOICES[key] else f"{key}: {value!r} is not one of {', '.join(_CHOICES[key])}"
    if kind is bool:
        return None if isinstance(value, bool) else f"{key}: {value!r} is not true or false"
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not numeric or (kind is int and value != int(value)):
        return f"{key}: {value!r} is not {'an integer' if kind is int else 'a number'}"
    return None


def flag_text(key: str, value: Any) -> str:
    """An override as its flag's value: 0.5 -> "0.5", "read" -> "read"."""
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
