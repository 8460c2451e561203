"""The columns of result rows, written once: one registry (``COLUMNS``: name, header, unit,
formatter, importance, legend) that the terminal table, the Markdown table, the HTML report,
results.csv and JSON read, and the one family of number formatters (``fmt_*``: a number and
its unit, a space between them: ``67.3 µs``, ``2.04 TB/s``).

A measured value is a field of a ``Row`` part (``store/row_parts.py``; results.csv and JSON
carry every field, flat: ``rows.FLAT_FIELDS``); a column here says how it is shown. A column with
``derived`` set is computed from the rows (``x_fastest``) and is written to results.csv and JSON
too. Adding a metric: the field in its part and in ``FLAT_FIELDS`` (appended: old run folders
keep their columns), the code that measures it, and its entry here.

Rows are read by attribute only (this module imports no row type: ``store/rows.py`` imports
it, for the oracle's name and the derived columns).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from attnbench.measure.stats import quantile

# The backend that runs the oracle (workload/reference.py): never a competitor. It is kept out
# of ranks, bests and summaries unless asked for, and refused as a check's normalizer: it is
# written to be right (float64, per request), not fast.
ORACLE_BACKEND = "reference"


def is_interpreted(row) -> bool:
    """The row ran through an interpreter (triton under TRITON_INTERPRET=1, its ``mode`` says):
    hundreds of times slower than the compiled kernel, so it is no competitor in a ranking."""
    return (row.id.mode or "").startswith("interpreted")


WEAK_N = 2  # an ok row timed fewer times than this (once) has no spread to judge a rank by


def weak_timing(row) -> bool:
    """An ok row whose median rests on fewer than WEAK_N timed calls (a call longer than the
    measurement budget is timed once: n=1)."""
    return row.status == "ok" and 0 < row.timing.n < WEAK_N


def is_oracle(backend: str) -> bool:
    """The row's backend is the oracle: the oracle declares no option, so its canonical
    identity (the rows' ``backend``, made once from ``-b``) is its bare name; nothing to parse."""
    return backend == ORACLE_BACKEND


# ---------------------------------------------------------------------------- formatters
def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def fmt_time(ms: Optional[float]) -> str:
    """Milliseconds -> ``94.5 ns`` / ``67.3 µs`` / ``1.25 ms`` / ``129 ms`` / ``2.1 s`` / ``-``."""
    if not _finite(ms):
        return "-"
    for scale, unit in ((1e6, "ns"), (1e3, "µs"), (1.0, "ms")):
        text = f"{ms * scale:.3g}"
        if abs(float(text)) < 1000:  # 999.7 µs is 1 ms, never "1e+03 µs"
            return f"{text} {unit}"
    return f"{ms / 1e3:.3g} s"


def fmt_rate(tbps: Optional[float]) -> str:
    """TB/s -> ``2.04 TB/s`` / ``578 GB/s`` / ``58.1 MB/s`` / ``-``."""
    if not _finite(tbps):
        return "-"
    for unit, scale in (("TB/s", 1.0), ("GB/s", 1e3)):
        if float(f"{tbps * scale:.3g}") >= 1:
            return f"{tbps * scale:.3g} {unit}"
    return f"{tbps * 1e6:.3g} MB/s"


def fmt_err(x: Optional[float]) -> str:
    """A relative error in one glance: ``3e-7``, ``0``, ``-``."""
    if not _finite(x):
        return "-"
    if x == 0:
        return "0"
    mant, exp = f"{x:.0e}".split("e")
    return f"{mant}e{int(exp)}"


def fmt_pct(fraction: Optional[float]) -> str:
    """A fraction as a whole percentage: ``15%``, ``-``."""
    return f"{100 * fraction:.0f}%" if _finite(fraction) else "-"


def fmt_ratio(x: Optional[float]) -> str:
    """A time ratio: ``2.00×``, ``-``."""
    return f"{x:.2f}×" if _finite(x) else "-"


# ---------------------------------------------------------------------------- per case
def quartiles(row) -> tuple[float, float]:
    """(p25, p75) of the row's samples (p20, p80 when the samples are not kept)."""
    t = row.timing
    if t.samples_ms:
        xs = sorted(t.samples_ms)
        return quantile(xs, 0.25), quantile(xs, 0.75)
    return t.p20_ms, t.p80_ms


def close_to_best(row, best) -> bool:
    """The middle half of ``row``'s samples overlaps the fastest's: the order may not hold."""
    lo, _ = quartiles(row)
    _, hi = quartiles(best)
    return row is not best and math.isfinite(lo) and math.isfinite(hi) and lo <= hi


def fastest_by_case(rows, rank_oracle: bool = False) -> dict:
    """Each case's fastest ok row; the oracle (float64, there to be right) is no competitor
    unless ``rank_oracle``."""
    best: dict = {}
    for r in rows:
        if is_interpreted(r):  # an interpreter's time says nothing about the kernel's
            continue
        if r.status == "ok" and _finite(r.timing.median_ms) and (rank_oracle or not is_oracle(r.id.backend)):
            if r.id.case_id not in best or r.timing.median_ms < best[r.id.case_id].timing.median_ms:
                best[r.id.case_id] = r
    return best


def x_fastest(row, best: dict) -> float:
    """The row's median over its case's fastest competitor's (NaN when either is missing)."""
    b = best.get(row.id.case_id)
    return row.timing.median_ms / b.timing.median_ms if row.status == "ok" and b is not None else math.nan


def vs_best(row, best: dict) -> str:
    b = best.get(row.id.case_id)
    if row.status != "ok" or b is None or not _finite(row.timing.median_ms):
        return "-"
    weak = " ?" if weak_timing(row) or weak_timing(b) else ""
    if row is b:
        return "best" + weak
    if is_oracle(row.id.backend):  # not ranked: the column compares competitors
        return "oracle"
    if is_interpreted(row):
        return "interp."
    return fmt_ratio(row.timing.median_ms / b.timing.median_ms) + (" ≈" if close_to_best(row, b) else "") + weak


def above_ceiling(row) -> bool:
    """Faster than its measured ceiling allows: the ceiling is wrong (measured low), not the row."""
    return _finite(row.roofline.pct_of_ceiling) and row.roofline.pct_of_ceiling > 100


def fmt_roofline(row) -> str:
    """``54% mem``; ``ceiling?`` above 100% (the ceiling is wrong: a note says so); ``-``."""
    rf = row.roofline
    if not _finite(rf.pct_of_ceiling):
        return "-"
    return "ceiling?" if above_ceiling(row) else f"{rf.pct_of_ceiling:.0f}% {rf.bound[:3]}"


def _iqr(r, _ctx) -> str:
    if r.status == "ok" and r.timing.n == 1:
        return "n=1"  # one timed call (a slow row under its budget): no spread to show
    return fmt_pct(r.timing.iqr_rel) if r.status == "ok" else "-"


# ---------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Column:
    """How one column is shown. ``name``: the Row field (or, ``derived``, the key of a value
    computed from the rows), in the row's part ``part``; ``unit``: of its raw value in results.csv and JSON;
    ``text(row, ctx)``: the shown text (ctx: ``{"best": fastest_by_case(rows)}``);
    ``importance``: 0 always shown, then lower first while the terminal has room; None: not in
    the terminal or Markdown table (results.csv, JSON and the HTML report only)."""

    name: str
    header: str
    unit: str
    text: Callable[[Any, dict], str]
    importance: Optional[int]
    legend: str = ""
    full_only: bool = False  # left out of the compact (one line per row) terminal table
    derived: Optional[Callable[[Any, dict], Any]] = None  # the raw value of a computed column
    part: str = ""  # the row's part that holds the field (Row.timing, Row.roofline, ...)

    def value(self, row, ctx: dict) -> Any:
        """The raw value (a number for sorting, CSV and JSON)."""
        if self.derived:
            return self.derived(row, ctx)
        return getattr(getattr(row, self.part) if self.part else row, self.name, None)


def _time(field: str) -> Callable[[Any, dict], str]:
    return lambda r, _ctx: fmt_time(getattr(r.timing, field))


#: left to right, as every table shows them
COLUMNS = [
    Column("plan_ms", "plan", "ms", _time("plan_ms"), 3,
           "plan: the engine's per-step metadata work (library plan call included)", part="timing"),
    Column("convert_ms", "convert", "ms", lambda r, c: fmt_time(r.timing.convert_ms) if r.timing.convert_ms else "-",
           4, "convert: what attnbench adds because the library cannot read the batch natively (gathered K/V, dense "
           "masks; - for none)", part="timing"),
    Column("median_ms", "kernel", "ms", _time("median_ms"), 0, "kernel: median per call", part="timing"),
    Column("p20_ms", "p20", "ms", _time("p20_ms"), None, part="timing"),
    Column("p80_ms", "p80", "ms", _time("p80_ms"), None, part="timing"),
    Column("iqr_rel", "IQR", "fraction", _iqr, 2,
           "IQR: interquartile range of the samples, % of the median (n=1: one timed call)", part="timing"),
    Column("x_fastest", "vs best", "×", lambda r, c: vs_best(r, c["best"]), 1,
           "vs best: kernel over the case's fastest (≈: the middle halves of their samples overlap, the order may not "
           "hold; ?: one side timed once (n=1), the rank may not hold; oracle: the float64 reference, interp.: run by an "
           "interpreter, neither ranked)", derived=lambda r, c: x_fastest(r, c["best"])),
    Column("pct_of_ceiling", "roofline", "%", lambda r, c: fmt_roofline(r), 5,
           "roofline: % of the binding ceiling, mem = memory-bound (measured bandwidth), com = compute-bound "
           "(measured matmul rate)", part="roofline"),
    Column("bound", "bound", "", lambda r, c: r.roofline.bound or "-", None, part="roofline"),
    Column("rel_err", "rel err", "", lambda r, c: fmt_err(r.correctness.rel_err), 6,
           "rel err: ‖out − ref‖/‖ref‖", full_only=True, part="correctness"),
    Column("tbps", "bandwidth", "TB/s", lambda r, c: fmt_rate(r.roofline.tbps), 7,
           "bandwidth: bytes moved / kernel time", full_only=True, part="roofline"),
]


def derived_columns() -> list[Column]:
    """The computed columns results.csv and JSON carry beside the Row fields."""
    return [c for c in COLUMNS if c.derived]


def context_of(rows) -> dict:
    """What the columns' texts and derived values need of all the rows."""
    return {"best": fastest_by_case(rows)}
