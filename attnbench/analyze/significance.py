"""Ratios of medians with bootstrap intervals, and the Mann-Whitney test: the statistics
behind ``compare`` and ``check`` (see ``compare.py`` for how they are used)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 20240607
ALPHA = 0.01  # p below this (with the interval above 1) makes a slowdown "real"


def median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=float))) if len(xs) else math.nan


def _boot_medians(xs: Sequence[float], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Medians of ``resamples`` bootstrap resamples of ``xs`` -> shape [resamples]."""
    a = np.asarray(xs, dtype=float)
    idx = rng.integers(0, len(a), size=(resamples, len(a)))
    return np.median(a[idx], axis=1)


def bootstrap_ratio(
    num: Sequence[Sequence[float]],
    den: Sequence[Sequence[float]],
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> tuple[float, float, float]:
    """Ratio ``prod(median(n) for n in num) / prod(median(d) for d in den)`` and its
    percentile-bootstrap interval -> (ratio, lo, hi). Each sample set is resampled on its own
    (the sets were measured at different times, so there is no pairing to keep)."""
    sets = [*num, *den]
    if any(len(s) == 0 for s in sets):
        return math.nan, math.nan, math.nan
    point = math.prod(median(s) for s in num) / math.prod(median(s) for s in den)
    rng = np.random.default_rng(seed)
    top = np.ones(resamples)
    bottom = np.ones(resamples)
    for s in num:
        top *= _boot_medians(s, rng, resamples)
    for s in den:
        bottom *= _boot_medians(s, rng, resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = top / bottom
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.nanpercentile(ratios, [tail, 100 - tail])
    return point, float(lo), float(hi)


def mwu_normal_approx(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value, normal approximation with tie and continuity
    correction (what scipy does for large samples); used when scipy is not installed."""
    n1, n2 = len(a), len(b)
    x = np.concatenate([np.asarray(a, float), np.asarray(b, float)])
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    ranks = np.empty(len(x))
    # average ranks of tied groups
    i = 0
    tie_term = 0.0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        t = j - i + 1
        tie_term += t**3 - t
        i = j + 1
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    mu = n1 * n2 / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u1 - mu) - 0.5) / math.sqrt(var)
    return float(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))))


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value that ``a`` and ``b`` come from the same distribution."""
    if len(a) == 0 or len(b) == 0:
        return math.nan
    try:
        from scipy.stats import mannwhitneyu
    except ImportError:
        return mwu_normal_approx(a, b)
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


@dataclass(frozen=True)
class Ratio:
    """``current / baseline`` of medians (> 1: current is slower), interval and p-value."""

    ratio: float
    lo: float
    hi: float
    p: float

    @property
    def indistinguishable(self) -> bool:
        return not (self.lo > 1 or self.hi < 1) if math.isfinite(self.lo) else True

    @property
    def slower_for_sure(self) -> bool:
        """The samples say it is slower: interval above 1 and p < ALPHA."""
        return math.isfinite(self.lo) and self.lo > 1 and self.p < ALPHA


def compare_samples(
    current: Sequence[float],
    baseline: Sequence[float],
    current_norm: Optional[Sequence[float]] = None,
    baseline_norm: Optional[Sequence[float]] = None,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Ratio:
    """Ratio of medians ``current / baseline``; with normalizer samples, of
    ``(current / current_norm) / (baseline / baseline_norm)``. The p-value then tests the
    samples of each side divided by its own normalizer's median."""
    if current_norm is None or baseline_norm is None:
        r, lo, hi = bootstrap_ratio([current], [baseline], resamples, seed=seed)
        return Ratio(r, lo, hi, mann_whitney_p(current, baseline))
    r, lo, hi = bootstrap_ratio([current, baseline_norm], [baseline, current_norm], resamples, seed=seed)
    cn, bn = median(current_norm), median(baseline_norm)
    p = mann_whitney_p([x / cn for x in current], [x / bn for x in baseline])
    return Ratio(r, lo, hi, p)
