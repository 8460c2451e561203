"""Presentation only: rich tables of result rows (and, in plots.py, matplotlib figures)."""
from __future__ import annotations

import math
from typing import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnbench.measure.stats import quantile
from attnbench.store.rows import Row, Status, is_interpreted, is_oracle

STATUS_STYLE = {Status.OK: "green", Status.SKIPPED: "yellow", Status.ERROR: "bold red", Status.MISMATCH: "bold red"}
#: the --format choices of every command that prints a table
FORMATS = ("table", "markdown", "csv", "json")


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


COMPACT_FROM = 24  # rows: from here on one line per row


def quartiles(row: Row) -> tuple[float, float]:
    """(p25, p75) of the row's samples (p20, p80 when the samples are not kept)."""
    if row.samples_ms:
        xs = sorted(row.samples_ms)
        return quantile(xs, 0.25), quantile(xs, 0.75)
    return row.p20_ms, row.p80_ms


def close_to_best(row: Row, best: Row) -> bool:
    """The middle half of ``row``'s samples overlaps the fastest's: the order may not hold."""
    lo, _ = quartiles(row)
    _, hi = quartiles(best)
    return row is not best and math.isfinite(lo) and math.isfinite(hi) and lo <= hi


def fastest_by_case(rows: list[Row], rank_oracle: bool = False) -> dict[str, Row]:
    """Each case's fastest ok row; the oracle (float64, there to be right) is no competitor
    unless ``rank_oracle``."""
    best: dict[str, Row] = {}
    for r in rows:
        if is_interpreted(r):  # an interpreter's time says nothing about the kernel's
            continue
        if r.status is Status.OK and math.isfinite(r.median_ms) and (rank_oracle or not is_oracle(r.backend)):
            if r.case_id not in best or r.median_ms < best[r.case_id].median_ms:
                best[r.case_id] = r
    return best


def vs_best(row: Row, best: dict[str, Row]) -> str:
    b = best.get(row.case_id)
    if row.status is not Status.OK or b is None or not math.isfinite(row.median_ms):
        return "-"
    weak = " ?" if weak_timing(row) or weak_timing(b) else ""
    if row is b:
        return "best" + weak
    if is_oracle(row.backend):  # not ranked: the column compares competitors
        return "oracle"
    if is_interpreted(row):
        return "interp."
    return f"{row.median_ms / b.median_ms:.2f}×" + (" ≈" if close_to_best(row, b) else "") + weak


WEAK_N = 2  # an ok row timed fewer times than this (once) has no spread to judge a rank by


def weak_timing(row: Row) -> bool:
    """An ok row whose median rests on fewer than WEAK_N timed calls (a call longer than the
    measurement budget is timed once: n=1)."""
    return row.status is Status.OK and 0 < row.n < WEAK_N


def above_ceiling(row: Row) -> bool:
    """Faster than its measured ceiling allows: the ceiling is wrong (measured low), not the row."""
    return math.isfinite(row.pct_of_ceiling) and row.pct_of_ceiling > 100


def fmt_roofline(row: Row) -> str:
    """``54% mem``; ``ceiling?`` above 100% (the ceiling is wrong: a note says so); ``-``."""
    if not math.isfinite(row.pct_of_ceiling):
        return "-"
    return "ceiling?" if above_ceiling(row) else f"{row.pct_of_ceiling:.0f}% {row.bound[:3]}"


def _ceiling_note(row: Row) -> str:
    if not above_ceiling(row):
        return ""
    return (f"{row.pct_of_ceiling:.0f}% of the measured {row.bound} ceiling: the ceiling is wrong (measured low, e.g. "
            "on a busy machine), not the row; see and re-measure it with `attnbench ceilings --measure`")


def row_notes(row: Row, methods: dict[str, list[str]]) -> list[str]:
    """What the reader must know to read this row: why it is not ok (and how to re-run it),
    how it ran (mode, timing method), when its case mixes timing methods."""
    out = [f"{row.backend}: {x}" for x in (row.reason, row.mode and f"ran as: {row.mode}", row.timing_note,
                                           _ceiling_note(row)) if x]
    if len(methods) > 1 and row.timing_method:
        out.append("timing methods differ in this case: " + "; ".join(f"{m}: {', '.join(b)}" for m, b in methods.items()))
    if row.status.failed and row.repro:
        out.append(f"re-run {row.case_id} · {row.backend}: {row.repro}")
    return out


def has_convert(rows: list[Row]) -> bool:
    """Some backend converted the batch (a convert column is worth showing)."""
    return any(math.isfinite(r.convert_ms) and r.convert_ms > 0 for r in rows)


def numbered_notes(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """The distinct notes of the rows, and each row's note numbers."""
    methods_by_case: dict[str, dict[str, list[str]]] = {}  # a case that mixes methods gets one note
    for r in rows:
        if r.timing_method:
            methods_by_case.setdefault(r.case_id, {}).setdefault(r.timing_method, []).append(r.backend)
    notes: list[str] = []
    refs_of = []
    for r in rows:
        refs = []
        for text in row_notes(r, methods_by_case.get(r.case_id, {})):
            if text not in notes:
                notes.append(text)
            refs.append(str(notes.index(text) + 1))
        refs_of.append(refs)
    return notes, refs_of


def batch_lines(rows: list[Row], most: int = 6) -> list[str]:
    """The batch of every case: one line when all share it; else one line per distinct batch."""
    by_batch: dict[str, list[str]] = {}
    for r in rows:
        cases = by_batch.setdefault(r.batch, [])
        if r.case_id not in cases:
            cases.append(r.case_id)
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
    if any(r.trace and r.timing_method.startswith("cpu") for r in rows):
        console.print(CPU_PROFILE_NOTE, style="dim", highlight=False)
