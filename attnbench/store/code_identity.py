"""Which code made a run's rows: attnbench's git commit, whether its package had uncommitted
edits (and a hash of them), and a hash of each ``--backend-file``. The manifest records them
when a run starts; ``--resume`` compares them with the code it runs now, so that one run
folder never holds rows of two code versions without saying so (an edited backend file or a
new commit between run and resume gave sdpa 0.04 ms before and 0.11 ms after, in one run).
"""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Iterable, Optional

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the attnbench package that runs


def code_diff_sha256(cwd: Path = PACKAGE_DIR) -> Optional[str]:
    """SHA-256 of the uncommitted edits to the package's tracked files (``git diff HEAD`` of
    the package folder: the hash of nothing when there are none); None when not a git checkout."""
    try:
        out = subprocess.run(["git", "diff", "HEAD", "--binary", "--", "."], cwd=cwd, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return hashlib.sha256(out.stdout).hexdigest() if out.returncode == 0 else None


def file_sha256(path) -> Optional[str]:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def backend_file_hashes(files: Iterable) -> dict[str, Optional[str]]:
    """Each ``--backend-file`` (as an absolute path) -> the SHA-256 of its bytes."""
    return {str(Path(f).resolve()): file_sha256(f) for f in files}


def _short(v) -> str:
    return "(not recorded)" if v is None else str(v)[:12]


def code_changes(then: dict, now: dict) -> list[str]:
    """What differs between the code a run recorded (its manifest's ``environment``) and the
    code running now (``environment`` keys ``git_commit``, ``git_dirty``, ``code_diff_sha256``);
    only what both sides recorded is compared."""
    out = []
    if then.get("git_commit") and now.get("git_commit") and then["git_commit"] != now["git_commit"]:
        out.append(f"attnbench commit {_short(then['git_commit'])} then, {_short(now['git_commit'])} now")
    diff_then, diff_now = then.get("code_diff_sha256"), now.get("code_diff_sha256")
    if diff_then and diff_now:
        if diff_then != diff_now:
            out.append(f"uncommitted edits of the attnbench package differ (diff sha256 {_short(diff_then)} then, "
                       f"{_short(diff_now)} now)")
    elif isinstance(then.get("git_dirty"), bool) and isinstance(now.get("git_dirty"), bool) \
            and then["git_dirty"] != now["git_dirty"]:
        out.append(f"uncommitted edits {'then' if then['git_dirty'] else 'now'}, none {'now' if then['git_dirty'] else 'then'}")
    return out


def backend_file_changes(recorded: dict, given: Iterable) -> list[str]:
    """Each backend file the run recorded (path -> SHA-256) that is not given now with the same
    bytes: edited since, or given no more."""
    now = backend_file_hashes(given)
    out = []
    for path, sha in recorded.items():
        if not sha:
            continue
        if path in now and now[path] != sha:
            out.append(f"--backend-file {path} edited since the run (sha256 {_short(sha)} then, {_short(now[path])} now)")
        elif path not in now and sha not in now.values():
            out.append(f"--backend-file {path} (sha256 {_short(sha)}) is not given with those bytes now")
    return out
