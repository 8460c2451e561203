"""The run's results table, fitted to the terminal: columns are taken by importance while they
fit the console's width (case, backend, status and kernel time always), as the column
registry (``store/columns.py``) orders and formats them; what does not fit is named under the table (it is all in results.csv). A sweep's typed values
(``Row.workload.params``) become one column per swept value (``context  page_size  seed``), values
only, rendered here (4096 as ``4k``, None as ``null``).
"""
from __future__ import annotations

from typing import Iterable, Optional

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnbench.analyze.fit import NAME, Blocks, Col, print_words
from attnbench.analyze.tables import COMPACT_FROM, STATUS_STYLE, batch_lines, has_convert, numbered_notes
from attnbench.store.columns import COLUMNS, Column, context_of
from attnbench.store.rows import Row
from attnbench.workload.sweeps import display_name, value_text


def table_columns(rows: list[Row], compact: bool = False) -> list[Column]:
    """The registry's columns a terminal or Markdown table may show, most important first
    (kernel always; convert only when some backend converted)."""
    cols = [c for c in COLUMNS if c.importance is not None and not (compact and c.full_only)
            and (c.name != "convert_ms" or has_convert(rows))]
    return sorted(cols, key=lambda c: c.importance)


def _case_cells(rows: list[Row]) -> tuple[list[str], list[list[str]], list[str]]:
    """(headers, cells per row, values fixed in every row as name=value): the case as one column
    per swept value that varies (from the rows' typed params, rendered here), or one ``case``
    column when the rows have no sweep or do not share one."""
    keys = list(rows[0].workload.params) if rows else []
    if not keys or any(list(r.workload.params) != keys for r in rows):
        return ["case"], [[r.id.case_id] for r in rows], []
    values = [[value_text(r.workload.params[k]) for k in keys] for r in rows]
    names = [display_name(k, keys) for k in keys]
    varies = [i for i in range(len(keys)) if len({v[i] for v in values}) > 1]
    fixed = [f"{names[i]}={values[0][i]}" for i in range(len(keys)) if i not in varies]
    if not varies:
        return ["case"], [[r.id.case_id] for r in rows], []
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
    ctx = context_of(rows)
    case_heads, case_cells, fixed = _case_cells(rows)
    if fixed:
        title = f"{title} ({', '.join(fixed)})" if title else ", ".join(fixed)
    cols = table_columns(rows, compact)  # kernel (importance 0) first
    texts = {c.name: [c.text(r, ctx) for r in rows] for c in cols}
    widths = {c.name: max(_width(texts[c.name]), cell_len(c.header)) for c in cols}
    ref_texts = [f"[{','.join(refs)}]" if refs else "" for refs in refs_of]
    must = [max(_width(c[i] for c in case_cells), cell_len(h)) for i, h in enumerate(case_heads)]
    must += [max(_width(r.id.backend for r in rows), 7), max(_width(r.status.value for r in rows), 6),
             widths[cols[0].name]]
    if notes:
        must.append(_width(ref_texts))
    fixed_width = sum(must) + 2 * (len(must) - 1)
    wanted = [c.name for c in cols[1:]]
    shown = wanted if width is None else fit_columns(widths, fixed_width, width, wanted)
    left_out = [c.header for c in cols[1:] if c.name not in shown]
    if width is not None and fixed_width > width:  # not even the fixed columns fit: a block per row
        order = [c for c in COLUMNS if c is cols[0]]
        fcols = [Col("case", NAME), Col("backend", NAME), Col("status"), Col(cols[0].header),
                 *([Col("notes")] if notes else [])]
        cells = [[r.id.case_id, r.id.backend, Text(r.status.value, style=STATUS_STYLE.get(r.status, "")),
                  texts[cols[0].name][i], *([ref_texts[i]] if notes else [])] for i, r in enumerate(rows)]
        return Blocks(fcols, cells, title), notes, [c.legend for c in order], left_out
    order = [c for c in COLUMNS if c is cols[0] or c.name in shown]  # left to right as the registry lists them

    t = Table(title=Text(title) if title else None, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False, padding=(0, 1, 0, 0))  # columns 2 cells apart: fit_columns counts that
    for h in case_heads:
        t.add_column(h, no_wrap=True, overflow="ellipsis")
    t.add_column("backend", no_wrap=True, overflow="ellipsis")
    t.add_column("status", no_wrap=True)
    for c in order:
        t.add_column(c.header, justify="right", no_wrap=True)
    if notes:
        t.add_column("", no_wrap=True)
    last_case = None
    for i, (r, refs) in enumerate(zip(rows, ref_texts)):
        if r.id.case_id != last_case and last_case is not None and not compact:
            t.add_section()
        case = case_cells[i] if r.id.case_id != last_case else [""] * len(case_heads)
        cells = [*(Text(c) for c in case), Text(r.id.backend),
                 Text(r.status.value, style=STATUS_STYLE.get(r.status, ""))]
        cells += [texts[c.name][i] for c in order]
        t.add_row(*cells, *([refs] if notes else []))
        last_case = r.id.case_id
    legend = [c.legend for c in order]
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
    for i, n in enumerate(notes, 1):  # wrapped at spaces: a path or a command in a note stays whole
        print_words(info, f"[{i}] {n}")
    for line in backend_summary(rows):
        info.print(line, highlight=False, markup=False)
