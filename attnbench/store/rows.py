"""Result rows: one per (case, backend), with a typed status and the fields it must carry.

What each status must carry (``Row.problems`` checks it; ``checked`` enforces it):

- ``ok``: a finite ``median_ms`` over ``n >= 1`` samples and the ``timing_method``;
- ``skipped``: a ``reason``: what the backend cannot do, or why the case could not run;
- ``error``: a ``reason``: the exception, signal or timeout;
- ``mismatch``: a ``reason``: what differs from the reference.

Every row the runner or the isolation parent yields passes through ``checked``: a row that
lacks what its status asks for becomes an ``error`` row naming what was missing, so that no
malformed row reaches a run folder.

A row is its outcome plus typed parts (``store/row_parts.py``: identity, workload, timing,
correctness, roofline, profile). On disk it is flat, as it always was: ``FLAT_FIELDS`` orders
the fields of the row and its parts (checked against the dataclasses when this module loads),
and rows.jsonl, JSON (``Row.to_json``) and results.csv (``CSV_FIELDS``) follow it.
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

from attnbench.store.columns import (
    ORACLE_BACKEND, context_of, derived_columns, is_interpreted, is_oracle,
)
from attnbench.store.row_parts import (
    PARTS, RowCorrectness, RowIdentity, RowProfile, RowRoofline, RowTiming, RowWorkload,
)
from attnbench.workload.sweeps import upgraded_params

__all__ = [
    "Status", "Row", "FLAT_FIELDS", "strict_json", "typed_row", "RowError", "checked", "LIST_FIELDS",
    "CSV_FIELDS", "rows_table", "rows_frame", "rows_csv",
    # re-exported: the oracle's name and the ranking tests (store/columns.py), the parts (store/row_parts.py)
    "ORACLE_BACKEND", "is_interpreted", "is_oracle", "RowIdentity", "RowWorkload", "RowTiming", "RowCorrectness",
    "RowRoofline", "RowProfile",
]



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
    """One (case, backend) measurement: its identity and typed parts (``store/row_parts.py``),
    each made where its facts are known, and its outcome. On disk it is one flat record
    (``FLAT_FIELDS``, the same names and order as before it had parts)."""

    id: RowIdentity
    status: Status = Status.OK
    reason: str = ""
    workload: RowWorkload = field(default_factory=RowWorkload)
    timing: RowTiming = field(default_factory=RowTiming)
    correctness: RowCorrectness = field(default_factory=RowCorrectness)
    roofline: RowRoofline = field(default_factory=RowRoofline)
    profile: RowProfile = field(default_factory=RowProfile)

    def __setattr__(self, name, value):
        # status is always a Status, however it is set (a plain string is converted)
        object.__setattr__(self, name, Status(value) if name == "status" else value)

    def problems(self) -> list[str]:
        """What this row lacks for its status ([] when it is well-formed)."""
        if self.status is Status.OK:
            out = []
            if not (self.timing.n >= 1 and math.isfinite(self.timing.median_ms)):
                out.append("an ok row needs a finite median_ms over n >= 1 samples")
            if not self.timing.timing_method:
                out.append("an ok row needs its timing_method")
            return out
        return [] if self.reason.strip() else [f"a {self.status.value} row needs a reason"]

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of a row across runs: scenario, case, backend (never its position)."""
        return (self.id.scenario, self.id.case_id, self.id.backend)

    def flat(self) -> dict:
        """The on-disk record: every field by its name, in ``FLAT_FIELDS`` order (the values are
        the row's own, not copies: ``to_json`` makes new lists and mappings)."""
        return {name: getattr(self if home is None else getattr(self, home), name)
                for name, home in _HOME.items()}

    def to_json(self) -> dict:
        """Strict JSON: NaN and infinities become null (``from_json`` reads either back)."""
        return strict_json(self.flat())

    @classmethod
    def from_json(cls, d: dict) -> "Row":
        """A row from its flat record; unknown keys are left out, null numbers read as NaN."""
        kw = {k: v for k, v in d.items() if k in _HOME}
        for k in _FLOAT_FIELDS:
            if k in kw and kw[k] is None:
                kw[k] = math.nan
        if isinstance(kw.get("params"), dict):
            kw["params"] = upgraded_params(kw["params"])
        return cls.of_flat(kw)

    @classmethod
    def of_flat(cls, kw: dict) -> "Row":
        """A row from flat field values (``FLAT_FIELDS`` names, each already of its type)."""
        own = {k: v for k, v in kw.items() if _HOME[k] is None}
        parts = {home: part(**{k: v for k, v in kw.items() if _HOME[k] == home}) for home, part in PARTS.items()}
        return cls(**own, **parts)


#: the flat record's fields, in the order rows.jsonl, results.csv and JSON have always written them
FLAT_FIELDS = (
    "scenario", "case_id", "backend", "status", "reason", "backend_version", "mode", "device", "device_id",
    "dtype", "page_size", "layout", "batch", "num_requests", "num_tokens", "plan_ms", "convert_ms", "median_ms",
    "p20_ms", "p80_ms", "min_ms", "iqr_rel", "n", "step_ms", "timing_method", "threads", "cold_l2", "flush",
    "timing_note", "rel_err", "max_abs_err", "tolerance", "flops", "bytes", "tflops", "tbps", "floor_ms", "bound",
    "pct_of_ceiling", "kernels_per_call", "kernel_sum_ms", "trace", "repro", "params", "samples_ms",
    "round_medians_ms", "plan_samples_ms", "convert_samples_ms",
)


def _homes() -> dict:
    """flat field name -> the part holding it (None: the row itself), in ``FLAT_FIELDS`` order."""
    where = {f.name: None for f in dataclasses.fields(Row) if f.name not in PARTS}
    for home, part in PARTS.items():
        where.update((f.name, home) for f in dataclasses.fields(part))
    if sorted(where) != sorted(FLAT_FIELDS):
        raise TypeError(f"FLAT_FIELDS and the fields of Row and its parts differ: {set(where) ^ set(FLAT_FIELDS)}")
    return {name: where[name] for name in FLAT_FIELDS}


_HOME = _homes()


def _hints() -> dict:
    """flat field name -> its annotation (evaluated)."""
    out = {k: v for k, v in typing.get_type_hints(Row).items() if k not in PARTS}
    for part in PARTS.values():
        out.update(typing.get_type_hints(part))
    return out


_FLOAT_FIELDS = {k for k, hint in _hints().items() if hint is float}


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
    return Row.of_flat(kw)


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
    return {name: kinds[hint] for name, hint in _hints().items()}


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
CSV_FIELDS = [name for name in FLAT_FIELDS if name not in LIST_FIELDS]


def rows_table(rows: Iterable[Row]) -> tuple[list[str], list[dict]]:
    """(columns, one dict per row) of results.csv: the CSV fields with the sweep values as
    columns after case_id, plus the registry's derived columns (``store/columns.py``:
    ``x_fastest``, the median over the case's fastest competitor's; the oracle is never the
    fastest, its own row is relative to the fastest competitor)."""
    rows = list(rows)
    param_cols: list[str] = []
    for r in rows:
        for k in r.workload.params:
            if k not in param_cols:
                param_cols.append(k)
    ctx, derived = context_of(rows), derived_columns()
    recs = []
    for r in rows:
        flat = r.flat()
        d = {k: flat[k] for k in CSV_FIELDS}
        for k in param_cols:
            v = r.workload.params.get(k)
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
