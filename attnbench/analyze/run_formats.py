"""A run's rows on stdout as ``--format table | markdown | csv | json`` (strict JSON: NaN is
null). The table is ``tables.print_results``; the other formats carry the same rows for
machines and pull requests."""
from __future__ import annotations

import json
import math

from rich.console import Console

from attnbench.analyze.summary import backend_summary
from attnbench.analyze.run_table import KERNEL, OPTIONAL, print_results, short_err
from attnbench.analyze.tables import batch_lines, fastest_by_case, fmt_roofline, fmt_time, has_convert, row_notes, vs_best
from attnbench.store.rows import Row, rows_csv, strict_json


def row_records(rows: list[Row]) -> list[dict]:
    """Every field of every row (raw samples left out: they are in rows.jsonl), plus x_fastest."""
    best = fastest_by_case(rows)
    out = []
    for r in rows:
        d = {k: v for k, v in r.to_json().items() if k != "samples_ms"}
        b = best.get(r.case_id)
        d["x_fastest"] = r.median_ms / b.median_ms if b is not None and r.status == "ok" else None
        out.append(strict_json(d))
    return out


def markdown_lines(rows: list[Row], title: str = "") -> list[str]:
    """The run as a Markdown table (for a pull request): every column of the terminal table."""
    best = fastest_by_case(rows)
    convert = has_convert(rows)
    lines = [f"**{title}**", ""] if title else []
    heads = ["case", "backend", "status", "plan"] + (["convert"] if convert else []) + [
        "kernel", "IQR", "vs best", "roofline", "rel err", "notes"]
    lines += ["| " + " | ".join(heads) + " |", "|" + "|".join("---" if h in ("case", "backend", "status", "notes")
                                                                else "---:" for h in heads) + "|"]
    notes: list[str] = []
    for r in rows:
        refs = []
        for text in row_notes(r, {}):
            if text not in notes:
                notes.append(text)
            refs.append(str(notes.index(text) + 1))
        roof = fmt_roofline(r)
        iqr = f"{100 * r.iqr_rel:.0f}%" if r.status == "ok" and math.isfinite(r.iqr_rel) else "-"
        cells = [r.case_id, r.backend, r.status.value, fmt_time(r.plan_ms)]
        cells += [fmt_time(r.convert_ms) if r.convert_ms else "-"] if convert else []
        cells += [fmt_time(r.median_ms), iqr, vs_best(r, best), roof, short_err(r.rel_err),
                  " ".join(f"[{x}]" for x in refs)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    legend = "; ".join(c.legend for c in [KERNEL, *OPTIONAL]
                       if c.key not in ("bandwidth",) and (convert or c.key != "convert"))
    lines += [""] + [f"{x}  " for x in batch_lines(rows)] + ["", f"_{legend}_"]
    if notes:
        lines += [""] + [f"{i}. {n}" for i, n in enumerate(notes, 1)]
    summary = backend_summary(rows)
    if summary:
        lines += ["", summary[0]] + [f"- {x.strip()}" for x in summary[1:]]
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
