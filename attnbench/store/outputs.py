"""The one rule for a file a command writes (``report -o``, ``import -o``, ``baseline --to``,
``history add --db``): never over something that is not a regular file, never over an input of
the command, never over a run folder's own files (issue 37)."""
from __future__ import annotations

import json
import os
import stat as _stat
from pathlib import Path
from typing import Optional

from attnbench.store.runfolder import LOCK_NAME, RunFolderError

RUN_FILES = ("manifest.json", "rows.jsonl", "results.csv", "rows.broken.jsonl", LOCK_NAME)


def is_run_folder(d: Path) -> bool:
    """A folder holding a rows.jsonl, or an attnbench manifest.json (an object with a ``scenario``:
    another program's manifest.json higher up, a web project's, makes no run folder)."""
    d = Path(d)
    if (d / "rows.jsonl").is_file():
        return True
    m = d / "manifest.json"
    try:
        if not m.is_file() or m.stat().st_size > 50_000_000:
            return False
        doc = json.loads(m.read_bytes())
    except (OSError, ValueError):
        return (d / LOCK_NAME).is_file()  # a run's manifest being written, or damaged: still the run's
    return isinstance(doc, dict) and "scenario" in doc


def _run_folder_of(path: Path) -> Optional[Path]:
    """The run folder holding ``path`` (a folder above it), or None."""
    for d in path.parents:
        if is_run_folder(d):
            return d
    return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(os.path.abspath(a)) == Path(os.path.abspath(b))


def check_write_target(path: Path, flag: str, inputs=(), example: str = "") -> Path:
    """The one rule for a file a command writes (``report -o``, ``import -o``, ``baseline --to``,
    ``history add --db``): RunFolderError (exit 2, naming ``flag``, the path and the fix) when

    - ``path`` exists and is not a regular file (a device such as /dev/null, a fifo, a socket,
      a folder, or a symbolic link to one of those): writing would replace it;
    - ``path`` is one of ``inputs`` (the files and folders the command reads);
    - ``path`` is a run folder's own file (rows.jsonl, manifest.json, results.csv, ...) or lies
      in a folder below a run folder (its tensors, its plots): a run's files are the run's.

    A new file beside a run's files (``RUN/report.html``) is fine. Returns ``path``."""
    path = Path(path)
    elsewhere = f"write it elsewhere, e.g. {flag} {example}" if example else "choose another path"
    if path.is_symlink() and not path.exists():
        raise RunFolderError(f"{flag} {path}: a symbolic link to {os.readlink(path)}, which does not exist; "
                             f"remove the link or {elsewhere}")
    if path.exists():
        mode = os.stat(path).st_mode
        if not _stat.S_ISREG(mode):
            what = ("a folder" if _stat.S_ISDIR(mode) else "a device" if _stat.S_ISCHR(mode) or _stat.S_ISBLK(mode)
                    else "a fifo" if _stat.S_ISFIFO(mode) else "a socket" if _stat.S_ISSOCK(mode) else "not a regular file")
            via = f" (a symbolic link to {os.readlink(path)})" if path.is_symlink() else ""
            hint = f"; name the file, e.g. {path / (Path(example).name or 'NAME')}" if _stat.S_ISDIR(mode) and example else ""
            raise RunFolderError(f"{flag} {path}: {what}{via}, not a regular file: writing would replace it{hint}; "
                                 f"{elsewhere}")
    for given in inputs:
        if given is not None and _same_file(path, Path(given)):
            raise RunFolderError(f"{flag} {path}: an input of this command; writing would replace it: {elsewhere}")
    real = Path(os.path.realpath(path))
    run = _run_folder_of(real)
    if run is not None and (real.name in RUN_FILES or real.parent != run):
        raise RunFolderError(f"{flag} {path}: a file of the run folder {run} itself; a run's files are the run's: "
                             f"{elsewhere}")
    return path


def remove_stale_temporaries(directory: Optional[Path], patterns: tuple[str, ...]) -> list[Path]:
    """Remove the temporary files (``.NAME.XXXX.tmp``, ``atomic_write``'s and ``--save-tensors``')
    that a process killed mid-write left in ``directory`` for the files ``patterns`` match
    (``"*.pt"``, ``"manifest.json"``); returns them. Call it holding the run folder's lock."""
    removed = []
    if directory is None or not Path(directory).is_dir():
        return removed
    for pattern in patterns:
        for tmp in Path(directory).glob(f".{pattern}.*.tmp"):
            try:
                if tmp.is_file() and not tmp.is_symlink():
                    tmp.unlink()
                    removed.append(tmp)
            except OSError:
                continue
    return removed
