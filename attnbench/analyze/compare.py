"""Speedups between backends and between runs, with their uncertainty; the regression check.

Pure logic, no printing. The statistics (``significance.py``) use one number per timing
round and row, ``Row.timing.round_medians_ms``, never the calls of one round as if each were an
independent measurement:

* the *ratio* of two runs is the shift between their rounds' log times (> 1: slower), with
  an exact rank interval and p-value; with ``normalize_by`` each round's time is first
  divided by the normalizer backend's time in the same round, which cancels a machine that
  is faster, slower or busier than the one the baseline came from, and slow spells of it;
* the ratio of two backends of one run pairs them round by round.

Rows of two runs are matched by ``Row.key`` (scenario, case, backend), never by position;
what the run as a whole must satisfy (same scenario, complete, every baseline case present)
is in ``coverage.py``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from attnbench.store.rows import Row, Status, is_oracle
from attnbench.analyze.significance import (
    REPORT_CONFIDENCE, Ratio, RoundsError, compare_paired, compare_runs, round_logs,
    rounds_needed,
)
from attnbench.analyze import ranks
from attnbench.analyze.normalizer import NormalizerError, normalizer_note, refuse_normalizer
from attnbench.analyze.gate_defaults import judge_noise
from attnbench.analyze.verdict import Thresholds, judge, thresholds_for
from attnbench.store.fingerprint import compare_fingerprints


class CompareError(ValueError):
    """The two sides cannot be compared (other device, unknown normalizer): a usage error."""


def ensure_same_device(current_fp: dict, baseline_fp: dict, allow_cross_device: bool) -> list[str]:
    """Raise CompareError on another device or host (the fields that differ, one by one) unless
    allowed; return the notes to print: fingerprints that differ (versions; the device too when
    allowed) and what could not be compared (a side that predates host fingerprints)."""
    d = compare_fingerprints(current_fp, baseline_fp)
    if not d.same_device and not allow_cross_device:
        raise CompareError(
            f"the runs were measured on different devices: {'; '.join(d.device)}; timings across devices "
            "(or hosts of one device name) are not comparable. "
            "Pass --allow-cross-device to compare anyway (with --normalize-by BACKEND to cancel the speed difference)"
        )
    return [f"fingerprints differ: {x}" for x in d.device + d.versions] + d.notes


def ensure_rows_same_device(current: Sequence[Row], baseline: Sequence[Row], allow_cross_device: bool) -> None:
    """Raise CompareError when a (case, backend) was measured on another device model in each
    run. A run spread over several devices (``--executor dask`` on a mixed cluster) can agree
    with another on the set of devices and still have put a case on another one."""
    if allow_cross_device:
        return
    base = {r.key: r.id.device for r in baseline if r.id.device}
    moved = [(r, base[r.key]) for r in current if r.id.device and base.get(r.key, r.id.device) != r.id.device]
    if moved:
        r, was = moved[0]
        raise CompareError(
            f"{len(moved)} row(s) were measured on different devices in the two runs, e.g. "
            f"{r.id.case_id} · {r.id.backend}: {was!r} (baseline) vs {r.id.device!r}; "
            "timings across devices are not comparable. "
            "Pass --allow-cross-device to compare anyway (with --normalize-by BACKEND to cancel the speed difference)"
        )


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
    return {(r.id.scenario, r.id.case_id): r for r in rows if r.id.backend == backend}


def _usable(r: Optional[Row]) -> bool:
    return r is not None and r.status is Status.OK and len(r.timing.round_medians_ms) > 0


# ---------------------------------------------------------------------------- check
@dataclass
class CaseResult:
    """One matched (or unmatched) key and what the check says about it. Verdicts of a compared
    pair (``verdict.judge``, the rule every command uses):

    - ``regressed``: slower beyond both thresholds, and the interval lies above 1 (fails)
    - ``slower``: slower (the interval lies above 1), but within a threshold
    - ``same``: not significant, and the interval lies within ±5%
    - ``unclear``: not significant, but the interval is too wide to call it the same
    - ``faster``: faster (the interval lies below 1)

    and of the statuses:

    - ``broken``: was ok, now mismatch or error (fails)
    - ``fixed``: was failing or skipped, now ok
    - ``still failing``: failing in both runs
    - ``skipped``: skipped now, was ok: not measured (fails)
    - ``unchanged``: not ok in either run with the same status
    - ``new``: only in the current run (fails with ``strict``)
    - ``vanished``: only in the baseline: not measured (fails)
    - ``normalizer``: the normalizer itself (ratio 1 by definition)
    - ``unnormalized``: the normalizer has no ok rounds in this case: not compared (fails)
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
    ratio: Optional[Ratio] = None  # normalized when the check is (the one the verdict follows)
    delta_ms: float = math.nan  # current - baseline as it would be on this machine (ratio applied)
    note: str = ""
    raw_ratio: Optional[Ratio] = None  # with a normalizer: the ratio of the times themselves
    normalized_by: str = ""  # with a normalizer: what each round was divided by, its times in both runs
    spread: float = math.nan  # the larger robust spread of the two sides' round values (log units; a gate's check)
    noisy: bool = False  # spread x gate_defaults.NOISY reaches the slowdown to fail: a false alarm is likely


@dataclass
class CheckResult:
    cases: list[CaseResult]
    normalize_by: Optional[str]
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # run-level failures (coverage.py)

    @property
    def failures(self) -> list[CaseResult]:
        return [c for c in self.cases if c.failed]

    @property
    def failed(self) -> bool:
        return bool(self.failures or self.problems)

    def count(self, verdict: str) -> int:
        return sum(c.verdict == verdict for c in self.cases)


def _status_verdict(res: CaseResult, cur: Row, base: Row) -> bool:
    """Verdicts decided by the statuses alone; True when one was given."""
    if base.status is Status.OK and cur.status.failed:
        res.verdict, res.failed, res.note = "broken", True, cur.reason
    elif base.status is not Status.OK and cur.status is Status.OK:
        res.verdict, res.note = "fixed", f"was {base.status}: {base.reason}".strip()
    elif base.status is Status.OK and cur.status is Status.SKIPPED:
        res.verdict, res.failed, res.note = "skipped", True, cur.reason
    elif cur.status is not Status.OK:
        res.verdict = "still failing" if cur.status.failed else "unchanged"
        res.note = cur.reason
    else:
        return False
    return True


def _enough_rounds(cur: Row, x, y, confidence: float, paired: bool = False) -> None:
    if (ranks.min_p(min(len(x), len(y))) if paired else ranks.min_p(len(x), len(y))) > 1 - confidence:
        need = rounds_needed(confidence, paired)
        raise CompareError(
            f"{cur.id.case_id} · {cur.id.backend}: {len(x)} timing round(s) in the run and {len(y)} in the baseline; "
            f"with fewer than {need} per side no difference can be significant at {confidence:.0%}. "
            f"Set timing.rounds in the scenario (e.g. --set timing.rounds={max(need, 10)}) for the run and the baseline"
        )


def _judge(cur: Row, base: Row, cn: Optional[Row], bn: Optional[Row], th: Thresholds, norm: Optional[str],
           gate: bool, paired: bool = False) -> CaseResult:
    res = CaseResult(
        cur.id.scenario, cur.id.case_id, cur.id.backend, verdict="", failed=False,
        baseline_status=base.status, current_status=cur.status,
        baseline_ms=base.timing.median_ms, current_ms=cur.timing.median_ms,
    )
    if _status_verdict(res, cur, base):
        return res
    if norm and cur.id.backend == norm:
        res.verdict = "normalizer"
        return res
    if norm and not (_usable(cn) and _usable(bn)):
        res.verdict, res.failed = "unnormalized", gate  # not compared: a gate must not pass on it
        res.note = f"{norm} is not ok in this case in both runs: not compared"
        return res
    try:
        x, y = round_logs(cur, cn if norm else None), round_logs(base, bn if norm else None)
    except RoundsError as e:
        res.verdict, res.failed, res.note = "unnormalized", gate, f"{e}: not compared"
        return res
    if gate:
        _enough_rounds(cur, x, y, th.confidence, paired)
    ratio = compare_paired if paired else compare_runs
    try:
        r = res.ratio = ratio(x, y, th.confidence)
    except RoundsError as e:  # paired rounds of unequal count
        res.verdict, res.failed, res.note = "unnormalized", gate, f"{e}: not compared"
        return res
    if norm:
        res.raw_ratio = ratio(round_logs(cur), round_logs(base), th.confidence)
        res.normalized_by = normalizer_note(norm, cn, bn)
    j = judge(r, cur.timing.median_ms, th)  # the one verdict rule (analyze/verdict.py)
    res.verdict, res.failed, res.note, res.delta_ms = j.verdict, j.failed, j.note, j.delta_ms
    if res.raw_ratio is not None and _disagree(r, res.raw_ratio):
        how = "faster" if res.raw_ratio.ratio < 1 else "slower"
        res.note = (f"{res.note}; " if res.note else "") + (
            f"the times themselves are {res.raw_ratio.ratio:.3f}× ({how}): the verdict comes from {norm}, {res.normalized_by}")
    if gate and not paired:  # paired rounds (compare commits): the interval is made of the very
        # scatter of head against base round by round, no level of another run to wander from
        _judge_noise(res, x, y, th)
    return res


def _judge_noise(res: CaseResult, x, y, th: Thresholds) -> None:
    """Mark (and note) a case whose own rounds scatter so much that unchanged code is likely
    to fail the threshold now and then (``gate_defaults.NOISY``)."""
    res.spread, res.noisy, note = judge_noise(x, y, res.current_ms, th.max_slowdown, th.min_delta_ms, res.scenario)
    if note:
        res.note = (f"{res.note}; " if res.note else "") + note


def _disagree(norm: Ratio, raw: Ratio) -> bool:
    """The normalized and the raw ratio point opposite ways (one above 1, the other below)."""
    return (norm.ratio > 1) != (raw.ratio > 1) and (norm.significant or raw.significant)


def check(
    current: Sequence[Row],
    baseline: Sequence[Row],
    thresholds: Thresholds = Thresholds(),
    normalize_by: Optional[str] = None,
    gate: bool = True,
    paired: bool = False,
) -> CheckResult:
    """Judge every case of ``current`` against ``baseline`` (matched by key). ``gate``:
    refuse (CompareError) rows with too few rounds to ever show a significant difference,
    and fail vanished (and, with ``strict``, new) cases; off for a plain report. ``paired``:
    round k of one side was measured next to round k of the other (``compare commits``), so
    the rounds are compared pair by pair (signed ranks) rather than as two samples."""
    if normalize_by and not any(r.id.backend == normalize_by for r in baseline):
        have = ", ".join(sorted({r.id.backend for r in baseline})) or "none"
        raise CompareError(f"--normalize-by {normalize_by}: the baseline has no rows of that backend (it has: {have})")
    try:
        refuse_normalizer(normalize_by, current, baseline)
    except NormalizerError as e:
        raise CompareError(str(e)) from None
    m = match_rows(current, baseline)
    cn, bn = _norm_rows(current, normalize_by), _norm_rows(baseline, normalize_by)
    out = []
    for cur, base in m.pairs:
        ck = (cur.id.scenario, cur.id.case_id)
        out.append(_judge(cur, base, cn.get(ck), bn.get(ck), thresholds, normalize_by, gate, paired))
    for r in m.new:
        out.append(CaseResult(r.id.scenario, r.id.case_id, r.id.backend, "new", gate and thresholds.strict,
                              current_status=r.status, current_ms=r.timing.median_ms))
    for r in m.vanished:
        out.append(CaseResult(r.id.scenario, r.id.case_id, r.id.backend, "vanished", gate,
                              baseline_status=r.status, baseline_ms=r.timing.median_ms))
    return CheckResult(out, normalize_by)


def report_runs(current: Sequence[Row], baseline: Sequence[Row], normalize_by: Optional[str] = None) -> CheckResult:
    """Two runs as ``compare runs`` and ``report`` show them: ``check``'s verdicts with the
    thresholds it uses without flags (``verdict.thresholds_for``), nothing marked failed (a
    report, not a gate)."""
    res = check(current, baseline, thresholds_for(current, baseline), normalize_by, gate=False)
    for c in res.cases:
        c.failed = False
    return res


# ---------------------------------------------------------------------------- backends
@dataclass
class BackendComparison:
    case_id: str
    backend: str
    status: str
    median_ms: float
    reference: str  # the backend it is compared with
    ratio: Optional[Ratio]  # this / reference, paired by round; None for the reference itself


def compare_backends(
    rows: Sequence[Row], baseline: Optional[str] = None, confidence: float = REPORT_CONFIDENCE
) -> list[BackendComparison]:
    """Per case, each backend against ``baseline`` (or the case's fastest ok backend, the
    oracle left out unless it is the ``baseline`` asked for), the two paired round by round
    (they took turns in the same rounds)."""
    by_case: dict[str, list[Row]] = {}
    for r in rows:
        by_case.setdefault(r.id.case_id, []).append(r)
    out = []
    for case_id, rs in by_case.items():
        ok = [r for r in rs if _usable(r)]
        ref = next((r for r in ok if r.id.backend == baseline), None) if baseline else None
        rivals = [r for r in ok if not is_oracle(r.id.backend)] or ok
        if baseline is None and rivals:  # a baseline asked for and not ok here: nothing to compare with
            ref = min(rivals, key=lambda r: r.timing.median_ms)
        for r in rs:
            ratio = None
            if ref is not None and _usable(r) and r is not ref:
                try:
                    ratio = compare_paired(round_logs(r), round_logs(ref), confidence)
                except RoundsError:
                    ratio = None
            out.append(BackendComparison(case_id, r.id.backend, r.status, r.timing.median_ms,
                                         ref.id.backend if ref else "", ratio))
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
