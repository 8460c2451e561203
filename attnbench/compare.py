"""Speedups between backends and between runs, with their uncertainty; the regression check.

Pure logic, no printing. Everything works on the raw ``samples_ms`` of result rows:

* a *ratio* is a ratio of medians, ``median(current) / median(baseline)`` (> 1: slower);
* its interval is a percentile bootstrap of that ratio (each side resampled independently,
  fixed seed, so the same samples always give the same interval);
* ``p`` is a two-sided Mann-Whitney U test of the two sample sets (scipy's when scipy is
  installed, else the normal approximation with tie correction implemented below);
* a difference is *indistinguishable* when the interval contains 1.

``normalize`` divides a backend's time by a normalizer backend's time measured in the same
case of the same run before comparing; the bootstrap then resamples all four sample sets
(current, current normalizer, baseline, baseline normalizer). This cancels a machine that is
uniformly faster, slower or busier than the one the baseline came from.

Rows of two runs are matched by ``Row.key`` (scenario, case, backend), never by position.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import numpy as np

from .results import Row

RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 20240607
ALPHA = 0.01  # p below this (with the interval above 1) makes a slowdown "real"


class CompareError(ValueError):
    """The two sides cannot be compared (other device, unknown normalizer): a usage error."""


# ---------------------------------------------------------------------------- statistics
def _median(xs: Sequence[float]) -> float:
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
    point = math.prod(_median(s) for s in num) / math.prod(_median(s) for s in den)
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


def _mwu_normal(a: Sequence[float], b: Sequence[float]) -> float:
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
        return _mwu_normal(a, b)
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
    cn, bn = _median(current_norm), _median(baseline_norm)
    p = mann_whitney_p([x / cn for x in current], [x / bn for x in baseline])
    return Ratio(r, lo, hi, p)


# ---------------------------------------------------------------------------- fingerprint
def fingerprint(manifest: dict, rows: Iterable[Row] = ()) -> dict:
    """Device, torch and backend versions of a run (from its manifest, else its rows)."""
    env = manifest.get("environment") or {}
    rows = list(rows)
    device = env.get("device") or next((r.device for r in rows if r.device), "")
    backends = dict(env.get("backends") or {})
    for r in rows:
        if r.backend_version and r.backend not in backends:
            backends[r.backend] = r.backend_version
    return {"device": device, "torch": env.get("torch") or "", "backends": backends}


def fingerprint_differences(a: dict, b: dict) -> tuple[bool, list[str]]:
    """-> (same device?, human-readable differences in device and versions)."""
    diffs = []
    same_device = (a.get("device") or "") == (b.get("device") or "")
    if not same_device:
        diffs.append(f"device: {b.get('device') or '?'} (baseline) vs {a.get('device') or '?'}")
    if a.get("torch") != b.get("torch"):
        diffs.append(f"torch: {b.get('torch') or '?'} (baseline) vs {a.get('torch') or '?'}")
    ba, bb = a.get("backends") or {}, b.get("backends") or {}
    for name in sorted(set(ba) & set(bb)):
        if ba[name] != bb[name]:
            diffs.append(f"{name}: {bb[name]} (baseline) vs {ba[name]}")
    return same_device, diffs


def ensure_same_device(current_fp: dict, baseline_fp: dict, allow_cross_device: bool) -> list[str]:
    """Raise CompareError on another device unless allowed; return the differences (warnings)."""
    same, diffs = fingerprint_differences(current_fp, baseline_fp)
    if not same and not allow_cross_device:
        raise CompareError(
            f"the runs were measured on different devices: {baseline_fp.get('device') or '?'!r} (baseline) "
            f"vs {current_fp.get('device') or '?'!r}; timings across devices are not comparable. "
            "Pass --allow-cross-device to compare anyway (with --normalize-by BACKEND to cancel the speed difference)"
        )
    return diffs


# ---------------------------------------------------------------------------- matching
@dataclass
class Matched:
    pairs: list[tuple[Row, Row]]  # (current, baseline), in the current run's order
    new: list[Row]  # in current only
    vanished: list[Row]  # in baseline only


def match_rows(current: Sequence[Row], baseline: Sequence[Row]) -> Matched:
    """Pair rows by ``Row.key``; rows on one side only are listed, never guessed."""
    base = {r.key: r for r in baseline}
    cur_keys = {r.key for r in current}
    pairs = [(r, base[r.key]) for r in current if r.key in base]
    new = [r for r in current if r.key not in base]
    vanished = [r for r in baseline if r.key not in cur_keys]
    return Matched(pairs, new, vanished)


def _norm_rows(rows: Sequence[Row], backend: Optional[str]) -> dict[tuple[str, str], Row]:
    if not backend:
        return {}
    return {(r.scenario, r.case_id): r for r in rows if r.backend == backend}


def _usable(r: Optional[Row]) -> bool:
    return r is not None and r.status == "ok" and len(r.samples_ms) > 0


# ---------------------------------------------------------------------------- check
@dataclass
class Thresholds:
    max_slowdown: float = 0.10  # relative: 0.10 = 10% slower
    min_delta_ms: float = 0.002  # absolute, in ms (2 µs)
    strict: bool = False  # vanished cases and ok -> skipped fail too


@dataclass
class CaseResult:
    """One matched (or unmatched) key and what the check says about it."""

    scenario: str
    case_id: str
    backend: str
    verdict: str  # see VERDICTS
    failed: bool
    baseline_status: str = ""
    current_status: str = ""
    baseline_ms: float = math.nan
    current_ms: float = math.nan
    ratio: Optional[Ratio] = None
    delta_ms: float = math.nan  # current - baseline (baseline scaled by the normalizer)
    note: str = ""


VERDICTS = {
    "regressed": "slower beyond both thresholds, and the samples say it is real",
    "broken": "was ok, now mismatch or error",
    "slower": "slower, but within a threshold or not significant",
    "same": "indistinguishable from the baseline",
    "faster": "faster, and the samples say it is real",
    "fixed": "was failing or skipped, now ok",
    "still failing": "failing in both runs",
    "skipped": "skipped now (was ok)",
    "unchanged": "not ok in either run with the same status",
    "new": "only in the current run",
    "vanished": "only in the baseline",
    "normalizer": "the normalizer itself (ratio 1 by definition)",
    "unnormalized": "the normalizer has no ok samples in this case",
}


@dataclass
class CheckResult:
    cases: list[CaseResult]
    normalize_by: Optional[str]
    warnings: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[CaseResult]:
        return [c for c in self.cases if c.failed]

    def count(self, verdict: str) -> int:
        return sum(c.verdict == verdict for c in self.cases)


def _judge(cur: Row, base: Row, cn: Optional[Row], bn: Optional[Row], th: Thresholds, norm: Optional[str]) -> CaseResult:
    res = CaseResult(
        cur.scenario, cur.case_id, cur.backend, verdict="", failed=False,
        baseline_status=base.status, current_status=cur.status,
        baseline_ms=base.median_ms, current_ms=cur.median_ms,
    )
    if base.status == "ok" and cur.status in ("mismatch", "error"):
        res.verdict, res.failed, res.note = "broken", True, cur.reason
        return res
    if base.status != "ok" and cur.status == "ok":
        res.verdict, res.note = "fixed", f"was {base.status}: {base.reason}".strip()
        return res
    if base.status == "ok" and cur.status == "skipped":
        res.verdict, res.failed, res.note = "skipped", th.strict, cur.reason
        return res
    if cur.status != "ok":
        res.verdict = "still failing" if cur.status in ("mismatch", "error") else "unchanged"
        res.note = cur.reason
        return res
    if not (cur.samples_ms and base.samples_ms):
        res.verdict, res.note = "unnormalized", "no timing samples"
        return res
    if norm:
        if cur.backend == norm:
            res.verdict = "normalizer"
            return res
        if not (_usable(cn) and _usable(bn)):
            res.verdict, res.note = "unnormalized", f"{norm} is not ok in this case in both runs"
            return res
        r = compare_samples(cur.samples_ms, base.samples_ms, cn.samples_ms, bn.samples_ms)
        # baseline time as it would be on the current machine: scaled by the normalizer
        expected = _median(base.samples_ms) * _median(cn.samples_ms) / _median(bn.samples_ms)
    else:
        r = compare_samples(cur.samples_ms, base.samples_ms)
        expected = _median(base.samples_ms)
    res.ratio = r
    res.delta_ms = _median(cur.samples_ms) - expected
    over = r.ratio > 1 + th.max_slowdown and res.delta_ms > th.min_delta_ms
    if over and r.slower_for_sure:
        res.verdict, res.failed = "regressed", True
    elif r.ratio > 1 and not r.indistinguishable:
        res.verdict = "slower"
        if not over:
            res.note = "under --max-slowdown" if r.ratio <= 1 + th.max_slowdown else "under --min-delta-us"
        else:
            res.note = f"not significant (p={r.p:.2g})"
    elif r.indistinguishable:
        res.verdict = "same"
    else:
        res.verdict = "faster"
    return res


def check(
    current: Sequence[Row],
    baseline: Sequence[Row],
    thresholds: Thresholds = Thresholds(),
    normalize_by: Optional[str] = None,
) -> CheckResult:
    """Judge every case of ``current`` against ``baseline`` (matched by key)."""
    if normalize_by:
        for side, rows in (("current run", current), ("baseline", baseline)):
            if not any(r.backend == normalize_by for r in rows):
                have = ", ".join(sorted({r.backend for r in rows})) or "none"
                raise CompareError(f"--normalize-by {normalize_by}: the {side} has no rows of that backend (it has: {have})")
    m = match_rows(current, baseline)
    cn, bn = _norm_rows(current, normalize_by), _norm_rows(baseline, normalize_by)
    out = []
    for cur, base in m.pairs:
        ck = (cur.scenario, cur.case_id)
        out.append(_judge(cur, base, cn.get(ck), bn.get(ck), thresholds, normalize_by))
    for r in m.new:
        out.append(CaseResult(r.scenario, r.case_id, r.backend, "new", False, current_status=r.status, current_ms=r.median_ms))
    for r in m.vanished:
        out.append(
            CaseResult(r.scenario, r.case_id, r.backend, "vanished", thresholds.strict and r.status == "ok",
                       baseline_status=r.status, baseline_ms=r.median_ms)
        )
    return CheckResult(out, normalize_by)


# ---------------------------------------------------------------------------- backends
@dataclass
class BackendComparison:
    case_id: str
    backend: str
    status: str
    median_ms: float
    reference: str  # the backend it is compared with
    ratio: Optional[Ratio]  # median(this) / median(reference); None for the reference itself


def compare_backends(rows: Sequence[Row], baseline: Optional[str] = None) -> list[BackendComparison]:
    """Per case, each backend against ``baseline`` (or the case's fastest ok backend)."""
    by_case: dict[str, list[Row]] = {}
    for r in rows:
        by_case.setdefault(r.case_id, []).append(r)
    out = []
    for case_id, rs in by_case.items():
        ok = [r for r in rs if _usable(r)]
        ref = next((r for r in ok if r.backend == baseline), None) if baseline else None
        if ref is None and ok:
            ref = min(ok, key=lambda r: _median(r.samples_ms))
        for r in rs:
            ratio = None
            if ref is not None and _usable(r) and r is not ref:
                ratio = compare_samples(r.samples_ms, ref.samples_ms)
            out.append(BackendComparison(case_id, r.backend, r.status, r.median_ms, ref.backend if ref else "", ratio))
    return out


def parse_fraction(text: str) -> float:
    """``10%`` -> 0.10; ``0.1`` -> 0.10. Raises ValueError with the accepted spellings."""
    s = str(text).strip()
    try:
        v = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise ValueError(f"{text!r}: expected a percentage like 10% or a fraction like 0.1") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{text!r}: must be a non-negative percentage or fraction")
    return v
