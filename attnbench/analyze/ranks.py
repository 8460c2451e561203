"""Exact rank statistics for a handful of replicates: a shift, its interval and its p-value.

Two kinds of data, both small (one value per timing round, 5 to 50 of them):

* two independent samples ``x`` and ``y`` (the rounds of two runs): the shift ``x - y`` is
  estimated by the median of all ``m * n`` differences ``x_i - y_j`` (Hodges-Lehmann), its
  interval is read off those sorted differences at ranks given by the exact null
  distribution of the Mann-Whitney ``U`` (Moses), and ``p`` is the exact two-sided
  Mann-Whitney test of ``U = #{x_i - y_j > 0}``;
* one sample ``z`` of paired differences (two backends measured in the same rounds): the
  same with the ``n (n + 1) / 2`` Walsh averages ``(z_i + z_j) / 2`` and the Wilcoxon
  signed-rank statistic ``W = #{Walsh averages > 0}``.

Because the interval and the test come from the same counts, the interval excludes 0
exactly when ``p <= 1 - confidence`` (ties aside): a result can never be "significant" with
an interval that contains 0, or the reverse. Both are exact for any number of replicates
that are exchangeable (no normal approximation), and say nothing more than the replicates
do: ``min_p`` is the smallest p-value a given number of them can ever reach.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

# numpy is imported in the functions that use it: the light commands (--help) import this
# module through the CLI and must not pay numpy's 90-120 ms.


@dataclass(frozen=True)
class Shift:
    """A shift estimate with its interval (``lo``, ``hi``; infinite when the replicates are
    too few for the confidence asked) and the two-sided p-value of "no shift"."""

    estimate: float
    lo: float
    hi: float
    p: float


def _divide_by_one_minus_q_power(c: np.ndarray, i: int) -> np.ndarray:
    """Coefficients of ``c(q) / (1 - q^i)`` truncated to ``len(c)``: a running sum over each
    residue class modulo ``i``."""
    import numpy as np
    size = len(c)
    rows = -(-size // i)
    padded = np.zeros(rows * i)
    padded[:size] = c
    return np.cumsum(padded.reshape(rows, i), axis=0).ravel()[:size]


@functools.lru_cache(maxsize=64)
def mann_whitney_pmf(m: int, n: int) -> np.ndarray:
    """P(U = u) for u = 0..m*n under "same distribution" (no ties): the coefficients of the
    Gaussian binomial ``prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i)``, normalized."""
    import numpy as np
    size = m * n + 1
    c = np.zeros(size)
    c[0] = 1.0
    for i in range(1, m + 1):
        if n + i < size:
            c[n + i:] -= c[: size - n - i].copy()
        c = _divide_by_one_minus_q_power(c, i)
        c /= c.max()  # keep the numbers in range; only ratios matter
    c = np.clip(c, 0.0, None)
    c /= c.sum()
    c.setflags(write=False)  # cached: shared by every caller
    return c


@functools.lru_cache(maxsize=64)
def signed_rank_pmf(n: int) -> np.ndarray:
    """P(W = w) for w = 0..n(n+1)/2 under "symmetric about 0": coefficients of
    ``prod_{i=1..n} (1 + q^i)``, normalized."""
    import numpy as np
    size = n * (n + 1) // 2 + 1
    c = np.zeros(size)
    c[0] = 1.0
    for i in range(1, n + 1):
        c[i:] += c[:-i].copy()
        c /= c.max()
    c /= c.sum()
    c.setflags(write=False)  # cached: shared by every caller
    return c


def _shift_from_counts(values: np.ndarray, pmf: np.ndarray, confidence: float) -> Shift:
    """Estimate, interval and p from the sorted pairwise values (differences or Walsh
    averages) and the null pmf of the number of them above 0."""
    import numpy as np
    values = np.sort(values)
    total = len(values)
    cdf = np.cumsum(pmf)
    alpha = 1.0 - confidence
    # c = the largest count with P(stat <= c) <= alpha / 2; the interval drops c values on each side
    c = int(np.searchsorted(cdf, alpha / 2 * (1 + 1e-9), side="right")) - 1
    lo, hi = (values[c], values[total - 1 - c]) if c >= 0 else (-math.inf, math.inf)
    stat = float(np.sum(values > 0) + 0.5 * np.sum(values == 0))
    below = cdf[int(math.floor(stat))]  # P(stat' <= stat)
    above = 1.0 - (cdf[int(math.ceil(stat)) - 1] if stat >= 1 else 0.0)  # P(stat' >= stat)
    p = float(min(1.0, 2 * min(below, above)))
    return Shift(float(np.median(values)), float(lo), float(hi), p)


def two_sample_shift(x: Sequence[float], y: Sequence[float], confidence: float) -> Shift:
    """Shift of ``x`` over ``y`` (Hodges-Lehmann), Moses interval, exact Mann-Whitney p."""
    import numpy as np
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) == 0 or len(y) == 0:
        return Shift(math.nan, math.nan, math.nan, math.nan)
    diffs = (x[:, None] - y[None, :]).ravel()
    return _shift_from_counts(diffs, mann_whitney_pmf(len(x), len(y)), confidence)


def paired_shift(z: Sequence[float], confidence: float) -> Shift:
    """Center of the paired differences ``z`` (median of Walsh averages), its interval from
    the signed-rank distribution, exact Wilcoxon signed-rank p."""
    import numpy as np
    z = np.asarray(z, float)
    n = len(z)
    if n == 0:
        return Shift(math.nan, math.nan, math.nan, math.nan)
    i, j = np.triu_indices(n)
    walsh = (z[i] + z[j]) / 2
    return _shift_from_counts(walsh, signed_rank_pmf(n), confidence)


def min_p(m: int, n: int = 0) -> float:
    """The smallest two-sided p-value ``m`` and ``n`` replicates can reach (``n = 0``:
    ``m`` paired differences). Below the gate's level, nothing could ever be significant."""
    if m <= 0:
        return 1.0
    if n == 0:
        return min(1.0, 2.0 / 2.0**m)
    return min(1.0, 2.0 / math.comb(m + n, m))
