"""Result rows, run folders, environment capture, and the CSV/JSON writers and loaders.

A run folder holds ``manifest.json`` (what ran, where, when, complete or not),
``rows.jsonl`` (one JSON object per finished row, raw timing samples included, appended and
flushed as each row finishes) and ``results.csv`` (the same rows without the samples, the
sweep values as columns, rewritten atomically after each row, so it is never half-written).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import pandas as pd

STATUSES = ("ok", "skipped", "error", "mismatch")


@dataclass
class Row:
    """One (case, backend) measurement. CSV columns come from these fields."""

    scenario: str
    case_id: str
    backend: str
    status: str = "ok"
    reason: str = ""
    backend_version: str = ""
    mode: str = ""
    device: str = ""
    dtype: str = ""
    page_size: int = 0
    layout: str = ""
    batch: str = ""  # e.g. "32 decode@4k + 8 tree(41)@2k"
    num_requests: int = 0
    num_tokens: int = 0
    plan_ms: float = math.nan
    median_ms: float = math.nan
    p20_ms: float = math.nan
    p80_ms: float = math.nan
    min_ms: float = math.nan
    iqr_rel: float = math.nan
    n: int = 0
    step_ms: float = math.nan  # plan + run: what an engine pays each step
    timing_method: str = ""
    cold_l2: Optional[bool] = None
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
    params: dict = field(default_factory=dict)
    samples_ms: list = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of a row across runs: scenario, case, backend (never its position)."""
        return (self.scenario, self.case_id, self.backend)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Row":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


CSV_FIELDS = [f.name for f in dataclasses.fields(Row) if f.name not in ("params", "samples_ms")]


def rows_frame(rows: Iterable[Row]) -> pd.DataFrame:
    """Rows as a DataFrame: sweep values as columns (after case_id), plus ``x_fastest``
    (median over the fastest ok backend's median in the same case)."""
    rows = list(rows)
    param_cols: list[str] = []
    for r in rows:
        for k in r.params:
            if k not in param_cols:
                param_cols.append(k)
    recs = []
    for r in rows:
        d = {k: getattr(r, k) for k in CSV_FIELDS}
        for k in param_cols:
            v = r.params.get(k)
            d[k] = json.dumps(v, default=str) if isinstance(v, (list, dict)) else v
        recs.append(d)
    cols = CSV_FIELDS[:2] + param_cols + CSV_FIELDS[2:]
    df = pd.DataFrame.from_records(recs, columns=cols)
    best: dict[str, float] = {}
    for r in rows:
        if r.status == "ok" and r.median_ms == r.median_ms:
            best[r.case_id] = min(best.get(r.case_id, math.inf), r.median_ms)
    df["x_fastest"] = [
        (r.median_ms / best[r.case_id]) if r.status == "ok" and r.case_id in best else math.nan for r in rows
    ]
    return df


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def safe_name(text: str, limit: int = 80) -> str:
    """A file-name-safe slug that cannot leave its folder (no separators, no '..')."""
    s = re.sub(r"[^A-Za-z0-9._=,+-]+", "-", text).strip(".-")
    s = s.replace("..", ".")
    return (s or "unnamed")[:limit]


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def git_commit(cwd: Optional[Path] = None) -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device_name: str, backend_versions: dict[str, str]) -> dict:
    import torch

    try:
        import triton  # noqa: F401

        triton_v = triton.__version__
    except Exception:
        triton_v = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_v,
        "device": device_name,
        "backends": backend_versions,
        "git_commit": git_commit(Path(__file__).resolve().parent),
    }


class RunFolder:
    """Writes a run folder as rows finish; loads one back."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.rows: list[Row] = []
        self.manifest: dict[str, Any] = {}

    @classmethod
    def create(cls, root: Path, scenario_name: str, out: Optional[Path] = None) -> "RunFolder":
        if out is None:
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            out = Path(root) / f"{stamp}-{safe_name(scenario_name)}"
            i = 1
            while out.exists():
                i += 1
                out = Path(root) / f"{stamp}-{safe_name(scenario_name)}-{i}"
        out.mkdir(parents=True, exist_ok=True)
        return cls(out)

    def start(self, manifest: dict) -> None:
        self.manifest = {"status": "incomplete", "start_time": utc_now(), **manifest}
        self._write_manifest()

    def _write_manifest(self) -> None:
        _atomic_write(self.path / "manifest.json", json.dumps(self.manifest, indent=2, default=str))

    def add(self, row: Row) -> None:
        self.rows.append(row)
        with open(self.path / "rows.jsonl", "a") as f:
            f.write(json.dumps(row.to_json(), default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        _atomic_write(self.path / "results.csv", rows_frame(self.rows).to_csv(index=False))

    def finish(self, complete: bool, **extra) -> None:
        self.manifest.update(status="complete" if complete else "incomplete", end_time=utc_now(), **extra)
        self._write_manifest()

    @classmethod
    def load(cls, path: Path) -> "RunFolder":
        path = Path(path)
        rf = cls(path)
        rows_file = path / "rows.jsonl"
        if not rows_file.is_file():
            raise FileNotFoundError(f"{path}: not a run folder (no rows.jsonl)")
        for line in rows_file.read_text().splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                rf.rows.append(Row.from_json(json.loads(line)))
            except (ValueError, TypeError):
                break  # a line cut by a crash mid-write: the rows before it stand
        try:
            rf.manifest = json.loads((path / "manifest.json").read_text())
        except (OSError, ValueError):
            rf.manifest = {}
        return rf


def scenario_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
