"""The run's results table, fitted to the terminal: columns are taken by importance while they
fit the console's width (case, backend, status and kernel time always), in short units; what
does not fit is named under the table (it is all in results.csv). A sweep's case ids become
one column per swept value (``context  page_size  seed``), values only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnbench.analyze.tables import (
    COMPACT_FROM, STATUS_STYLE, batch_lines, fastest_by_case, fmt_roofline, has_convert, numbered_notes, vs_best,
)
from attnbench.store.rows import Row, Status


def short_time(ms: float) -> str:
    """Milliseconds -> ``94.5ns`` / ``67.3µs`` / ``1.25ms`` / ``129ms`` / ``2.1s`` / ``-``."""
    if ms is None or not math.isfinite(ms):
        return "-"
    if ms < 1e-3:
        return f"{ms * 1e6:.3g}ns"
    if ms < 1.0:
        return f"{ms * 1e3:.3g}µs"
    if ms < 1000:
        return f"{ms:.3g}ms"
    return f"{ms / 1e3:.3g}s"


def short_rate(tbps: float) -> str:
    """TB/s -> ``2.04TB/s`` / ``578GB/s`` / ``58.1MB/s``."""
    if tbps is None or not math.isfinite(tbps):
        return "-"
    for unit, scale in (("TB/s", 1.0), ("GB/s", 1e3), ("MB/s", 1e6)):
        if tbps * scale >= 1 or unit == "MB/s":
            return f"{tbps * scale:.3g}{unit}"
    return "-"  # not reached


def short_err(x: float) -> str:
    """A relative error in one glance: ``3e-7``, ``0``, ``-``."""
    if x is None or not math.isfinite(x):
        return "-"
    if x == 0:
        return "0"
    mant, exp = f"{x:.0e}".split("e")
    return f"{mant}e{int(exp)}"


@dataclass(frozen=True)
class Col:
    key: str
    header: str
    cell: Callable[[Row, dict], str]  # (row, context) -> text
    legend: str = ""
    full_only: bool = False  # left out of the compact (one line per row) table


def _roof(r: Row, _ctx) -> str:
    return fmt_roofline(r)


def _iqr(r: Row, _ctx) -> str:
    if r.status is Status.OK and r.n == 1:
        return "n=1"  # one timed call (a slow row under its budget): no spread to show
    return f"{100 * r.iqr_rel:.0f}%" if r.status is Status.OK and math.isfinite(r.iqr_rel) else "-"


KERNEL = Col("kernel", "kernel", lambda r, c: short_time(r.median_ms), "kernel: median per call")
#: the optional columns, most important first: each is shown only when it still fits
OPTIONAL = [
    Col("vs_best", "vs best", lambda r, c: vs_best(r, c["best"]),
        "vs best: kernel over the case's fastest (≈: the middle halves of their samples overlap, the order may not hold;"
        " ?: one side timed once (n=1), the rank may not hold; oracle: the float64 reference, interp.: run by"
        " an interpreter, neither ranked)"),
    Col("iqr", "IQR", _iqr, "IQR: interquartile range of the samples, % of the median (n=1: one timed call)"),
    Col("plan", "plan", lambda r, c: short_time(r.plan_ms),
        "plan: the engine's per-step metadata work (library plan call included)"),
    Col("convert", "convert", lambda r, c: short_time(r.convert_ms) if r.convert_ms else "-",
        "convert: what attnbench adds because the library cannot read the batch natively (gathered K/V, dense "
        "masks; - for none)"),
    Col("roofline", "roofline", _roof, "roofline: % of the binding ceiling, mem = memory-bound (measured bandwidth), "
        "com = compute-bound (measured matmul rate)"),
    Col("rel_err", "rel err", lambda r, c: short_err(r.rel_err), "rel err: ‖out − ref‖/‖ref‖", full_only=True),
    Col("bandwidth", "bandwidth", lambda r, c: short_rate(r.tbps), "bandwidth: bytes moved / kernel time",
        full_only=True),
]
ORDER = ["plan", "convert", "kernel", "iqr", "vs_best", "roofline", "rel_err", "bandwidth"]  # left to right


def swept_values(rows: list[Row]) -> Optional[list[str]]:
    """The names of the swept values when every case id reads ``name=value,...`` with the same
    names (a sweep), else None. Case ids are made that way (workload.sweeps.case_id_for)."""
    names = None
    for r in rows:
        parts = [p.split("=", 1) for p in r.case_id.split(",")]
        if any(len(p) != 2 for p in parts):
            return None
        these = [p[0] for p in parts]
        if names is None:
            names = these
        elif these != names:
            return None
    return names


def _case_cells(rows: list[Row]) -> tuple[list[str], list[list[str]], list[str]]:
    """(headers, cells per row, values fixed in every row as name=value): the case as one column
    per swept value that varies, or one ``case`` column."""
    names = swept_values(rows)
    if not names:
        return ["case"], [[r.case_id] for r in rows], []
    values = [[p.split("=", 1)[1] for p in r.case_id.split(",")] for r in rows]
    varies = [i for i in range(len(names)) if len({v[i] for v in values}) > 1]
    fixed = [f"{names[i]}={values[0][i]}" for i in range(len(names)) if i not in varies]
    if not varies:
        return ["case"], [[r.case_id] for r in rows], []
    return [names[i] for i in varies], [[v[i] for i in varies] for v in values], fixed


def _width(texts: Iterable[str]) -> int:
    return max((cell_len(t) for t in texts), default=0)


def fit_columns(widths: dict[str, int], fixed_width: int, available: int, candidates: list[str]) -> list[str]:
    """The candidate columns (most important first) taken while the table still fits
    ``available`` cells: each column costs its width and 2 cells of padding."""
    chosen, used = [], fixed_width
    for key in candidates:
        if used + widths[key] + 2 <= available:
            chosen.append(key)
            used += widths[key] + 2
    return chosen


def results_table(rows: Iterable[Row], title: str = "", compact: bool = False,
                  width: Optional[int] = None) -> tuple[Table, list[str], list[str], list[str]]:
    """(table, footnotes, legend parts of the shown columns, columns left out) for a console
    ``width`` cells wide (None: every column)."""
    rows = list(rows)
    notes, refs_of = numbered_notes(rows)
    best = fastest_by_case(rows)
    ctx = {"best": best}
    case_heads, case_cells, fixed = _case_cells(rows)
    if fixed:
        title = f"{title} ({', '.join(fixed)})" if title else ", ".join(fixed)
    cols = {c.key: c for c in [KERNEL, *OPTIONAL]}
    wanted = [c.key for c in OPTIONAL if (c.key != "convert" or has_convert(rows)) and not (compact and c.full_only)]
    texts = {k: [cols[k].cell(r, ctx) for r in rows] for k in ["kernel", *wanted]}
    widths = {k: max(_width(v), cell_len(cols[k].header)) for k, v in texts.items()}
    ref_texts = [",".join(f"[{x}]" for x in refs) for refs in refs_of]
    must = [max(_width(c[i] for c in case_cells), cell_len(h)) for i, h in enumerate(case_heads)]
    must += [max(_width(r.backend for r in rows), 7), max(_width(r.status.value for r in rows), 6), widths["kernel"]]
    if notes:
        must.append(_width(ref_texts))
    fixed_width = sum(must) + 2 * (len(must) - 1)
    shown = wanted if width is None else fit_columns(widths, fixed_width, width, wanted)
    left_out = [cols[k].header for k in wanted if k not in shown]
    order = [k for k in ORDER if k == "kernel" or k in shown]

    t = Table(title=Text(title) if title else None, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False, padding=(0, 1, 0, 0))  # columns 2 cells apart: fit_columns counts that
    for h in case_heads:
        t.add_column(h, no_wrap=True, overflow="ellipsis")
    t.add_column("backend", no_wrap=True, overflow="ellipsis")
    t.add_column("status", no_wrap=True)
    for k in order:
        t.add_column(cols[k].header, justify="right", no_wrap=True)
    if notes:
        t.add_column("", no_wrap=True)
    last_case = None
    for i, (r, refs) in enumerate(zip(rows, ref_texts)):
        if r.case_id != last_case and last_case is not None and not compact:
            t.add_section()
        case = case_cells[i] if r.case_id != last_case else [""] * len(case_heads)
        cells = [*(Text(c) for c in case), Text(r.backend), Text(r.status.value, style=STATUS_STYLE.get(r.status, ""))]
        cells += [texts[k][i] for k in order]
        t.add_row(*cells, *([refs] if notes else []))
        last_case = r.case_id
    legend = [cols[k].legend for k in order]
    return t, notes, legend, left_out


PROSE_WIDTH = 100  # the legend's lines at most (a table may be wider)


def print_results(rows: Iterable[Row], console: Console, title: str = "", compact: bool | None = None,
                  notes_console: Console | None = None) -> None:
    """The table on ``console``, fitted to its width; batch, legend, notes and the per-backend
    summary after it (on ``notes_console`` when given). ``compact`` None: one line per row
    (no blank line between cases, no rel err / bandwidth) from COMPACT_FROM rows."""
    from attnbench.analyze.summary import backend_summary

    rows = list(rows)
    info = notes_console or console
    compact = len(rows) >= COMPACT_FROM if compact is None else compact
    table, notes, legend, left_out = results_table(rows, title, compact=compact, width=console.width)
    console.print(table)
    for line in batch_lines(rows):
        info.print(line, highlight=False, markup=False)  # wrapped at words, not mid-word by the terminal
    # prose: wrapped at a reading width, not spread over a log's 160 columns
    info.print("; ".join(legend), style="dim", highlight=False, width=min(info.width, PROSE_WIDTH))
    if left_out:
        info.print(f"not shown at {console.width} columns: {', '.join(left_out)} (all in results.csv)",
                   style="dim", highlight=False)
    for i, n in enumerate(notes, 1):
        info.print(f"[{i}] {n}", highlight=False, markup=False, soft_wrap=True)
    for line in backend_summary(rows):
        info.print(line, highlight=False, markup=False)
