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
from typing import Optional

from attnbench.store.fingerprint import clean_fingerprint, fingerprint
from attnbench.store.manifest import Manifest
from attnbench.store.rows import Row
from attnbench.store.outputs import check_write_target
from attnbench.store.runfolder import RunFolder, atomic_write, utc_now
from attnbench.store.run_reader import BaselineError, check_rows, row_problem  # noqa: F401 - importable from here as before

FORMAT_VERSION = 1
# manifest keys a baseline keeps: what ran and where (not the scenario text's copy of itself)
MANIFEST_KEYS = (
    "scenario", "scenario_path", "scenario_sha256", "command", "overrides", "seed",
    "attnbench", "environment", "start_time", "end_time", "status", "cases", "backends_requested",
)


@dataclass
class Loaded:
    """Rows of a run folder or a baseline file, with where they came from."""

    label: str
    rows: list[Row]
    manifest: Manifest
    fingerprint: dict


def _rows_from_json(items: list, where: str, fix: str) -> list[Row]:
    rows = []
    for i, d in enumerate(items):
        try:
            if not isinstance(d, dict):
                raise TypeError(f"{type(d).__name__}, expected an object")
            rows.append(Row.from_json(d))
        except (TypeError, ValueError) as e:
            raise BaselineError(f"{where}: rows[{i}]: {e}; {fix}") from None
    return rows


def load_rows(path: Path, need_rounds: bool = False) -> Loaded:
    """A run folder (``rows.jsonl`` + ``manifest.json``) or a baseline JSON file, every row
    checked (``check_rows``); ``need_rounds``: ok rows must have their round medians."""
    loaded = _load(Path(path))
    check_rows(loaded.label, loaded.rows, loaded.manifest, need_rounds)
    return loaded


def _load(path: Path) -> Loaded:
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
    version = data["attnbench_baseline"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise BaselineError(f"{path}: attnbench_baseline: {version!r}, expected the format number {FORMAT_VERSION}")
    if version > FORMAT_VERSION:
        raise BaselineError(f"{path}: baseline format {version} is newer than this attnbench reads")
    for key in ("manifest", "fingerprint"):
        if not isinstance(data.get(key) or {}, dict):
            raise BaselineError(f"{path}: {key}: {type(data[key]).__name__}, expected an object; "
                                f"make the baseline again: attnbench baseline RUN --to {path}")
    rows = _rows_from_json(data["rows"], str(path), f"make the baseline again: attnbench baseline RUN --to {path}")
    manifest = data.get("manifest") or {}
    if not isinstance(manifest, dict):
        raise BaselineError(f"{path}: manifest: a {type(manifest).__name__}, not a mapping")
    manifest = Manifest.from_json(manifest)
    fp = data.get("fingerprint") or fingerprint(manifest, rows)
    if not isinstance(fp, dict):
        raise BaselineError(f"{path}: fingerprint: a {type(fp).__name__}, not a mapping")
    return Loaded(str(path), rows, manifest, clean_fingerprint(fp))


def few_rounds_problem(run: Path, rf: RunFolder, need: int) -> Optional[str]:
    """Why ``check`` (which needs ``need`` timing rounds per side) would refuse this run as a
    baseline: its ok rows with fewer rounds, counted, with the command that makes a usable run."""
    few = [r for r in rf.rows if r.status == "ok" and len(r.timing.round_medians_ms or []) < need]
    if not few:
        return None
    ok = sum(r.status == "ok" for r in rf.rows)
    have = sorted({len(r.timing.round_medians_ms or []) for r in few})
    m = rf.manifest
    scenario = m.scenario_path or m.scenario or "SCENARIO"
    return (f"{run}: {len(few)} of {ok} ok row(s) have {'/'.join(map(str, have))} timing round(s) "
            f"(e.g. {few[0].id.case_id} · {few[0].id.backend}); attnbench check needs at least {need} per side at its "
            f"default confidence and would refuse this baseline. Make a run with more rounds and the baseline "
            f"of that: attnbench run {scenario} --set timing.rounds={max(need, 10)} (with the run's other options), "
            "or pass --allow-few-rounds to keep this one (then check it at a lower --confidence)")


def make_baseline(run: Path, min_rounds: int = 0) -> dict:
    """The baseline document of a run folder (not written anywhere); refused when ``check``
    would refuse it: a damaged row, a duplicate, a line of rows.jsonl that is not a row, and
    (``min_rounds``) ok rows with fewer timing rounds than that."""
    rf = RunFolder.load(Path(run))
    if not rf.rows:
        raise BaselineError(f"{run}: the run folder has no rows")
    if rf.broken_lines:
        raise BaselineError(f"{run}: rows.jsonl has {len(rf.broken_lines)} line(s) that are not rows (line "
                            f"{', '.join(map(str, rf.broken_lines[:10]))}): a baseline of the rest would hide them; "
                            "run the scenario again (or finish it: attnbench run --resume, which sets them aside)")
    check_rows(str(run), rf.rows, rf.manifest, need_rounds=True)
    why = few_rounds_problem(Path(run), rf, min_rounds) if min_rounds else None
    if why:
        raise BaselineError(why)
    return {
        "attnbench_baseline": FORMAT_VERSION,
        "created": utc_now(),
        "source": str(run),
        "fingerprint": fingerprint(rf.manifest, rf.rows),
        "manifest": {k: v for k, v in rf.manifest.to_json().items() if k in MANIFEST_KEYS},
        "rows": [{k: v for k, v in r.to_json().items() if k != "trace"} for r in rf.rows],
    }


def write_baseline(run: Path, to: Path, min_rounds: int = 0) -> dict:
    to = Path(to)
    if to.is_dir():
        raise BaselineError(f"--to {to}: a folder; name the baseline file, e.g. {to / 'NAME.json'}")
    to = check_write_target(to, "--to", inputs=[run], example="results/baselines/NAME.json")
    doc = make_baseline(run, min_rounds)
    to.parent.mkdir(parents=True, exist_ok=True)
    # one row per line: reviewable diffs when a committed baseline is refreshed
    head = {k: v for k, v in doc.items() if k != "rows"}
    body = ",\n".join("  " + json.dumps(r, default=str, allow_nan=False) for r in doc["rows"])
    text = json.dumps(head, indent=1, default=str)[:-2] + ',\n "rows": [\n' + body + "\n ]\n}\n"
    json.loads(text)  # the hand-joined document must parse
    atomic_write(to, text)  # a temporary file of this writer's own, removed if the write fails
    return doc
