"""Run folders: written as rows finish, loaded back; environment capture.

A run folder holds ``manifest.json`` (what ran, where, when, complete or not),
``rows.jsonl`` (one JSON object per finished row, raw timing samples included, appended and
flushed as each row finishes) and ``results.csv`` (the same rows without the samples, the
sweep values as columns, rewritten atomically after each row, so it is never half-written).
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from attnbench.store.rows import Row, rows_frame
from attnbench.workload.units import safe_name


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
        self.write_manifest()

    def write_manifest(self) -> None:
        atomic_write(self.path / "manifest.json", json.dumps(self.manifest, indent=2, default=str))

    def add(self, row: Row) -> None:
        self.rows.append(row)
        with open(self.path / "rows.jsonl", "a") as f:
            f.write(json.dumps(row.to_json(), default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        atomic_write(self.path / "results.csv", rows_frame(self.rows).to_csv(index=False))

    def finish(self, complete: bool, **extra) -> None:
        self.manifest.update(status="complete" if complete else "incomplete", end_time=utc_now(), **extra)
        self.write_manifest()

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
