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
from attnbench.backend import registry
from attnbench.store.code_identity import PACKAGE_DIR, backend_file_changes, code_changes, code_diff_sha256
from attnbench.store.manifest import Manifest
from attnbench.store.options import RunOptions
from attnbench.store.outputs import RUN_FILES, remove_stale_temporaries
from attnbench.store.runfolder import RunFolder, git_commit, git_dirty, scenario_hash, utc_now
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
    if not (path / "rows.jsonl").is_file() and not (path / "manifest.json").is_file():
        if {p.name for p in path.iterdir()} <= {".lock"}:  # stopped between making the folder and its manifest
            raise ResumeError(f"--resume {path}: holds no run yet (it was stopped before its manifest was written), so "
                              f"there is nothing to resume; start the run again with --out {path}")
        raise ResumeError(f"--resume {path}: not a run folder (no manifest.json, no rows.jsonl)")
    folder = RunFolder.open_locked(path)  # RunFolderError when another process writes it
    try:
        return _check(folder)
    except BaseException:
        folder.unlock()
        raise


def _check(folder: RunFolder) -> Resumed:
    path, man = folder.path, folder.manifest
    if man == Manifest():
        raise ResumeError(f"--resume {path}: manifest.json is missing or unreadable; start a new run instead")
    for key in _USED:
        if man.problem(key):
            raise ResumeError(f"--resume {path}: manifest.json: {man.problem(key)} (edited by hand?); "
                              "start a new run instead")
    text = man.scenario_text
    if not isinstance(text, str):
        raise ResumeError(f"--resume {path}: the manifest holds no scenario_text; start a new run instead")
    if not man.scenario_sha256 or scenario_hash(text) != man.scenario_sha256:
        what = "does not match scenario_sha256" if man.scenario_sha256 else "comes without its scenario_sha256"
        raise ResumeError(f"--resume {path}: manifest.json: scenario_text {what} (edited by hand?); start a new run instead")
    if man.settings_sha256 != man.settings_hash():
        what = "do not match settings_sha256" if man.settings_sha256 else "come without their settings_sha256"
        raise ResumeError(f"--resume {path}: manifest.json: the recorded settings (scenario text, overrides, options, "
                          f"isolate, timeout) {what} (edited by hand, or written by an older attnbench); "
                          "start a new run instead")
    scenario_path = man.scenario_path or "<manifest>"
    try:
        sf = load_text(text, scenario_path, man.overrides)
    except ScenarioError as e:
        raise ResumeError(f"--resume {path}: the recorded scenario no longer loads: {e}") from None
    if man.scenario and sf.name != man.scenario:
        raise ResumeError(f"--resume {path}: scenario name {sf.name!r} differs from the manifest's {man.scenario!r}")
    # a folder written before options were recorded: the backends it asked for
    opts = man.options if man.options is not None else RunOptions(backends=list(man.backends_requested) or None)
    missing = [b for b in (opts.backends or []) if registry.backend_name(b) not in registry.all_names()]
    if missing:
        files = man.backend_files
        hint = f" pass --backend-file {' --backend-file '.join(files)} again" if files else " pass its --backend-file again"
        raise ResumeError(f"--resume {path}: backend {missing[0]!r} is unknown here;{hint} (it runs that file's code)")
    done = _rows_done(folder, sf, list(opts.backend_specs or man.backends_requested))
    return Resumed(folder, sf, opts, list(man.overrides), scenario_path, done, man.isolate, man.timeout)


# the manifest keys --resume goes on with: a wrong type in any of them refuses the resume
_USED = ("scenario", "scenario_text", "scenario_sha256", "settings_sha256", "overrides", "options",
         "backends_requested", "backend_files", "isolate", "timeout", "select")


def _rows_done(folder: RunFolder, sf: ScenarioFile, backends: list[str]) -> frozenset:
    """The (case, backend) rows already in the folder; ResumeError for a row that cannot be
    one of this run's: another scenario's, a case the scenario does not have, a backend the
    run never ran (``backends``: its specs; [] when not recorded), or a second row of one case
    and backend (which one counts would depend on their order)."""
    cases, ran = {c.case_id for c in sf.cases}, set(backends)
    seen: set[tuple[str, str]] = set()
    for i, r in enumerate(folder.rows, 1):
        where = f"--resume {folder.path}: rows.jsonl: row {i} ({r.id.case_id} · {r.id.backend})"
        if r.id.scenario != sf.name:
            why = f"is of scenario {r.id.scenario!r}, not this run's {sf.name!r}"
        elif r.id.case_id not in cases:
            why = f"is of a case the scenario does not have (its cases: {', '.join(sorted(cases)[:5])}, ...)"
        elif ran and r.id.backend not in ran:
            why = f"is of backend {r.id.backend!r}, which the run never ran (its backends: {', '.join(backends)})"
        elif (r.id.case_id, r.id.backend) in seen:
            why = "repeats an earlier row of that case and backend"
        else:
            seen.add((r.id.case_id, r.id.backend))
            continue
        raise ResumeError(f"{where} {why}: rows from elsewhere would be mixed into this run; start a new run "
                          "(or remove that line by hand, knowing what it was)")
    return frozenset(seen)


def code_now() -> dict:
    """The code running now, as a manifest's ``environment`` records it (commit, edits)."""
    return {"git_commit": git_commit(PACKAGE_DIR), "git_dirty": git_dirty(PACKAGE_DIR),
            "code_diff_sha256": code_diff_sha256()}


def environment_changes(prior: Resumed, device_name: str, backend_files=(), code: Optional[dict] = None) -> list[str]:
    """What differs between the run's recorded attnbench version, code (commit, uncommitted
    edits, ``--backend-file`` bytes), torch and device and this machine's (rows from both
    would sit under one manifest); [] when nothing does. ``code``: ``code_now()``."""
    import torch

    man = prior.folder.manifest
    changes = []
    for what, then, now in (
        ("attnbench", man.attnbench, __version__),
        ("torch", man.environment.get("torch"), torch.__version__),
        ("device", man.environment.get("device"), device_name),
    ):
        if then != now:
            changes.append(f"{what} {then if then is not None else '(not recorded)'} then, {now} now")
    changes += code_changes(man.environment, code if code is not None else code_now())
    return changes + backend_file_changes(man.backend_files_sha256, backend_files)


def begin(prior: Resumed, isolate: bool, env_changes: list[str], executor: Optional[dict] = None,
          code: Optional[dict] = None) -> Optional[str]:
    """The resume proceeds: set aside broken lines of rows.jsonl (returns a note saying so),
    rewrite results.csv from the rows, and record the resume in the manifest (with ``code``,
    the code it runs: ``code_now()`` and the backend files' hashes)."""
    folder = prior.folder
    note = folder.set_aside_broken_lines()
    # what a kill mid-write left (a case file's temporary: SIGKILL inside torch.save)
    stale = remove_stale_temporaries(folder.path, RUN_FILES) + remove_stale_temporaries(prior.options.save_tensors, ("*.pt",))
    if stale:
        note = "; ".join(filter(None, [note, f"removed {len(stale)} temporary file(s) a killed process left: "
                                             + ", ".join(str(p) for p in stale[:3]) + (", ..." if stale[3:] else "")]))
    entry = {"time": utc_now(), "rows_before": len(folder.rows), "isolate": isolate, "executor": executor or {"kind": "local"},
             "code": code or code_now()}
    if env_changes:
        entry["environment_changes"] = env_changes
    folder.manifest.resumed.append(entry)
    folder.manifest.status = "incomplete"
    folder.write_manifest()
    return note
