"""Trends of a history (``store.history``): per (scenario, case, backend), its points oldest
first, each judged against the point before it by the regression gate's own ``compare.check``
(the timing rounds as replicates, the 99% interval, and the thresholds ``check`` uses without
flags: ``verdict.thresholds_for``, 20% on a CPU and 10% on a GPU), so a trend reads the way
``attnbench check`` would have on that night. A point measured on another device
(or another host of the same device name, by the host fields both runs recorded), with
another scenario text or other ``--set`` overrides than the one before is not compared (its
note says why).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Callable, Optional, Sequence

from attnbench.analyze.compare import CaseResult, CompareError, check
from attnbench.analyze.verdict import Thresholds, thresholds_for
from attnbench.analyze.svg_charts import trend
from attnbench.store.fingerprint import compare_fingerprints
from attnbench.store.history import Point

Key = tuple[str, str, str]  # scenario, case, backend


@dataclass
class Step:
    point: Point
    result: Optional[CaseResult]  # against the point before (None: the first, or not comparable)
    note: str = ""


def trends(pts: Sequence[Point], pick: Optional[Callable[..., bool]] = None,
           thresholds: Optional[Thresholds] = None) -> dict[Key, list[Step]]:
    """The steps of every (scenario, case, backend) ``pick(case_id, backend, params)`` keeps,
    judged by ``thresholds`` (default: what ``check`` uses without flags on the two points' rows)."""
    by_key: dict[Key, list[Point]] = {}
    for p in pts:
        if pick is None or pick(p.row.id.case_id, p.row.id.backend, p.row.workload.params):
            by_key.setdefault(p.row.key, []).append(p)
    return {key: _steps(ps, thresholds) for key, ps in by_key.items()}


def _steps(ps: list[Point], thresholds: Optional[Thresholds]) -> list[Step]:
    out = [Step(ps[0], None)]
    for prev, cur in zip(ps, ps[1:]):
        if prev.run.device != cur.run.device:
            out.append(Step(cur, None, f"device changed ({prev.run.device} -> {cur.run.device}): not compared"))
            continue
        host = compare_fingerprints(cur.run.fingerprint, prev.run.fingerprint).device
        if host:  # the same device name on another machine (the host fields both runs recorded)
            out.append(Step(cur, None, f"host changed ({'; '.join(host).replace('(baseline) vs', '->')}): not compared"))
            continue
        if prev.run.scenario_sha256 != cur.run.scenario_sha256:
            out.append(Step(cur, None, f"scenario text changed (sha256 {prev.run.scenario_sha256[:12]} -> "
                                       f"{cur.run.scenario_sha256[:12]}): not compared"))
            continue
        sets = _overrides_changed(prev.run.overrides, cur.run.overrides)
        if sets:
            out.append(Step(cur, None, f"--set overrides changed ({sets}): not compared"))
            continue
        try:
            th = thresholds or thresholds_for([prev.row], [cur.row])
            res = check([cur.row], [prev.row], th, gate=False).cases[0]
        except CompareError as e:
            out.append(Step(cur, None, str(e)))
            continue
        out.append(Step(cur, res, res.note))
    return out


def _overrides_changed(prev: Optional[list[str]], cur: Optional[list[str]]) -> str:
    """How two points' --set overrides differ ("" when alike). A point stored before overrides
    were recorded (None) is alike only to a point without any."""
    def shown(o: Optional[list[str]]) -> str:
        return "not recorded" if o is None else " ".join(f"--set {x}" for x in o) or "none"
    if (prev or []) == (cur or []):
        return ""
    return f"{shown(prev)} -> {shown(cur)}"


def ratio_text(res: Optional[CaseResult]) -> str:
    r = res.ratio if res else None
    if r is None or not math.isfinite(r.ratio):
        return ""
    return f"{r.ratio:.3f} [{r.lo:.3f}, {r.hi:.3f}]"


def step_cells(s: Step) -> list[str]:
    """started, commit, device, status, median ms, ratio to the previous point, p, verdict, note."""
    r = s.point.row
    res = s.result
    med = f"{r.timing.median_ms:.4g}" if math.isfinite(r.timing.median_ms) else ""
    p = f"{res.ratio.p:.2g}" if res and res.ratio else ""
    return [s.point.run.started[:19], _short_commit(s.point.run.git_commit), s.point.run.device, r.status.value, med,
            ratio_text(res), p, res.verdict if res else "", s.note or (r.reason if r.status.value != "ok" else "")]


def _short_commit(c: Optional[str]) -> str:
    """A commit's first 10 characters, its "+dirty" kept."""
    if not c:
        return ""
    sha, dirty, _ = c.partition("+dirty")
    return sha[:10] + ("+dirty" if dirty else "")


def step_record(key: Key, s: Step) -> dict:
    """One step as JSON (``history show --format json``): raw numbers, None where there are none."""
    r, res, run = s.point.row, s.result, s.point.run
    ratio = res.ratio if res else None

    def num(v):
        return v if isinstance(v, (int, float)) and math.isfinite(v) else None
    return {"scenario": key[0], "case": key[1], "backend": key[2], "started": run.started, "commit": run.git_commit,
            "device": run.device, "scenario_sha256": run.scenario_sha256, "overrides": run.overrides,
            "run": run.run_path, "status": r.status.value, "median_ms": num(r.timing.median_ms),
            "compared": res is not None, "verdict": res.verdict if res else None,
            "ratio": num(ratio.ratio) if ratio else None, "lo": num(ratio.lo) if ratio else None,
            "hi": num(ratio.hi) if ratio else None, "p": num(ratio.p) if ratio else None,
            "note": s.note or (r.reason if r.status.value != "ok" else "")}


STEP_HEADS = ["started", "commit", "device", "status", "median ms", "vs previous [99% interval]", "p", "verdict",
              "note"]


def _point_label(s: Step) -> str:
    """A point on the trend's x axis: its run's start (to the minute, UTC as stored) and commit."""
    run = s.point.run
    sha, dirty, _ = (run.git_commit or "").partition("+dirty")
    return f"{run.started[:16].replace('T', ' ')} {sha[:7]}{'+dirty' if dirty else ''}".strip()


def history_html(found: dict[Key, list[Step]], source: str) -> str:
    """The report's history section: per case a trend chart (a line per backend) and the steps."""
    if not found:
        return f'<h2>History</h2><p class="note">{escape(source)}: no stored point matches</p>'
    parts = [f'<h2>History</h2><p class="note">{escape(source)}; each point against the one before by the '
             "gate's statistics and verdicts (attnbench check without flags: timing rounds as replicates, 99% "
             "interval, 20% slowdown allowed on a CPU, 10% on a GPU)</p>"]
    cases: dict[tuple[str, str], list[Key]] = {}
    for key in found:
        cases.setdefault(key[:2], []).append(key)
    for (scen, case), keys in cases.items():
        lines = {k[2]: [(_point_label(s), s.point.row.timing.median_ms) for s in found[k]] for k in keys}
        svg = trend(f"{scen} · {case}: median time per point", lines)
        head = "".join(f"<th>{escape(h)}</th>" for h in ["backend", *STEP_HEADS])
        body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in [k[2], *step_cells(s)]) + "</tr>"
                       for k in keys for s in found[k])
        parts.append(f"<h3>{escape(scen)} · {escape(case)}</h3>{svg or ''}"
                     f'<table class="sortable history"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
    return "\n".join(parts)
