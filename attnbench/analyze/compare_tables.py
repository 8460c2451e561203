"""Presentation of comparisons and checks: rich table, Markdown, CSV or JSON.

Each report is a list of records (raw numbers, for CSV/JSON) and a list of columns that say
how to show each field in a table or Markdown (formatted text). One ``render`` serves all
four formats, the way hyperfine's exporters share one interface.
"""
from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from rich.console import Console
from rich.text import Text

from attnbench.analyze.compare import BackendComparison, CaseResult, CheckResult
from attnbench.analyze.fit import NAME, PROSE as PROSE_KIND, VALUE, Col as FitCol, print_fitted
from attnbench.analyze.significance import Ratio
from attnbench.analyze.tables import FORMATS, fmt_time  # noqa: F401  (FORMATS re-exported)
from attnbench.store.rows import Status
from attnbench.store.safe_text import md_text

VERDICT_STYLE = {
    "regressed": "bold red", "broken": "bold red", "slower": "yellow", "same": "dim", "unclear": "yellow",
    "faster": "green", "fixed": "green", "still failing": "red", "skipped": "yellow",
    "new": "cyan", "vanished": "magenta", "unnormalized": "yellow", "normalizer": "dim",
}


@dataclass
class Column:
    key: str
    header: str
    show: Callable[[Any], str] = str
    justify: str = "left"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def fmt_ratio(x: float) -> str:
    return f"{x:.3f}×" if _finite(x) else "-"


def fmt_interval(rec: dict) -> str:
    lo, hi = rec.get("lo"), rec.get("hi")
    return f"[{lo:.3f}, {hi:.3f}]" if _finite(lo) and _finite(hi) else "-"


def fmt_p(p: float) -> str:
    if not _finite(p):
        return "-"
    return "<1e-4" if p < 1e-4 else f"{p:.2g}"


def fmt_delta(ms: float) -> str:
    if not _finite(ms):
        return "-"
    return ("+" if ms >= 0 else "-") + fmt_time(abs(ms))


def _ratio_fields(r: Optional[Ratio]) -> dict:
    if r is None:
        return {"ratio": math.nan, "lo": math.nan, "hi": math.nan, "p": math.nan, "rounds": ""}
    return {"ratio": r.ratio, "lo": r.lo, "hi": r.hi, "p": r.p, "rounds": r.rounds}


# ---------------------------------------------------------------------------- records
def check_records(cases: Sequence[CaseResult]) -> list[dict]:
    out = []
    for c in cases:
        out.append({
            "scenario": c.scenario, "case": c.case_id, "backend": c.backend, "verdict": c.verdict,
            "failed": c.failed, "baseline_status": c.baseline_status, "current_status": c.current_status,
            "baseline_ms": c.baseline_ms, "current_ms": c.current_ms, **_ratio_fields(c.ratio),
            "delta_ms": c.delta_ms, "note": c.note,
            "raw_ratio": c.raw_ratio.ratio if c.raw_ratio else math.nan, "normalized_by": c.normalized_by,
        })
    return out


def check_columns(normalized: bool, confidence: float) -> list[Column]:
    """With a normalizer, the verdict's ratio is the normalized one: the table shows it beside
    the ratio of the times themselves and what each round was divided by, so that times that
    fell next to a "slower" verdict explain themselves."""
    rel = " (normalized)" if normalized else ""
    cols = [
        Column("case", "case"),
        Column("backend", "backend"),
        Column("verdict", "verdict"),
        Column("baseline_ms", "baseline", fmt_time, "right"),
        Column("current_ms", "current", fmt_time, "right"),
    ]
    if normalized:
        cols.append(Column("raw_ratio", "raw ratio", fmt_ratio, "right"))
    cols += [
        Column("ratio", "ratio" + rel, fmt_ratio, "right"),
        Column("_interval", f"{confidence:.0%} interval", justify="right"),
        Column("p", "p", fmt_p, "right"),
        Column("rounds", "rounds", justify="right"),
        Column("delta_ms", "Δ" + rel, fmt_delta, "right"),
    ]
    if normalized:
        cols.append(Column("normalized_by", "normalized by"))
    return cols + [Column("note", "note")]


def backend_verdict(status: str, r: Optional[Ratio]) -> str:
    """What a reader should take from one backend's ratio: only what its interval supports."""
    if status != Status.OK:
        return str(status)
    if r is None:
        return "baseline"  # the backend the others are compared with
    if r.significant:
        return f"{r.ratio:.2f}× slower" if r.ratio >= 1 else f"{1 / r.ratio:.2f}× faster"
    return "≈ same" if r.same else "unclear"


def backend_records(comps: Sequence[BackendComparison]) -> list[dict]:
    out = []
    for c in comps:
        r = c.ratio
        out.append({
            "case": c.case_id, "backend": c.backend, "status": c.status, "median_ms": c.median_ms,
            "vs": c.reference, **_ratio_fields(r), "significant": bool(r and r.significant),
            "verdict": backend_verdict(c.status, r),
        })
    return out


def backend_columns(confidence: float) -> list[Column]:
    return [
        Column("case", "case"),
        Column("backend", "backend"),
        Column("median_ms", "time", fmt_time, "right"),
        Column("vs", "vs"),
        Column("ratio", "ratio", fmt_ratio, "right"),
        Column("_interval", f"{confidence:.0%} interval", justify="right"),
        Column("p", "p", fmt_p, "right"),
        Column("rounds", "rounds", justify="right"),
        Column("verdict", "verdict"),
    ]


def run_pair_columns(normalized: bool, confidence: float) -> list[Column]:
    return check_columns(normalized, confidence)


# ---------------------------------------------------------------------------- render
def _cell(rec: dict, col: Column) -> str:
    if col.key == "_interval":
        return fmt_interval(rec)
    v = rec.get(col.key)
    return col.show(v) if v is not None else "-"


def json_value(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# Above this many rows a table is laid out here, as plain aligned text: rich measures and renders
# every cell of a Table (~1.5 ms a row: compare runs of 10k cases took 21 s, 100k about 4 min).
RICH_TABLE_ROWS = 2000


def plain_table(records: list[dict], columns: list[Column], title: str = "") -> str:
    """``records`` as aligned text (a header, a rule, a line per record; a case's name once)."""
    cells, last = [], None
    for r in records:
        cells.append([("" if c.key == "case" and r.get("case") == last else _cell(r, c)) for c in columns])
        last = r.get("case")
    widths = [max([len(c.header)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if c.justify == "right" else v.ljust(w)
                         for v, w, c in zip(values, widths, columns)).rstrip()

    out = ([title] if title else []) + [line([c.header for c in columns]), "  ".join("-" * w for w in widths)]
    return "\n".join(out + [line(row) for row in cells])


def render(records: list[dict], columns: list[Column], fmt: str, console: Console, title: str = "") -> None:
    """Print ``records`` as a rich table, Markdown, CSV or JSON (raw numbers for the last two)."""
    if fmt == "json":
        console.print_json(json.dumps([{k: json_value(v) for k, v in r.items()} for r in records]))
        return
    if fmt == "csv":
        import csv

        keys = list(records[0]) if records else [c.key for c in columns if not c.key.startswith("_")]
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        for r in records:
            w.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()})
        console.out(buf.getvalue(), end="", highlight=False)
        return
    if fmt == "markdown":
        lines = []
        if title:
            lines += [f"**{md_text(title)}**", ""]
        lines.append("| " + " | ".join(md_text(c.header) for c in columns) + " |")
        lines.append("|" + "|".join("---:" if c.justify == "right" else "---" for c in columns) + "|")
        for r in records:
            lines.append("| " + " | ".join(md_text(_cell(r, c)) for c in columns) + " |")
        console.out("\n".join(lines), highlight=False)
        return
    if len(records) > RICH_TABLE_ROWS:
        console.out(plain_table(records, columns, title), highlight=False)
        return
    rows, sections = _cells(records, columns)
    print_fitted(console, [FitCol(c.header, NAME if c.key in NAMES else PROSE_KIND if c.key in PROSE else VALUE, c.justify,
                                  NARROW_DROPS.index(c.key) if c.key in NARROW_DROPS else None) for c in columns],
                 rows, title, sections, where="--format csv or json")


NAMES = ("case", "backend", "point")  # what a user types next (-k, -b): never cut, never left out
PROSE = ("note",)  # columns of words: they wrap at words; the others keep their width or are left out

#: columns a table too wide for its console leaves out, in this order (results.csv/JSON keep them)
NARROW_DROPS = ("p", "rounds", "vs", "raw_ratio", "delta_ms", "normalized_by", "_interval", "baseline_ms",
                "current_ms")


def _cells(records: list[dict], columns: list[Column]) -> tuple[list[list[Text]], list[int]]:
    """(the cells of each record, a case's name once; the indexes where a new case starts)."""
    rows, sections, last_case = [], [], None
    for i, r in enumerate(records):
        if last_case is not None and r.get("case") != last_case:
            sections.append(i)
        cells = []
        for c in columns:
            text = _cell(r, c)
            if c.key == "case" and r.get("case") == last_case:
                text = ""
            style = VERDICT_STYLE.get(r.get("verdict", ""), "") if c.key == "verdict" else ""
            if c.key == "verdict" and text in ("≈ same", "unclear"):
                style = VERDICT_STYLE["same" if text == "≈ same" else "unclear"]
            cells.append(Text(text, style=style))
        rows.append(cells)
        last_case = r.get("case")
    return rows, sections


def check_summary(res: CheckResult) -> str:
    counts = {}
    for c in res.cases:
        counts[c.verdict] = counts.get(c.verdict, 0) + 1
    parts = [f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return f"{len(res.cases)} case(s): " + ", ".join(parts)
