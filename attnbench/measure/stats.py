"""Statistics of raw timing samples, computed on demand (the samples are always kept)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


def quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of already sorted samples."""
    if not sorted_xs:
        return math.nan
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def kept(samples: Sequence[float]) -> list[float]:
    """Samples as a run folder keeps them (ms, to the nanosecond)."""
    return [round(x, 6) for x in samples]


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    p20: float
    p80: float
    min: float
    mean: float
    iqr_rel: float  # (p75 - p25) / median

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Summary":
        xs = sorted(samples)
        if not xs:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan, nan)
        med = quantile(xs, 0.5)
        iqr = quantile(xs, 0.75) - quantile(xs, 0.25)
        return cls(
            n=len(xs),
            median=med,
            p20=quantile(xs, 0.2),
            p80=quantile(xs, 0.8),
            min=xs[0],
            mean=sum(xs) / len(xs),
            iqr_rel=iqr / med if med > 0 else math.nan,
        )
