"""A decision (``analyze/decide.py``) as records, the engine's JSON, Markdown and an HTML section.

Times per step are the weighted mean: a total over the weighted steps divided by their weight
(with weights that are step counts, what one step of the trace costs on average).
"""
from __future__ import annotations

import math
from html import escape
from typing import Optional

from attnbench.analyze.decide import PARTS, CaseChoice, Decision, Gain, Total
from attnbench.analyze.tables import fmt_time
from attnbench.store.safe_text import md_text

FORMAT_VERSION = 1  # of the JSON document (``attnbench_decide``)


def _ok(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def fmt_gain(g: Optional[Gain]) -> str:
    """``1.23× [1.19, 1.27]`` (the interval left out when the rounds give none)."""
    if g is None or not _ok(g.ratio):
        return "-"
    return f"{g.ratio:.2f}×" + (f" [{g.lo:.2f}, {g.hi:.2f}]" if _ok(g.lo) and _ok(g.hi) else "")


def step_text(d: Decision) -> str:
    counted = " + ".join(d.parts)
    left = [p for p in PARTS if p not in d.parts]
    return counted + (f" ({' and '.join(left)} left out)" if left else "")


def picks_changed(d: Decision) -> int:
    """Cases whose pick by kernel time alone differs from the pick by step cost."""
    k = {c.case_id: c.pick.backend for c in d.kernel_only.cases if c.pick} if d.kernel_only else {}
    return sum(1 for c in d.cases if c.pick and c.case_id in k and k[c.case_id] != c.pick.backend)


def kernel_line(d: Decision) -> str:
    """What a kernel benchmark alone would have decided, against the step's decision."""
    k = d.kernel_only
    if k is None:
        return ""
    n = len([c for c in d.cases if c.pick])
    if k.best is None:
        said = "no single backend covers every case"
    elif k.best.vs_dispatch and all(c.pick.backend == k.best.backend for c in k.cases if c.pick):
        said = f"{k.best.backend} would be the pick for every shape"
    else:
        said = f"the best single backend would be {k.best.backend}, dispatching {fmt_gain(k.best.vs_dispatch)} over it"
    changed, extra = picks_changed(d), [p for p in d.parts if p != "kernel"]
    if not changed:
        return f"by kernel time alone: {said}; the same picks"
    return (f"by kernel time alone: {said}; {changed} of {n} pick(s) change when {' and '.join(extra)} "
            f"count{'s' if len(extra) == 1 else ''}")


def headline(d: Decision) -> str:
    """One sentence: what dispatching buys over the best single backend."""
    dis = d.dispatch
    if d.best is None:
        return (f"no single backend is ok in all {dis.cases} case(s); dispatching runs them all at "
                f"{fmt_time(dis.step.ms)} per step")
    if all(c.pick.backend == d.best.backend for c in d.cases if c.pick is not None):
        return (f"{d.best.backend} is the pick for every shape: dispatching buys nothing over it "
                f"({fmt_time(dis.step.ms)} per step, {step_text(d)}, weighted over {dis.weight:g} step(s))")
    return (f"dispatching buys {fmt_gain(d.best.vs_dispatch)} over {d.best.backend} alone: "
            f"{fmt_time(dis.step.ms)} against {fmt_time(d.best.step.ms)} per step "
            f"({step_text(d)}, weighted over {dis.weight:g} step(s))")


def shape_keys(d: Decision) -> dict[str, str]:
    """case id -> the key an engine looks its batch up by: the batch text when no two cases
    share it, else the batch text and the case id."""
    shapes = [c.shape for c in d.cases]
    return {c.case_id: c.shape if c.shape and shapes.count(c.shape) == 1 else f"{c.shape} | {c.case_id}"
            for c in d.cases}


def total_record(t: Total) -> dict:
    g = t.vs_dispatch
    return {"backend": t.backend, "cases": t.cases, "weight": t.weight, "full": t.full,
            "per_step_ms": t.step.ms, "lo_ms": t.step.lo, "hi_ms": t.step.hi,
            "total_ms": t.step.ms * t.weight, "plan_ms": t.plan, "convert_ms": t.convert, "kernel_ms": t.kernel,
            "plan_share": (t.plan + t.convert) / t.step.ms if t.step.ms > 0 else math.nan,
            "vs_dispatch": g.ratio if g else math.nan, "vs_lo": g.lo if g else math.nan, "vs_hi": g.hi if g else math.nan}


def case_record(c: CaseChoice, key: str) -> dict:
    p, ru = c.pick, c.runner_up
    return {"key": key, "case_id": c.case_id, "shape": c.shape, "params": c.params, "weight": c.weight,
            "backend": p.backend if p else None, "route": p.route if p else "",
            "step_ms": p.step if p else math.nan, "plan_ms": p.plan if p else math.nan,
            "convert_ms": p.convert if p else math.nan, "kernel_ms": p.kernel if p else math.nan,
            "runner_up": c.costs[1].backend if len(c.costs) > 1 else None,
            "runner_up_ratio": ru.ratio if ru else math.nan, "lo": ru.lo if ru else math.nan,
            "hi": ru.hi if ru else math.nan, "verdict": c.verdict or None, "tie": c.tie if ru else False, "kernel_pick": c.kernel_pick or None,
            "candidates": {x.backend: x.step for x in c.costs}, "not_ok": c.not_ok}


def _clean(v):
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def json_doc(d: Decision, run: str, scenario: str, device: str) -> dict:
    """The document an engine loads: ``dispatch`` maps each shape key to the backend spec to run
    (``-b`` spelling, options included); the rest says how sure and what it buys."""
    keys = shape_keys(d)
    best = d.best
    return _clean({
        "attnbench_decide": FORMAT_VERSION, "run": run, "scenario": scenario, "device": device,
        "step": step_text(d), "confidence": d.confidence, "rounds": d.rounds,
        "dispatch": {keys[c.case_id]: c.pick.backend for c in d.cases if c.pick is not None},
        "best_single": best.backend if best else None,
        "gain": ({"over": best.backend, "ratio": best.vs_dispatch.ratio, "lo": best.vs_dispatch.lo,
                  "hi": best.vs_dispatch.hi} if best and best.vs_dispatch else None),
        "dispatch_total": total_record(d.dispatch), "backends": [total_record(t) for t in d.totals],
        "cases": [case_record(c, keys[c.case_id]) for c in d.cases], "notes": d.notes,
        "kernel_only": ({"best_single": d.kernel_only.best.backend if d.kernel_only.best else None,
                         "gain": fmt_gain(d.kernel_only.best.vs_dispatch) if d.kernel_only.best else None,
                         "picks_changed": picks_changed(d)} if d.kernel_only else None),
    })


BACKEND_HEAD = ["backend", "covers", "per step", "interval", "plan", "convert", "kernel", "plan+convert share", "÷ dispatch"]
CASE_HEAD = ["shape", "weight", "pick", "step", "plan", "convert", "kernel", "runner-up", "runner-up ÷ pick"]


def backend_cells(t: Total, of_cases: int, of_weight: float) -> list[str]:
    r = total_record(t)
    interval = f"[{fmt_time(r['lo_ms'])}, {fmt_time(r['hi_ms'])}]" if _ok(r["lo_ms"]) and _ok(r["hi_ms"]) else "-"
    name = t.backend + ("" if t.full else " (partial)")
    return [name, f"{t.cases}/{of_cases} ({t.weight:g}/{of_weight:g})", fmt_time(r["per_step_ms"]), interval,
            fmt_time(r["plan_ms"]), fmt_time(r["convert_ms"]), fmt_time(r["kernel_ms"]),
            f"{r['plan_share']:.0%}" if _ok(r["plan_share"]) else "-", fmt_gain(t.vs_dispatch)]


def case_cells(c: CaseChoice) -> list[str]:
    p = c.pick
    if p is None:
        why = ", ".join(f"{b} {s}" for b, s in c.not_ok.items())
        return [c.shape or c.case_id, f"{c.weight:g}", f"none ok ({why})", "-", "-", "-", "-", "-", "-"]
    pick = p.backend + (f" ({p.route})" if p.route else "") + (" ≈" if c.runner_up and c.tie else "")
    if c.kernel_pick:
        pick += f"; plan decides (kernel alone: {c.kernel_pick})"
    return [c.shape or c.case_id, f"{c.weight:g}", pick, fmt_time(p.step), fmt_time(p.plan), fmt_time(p.convert),
            fmt_time(p.kernel), c.costs[1].backend if len(c.costs) > 1 else "-", fmt_gain(c.runner_up)]


def tables(d: Decision) -> tuple[list[list[str]], list[list[str]]]:
    """(backend rows with the dispatch last, case rows) as shown text."""
    dis = d.dispatch
    rows = [backend_cells(t, dis.cases, dis.weight) for t in d.totals]
    rows.append(backend_cells(dis, dis.cases, dis.weight))
    crows = [case_cells(c) for c in sorted(d.cases, key=lambda c: -c.weight)]
    if "convert" not in d.parts:  # left out: not a zero
        for table, head in ((rows, BACKEND_HEAD), (crows, CASE_HEAD)):
            for r in table:
                r[head.index("convert")] = "-"
    return rows, crows


def legend(d: Decision) -> str:
    return (f"step = {step_text(d)}, weighted mean per step; intervals: {d.confidence:.0%} over "
            f"{d.rounds or 'differing'} timing round(s), each estimate the center of its interval's statistic; "
            "≈: the runner-up's verdict is same or unclear (its interval holds 1: a tie); "
            "plan+convert share: the part of the step outside the kernel; ÷ dispatch: the backend's total over the dispatch's")


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(map(md_text, head)) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return out + ["| " + " | ".join(md_text(x) for x in r) + " |" for r in rows]


def markdown(d: Decision, title: str) -> str:
    """The decision for a pull request or a note: headline, per-backend table, dispatch table."""
    brows, crows = tables(d)
    lines = [f"### {md_text(title)}", "", f"**{md_text(headline(d))}**", "", md_text(kernel_line(d)), "",
             *_md_table(BACKEND_HEAD, brows), "", *_md_table(CASE_HEAD, crows), "", f"_{md_text(legend(d))}_"]
    lines += [""] + [f"- {md_text(n)}" for n in d.notes] if d.notes else []
    return "\n".join(lines) + "\n"


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(x)}</td>" for x in r) + "</tr>" for r in rows)
    return f'<table class="decide"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def html_section(d: Decision, label: str) -> str:
    """The report's section for one run (``attnbench report``)."""
    brows, crows = tables(d)
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in d.notes)
    return (f"<h3>decision for {escape(label)}</h3><p><b>{escape(headline(d))}</b></p><p>{escape(kernel_line(d))}</p>"
            f"{_html_table(BACKEND_HEAD, brows)}{_html_table(CASE_HEAD, crows)}"
            f'<p class="note">{escape(legend(d))} (attnbench decide)</p>{notes}')


def report_section(runs) -> str:
    """``attnbench report``'s decision section: one per run whose scenario gives weights (an
    imported trace) and that has a competitor ok; "" when no run has one. ``runs``: objects with
    ``label``, ``manifest`` and ``rows`` (``analyze.report.RunData``)."""
    from attnbench.analyze.case_weights import WeightsError, run_weights
    from attnbench.analyze.decide import DecideError, decide

    parts = []
    for run in runs:
        try:
            weights = run_weights(run.manifest, run.rows, run.label)
            if not weights.weighted:
                continue
            d = decide(run.rows, weights.by_case)
        except (WeightsError, DecideError):
            continue  # a run without weights or competitors has no decision to show
        d.notes[:0] = weights.notes
        parts.append(html_section(d, run.label))
    if not parts:
        return ""
    return ('<h2>Decision</h2><p class="note">per batch shape the fastest ok backend, weighted by each shape\'s '
            "steps (the scenario's weights), and what dispatching buys over one backend for all "
            "(docs/decide.md)</p>" + "".join(parts))
