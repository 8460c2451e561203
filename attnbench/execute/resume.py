"""``attnbench run --resume RUN_DIR``: finish a run folder that a crash or Ctrl-C left incomplete.

The scenario comes back from the manifest (its text and ``--set`` overrides: the original file
may have changed or be gone), the run options from the manifest's ``options`` (and
``--isolate`` with its ``--timeout``); every (case, backend) row already in ``rows.jsonl`` is
skipped, the rest are appended to the same folder, and the manifest is marked complete at
the end.

Two steps, so that a resume that is refused changes nothing on disk: ``open_run`` takes the
folder's lock and reads and checks everything (the manifest's types, its scenario, the
backends, and with ``environment_changes`` the attnbench version, torch and device it was
made with); only ``begin`` writes: lines of ``rows.jsonl`` that are not rows (a line a crash
cut short) move to ``rows.broken.jsonl``, and the manifest records the resume.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from attnbench import __version__
from attnbench import backend as registry
from attnbench.execute.options import RunOptions, options_from_json
from attnbench.store.runfolder import RunFolder, atomic_write, read_manifest, read_rows, scenario_hash, utc_now
from attnbench.store.rows import rows_frame
from attnbench.workload.scenario import ScenarioError, ScenarioFile, load_text


class ResumeError(ValueError):
    """The folder cannot be resumed; the message says why and what to do."""


@dataclass
class Resumed:
    folder: RunFolder  # loaded and locked
    sf: ScenarioFile
    options: RunOptions
    overrides: list[str]
    scenario_path: str
    done: frozenset = field(default_factory=frozenset)
    isolate: bool = False  # the run's own --isolate
    timeout: Optional[float] = None  # and its --timeout (None: not recorded)


def open_run(path: Path) -> Resumed:
    """Lock and read a run folder and check that it can be resumed; writes nothing."""
    path = Path(path)
    if not path.is_dir():
        raise ResumeError(f"--resume {path}: no such run folder")
    rows_file, man_file = path / "rows.jsonl", path / "manifest.json"
    if not rows_file.is_file() and not man_file.is_file():
        raise ResumeError(f"--resume {path}: not a run folder (no manifest.json, no rows.jsonl)")
    folder = RunFolder(path)
    folder.lock()  # RunFolderError when another process writes it
    try:
        if rows_file.is_file():  # absent: interrupted before the first row
            folder.rows, folder.broken_lines = read_rows(rows_file)
        folder.manifest = read_manifest(man_file)
        return _check(folder)
    except BaseException:
        folder.unlock()
        raise


def _check(folder: RunFolder) -> Resumed:
    path, man = folder.path, folder.manifest
    if not man:
        raise ResumeError(f"--resume {path}: manifest.json is missing or unreadable; start a new run instead")
    text = man.get("scenario_text")
    if not isinstance(text, str):
        raise ResumeError(f"--resume {path}: the manifest holds no scenario_text; start a new run instead")
    if man.get("scenario_sha256") and scenario_hash(text) != man["scenario_sha256"]:
        raise ResumeError(f"--resume {path}: scenario_text does not match scenario_sha256 (edited manifest?)")
    scenario_path = str(man.get("scenario_path") or "<manifest>")
    overrides = man.get("overrides") or []
    if not (isinstance(overrides, list) and all(isinstance(o, str) for o in overrides)):
        raise ResumeError(f"--resume {path}: manifest.json: overrides: not a list of KEY=VALUE texts (edited by hand?)")
    try:
        sf = load_text(text, scenario_path, overrides)
    except ScenarioError as e:
        raise ResumeError(f"--resume {path}: the recorded scenario no longer loads: {e}") from None
    if man.get("scenario") and sf.name != man["scenario"]:
        raise ResumeError(f"--resume {path}: scenario name {sf.name!r} differs from the manifest's {man['scenario']!r}")
    try:
        opts = _options(man)
    except ValueError as e:
        raise ResumeError(f"--resume {path}: manifest.json: {e} (edited by hand?); start a new run instead") from None
    missing = [b for b in (opts.backends or []) if registry.backend_name(b) not in registry.all_names()]
    if missing:
        files = man.get("backend_files") or []
        files = [str(f) for f in files] if isinstance(files, list) else []
        hint = f" pass --backend-file {' --backend-file '.join(files)} again" if files else " pass its --backend-file again"
        raise ResumeError(f"--resume {path}: backend {missing[0]!r} is unknown here;{hint} (it runs that file's code)")
    timeout = man.get("timeout")
    timeout = float(timeout) if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0 else None
    done = frozenset((r.case_id, r.backend) for r in folder.rows if r.scenario == sf.name)
    return Resumed(folder, sf, opts, list(overrides), scenario_path, done, bool(man.get("isolate") is True), timeout)


def _options(man: dict) -> RunOptions:
    if "options" in man:
        return options_from_json(man["options"])
    # a folder written before options were recorded: the backends it asked for
    asked = man.get("backends_requested") or []
    if not (isinstance(asked, list) and all(isinstance(b, str) for b in asked)):
        raise ValueError("backends_requested: not a list of names")
    return RunOptions(backends=list(asked) or None)


def environment_changes(prior: Resumed, device_name: str) -> list[str]:
    """What differs between the run's recorded attnbench version, torch and device and this
    machine's (rows from both would sit under one manifest); [] when nothing does."""
    import torch

    man = prior.folder.manifest
    env = man.get("environment") if isinstance(man.get("environment"), dict) else {}
    changes = []
    for what, then, now in (
        ("attnbench", man.get("attnbench"), __version__),
        ("torch", env.get("torch"), torch.__version__),
        ("device", env.get("device"), device_name),
    ):
        if then != now:
            changes.append(f"{what} {then if then is not None else '(not recorded)'} then, {now} now")
    return changes


def begin(prior: Resumed, isolate: bool, env_changes: list[str], executor: Optional[dict] = None) -> Optional[str]:
    """The resume proceeds: set aside broken lines of rows.jsonl (returns a note saying so),
    rewrite results.csv from the rows, and record the resume in the manifest."""
    folder, note = prior.folder, None
    rows_file = folder.path / "rows.jsonl"
    if folder.broken_lines:
        broken = set(folder.broken_lines)
        lines = rows_file.read_bytes().splitlines(keepends=True)
        kept = [ln for i, ln in enumerate(lines, 1) if i not in broken and ln.strip()]
        with open(folder.path / "rows.broken.jsonl", "ab") as f:
            for i in sorted(broken):
                f.write(lines[i - 1].rstrip(b"\n") + b"\n")
        atomic_write(rows_file, b"".join(ln if ln.endswith(b"\n") else ln + b"\n" for ln in kept).decode())
        note = (f"{len(broken)} line(s) of rows.jsonl that were not rows (line "
                f"{', '.join(map(str, sorted(broken)))}) moved to {folder.path / 'rows.broken.jsonl'}")
    if folder.rows or rows_file.is_file():
        atomic_write(folder.path / "results.csv", rows_frame(folder.rows).to_csv(index=False))
    entry = {"time": utc_now(), "rows_before": len(folder.rows), "isolate": isolate, "executor": executor or {"kind": "local"}}
    if env_changes:
        entry["environment_changes"] = env_changes
    resumed = folder.manifest.get("resumed")
    folder.manifest["resumed"] = (resumed if isinstance(resumed, list) else []) + [entry]
    folder.manifest["status"] = "incomplete"
    folder.write_manifest()
    return note
