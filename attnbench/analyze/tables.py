"""Presentation only: rich tables of result rows (and, in plots.py, matplotlib figures)."""
from __future__ import annotations

import math
import re
from typing import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnbench.store.columns import (  # noqa: F401 (the formatters and per-case helpers, re-exported)
    above_ceiling, close_to_best, fastest_by_case, fmt_roofline, fmt_time, quartiles, vs_best, weak_timing,
)
from attnbench.store.rows import Row, Status

STATUS_STYLE = {Status.OK: "green", Status.SKIPPED: "yellow", Status.ERROR: "bold red", Status.MISMATCH: "bold red"}
#: the --format choices of every command that prints a table
FORMATS = ("table", "markdown", "csv", "json")
COMPACT_FROM = 24  # rows: from here on one line per row


def _ceiling_note(row: Row) -> str:
    if not above_ceiling(row):
        return ""
    rf = row.roofline
    return (f"{rf.pct_of_ceiling:.0f}% of the measured {rf.bound} ceiling: the ceiling is wrong (measured low, e.g. "
            "on a busy machine), not the row; see and re-measure it with `attnbench ceilings --measure`")


def row_notes(row: Row, methods: dict[str, list[str]]) -> list[str]:
    """What the reader must know to read this row: why it is not ok (and how to re-run it),
    how it ran (mode, timing method), when its case mixes timing methods."""
    notes = (row.reason, row.id.mode and f"ran as: {row.id.mode}", row.timing.timing_note, _ceiling_note(row))
    out = [f"{row.id.backend}: {x}" for x in notes if x]
    if len(methods) > 1 and row.timing.timing_method:
        out.append("timing methods differ in this case: " + "; ".join(f"{m}: {', '.join(b)}" for m, b in methods.items()))
    if row.status.failed and row.id.repro:
        out.append(f"re-run {row.id.case_id} · {row.id.backend}: {row.id.repro}")
    return out


def has_convert(rows: list[Row]) -> bool:
    """Some backend converted the batch (a convert column is worth showing)."""
    return any(math.isfinite(r.timing.convert_ms) and r.timing.convert_ms > 0 for r in rows)


_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?")


def alike_key(note: str) -> str:
    """Notes that differ only in their numbers (a timing note's milliseconds) share this key;
    a re-run line is its own (each is a command to copy)."""
    return note if note.startswith("re-run ") else _NUMBER.sub("#", note)


def numbered_notes(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """The distinct notes of the rows, and each row's note numbers. Notes alike but for their
    numbers are one note with a count (cpu-sweep on a busy machine printed 26 near-identical
    "other threads ... worked" notes, 222 characters each): its first row's text, then how many
    rows share it."""
    methods_by_case: dict[str, dict[str, list[str]]] = {}  # a case that mixes methods gets one note
    for r in rows:
        if r.timing.timing_method:
            methods_by_case.setdefault(r.id.case_id, {}).setdefault(r.timing.timing_method, []).append(r.id.backend)
    notes: list[str] = []
    index: dict[str, int] = {}
    texts: list[set] = []  # the distinct texts behind each note
    rows_of: list[int] = []
    refs_of = []
    for r in rows:
        refs = []
        for text in row_notes(r, methods_by_case.get(r.id.case_id, {})):
            key = alike_key(text)
            if key not in index:
                index[key] = len(notes)
                notes.append(text)
                texts.append(set())
                rows_of.append(0)
            i = index[key]
            texts[i].add(text)
            if str(i + 1) not in refs:
                rows_of[i] += 1
                refs.append(str(i + 1))
        refs_of.append(refs)
    notes = [n if len(t) == 1 else f"{n} ({k} rows alike; the numbers are the first one's, each row's are in "
             "results.csv)" for n, t, k in zip(notes, texts, rows_of)]
    return notes, refs_of


def batch_lines(rows: list[Row], most: int = 6) -> list[str]:
    """The batch of every case: one line when all share it; else one line per distinct batch."""
    by_batch: dict[str, list[str]] = {}
    for r in rows:
        cases = by_batch.setdefault(r.workload.batch, [])
        if r.id.case_id not in cases:
            cases.append(r.id.case_id)
    if len(by_batch) == 1:
        return [f"batch: {next(iter(by_batch))}"]
    if len(by_batch) > most:
        return [f"batch: {len(by_batch)} different batches (column `batch` of results.csv)"]
    return [f"batch of {cs[0]}" + (f" and {len(cs) - 1} more case(s)" if len(cs) > 1 else "") + f": {b}"
            for b, cs in by_batch.items()]


CPU_PROFILE_NOTE = (
    "on a CPU, 'kernel sum' adds up the wall time of the aten ops each profiled call makes: the profiler "
    "records every op (its own cost lands inside each op's time) and the calls are few and not warmed up "
    "as the timed ones are, so it can exceed the timed median; use it for the ops' shares, the median for time"
)


def print_profiles(rows: Iterable[Row], console: Console, top: int = 3) -> None:
    """Kernel tables of the --profile pass: kernels per call, their summed time, the top kernels."""
    import json
    from pathlib import Path

    from attnbench.analyze.fit import NAME, PROSE, Col, print_fitted

    cols = [Col("case", NAME), Col("backend", NAME), Col("kernels/call", justify="right", drop=2),
            Col("kernel sum", justify="right"), Col("timed median", justify="right", drop=1),
            Col("top kernels (share)", PROSE, drop=3), Col("trace", drop=0)]
    cells = []
    for r in rows:
        if not r.profile.trace:
            continue
        tops = ""
        kfile = Path(r.profile.trace.replace(".trace.json", ".kernels.json"))
        if kfile.is_file():
            ks = json.loads(kfile.read_text())["run_kernels"][:top]
            tops = "; ".join(f"{k['name'][:48]} ({k['share']:.0%})" for k in ks)
        p = r.profile
        cells.append([r.id.case_id, r.id.backend, str(p.kernels_per_call), fmt_time(p.kernel_sum_ms),
                      fmt_time(r.timing.median_ms), tops, Path(p.trace).name])
    print_fitted(console, cols, cells, "profile (one torch.profiler pass per row, after timing)", where="the run folder")
    if any(r.profile.trace and r.timing.timing_method.startswith("cpu") for r in rows):
        console.print(CPU_PROFILE_NOTE, style="dim", highlight=False)
