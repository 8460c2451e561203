"""``attnbench run --resume RUN_DIR``: finish a run folder that a crash or Ctrl-C left incomplete.

The scenario comes back from the manifest (its text and ``--set`` overrides: the original file
may have changed or be gone), the run options from the manifest's ``options``; every
(case, backend) row already in ``rows.jsonl`` is skipped, the rest are appended to the same
folder, and the manifest is marked complete at the end. A line cut short by a crash in the
middle of a write is dropped (``rows.jsonl`` is rewritten atomically first), so appending
cannot bury later rows behind a broken line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from attnbench import backend as registry
from attnbench.execute.options import RunOptions, options_from_json
from attnbench.store.runfolder import RunFolder, atomic_write, scenario_hash, utc_now
from attnbench.store.rows import rows_frame
from attnbench.workload.scenario import ScenarioError, ScenarioFile, load_text


class ResumeError(ValueError):
    """The folder cannot be resumed; the message says why and what to do."""


@dataclass
class Resumed:
    folder: RunFolder
    sf: ScenarioFile
    options: RunOptions
    overrides: list[str]
    scenario_path: str
    done: frozenset = field(default_factory=frozenset)


def reopen(path: Path) -> RunFolder:
    """Load a run folder and rewrite its rows.jsonl and results.csv from the rows that loaded."""
    path = Path(path)
    if not path.is_dir():
        raise ResumeError(f"--resume {path}: no such run folder")
    if not (path / "rows.jsonl").is_file():
        if not (path / "manifest.json").is_file():
            raise ResumeError(f"--resume {path}: not a run folder (no manifest.json, no rows.jsonl)")
        (path / "rows.jsonl").write_text("")  # interrupted before the first row
    folder = RunFolder.load(path)
    text = "".join(json.dumps(r.to_json(), default=str) + "\n" for r in folder.rows)
    atomic_write(path / "rows.jsonl", text)
    atomic_write(path / "results.csv", rows_frame(folder.rows).to_csv(index=False))
    return folder


def open_run(path: Path) -> Resumed:
    folder = reopen(path)
    man = folder.manifest
    if not man:
        raise ResumeError(f"--resume {path}: manifest.json is missing or unreadable; start a new run instead")
    text = man.get("scenario_text")
    if not isinstance(text, str):
        raise ResumeError(f"--resume {path}: the manifest holds no scenario_text; start a new run instead")
    if man.get("scenario_sha256") and scenario_hash(text) != man["scenario_sha256"]:
        raise ResumeError(f"--resume {path}: scenario_text does not match scenario_sha256 (edited manifest?)")
    scenario_path = str(man.get("scenario_path") or "<manifest>")
    overrides = list(man.get("overrides") or [])
    try:
        sf = load_text(text, scenario_path, overrides)
    except ScenarioError as e:
        raise ResumeError(f"--resume {path}: the recorded scenario no longer loads: {e}") from None
    if man.get("scenario") and sf.name != man["scenario"]:
        raise ResumeError(f"--resume {path}: scenario name {sf.name!r} differs from the manifest's {man['scenario']!r}")
    if "options" in man:
        opts = options_from_json(man["options"])
    else:  # a folder written before options were recorded: the backends it asked for
        opts = RunOptions(backends=list(man.get("backends_requested") or []) or None)
    missing = [b for b in (opts.backends or []) if b not in registry.all_names()]
    if missing:
        files = man.get("backend_files") or []
        hint = f" pass --backend-file {' --backend-file '.join(files)} again" if files else " pass its --backend-file again"
        raise ResumeError(f"--resume {path}: backend {missing[0]!r} is unknown here;{hint} (it runs that file's code)")
    done = frozenset((r.case_id, r.backend) for r in folder.rows if r.scenario == sf.name)
    return Resumed(folder, sf, opts, overrides, scenario_path, done)


def mark_resumed(folder: RunFolder, isolate: bool) -> None:
    folder.manifest.setdefault("resumed", []).append(
        {"time": utc_now(), "rows_before": len(folder.rows), "isolate": isolate}
    )
    folder.manifest["status"] = "incomplete"
    folder.write_manifest()
