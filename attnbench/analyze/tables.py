"""Presentation only: rich tables of result rows (and, in plots.py, matplotlib figures)."""
from __future__ import annotations

import math
from typing import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnbench.store.rows import Row, Status, rows_frame

STATUS_STYLE = {Status.OK: "green", Status.SKIPPED: "yellow", Status.ERROR: "bold red", Status.MISMATCH: "bold red"}
SPREAD_WARN = 0.05


def fmt_time(ms: float) -> str:
    """Milliseconds -> ``67.3 µs`` / ``1.25 ms`` / ``-``."""
    if ms is None or not math.isfinite(ms):
        return "-"
    if ms < 1.0:
        return f"{ms * 1e3:.1f} µs"
    if ms < 100:
        return f"{ms:.3g} ms"
    return f"{ms:.0f} ms"


def fmt_bandwidth(tbps: float) -> str:
    """TB/s -> ``2.04 TB/s`` or, below 0.1 TB/s (CPUs), ``12.3 GB/s``."""
    if tbps is None or not math.isfinite(tbps):
        return "-"
    return f"{tbps:.2f} TB/s" if tbps >= 0.1 else f"{tbps * 1e3:.3g} GB/s"


def fmt_num(x: float, spec: str = ".3g") -> str:
    return "-" if x is None or not isinstance(x, (int, float)) or not math.isfinite(x) else format(x, spec)


def spread_warning(row: Row) -> str:
    if row.status is Status.OK and math.isfinite(row.iqr_rel) and row.iqr_rel > SPREAD_WARN:
        where = "other work on the GPU" if row.timing_method.startswith("cuda") else "other processes on the CPU"
        tip = f"IQR is {row.iqr_rel:.0%} of the median: lengthen timing.measure_ms, stop {where}"
        if row.timing_method == "cuda-events" and "capture failed" not in row.timing_note:
            tip += ", or allow CUDA graphs (launch gaps add noise)"
        return tip
    return ""


def results_table(rows: Iterable[Row], title: str = "") -> tuple[Table, list[str]]:
    """The results table and its footnotes (reasons, modes, warnings), numbered in the table."""
    rows = list(rows)
    df = rows_frame(rows)
    t = Table(title=Text(title) if title else None, header_style="bold", pad_edge=False)  # text, not markup
    t.add_column("case", overflow="fold", max_width=28)
    t.add_column("backend")
    t.add_column("status")
    for col in ("plan", "convert", "kernel", "spread", "rel err", "bandwidth", "roofline", "vs best"):
        t.add_column(col, justify="right")
    t.add_column("", justify="left")
    # backends of each case by timing method: a case that mixes methods gets one note saying so
    methods_by_case: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        if r.timing_method:
            methods_by_case.setdefault(r.case_id, {}).setdefault(r.timing_method, []).append(r.backend)
    notes: list[str] = []
    last_case = None
    for r, xf in zip(rows, df["x_fastest"]):
        mine = [f"{r.backend}: {x}" for x in (r.reason, r.mode and f"ran as: {r.mode}", r.timing_note, spread_warning(r)) if x]
        methods = methods_by_case.get(r.case_id, {})
        if len(methods) > 1 and r.timing_method:
            mine.append("timing methods differ in this case: " + "; ".join(f"{m}: {', '.join(b)}" for m, b in methods.items()))
        refs = []
        for text in mine:
            if text not in notes:
                notes.append(text)
            refs.append(str(notes.index(text) + 1))
        roof = f"{r.pct_of_ceiling:.0f}% {r.bound[:3]}" if math.isfinite(r.pct_of_ceiling) else "-"
        vs = "best" if xf == 1.0 else (f"{xf:.2f}×" if math.isfinite(xf) else "-")
        spread = f"±{100 * r.iqr_rel / 2:.1f}%" if r.status is Status.OK and math.isfinite(r.iqr_rel) else "-"
        if r.case_id != last_case and last_case is not None:
            t.add_section()
        t.add_row(
            Text(r.case_id if r.case_id != last_case else ""),
            Text(r.backend),
            Text(r.status, style=STATUS_STYLE.get(r.status, "")),
            fmt_time(r.plan_ms),
            fmt_time(r.convert_ms) if r.convert_ms else "-",
            fmt_time(r.median_ms),
            spread,
            fmt_num(r.rel_err, ".0e"),
            fmt_bandwidth(r.tbps),
            roof,
            vs,
            ",".join(f"[{x}]" for x in refs),
        )
        last_case = r.case_id
    return t, notes


def print_results(rows: Iterable[Row], console: Console, title: str = "") -> None:
    rows = list(rows)
    table, notes = results_table(rows, title)
    console.print(table)
    batches = {}
    for r in rows:
        batches.setdefault(r.case_id, r.batch)
    if len(set(batches.values())) == 1:
        console.print(f"batch: {next(iter(batches.values()))}", highlight=False, markup=False)
    else:
        for cid, b in batches.items():
            console.print(f"batch of {cid}: {b}", highlight=False, markup=False)
    console.print(
        "plan = the engine's per-step metadata work (library plan call included); convert = what attnbench adds "
        "because the library cannot read the batch natively (gathered K/V, dense masks; - for none); "
        "kernel = median per call; spread = half the interquartile range; vs best = kernel time over the "
        "fastest ok backend of the case; roofline = time at the measured ceiling over kernel time",
        style="dim",
        highlight=False,
    )
    for i, n in enumerate(notes, 1):
        console.print(f"[{i}] {n}", highlight=False, markup=False)


def print_profiles(rows: Iterable[Row], console: Console, top: int = 3) -> None:
    """Kernel tables of the --profile pass: kernels per call, their summed time, the top kernels."""
    import json
    from pathlib import Path

    t = Table(title="profile (one torch.profiler pass per row, after timing)", header_style="bold")
    for col in ("case", "backend", "kernels/call", "kernel sum", "timed median", "top kernels (share)", "trace"):
        t.add_column(col, overflow="fold")
    for r in rows:
        if not r.trace:
            continue
        tops = ""
        kfile = Path(r.trace.replace(".trace.json", ".kernels.json"))
        if kfile.is_file():
            ks = json.loads(kfile.read_text())["run_kernels"][:top]
            tops = "; ".join(f"{k['name'][:48]} ({k['share']:.0%})" for k in ks)
        t.add_row(Text(r.case_id), Text(r.backend), str(r.kernels_per_call), fmt_time(r.kernel_sum_ms), fmt_time(r.median_ms), tops, Path(r.trace).name)
    console.print(t)
