"""Baseline files, and one loader for "a run folder or a baseline file".

A baseline is one JSON file, small enough to commit (``results/baselines/NAME.json``)::

    {"attnbench_baseline": 1, "created": ..., "source": "results/<run folder>",
     "fingerprint": {"device": ..., "torch": ..., "backends": {...}},
     "manifest": {scenario, scenario_sha256, command, overrides, seed, environment, ...},
     "rows": [<Row as JSON, raw samples included>, ...]}

The raw samples stay in it: a regression check needs distributions, not single numbers.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from attnbench.store.fingerprint import fingerprint
from attnbench.store.rows import Row
from attnbench.store.runfolder import RunFolder, utc_now

class BaselineError(ValueError):
    """A file that is not a usable baseline or run folder; the message says which and why."""


FORMAT_VERSION = 1
# manifest keys a baseline keeps: what ran and where (not the scenario text's copy of itself)
MANIFEST_KEYS = (
    "scenario", "scenario_path", "scenario_sha256", "command", "overrides", "seed",
    "attnbench", "environment", "start_time", "end_time", "status",
)


@dataclass
class Loaded:
    """Rows of a run folder or a baseline file, with where they came from."""

    label: str
    rows: list[Row]
    manifest: dict
    fingerprint: dict


def load_rows(path: Path) -> Loaded:
    """A run folder (``rows.jsonl`` + ``manifest.json``) or a baseline JSON file."""
    path = Path(path)
    if path.is_dir():
        rf = RunFolder.load(path)  # FileNotFoundError names the folder when it is not a run
        return Loaded(str(path), rf.rows, rf.manifest, fingerprint(rf.manifest, rf.rows))
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such run folder or baseline file")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BaselineError(f"{path}: not a baseline file (invalid JSON: {e})") from None
    if not isinstance(data, dict) or "attnbench_baseline" not in data or not isinstance(data.get("rows"), list):
        raise BaselineError(
            f"{path}: not a baseline file (expected the output of `attnbench baseline RUN --to {path}`) "
            "or a run folder"
        )
    if data["attnbench_baseline"] > FORMAT_VERSION:
        raise BaselineError(f"{path}: baseline format {data['attnbench_baseline']} is newer than this attnbench reads")
    rows = [Row.from_json(d) for d in data["rows"]]
    manifest = data.get("manifest") or {}
    fp = data.get("fingerprint") or fingerprint(manifest, rows)
    return Loaded(str(path), rows, manifest, fp)


def make_baseline(run: Path) -> dict:
    """The baseline document of a run folder (not written anywhere)."""
    rf = RunFolder.load(Path(run))
    if not rf.rows:
        raise BaselineError(f"{run}: the run folder has no rows")
    return {
        "attnbench_baseline": FORMAT_VERSION,
        "created": utc_now(),
        "source": str(run),
        "fingerprint": fingerprint(rf.manifest, rf.rows),
        "manifest": {k: rf.manifest[k] for k in MANIFEST_KEYS if k in rf.manifest},
        "rows": [{k: v for k, v in r.to_json().items() if k != "trace"} for r in rf.rows],
    }


def write_baseline(run: Path, to: Path) -> dict:
    doc = make_baseline(run)
    to = Path(to)
    to.parent.mkdir(parents=True, exist_ok=True)
    tmp = to.with_name(f".{to.name}.tmp")
    # one row per line: reviewable diffs when a committed baseline is refreshed
    head = {k: v for k, v in doc.items() if k != "rows"}
    body = ",\n".join("  " + json.dumps(r, default=str) for r in doc["rows"])
    text = json.dumps(head, indent=1, default=str)[:-2] + ',\n "rows": [\n' + body + "\n ]\n}\n"
    json.loads(text)  # the hand-joined document must parse
    tmp.write_text(text)
    tmp.replace(to)
    return doc
