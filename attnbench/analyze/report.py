"""The HTML report of one or more runs (``attnbench report``): one self-contained file.

Sections: the environment of each run (device, versions, options from its typed Manifest),
the run table (every row of every run: status and reason, times, roofline, error, the repro
command; sortable and filterable by the script of ``report_page``), the comparison (two or
more runs: the last against the first with ``compare.check``'s verdicts and round intervals;
several backends in a run: ``compare.compare_backends``' paired ratios), per-case bars, the
roofline with the ceilings ``plots.ceilings_of`` reads from the rows, and optionally a history
(``history_view``). Nothing is fetched at view time: the charts are inline SVG.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Optional, Sequence

from attnbench.analyze.compare import CheckResult, CompareError, compare_backends, report_runs
from attnbench.analyze.plots import ceilings_of
from attnbench.analyze.report_page import page
from attnbench.analyze.coverage import scenario_change
from attnbench.analyze.significance import REPORT_CONFIDENCE, rounds_needed
from attnbench.analyze.svg_charts import case_bars, color, roofline
from attnbench.store.manifest import Manifest, load_note
from attnbench.store.options import options_to_json
from attnbench.store.columns import COLUMNS as REGISTRY, context_of
from attnbench.store.rows import Row, Status


@dataclass
class RunData:
    """One run as the report reads it: a label (its folder name), manifest and rows."""

    label: str
    manifest: Manifest
    rows: list[Row]


def _num(v, fmt="{:.4g}") -> tuple[str, str]:
    """(shown text, sort value) of a number; blanks for NaN/None."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "", ""
    return fmt.format(v), repr(float(v))


def _td(text: str, sort: Optional[str] = None, cls: str = "") -> str:
    attrs = (f' data-v="{escape(sort)}"' if sort is not None else "") + (f' class="{cls}"' if cls else "")
    return f"<td{attrs}>{text}</td>"


def _ratio_text(r) -> str:
    if r is None:
        return ""
    if unbounded(r):
        return f"{r.ratio:.3f} [no interval: {r.rounds} rounds are too few at {r.confidence:.0%}]"
    return f"{r.ratio:.3f} [{r.lo:.3f}, {r.hi:.3f}]"


def unbounded(r) -> bool:
    """The interval is [0, inf]: with so few rounds the exact rank test's smallest p is above
    1 - confidence (5 paired rounds: 2/32 = 0.0625 > 0.05), so no data could bound the ratio;
    a 19x gap read "[0.000, inf] unclear"."""
    return not (r.lo > 0 and math.isfinite(r.hi))


def _scenarios_differ(base: RunData, cur: RunData) -> Optional[str]:
    """Why the last run is not compared with the first: other scenarios (by name, by text, by
    --set overrides), as attnbench check refuses them; None when they are the same scenario."""
    names = (base.manifest.scenario or "?", cur.manifest.scenario or "?")
    if names[0] != names[1]:
        return f"they are runs of different scenarios ({names[0]!r} and {names[1]!r}): their cases are not the same"
    if base.manifest.scenario_sha256 and cur.manifest.scenario_sha256:
        why = scenario_change(cur.manifest, base.manifest)
        return why.replace("the baseline", base.label).replace("the run's", f"{cur.label}'s") if why else None
    return None


# ---------------------------------------------------------------------------- environment
def _env_rows(m: Manifest) -> list[tuple[str, str]]:
    env = m.environment or {}
    out = [("device", m.device or "?"), ("attnbench", m.attnbench or "?"), ("scenario", m.scenario or "?"),
           ("scenario sha256", (m.scenario_sha256 or "")[:16]), ("started", m.start_time or ""),
           ("status", m.status or "")]
    out += [(k, str(v)) for k, v in env.items() if k != "device" and not isinstance(v, (dict, list))]
    for k, v in env.items():
        if isinstance(v, dict):
            out += [(f"{k}.{kk}", str(vv)) for kk, vv in v.items()]
    if m.options is not None:
        out += [(f"option {k}", str(v)) for k, v in options_to_json(m.options).items()
                if v not in (None, False, {}, [])]
    out += [("overrides", " ".join(m.overrides))] if m.overrides else []
    load = m.load or {}
    out += [(f"load average at {w}", " ".join(map(str, load[w])) + f" (1, 5, 15 min; {load.get('cores')} cores)")
            for w in ("start", "end") if isinstance(load.get(w), list)]
    out += [("command", m.command or "")]
    return out


def environment_section(runs: Sequence[RunData]) -> str:
    parts = ["<h2>Environment</h2>"]
    for run in runs:
        cells = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in _env_rows(run.manifest))
        busy = load_note(run.manifest)
        parts.append(f'<h3>{escape(run.label)}</h3>' + (f'<p class="note">{escape(busy)}</p>' if busy else "")
                     + f'<table class="env" data-run="{escape(run.label)}">{cells}</table>')
    return "\n".join(parts)


# ---------------------------------------------------------------------------- run table
def columns() -> list[tuple[str, str]]:
    """(data-col, header) of the run table: the row's identity and outcome, the column
    registry's columns (store/columns.py), the count of timing rounds and the repro command."""
    return [("run", "run"), ("case", "case"), ("backend", "backend"), ("status", "status"), ("reason", "reason"),
            ("batch", "batch"), *((c.name, c.header) for c in REGISTRY), ("rounds", "rounds"), ("repro", "repro")]


def _row_cells(label: str, r: Row, ctx: dict) -> list[str]:
    cells = [_td(escape(label)), _td(escape(r.id.case_id)), _td(escape(r.id.backend)),
             _td(escape(r.status.value)), _td(escape(r.reason)), _td(escape(r.workload.batch))]
    for c in REGISTRY:  # shown as every table shows it, sorted by the raw value
        v = c.value(r, ctx)
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        sort = (repr(float(v)) if math.isfinite(v) else "") if number else None
        cells.append(_td(escape(c.text(r, ctx)), sort, "num" if number else ""))
    cells.append(_td(str(len(r.timing.round_medians_ms)), str(len(r.timing.round_medians_ms)), "num"))
    cells.append(_td(f"<code>{escape(r.id.repro)}</code>" if r.id.repro else "", r.id.repro, "repro"))
    return cells


def _select(ident: str, label: str, values: list[str]) -> str:
    opts = "".join(f'<option value="{escape(v)}">{escape(v)}</option>' for v in values)
    return f'<label>{label} <select id="{ident}"><option value="">all</option>{opts}</select></label>'


def run_table_section(runs: Sequence[RunData]) -> str:
    ctxs = [context_of(run.rows) for run in runs]  # "vs best": within its own run
    all_rows = [(run.label, r, ctx) for run, ctx in zip(runs, ctxs) for r in run.rows]
    head = "".join(f'<th data-col="{c}">{escape(t)}</th>' for c, t in columns())
    body = []
    for label, r, ctx in all_rows:
        attrs = (f'data-backend="{escape(r.id.backend)}" data-case="{escape(r.id.case_id)}" '
                 f'class="status-{r.status.value}"')
        body.append(f"<tr {attrs}>" + "".join(_row_cells(label, r, ctx)) + "</tr>")
    backends = sorted({r.id.backend for _, r, _ in all_rows})
    cases = list(dict.fromkeys(r.id.case_id for _, r, _ in all_rows))
    filters = (f'<div class="filters">{_select("f-backend", "backend", backends)}{_select("f-case", "case", cases)}'
               f'<span class="note"><span id="shown">{len(all_rows)}</span> of {len(all_rows)} rows shown; '
               "click a header to sort</span></div>")
    return (f"<h2>Rows</h2>{filters}<table id=\"runs\" class=\"sortable\"><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


# ---------------------------------------------------------------------------- comparison
def runs_check(base: RunData, cur: RunData) -> CheckResult:
    """``cur`` against ``base`` as ``attnbench check`` without flags judges it (the thresholds
    ``verdict.thresholds_for`` gives their rows); CompareError when they cannot be compared."""
    return report_runs(cur.rows, base.rows)


def _runs_comparison(base: RunData, cur: RunData) -> str:
    differ = _scenarios_differ(base, cur)
    if differ:
        return (f'<h3>{escape(cur.label)} against {escape(base.label)}</h3><p class="note" data-not-compared="scenario">'
                f"not compared: {escape(differ)}; the ratios would compare workloads, not code "
                "(attnbench check refuses them too)</p>")
    try:
        res = runs_check(base, cur)
    except CompareError as e:
        return f'<p class="note">{escape(base.label)} vs {escape(cur.label)}: not compared: {escape(str(e))}</p>'
    warn = ""
    if base.manifest.device and cur.manifest.device and base.manifest.device != cur.manifest.device:
        warn = (f'<p class="note">measured on different devices ({escape(base.manifest.device)} vs '
                f'{escape(cur.manifest.device)}): the ratios compare machines, not code</p>')
    head = "".join(f"<th>{t}</th>" for t in ("case", "backend", "verdict", f"{escape(base.label)} ms",
                                               f"{escape(cur.label)} ms", "ratio [interval]", "p", "rounds"))
    body = []
    for c in res.cases:
        ratio = c.ratio
        cells = [_td(escape(c.case_id)), _td(escape(c.backend)),
                 _td(escape(c.verdict), None, f"verdict-{c.verdict.replace(' ', '-')}"),
                 _td(*_num(c.baseline_ms), "num"), _td(*_num(c.current_ms), "num"),
                 _td(_ratio_text(ratio), repr(ratio.ratio) if ratio else "", "num"),
                 _td(*_num(ratio.p if ratio else None, "{:.2g}"), "num"), _td(escape(ratio.rounds if ratio else ""))]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<h3>{escape(cur.label)} against {escape(base.label)}</h3>{warn}"
            f'<p class="note">ratio = {escape(cur.label)} / {escape(base.label)} (&gt; 1: slower), the timing rounds as '
            f"replicates, {res.cases and next((c.ratio.confidence for c in res.cases if c.ratio), 0.99):.0%} "
            "interval and the verdicts of attnbench check without flags (docs/ci.md, \"The verdict\")</p>"
            f'<table class="sortable compare" data-compare="runs"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _backends_comparison(run: RunData) -> str:
    comps = compare_backends(run.rows, None, REPORT_CONFIDENCE)
    need = max(rounds_needed(REPORT_CONFIDENCE, paired=True), 10)
    head = "".join(f"<th>{t}</th>" for t in ("case", "backend", "status", "median ms", "against", "ratio [interval]",
                                               "p", "reading"))
    body = []
    for c in comps:
        r = c.ratio
        reading = "" if r is None else ("slower" if r.slower_for_sure else "faster" if r.faster_for_sure
                                         else "≈ same" if r.same else f"too few rounds (set timing.rounds={need})"
                                         if unbounded(r) else "unclear")
        cells = [_td(escape(c.case_id)), _td(escape(c.backend)), _td(escape(str(getattr(c.status, "value", c.status)))),
                 _td(*_num(c.median_ms), "num"), _td(escape(c.reference if r else "")),
                 _td(_ratio_text(r), repr(r.ratio) if r else "", "num"),
                 _td(*_num(r.p if r else None, "{:.2g}"), "num"), _td(reading)]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<h3>backends of {escape(run.label)}</h3>"
            f'<p class="note">each backend / the case\'s fastest, paired round by round, '
            f"{REPORT_CONFIDENCE:.0%} interval (attnbench compare backends)</p>"
            f'<table class="sortable compare" data-compare="backends"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def comparison_section(runs: Sequence[RunData]) -> str:
    parts = []
    if len(runs) >= 2:
        parts += [_runs_comparison(runs[0], cur) for cur in runs[1:]]
    for run in runs:
        if len({r.id.backend for r in run.rows if r.status is Status.OK}) >= 2:
            parts.append(_backends_comparison(run))
    return "<h2>Comparison</h2>" + "\n".join(parts) if parts else ""


# ---------------------------------------------------------------------------- charts
def _colors(runs: Sequence[RunData]) -> dict[str, str]:
    names = list(dict.fromkeys(r.id.backend for run in runs for r in run.rows))
    return {b: color(i) for i, b in enumerate(names)}


def bars_section(runs: Sequence[RunData]) -> str:
    colors = _colors(runs)
    by_case: dict[str, list] = {}  # one pass over the rows (a scan per case was quadratic: 10k rows took 6.4 s)
    for run in runs:
        for r in run.rows:
            label = f"{run.label} · {r.id.backend}" if len(runs) > 1 else r.id.backend
            by_case.setdefault(r.id.case_id, []).append((label, r))
    charts = [case_bars(case, series, colors) for case, series in by_case.items()]
    return ('<h2>Per case</h2><p class="note">median time per call; the whisker spans p20 to p80</p>'
            f'<div class="charts">{"".join(charts)}</div>')


def roofline_section(runs: Sequence[RunData]) -> str:
    colors = _colors(runs)
    charts = []
    for run in runs:
        pts = [r for r in run.rows if r.status is Status.OK and r.roofline.flops > 0 and r.roofline.bytes > 0]
        if not pts:
            continue
        bw, peak, source = ceilings_of(pts)
        svg = roofline(pts, bw, peak, source, colors)
        if svg:
            charts.append(f"<div><h3>{escape(run.label)}</h3>{svg}</div>")
    if not charts:
        return '<h2>Roofline</h2><p class="note">no ok row with FLOPs and bytes</p>'
    return f'<h2>Roofline</h2><div class="charts">{"".join(charts)}</div>'


def build_report(runs: Sequence[RunData], title: str = "", extra_sections: Sequence[str] = ()) -> str:
    """The whole HTML document of ``runs`` (``extra_sections``: HTML appended, e.g. a history)."""
    title = title or "attnbench report: " + ", ".join(run.label for run in runs)
    counts = {}
    for run in runs:
        for r in run.rows:
            counts[r.status.value] = counts.get(r.status.value, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    body = [f"<h1>{escape(title)}</h1>", f'<p class="note">{len(runs)} run(s): {escape(summary)}</p>',
            run_table_section(runs), comparison_section(runs), bars_section(runs), roofline_section(runs),
            *extra_sections, environment_section(runs)]
    return page(title, "\n".join(s for s in body if s))

