"""One reader of run folders, with one set of refusals, for every command that reads one
(``check``, ``compare runs``, ``baseline``, ``report``, ``plot``, ``history add``,
``tree-costs``): a run folder that ``check`` refuses is refused by all of them, with the same
message (they used to store, show or plot what ``check`` refused: a second copy of a row
100x slower, a negative median shown as -3 ms, a row planted from another run).

A run's rows must be its own: one row per (case, backend), each with a non-empty identity, an
``ok`` row with a finite median above 0 ms and its samples, every row of the run's scenario
(the manifest's ``scenario``) and of a backend the run ran (its ``backends_requested``).
Baseline files (``store.baselines``) pass through the same ``check_rows``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence

from attnbench.store.manifest import Manifest
from attnbench.store.rows import Row
from attnbench.store.runfolder import RunFolder, RunFolderError


class BaselineError(RunFolderError):
    """A run folder or baseline file whose rows cannot be used (damaged, edited, mixed); the
    message names the file, the row and the field, and what to do."""


def _bad_time(v: Any) -> bool:
    return isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0


def _times_problem(name: str, v: Any, required: bool) -> Optional[str]:
    """What is wrong with a list of times in ms (None: nothing)."""
    if not isinstance(v, list):
        return f"{name}: {type(v).__name__}, expected a list of times in ms"
    if not v:
        return f"{name}: empty" if required else None
    for k, x in enumerate(v):
        if _bad_time(x):
            return f"{name}[{k}] = {x!r}: not a finite time > 0 ms"
    return None


def row_problem(row: Row, need_rounds: bool) -> Optional[str]:
    """The first field of ``row`` that makes it unusable for a comparison (None: none)."""
    for name in ("scenario", "case_id", "backend"):
        if not isinstance(getattr(row.id, name), str) or not getattr(row.id, name):
            return f"{name}: {getattr(row.id, name)!r}, expected a non-empty string"
    if not isinstance(row.workload.params, dict):
        return f"params: {type(row.workload.params).__name__}, expected an object"
    if row.status != "ok":
        return None
    if _bad_time(row.timing.median_ms):
        return f"median_ms = {row.timing.median_ms!r}: not a finite time > 0 ms"
    why = _times_problem("samples_ms", row.timing.samples_ms, required=True)
    if why is None and (need_rounds or row.timing.round_medians_ms):
        why = _times_problem("round_medians_ms", row.timing.round_medians_ms, required=True)
        if why == "round_medians_ms: empty":
            why += " (rows made before attnbench kept a median per timing round)"
    return why


def _foreign(row: Row, manifest: Manifest) -> Optional[str]:
    """Why ``row`` cannot be one of the run the manifest describes (None: it can)."""
    if manifest.scenario and row.id.scenario != manifest.scenario:
        return f"is of scenario {row.id.scenario!r}, not the run's {manifest.scenario!r}"
    ran = set(manifest.backends_requested)
    if ran and row.id.backend not in ran:
        return f"is of backend {row.id.backend!r}, which the run never ran (its backends: {', '.join(sorted(ran))})"
    return None


def check_rows(label: str, rows: Sequence[Row], manifest: Manifest, need_rounds: bool) -> None:
    """Raise BaselineError naming the file, the row and what is wrong: a field that cannot be
    compared, a row of another scenario or of a backend the run never ran, or a second row of
    one (scenario, case, backend), whose verdict would depend on the rows' order."""
    is_file = not Path(label).is_dir()
    fix = (f"make the baseline again: attnbench baseline RUN --to {label}" if is_file
           else "the run folder was edited or damaged: run the scenario again")
    first: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        where = (f"{label}: " + (f"rows[{i}]" if is_file else f"row {i + 1} of rows.jsonl")
                 + f" ({r.id.case_id} · {r.id.backend})")
        why = row_problem(r, need_rounds)
        if why:
            raise BaselineError(f"{where}.{why}; {fix}")
        why = _foreign(r, manifest)
        if why:
            raise BaselineError(f"{where} {why}: rows from elsewhere would be mixed into this run; {fix}")
        if r.key in first:
            was = f"rows[{first[r.key]}]" if is_file else f"row {first[r.key] + 1}"
            raise BaselineError(f"{where} repeats {was}: one row per case and backend, or the verdict would "
                                f"depend on their order; {fix}")
        first[r.key] = i


def read_run(path: Path, need_rounds: bool = False) -> RunFolder:
    """A run folder read back with every row checked (``check_rows``); RunFolderError when
    ``path`` is not a run folder. Lines of rows.jsonl that are not rows are skipped with a
    warning (``RunFolder.load``) and counted in ``broken_lines``."""
    path = Path(path)
    if not path.is_dir():
        raise RunFolderError(f"{path}: not a run folder (no such folder)" if not path.exists()
                             else f"{path}: not a run folder (a file)")
    if not (path / "rows.jsonl").is_file():
        raise RunFolderError(f"{path}: not a run folder (no rows.jsonl)")
    rf = RunFolder.load(path)
    check_rows(str(path), rf.rows, rf.manifest, need_rounds)
    return rf
