"""How a gate setting behaves on real runs: its false-alarm rate and its power.

Given ``M`` runs of one scenario made the same way (unchanged code), every ordered pair
(baseline run ``i``, checked run ``j``, ``i != j``) is one A/A check: any failing case is a
false alarm. The same pairs, with the checked run slowed down by a factor ``s``, are A/B
checks: the share of them that fail is the power at ``s``.

The slowdown is injected by scaling: every round median, sample and median of the checked
run's rows is multiplied by ``s``, except the normalizer's (its rounds stand for the machine,
not the code under test). Scaling keeps each run's own noise (its slow spells, its rounds'
spread) and changes only the level, so the A/B checks see the same run-to-run variation as
real ones, and one set of runs serves every ``s``. What it does not model is a slowdown that
also changes the noise (extra work that is noisier than the rest of the call).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from itertools import permutations
from typing import Optional, Sequence

from attnbench.analyze.compare import Thresholds, check
from attnbench.store.rows import Row


def scaled(rows: Sequence[Row], factor: float, keep: Optional[str]) -> list[Row]:
    """``rows`` with the times of every ok row except backend ``keep`` multiplied by ``factor``."""
    out = []
    for r in rows:
        if r.status != "ok" or r.id.backend == keep:
            out.append(r)
            continue
        t = r.timing
        out.append(dataclasses.replace(r, timing=dataclasses.replace(
            t,
            median_ms=t.median_ms * factor,
            samples_ms=[x * factor for x in t.samples_ms],
            round_medians_ms=[x * factor for x in t.round_medians_ms],
        )))
    return out


@dataclass
class Tally:
    """Checks (pairs of runs) and cases: how many there were and how many failed."""

    checks: int = 0
    checks_failed: int = 0
    cases: int = 0
    cases_failed: int = 0


@dataclass
class Calibration:
    runs: int
    aa: Tally
    ab: dict[float, Tally]  # slowdown -> tally
    aa_ratios: dict[str, list[float]] = field(default_factory=dict)  # "case · backend" -> A/A ratios
    aa_runs_failing: set = field(default_factory=set)  # run indices in a false alarm (either side)


def _tally(t: Tally, current: Sequence[Row], baseline: Sequence[Row], th: Thresholds, norm: Optional[str]):
    res = check(current, baseline, th, norm)
    judged = [c for c in res.cases if c.ratio is not None]
    t.checks += 1
    t.checks_failed += bool(res.failures)
    t.cases += len(judged)
    t.cases_failed += sum(c.failed for c in judged)
    return res


def calibrate(runs: Sequence[Sequence[Row]], th: Thresholds, normalize_by: Optional[str],
              slowdowns: Sequence[float]) -> Calibration:
    """A/A and scaled A/B checks over every ordered pair of ``runs``."""
    cal = Calibration(len(runs), Tally(), {s: Tally() for s in slowdowns})
    for i, j in permutations(range(len(runs)), 2):
        res = _tally(cal.aa, runs[j], runs[i], th, normalize_by)
        if res.failures:
            cal.aa_runs_failing |= {i, j}
        for c in res.cases:
            if c.ratio is not None:
                cal.aa_ratios.setdefault(f"{c.case_id} · {c.backend}", []).append(c.ratio.ratio)
        for s in slowdowns:
            _tally(cal.ab[s], scaled(runs[j], s, normalize_by), runs[i], th, normalize_by)
    return cal


def _rate(k: int, n: int) -> float:
    return k / n if n else math.nan


def summary_records(cal: Calibration) -> list[dict]:
    """One record for the A/A checks, one per injected slowdown."""
    rows = [("none (A/A)", 1.0, cal.aa)] + [(f"{s:g}×", s, t) for s, t in sorted(cal.ab.items())]
    return [{
        "slowdown": name, "factor": factor, "checks": t.checks, "checks_failed": t.checks_failed,
        "check_rate": _rate(t.checks_failed, t.checks), "cases": t.cases, "cases_failed": t.cases_failed,
        "case_rate": _rate(t.cases_failed, t.cases),
    } for name, factor, t in rows]


def wander_records(cal: Calibration) -> list[dict]:
    """Per case, how far the A/A ratios of unchanged code wander from 1."""
    import numpy as np  # not at import: `attnbench --help` imports this module

    out = []
    for key, ratios in cal.aa_ratios.items():
        a = np.asarray(ratios)
        out.append({
            "case": key, "checks": len(a), "median": float(np.median(a)),
            "p1": float(np.percentile(a, 1)), "p99": float(np.percentile(a, 99)), "max": float(a.max()),
        })
    return out
