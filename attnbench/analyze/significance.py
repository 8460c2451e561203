"""Ratios of times with intervals and p-values whose unit of replication is the timing round.

Why rounds, not calls: calls of one run share the machine's state (its load, clock, cache
and memory placement), so thousands of calls of one run are not thousands of independent
measurements; treating them so made unchanged code "significantly" slower with p = 1e-260.
What repeats independently is the round (``timing.rounds``: a case's backends take turns,
each round a short measurement of every backend). Each round gives one number per backend,
its median call time (``Row.timing.round_medians_ms``), and the statistics here use only those:

* the value of a round is ``log(round median)``, or with a normalizer backend
  ``log(round median / the normalizer's median in the same round)``;
* two runs (``compare_runs``): the ratio is ``exp`` of the Hodges-Lehmann shift between the
  two runs' round values, with the exact Mann-Whitney interval and p (``ranks.py``);
* two backends of one run (``compare_paired``): the rounds are paired, the ratio is ``exp``
  of the center of the per-round log ratios, with the exact signed-rank interval and p.

The interval excludes 1 exactly when p <= 1 - confidence, so a verdict can follow either.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

# numpy: imported in the functions that use it (the light commands import this module)
from attnbench.analyze import ranks
from attnbench.store.rows import Row

if TYPE_CHECKING:
    import numpy as np

GATE_CONFIDENCE = 0.99  # check: a slowdown is real when the 99% interval lies above 1
REPORT_CONFIDENCE = 0.95  # compare: the interval shown
SAME_WITHIN = 0.05  # "≈ same" when the whole interval lies within ±5% (else "unclear")


def median(xs: Sequence[float]) -> float:
    import numpy as np
    return float(np.median(np.asarray(xs, dtype=float))) if len(xs) else math.nan


@dataclass(frozen=True)
class Ratio:
    """``current / baseline`` (> 1: current is slower), its interval at ``confidence``, the
    p-value of "no difference", and how many rounds each side had."""

    ratio: float
    lo: float
    hi: float
    p: float
    confidence: float
    rounds: str = ""  # "10 vs 10" (two runs) or "10 paired"

    @property
    def significant(self) -> bool:
        """The interval excludes 1 (equivalently p <= 1 - confidence)."""
        return self.slower_for_sure or self.faster_for_sure

    @property
    def slower_for_sure(self) -> bool:
        return math.isfinite(self.lo) and self.lo > 1

    @property
    def faster_for_sure(self) -> bool:
        return math.isfinite(self.hi) and self.hi < 1

    @property
    def same(self) -> bool:
        """Not significant, and the interval is narrow enough to call it the same (±5%)."""
        return (
            not self.significant
            and math.isfinite(self.lo) and math.isfinite(self.hi)
            and self.lo >= 1 / (1 + SAME_WITHIN) and self.hi <= 1 + SAME_WITHIN
        )


def _from_shift(s: ranks.Shift, confidence: float, rounds: str) -> Ratio:
    return Ratio(math.exp(s.estimate), math.exp(s.lo), math.exp(s.hi), s.p, confidence, rounds)


class RoundsError(ValueError):
    """Rows whose rounds cannot be used (none recorded, or a normalizer with other rounds)."""


def round_logs(row: Row, norm: Optional[Row] = None) -> np.ndarray:
    """``log`` of each round's median of ``row`` (divided by ``norm``'s of the same round)."""
    import numpy as np
    vals = np.log(np.asarray(row.timing.round_medians_ms, dtype=float))
    if norm is None:
        return vals
    nv = np.log(np.asarray(norm.timing.round_medians_ms, dtype=float))
    if len(nv) != len(vals):
        raise RoundsError(f"{norm.id.backend} has {len(nv)} rounds and {row.id.backend} {len(vals)} "
                          f"in case {row.id.case_id}")
    return vals - nv


def compare_runs(current: Sequence[float], baseline: Sequence[float], confidence: float) -> Ratio:
    """Ratio of two runs from their round values (``round_logs``), rounds as replicates."""
    s = ranks.two_sample_shift(current, baseline, confidence)
    return _from_shift(s, confidence, f"{len(current)} vs {len(baseline)}")


def compare_paired(this: Sequence[float], other: Sequence[float], confidence: float) -> Ratio:
    """Ratio of two backends measured in the same rounds of one run, paired by round."""
    import numpy as np
    if len(this) != len(other):
        raise RoundsError(f"{len(this)} rounds against {len(other)}: not measured in the same rounds")
    s = ranks.paired_shift(np.asarray(this) - np.asarray(other), confidence)
    return _from_shift(s, confidence, f"{len(this)} paired")


def rounds_needed(confidence: float, paired: bool = False) -> int:
    """The fewest rounds per side with which a difference can be significant at all."""
    alpha = 1 - confidence
    n = 1
    while (ranks.min_p(n) if paired else ranks.min_p(n, n)) > alpha:
        n += 1
    return n
