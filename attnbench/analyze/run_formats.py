"""A run's rows on stdout as ``--format table | markdown | csv | json`` (strict JSON: NaN is
null). The table is ``tables.print_results``; the other formats carry the same rows for
machines and pull requests."""
from __future__ import annotations

import json

from rich.console import Console

from attnbench.analyze.summary import backend_summary
from attnbench.analyze.run_table import print_results, table_columns
from attnbench.analyze.tables import batch_lines, row_notes
from attnbench.store.columns import COLUMNS, context_of, derived_columns
from attnbench.store.rows import Row, rows_csv, strict_json
from attnbench.store.safe_text import md_text


def row_records(rows: list[Row]) -> list[dict]:
    """Every field of every row (raw samples left out: they are in rows.jsonl), plus the
    registry's derived columns (x_fastest)."""
    ctx, derived = context_of(rows), derived_columns()
    out = []
    for r in rows:
        d = {k: v for k, v in r.to_json().items() if k != "samples_ms"}
        d.update((c.name, c.value(r, ctx)) for c in derived)
        out.append(strict_json(d))
    return out


def markdown_lines(rows: list[Row], title: str = "") -> list[str]:
    """The run as a Markdown table (for a pull request): the terminal table's columns (the
    registry's, left to right), every one of them."""
    ctx = context_of(rows)
    shown = set(c.name for c in table_columns(rows))
    cols = [c for c in COLUMNS if c.name in shown]
    lines = [f"**{md_text(title)}**", ""] if title else []
    heads = ["case", "backend", "status", *(c.header for c in cols), "notes"]
    lines += ["| " + " | ".join(heads) + " |",
              "|" + "|".join(["---"] * 3 + ["---:"] * len(cols) + ["---"]) + "|"]
    notes: list[str] = []
    for r in rows:
        refs = []
        for text in row_notes(r, {}):
            if text not in notes:
                notes.append(text)
            refs.append(str(notes.index(text) + 1))
        cells = [r.id.case_id, r.id.backend, r.status.value, *(c.text(r, ctx) for c in cols),
                 " ".join(f"[{x}]" for x in refs)]
        lines.append("| " + " | ".join(md_text(c) for c in cells) + " |")
    lines += [""] + [f"{md_text(x)}  " for x in batch_lines(rows)]
    lines += ["", "_" + md_text("; ".join(c.legend for c in cols)) + "_"]
    if notes:
        lines += [""] + [f"{i}. {md_text(n)}" for i, n in enumerate(notes, 1)]
    summary = backend_summary(rows)
    if summary:
        lines += ["", md_text(summary[0])] + [f"- {md_text(x.strip())}" for x in summary[1:]]
    return lines


def render_run(rows: list[Row], fmt: str, console: Console, info: Console, title: str = "",
               compact: bool | None = None) -> None:
    """Results on ``console`` (stdout); with table/markdown the notes go with them."""
    rows = list(rows)
    if fmt == "json":
        console.out(json.dumps(row_records(rows), indent=1, allow_nan=False, default=str), highlight=False)
    elif fmt == "csv":
        console.out(rows_csv(rows), end="", highlight=False)
    elif fmt == "markdown":
        console.out("\n".join(markdown_lines(rows, title)), highlight=False)
    else:
        print_results(rows, console, title=title, compact=compact, notes_console=info)
