"""The one verdict on a pair of measurements: a candidate's timing rounds against a baseline's.

Every command that says how two measurements compare (``check``, ``compare runs``,
``compare commits``, ``history``, ``report``, ``decide``) takes its word from ``judge``, with
the thresholds ``thresholds_for`` gives the rows (or the user's flags, for ``check``), so one
pair gets one verdict wherever it is shown. The ratio is ``candidate / baseline`` (> 1:
slower) with its interval at ``Thresholds.confidence`` (``significance.py``: two runs as two
samples of rounds, two backends of one run paired by round); the rule, in order:

* ``regressed``: the interval lies above 1, the ratio exceeds ``1 + max_slowdown`` and the
  difference exceeds ``min_delta_ms`` (``check`` fails on it);
* ``slower``: the interval lies above 1, within one of those tolerances;
* ``faster``: the interval lies below 1;
* ``same``: the interval holds 1 and lies within ±5% (``SAME_WITHIN``);
* ``unclear``: the interval holds 1 and is wider (more timing rounds narrow it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from attnbench.analyze.gate_defaults import default_max_slowdown
from attnbench.analyze.significance import GATE_CONFIDENCE, SAME_WITHIN, Ratio
from attnbench.store.rows import Row

VERDICTS = ("regressed", "slower", "faster", "same", "unclear")
TIES = ("same", "unclear")  # the interval holds 1: the rounds cannot tell the two apart


@dataclass
class Thresholds:
    max_slowdown: float = 0.10  # relative: 0.10 = 10% slower
    min_delta_ms: float = 0.002  # absolute, in ms (2 µs)
    strict: bool = False  # new cases fail too (check)
    confidence: float = GATE_CONFIDENCE  # the interval every verdict reads


def thresholds_for(*sides: Sequence[Row]) -> Thresholds:
    """The thresholds every command judges ``sides``' rows by when the user gives none: 99%,
    2 µs, and ``--max-slowdown`` 20% when either side was measured on a CPU, else 10%
    (``gate_defaults.default_max_slowdown``, what ``check`` uses without flags)."""
    return Thresholds(max_slowdown=default_max_slowdown(*sides)[0])


@dataclass(frozen=True)
class Judgement:
    verdict: str  # one of VERDICTS
    failed: bool  # regressed: a gate fails on it
    note: str  # which tolerance a "slower" stayed under, or why "unclear"
    delta_ms: float  # candidate - baseline as it would be at the candidate's time (the ratio applied)


def judge(r: Ratio, candidate_ms: float, th: Thresholds) -> Judgement:
    """The verdict on ``r`` (candidate / baseline at ``th.confidence``); ``candidate_ms`` the
    candidate's time, which ``min_delta_ms`` is measured against."""
    delta = candidate_ms * (1 - 1 / r.ratio) if r.ratio > 0 and math.isfinite(r.ratio) else math.nan
    if r.slower_for_sure:
        if r.ratio > 1 + th.max_slowdown and delta > th.min_delta_ms:
            return Judgement("regressed", True, "", delta)
        under = "under --max-slowdown" if r.ratio <= 1 + th.max_slowdown else "under --min-delta-us"
        return Judgement("slower", False, under, delta)
    if r.faster_for_sure:
        return Judgement("faster", False, "", delta)
    if r.same:
        return Judgement("same", False, "", delta)
    return Judgement("unclear", False, f"p={r.p:.2g}, not significant; more rounds narrow the interval", delta)


def rule_text(th: Thresholds) -> str:
    """The rule in one line, for legends: what each word means at ``th``."""
    return (f"regressed: the {th.confidence:.0%} interval lies above 1 and the ratio exceeds "
            f"{1 + th.max_slowdown:.2f}× and the difference {th.min_delta_ms * 1e3:g} µs; slower: above 1, within those; "
            f"faster: below 1; same: it holds 1 within ±{SAME_WITHIN:.0%}; unclear: it holds 1, wider")
