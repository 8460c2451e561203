"""Gate settings that do not cry wolf: the --max-slowdown a check uses when none is given, and
the rule that marks a case whose own timing rounds scatter too much for the threshold.

Pure logic on rows and round values (log times); ``compare.check`` applies the rule to every
case a gate compares, ``cli/gate.py`` applies the default and prints why.
"""
from __future__ import annotations

import math
from typing import Sequence

from attnbench.store.rows import Row

# --max-slowdown when the user gives none: what a calibration supports (docs/ci.md). On this
# project's 2-core CPU, unchanged code's A/A ratios wandered 0.89x-1.12x (1st-99th percentile)
# between runs: 10% failed 3.8% of 870 A/A checks, 20% none. On an H200 they stayed within
# 0.994x-1.007x and 5% met both targets: 10% on a GPU is safe.
CPU_MAX_SLOWDOWN = 0.20
GPU_MAX_SLOWDOWN = 0.10


def measured_on_cpu(rows: Sequence[Row]) -> bool:
    """Some row was measured on a CPU (``measure.metrics.device_name``: ``cpu ...``)."""
    return any(isinstance(r.id.device, str) and r.id.device.startswith("cpu") for r in rows)


def default_max_slowdown(*sides: Sequence[Row]) -> tuple[float, str]:
    """The --max-slowdown to use when none is given, and why (for the gate line): 20% when
    either side was measured on a CPU, else 10%."""
    if any(measured_on_cpu(rows) for rows in sides):
        return CPU_MAX_SLOWDOWN, (
            f"the CPU default: in docs/ci.md's CPU calibration {GPU_MAX_SLOWDOWN:.0%} failed 3.8% of A/A checks of "
            f"unchanged code, {CPU_MAX_SLOWDOWN:.0%} none; --max-slowdown sets another")
    if not any(r.id.device for rows in sides for r in rows):
        return GPU_MAX_SLOWDOWN, "the default (the rows do not say their device); --max-slowdown sets another"
    return GPU_MAX_SLOWDOWN, "the GPU default; --max-slowdown sets another"


# A case is noisy when NOISY x the robust spread of its rounds (the larger of the two sides)
# reaches log(the slowdown it must exceed to fail). Why 4: the interval accounts for the
# rounds' scatter within a run, but the level of unchanged code also moves between runs, and on
# a busy machine by about as much as its rounds scatter. If the run-to-run shift of each side
# is about one spread s, the difference of two runs has a sd of about 1.4 s, and a shift past
# t = NOISY x s is a 2.8-sigma event: about 1 case in 400 checks at 4 x, 1 in 60 at 3 x,
# 1 in 13 at 2 x. docs/ci.md gives the calibrations this was checked against.
NOISY = 4.0


def robust_spread(logs) -> float:
    """1.4826 x MAD of a row's round values (log times: 0.05 is about 5%); NaN with under 3 rounds."""
    import numpy as np  # not at import: `attnbench --help` imports this module

    v = np.asarray(logs, dtype=float)
    if len(v) < 3:
        return math.nan
    return float(1.4826 * np.median(np.abs(v - np.median(v))))


def slowdown_to_fail(current_ms: float, max_slowdown: float, min_delta_ms: float) -> float:
    """The ratio a case must exceed to fail: above ``1 + max_slowdown``, and slow enough that
    the difference exceeds ``min_delta_ms`` (``delta = current * (1 - 1/ratio)``); inf when
    no ratio can."""
    need = 1 + max_slowdown
    if min_delta_ms > 0 and math.isfinite(current_ms) and current_ms > 0:
        if min_delta_ms >= current_ms:
            return math.inf
        need = max(need, 1 / (1 - min_delta_ms / current_ms))
    return need


def judge_noise(run_logs, base_logs, current_ms: float, max_slowdown: float, min_delta_ms: float,
                scenario: str) -> tuple[float, bool, str]:
    """-> (the larger robust spread of the two sides' round values, noisy?, the note for a
    noisy case: how much, which side, and the calibration that measures it; "" otherwise)."""
    spreads = [(robust_spread(v), side) for v, side in ((run_logs, "this run"), (base_logs, "the baseline"))]
    spreads = [(v, side) for v, side in spreads if math.isfinite(v)]
    if not spreads:
        return math.nan, False, ""
    spread, side = max(spreads)
    need = slowdown_to_fail(current_ms, max_slowdown, min_delta_ms)
    if not (math.isfinite(need) and NOISY * spread >= math.log(need)):
        return spread, False, ""
    return spread, True, (
        f"noisy: its rounds scatter {spread:.1%} ({side}; robust spread of the round times), over 1/{NOISY:g} of "
        f"the {need - 1:.0%} slowdown it must exceed to fail: unchanged code is likely to fail here now and then; "
        f"measure how often with `attnbench calibrate {scenario or 'SCENARIO'} --runs 20`")
