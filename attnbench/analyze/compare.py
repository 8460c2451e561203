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
from typing import Optional, Sequence

from attnbench.analyze.significance import Ratio, compare_samples, median
from attnbench.store.fingerprint import fingerprint_differences
from attnbench.store.rows import Row, Status


class CompareError(ValueError):
    """The two sides cannot be compared (other device, unknown normalizer): a usage error."""


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
    return r is not None and r.status is Status.OK and len(r.samples_ms) > 0


# ---------------------------------------------------------------------------- check
@dataclass
class Thresholds:
    max_slowdown: float = 0.10  # relative: 0.10 = 10% slower
    min_delta_ms: float = 0.002  # absolute, in ms (2 µs)
    strict: bool = False  # vanished cases and ok -> skipped fail too


@dataclass
class CaseResult:
    """One matched (or unmatched) key and what the check says about it. Verdicts:

    - ``regressed``: slower beyond both thresholds, and the samples say it is real
    - ``broken``: was ok, now mismatch or error
    - ``slower``: slower, but within a threshold or not significant
    - ``same``: indistinguishable from the baseline
    - ``faster``: faster, and the samples say it is real
    - ``fixed``: was failing or skipped, now ok
    - ``still failing``: failing in both runs
    - ``skipped``: skipped now (was ok)
    - ``unchanged``: not ok in either run with the same status
    - ``new``: only in the current run
    - ``vanished``: only in the baseline
    - ``normalizer``: the normalizer itself (ratio 1 by definition)
    - ``unnormalized``: the normalizer has no ok samples in this case
    """

    scenario: str
    case_id: str
    backend: str
    verdict: str  # one of the verdicts above
    failed: bool
    baseline_status: str = ""
    current_status: str = ""
    baseline_ms: float = math.nan
    current_ms: float = math.nan
    ratio: Optional[Ratio] = None
    delta_ms: float = math.nan  # current - baseline (baseline scaled by the normalizer)
    note: str = ""


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
    if base.status is Status.OK and cur.status.failed:
        res.verdict, res.failed, res.note = "broken", True, cur.reason
        return res
    if base.status is not Status.OK and cur.status is Status.OK:
        res.verdict, res.note = "fixed", f"was {base.status}: {base.reason}".strip()
        return res
    if base.status is Status.OK and cur.status is Status.SKIPPED:
        res.verdict, res.failed, res.note = "skipped", th.strict, cur.reason
        return res
    if cur.status is not Status.OK:
        res.verdict = "still failing" if cur.status.failed else "unchanged"
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
        expected = median(base.samples_ms) * median(cn.samples_ms) / median(bn.samples_ms)
    else:
        r = compare_samples(cur.samples_ms, base.samples_ms)
        expected = median(base.samples_ms)
    res.ratio = r
    res.delta_ms = median(cur.samples_ms) - expected
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
            CaseResult(r.scenario, r.case_id, r.backend, "vanished", thresholds.strict and r.status is Status.OK,
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
            ref = min(ok, key=lambda r: median(r.samples_ms))
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
