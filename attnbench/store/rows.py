"""Result rows: one per (case, backend), with a typed status and the fields it must carry.

What each status must carry (``Row.problems`` checks it; ``checked`` enforces it):

- ``ok``: a finite ``median_ms`` over ``n >= 1`` samples and the ``timing_method``;
- ``skipped``: a ``reason``: what the backend cannot do, or why the case could not run;
- ``error``: a ``reason``: the exception, signal or timeout;
- ``mismatch``: a ``reason``: what differs from the reference.

Every row the runner or the isolation parent yields passes through ``checked``: a row that
lacks what its status asks for becomes an ``error`` row naming what was missing, so that no
malformed row reaches a run folder. CSV columns come from the dataclass fields
(``CSV_FIELDS``), never from a second list.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Iterable, Optional

from attnbench.store.columns import (  # noqa: F401 (re-exported)
    ORACLE_BACKEND, context_of, derived_columns, is_interpreted, is_oracle,
)
from attnbench.workload.sweeps import upgraded_params



if TYPE_CHECKING:
    import pandas as pd


class Status(str, Enum):
    """What became of a row (what each must carry: the module's docstring). A ``str`` enum:
    ``Status.OK == "ok"``, and it is written to CSV and JSON as its plain value."""

    OK = "ok"
    SKIPPED = "skipped"
    ERROR = "error"
    MISMATCH = "mismatch"

    __str__ = str.__str__
    __format__ = str.__format__

    @property
    def failed(self) -> bool:
        return self in (Status.ERROR, Status.MISMATCH)


@dataclass
class Row:
    """One (case, backend) measurement. CSV columns come from these fields."""

    scenario: str
    case_id: str
    backend: str
    status: Status = Status.OK
    reason: str = ""
    backend_version: str = ""
    mode: str = ""
    device: str = ""
    device_id: str = ""  # GPU-<uuid> or host:cpu: which physical device (rows of a case share one)
    dtype: str = ""
    page_size: int = 0
    layout: str = ""
    batch: str = ""  # e.g. "32 decode@4k + 8 tree(41)@2k"
    num_requests: int = 0
    num_tokens: int = 0
    plan_ms: float = math.nan  # the engine's per-step metadata work (the library's own plan call included)
    convert_ms: float = math.nan  # what attnbench adds because the library cannot read the batch natively (0: none)
    median_ms: float = math.nan
    p20_ms: float = math.nan
    p80_ms: float = math.nan
    min_ms: float = math.nan
    iqr_rel: float = math.nan
    n: int = 0
    step_ms: float = math.nan  # plan + kernel: what an engine pays each step (convert excluded)
    timing_method: str = ""
    threads: int = 0  # intra-op threads of a CPU row's backend (0: a GPU row)
    cold_l2: Optional[bool] = None
    flush: str = ""  # how the L2 was emptied before each timed call (timing.flush); "": not flushed (warm L2, CPU)
    timing_note: str = ""
    rel_err: float = math.nan
    max_abs_err: float = math.nan
    tolerance: float = math.nan
    flops: int = 0
    bytes: int = 0
    tflops: float = math.nan
    tbps: float = math.nan
    floor_ms: float = math.nan
    bound: str = ""
    pct_of_ceiling: float = math.nan
    kernels_per_call: Optional[int] = None  # from the --profile pass
    kernel_sum_ms: float = math.nan  # summed device time of the run's kernels, per call (--profile)
    trace: str = ""
    repro: str = ""  # the one command that re-runs just this row (scenario, -k, -b, shaping options)
    params: dict = field(default_factory=dict)
    samples_ms: list = field(default_factory=list)
    # the median of each timing round (timing.rounds), in order: the unit that `check` and
    # `compare` replicate over, since calls within one round share the machine's state
    round_medians_ms: list = field(default_factory=list)
    # every timed call of the plan and of the convert (host, synchronized; one engine step each):
    # their spread, which `decide` spreads over the rounds (empty in runs made before they were kept)
    plan_samples_ms: list = field(default_factory=list)
    convert_samples_ms: list = field(default_factory=list)

    def __setattr__(self, name, value):
        # status is always a Status, however it is set (a plain string is converted)
        object.__setattr__(self, name, Status(value) if name == "status" else value)

    def problems(self) -> list[str]:
        """What this row lacks for its status ([] when it is well-formed)."""
        if self.status is Status.OK:
            out = []
            if not (self.n >= 1 and math.isfinite(self.median_ms)):
                out.append("an ok row needs a finite median_ms over n >= 1 samples")
            if not self.timing_method:
                out.append("an ok row needs its timing_method")
            return out
        return [] if self.reason.strip() else [f"a {self.status.value} row needs a reason"]

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of a row across runs: scenario, case, backend (never its position)."""
        return (self.scenario, self.case_id, self.backend)

    def to_json(self) -> dict:
        """Strict JSON: NaN and infinities become null (``from_json`` reads either back)."""
        return strict_json(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, d: dict) -> "Row":
        kw = {k: v for k, v in d.items() if k in _FIELDS}
        for k in _FLOAT_FIELDS:
            if k in kw and kw[k] is None:
                kw[k] = math.nan
        if isinstance(kw.get("params"), dict):
            kw["params"] = upgraded_params(kw["params"])
        return cls(**kw)


_FIELDS = {f.name for f in dataclasses.fields(Row)}
_FLOAT_FIELDS = {f.name for f in dataclasses.fields(Row) if f.type in ("float", float)}


def strict_json(obj):
    """``obj`` with every non-finite float replaced by None, so that ``json.dumps(...,
    allow_nan=False)`` succeeds and any JSON parser reads the result."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def typed_row(d) -> Row:
    """A row from a JSON value read from a file; RowError naming the field when a value has
    the wrong type (a hand edit, a cut line), so that no reader trips over it later."""
    if not isinstance(d, dict):
        raise RowError(f"a row is a JSON object, not {type(d).__name__}")
    checks = _field_checks()
    for name in ("scenario", "case_id", "backend"):
        if name not in d:
            raise RowError(f"a row needs {name}")
    kw = {}
    for k, v in d.items():
        if k in checks:
            ok, what = checks[k]
            if not ok(v):
                raise RowError(f"{k}: {str(v)[:40]!r} is not {what}")
            kw[k] = math.nan if v is None and what == "a number" else v
    if "params" in kw:  # a row written before swept values were typed: "4k" -> 4096
        kw["params"] = upgraded_params(kw["params"])
    return Row(**kw)


class RowError(ValueError):
    """A JSON object that is not a well-typed row; the message names the field."""


def _number(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@functools.lru_cache(maxsize=1)
def _field_checks() -> dict:
    """field name -> (accepts(value), what it should be), from the field annotations."""
    kinds = {
        str: (lambda v: isinstance(v, str), "a string"),
        int: (_integer, "an integer"),
        float: (_number, "a number"),
        Status: (lambda v: v in {s.value for s in Status}, "one of " + ", ".join(s.value for s in Status)),
        Optional[bool]: (lambda v: v is None or isinstance(v, bool), "true, false or null"),
        Optional[int]: (lambda v: v is None or _integer(v), "an integer or null"),
        dict: (lambda v: isinstance(v, dict), "a mapping"),
        list: (lambda v: isinstance(v, list) and all(_number(x) for x in v), "a list of numbers"),
    }
    return {name: kinds[hint] for name, hint in typing.get_type_hints(Row).items()}


def checked(row: Row) -> Row:
    """The gate every produced row passes: a row that lacks what its status must carry
    becomes an ``error`` row whose reason says what was missing (and what it claimed)."""
    missing = row.problems()
    if missing:
        claimed, was = row.status.value, row.reason.strip()
        row.status = Status.ERROR
        row.reason = f"malformed {claimed} row: " + "; ".join(missing) + (f" (its reason: {was})" if was else "")
    return row


LIST_FIELDS = ("params", "samples_ms", "round_medians_ms", "plan_samples_ms", "convert_samples_ms")
CSV_FIELDS = [f.name for f in dataclasses.fields(Row) if f.name not in LIST_FIELDS]


def rows_table(rows: Iterable[Row]) -> tuple[list[str], list[dict]]:
    """(columns, one dict per row) of results.csv: the CSV fields with the sweep values as
    columns after case_id, plus the registry's derived columns (``store/columns.py``:
    ``x_fastest``, the median over the case's fastest competitor's; the oracle is never the
    fastest, its own row is relative to the fastest competitor)."""
    rows = list(rows)
    param_cols: list[str] = []
    for r in rows:
        for k in r.params:
            if k not in param_cols:
                param_cols.append(k)
    ctx, derived = context_of(rows), derived_columns()
    recs = []
    for r in rows:
        d = {k: getattr(r, k) for k in CSV_FIELDS}
        for k in param_cols:
            v = r.params.get(k)
            d[k] = json.dumps(v, default=str) if isinstance(v, (list, dict)) else v
        d.update((c.name, c.value(r, ctx)) for c in derived)
        recs.append(d)
    return CSV_FIELDS[:2] + param_cols + CSV_FIELDS[2:] + [c.name for c in derived], recs


def rows_frame(rows: Iterable[Row]) -> "pd.DataFrame":
    """Rows as a DataFrame (the columns of results.csv), for plots and scripts."""
    import pandas as pd  # here: pandas takes a third of a second to import

    cols, recs = rows_table(rows)
    return pd.DataFrame.from_records(recs, columns=cols)


def _csv_value(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, Enum):
        return str(v.value)
    return repr(v) if isinstance(v, float) else str(v)


def rows_csv(rows: Iterable[Row]) -> str:
    """results.csv as text, written with the csv module: pandas is not imported by a run
    (0.3 s CPU and 33 MiB for one file). Empty cells for None/NaN, floats as Python's
    shortest round-trip text."""
    import csv
    import io

    cols, recs = rows_table(rows)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for d in recs:
        w.writerow([_csv_value(d[c]) for c in cols])
    return buf.getvalue()
