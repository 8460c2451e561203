"""Run folders: written as rows finish, loaded back; environment capture.

A run folder holds ``manifest.json`` (what ran, where, when, complete or not),
``rows.jsonl`` (one JSON object per finished row, raw timing samples included, appended and
flushed as each row finishes: a crash of the process loses no finished row) and
``results.csv`` (the same rows without the samples, the sweep values as columns, rewritten
atomically, so it is never half-written: at most every ``CSV_EVERY_S`` seconds while the
run goes, and when it finishes or is interrupted).

A run folder belongs to one run: ``create`` refuses a folder that already holds files, and
the writer holds an exclusive lock on ``.lock`` (``flock``; released by the kernel when the
process ends, however it ends), so a second writer is refused instead of mixing its rows in.
Readers skip a line of ``rows.jsonl`` that is not a well-typed row and say so (a
``RowsFileWarning`` with the count and the line numbers); the rows after it still count.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Optional

from attnbench.store.code_identity import code_diff_sha256
from attnbench.store.manifest import Manifest, record_load
from attnbench.store.rows import Row, rows_csv, typed_row
from attnbench.store.writer import FolderBusy, leave_if_copy, lock_file, release
from attnbench.workload.units import safe_name


CSV_EVERY_S = 10.0  # rewriting results.csv after every row made a 300-row sweep quadratic
LOCK_NAME = ".lock"
RESULTS_ENV = "ATTNBENCH_RESULTS_DIR"


def results_root(given: Optional[Path] = None) -> Path:
    """Where new run folders go: ``given`` (--results-dir), else $ATTNBENCH_RESULTS_DIR, else
    ``results`` under the current folder."""
    return Path(given) if given is not None else Path(os.environ.get(RESULTS_ENV) or "results")


class RunFolderError(ValueError):
    """A folder that cannot be used as a run folder; the message names it and the fix."""


class RowsFileWarning(UserWarning):
    """Lines of a rows.jsonl that are not result rows: skipped and counted, never silently."""


def atomic_write(path: Path, text) -> None:
    """Write ``text`` (str, or bytes) to ``path`` through a temporary file of this writer's own (never one a
    second process shares), so that ``path`` holds the old text or the new, never a mix; the
    temporary file goes away when the write fails (a full disk, say), and the error names
    ``path`` (a failed write to a file descriptor names no file of its own)."""
    path = Path(path)
    if path.exists() and not path.is_file():  # a device, a fifo, a folder: never renamed over
        raise IsADirectoryError(21, "not a regular file: writing would replace it", str(path)) if path.is_dir() \
            else OSError(17, "not a regular file: writing would replace it", str(path))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it (mkstemp makes 0600): rows.jsonl's mode
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None and e.errno is not None:
            raise OSError(e.errno, e.strerror or str(e), str(path)) from None
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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


def git_dirty(cwd: Optional[Path] = None) -> Optional[bool]:
    """Whether the work tree has uncommitted changes to tracked files (None: not a git checkout)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                             capture_output=True, text=True, timeout=5)
        return bool(out.stdout.strip()) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device_name: str, backend_versions: dict[str, str], host: Optional[dict] = None) -> dict:
    """What a manifest records about this machine; ``host``: the fields that tell it from
    another machine of the same device name (``measure.host.host_fingerprint``)."""
    import torch

    try:  # the installed version, without importing triton (its import is slow and noisy at exit)
        import importlib.metadata as md

        triton_v = md.version("triton")
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
        "git_dirty": git_dirty(Path(__file__).resolve().parent),  # the commit is not all of the code run
        "code_diff_sha256": code_diff_sha256(),  # which uncommitted edits (--resume compares it)
        **({"host": dict(host)} if host else {}),
    }


LOCK = LOCK_NAME


def _lock(path: Path):
    """An exclusive, non-blocking lock on ``path/.lock`` (``store.writer.lock_file``);
    RunFolderError when another process holds it."""
    try:
        return lock_file(path / LOCK)
    except FolderBusy as e:
        raise RunFolderError(f"{path}: another attnbench process (pid {e.holder}) is writing this run folder; "
                             "wait for it to finish, or use another --out") from None


def _entries(path: Path, own: Optional[Path] = None) -> list[str]:
    """The names in ``path`` but the lock and ``own``: the run's own --save-tensors folder, while empty."""
    return sorted(p.name for p in path.iterdir() if p.name != LOCK and not (
        own is not None and p.is_dir() and not p.is_symlink() and p.absolute() == Path(own).absolute() and not any(p.iterdir())))


def check_out(out: Path, own: Optional[Path] = None) -> None:
    """``--out`` must name a new or empty folder (not a file, not a dangling link); ``own``:
    the run's --save-tensors folder, which may already be there inside it, empty."""
    if out.is_symlink() and not out.exists():
        raise RunFolderError(f"--out {out}: a symbolic link to {os.readlink(out)}, which does not exist; "
                             "remove the link or choose another --out")
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"--out {out}: a file, not a folder; choose a folder name")
    if out.is_dir():
        names = _entries(out, own)
        # (a manifest being written by another run shows first as its temporary file)
        if "manifest.json" in names or "rows.jsonl" in names or any(n.startswith(".manifest.json.") for n in names):
            raise RunFolderError(
                f"--out {out}: already a run folder, and a run folder belongs to one run; choose a new --out, "
                f"or finish that run with `attnbench run --resume {out}`"
            )
        if names:
            raise RunFolderError(f"--out {out}: not empty ({len(names)} entries, e.g. {names[0]}); "
                                 "choose a new or empty folder")


class RunFolder:
    """Writes a run folder as rows finish (holding its lock); loads one back."""

    def __init__(self, path: Path):
        # absolute once, here: a backend that calls os.chdir must not send later writes
        # (rows, manifest, CSV) to another folder of the same relative name
        self.path = Path(path).absolute()
        self.rows: list[Row] = []
        self.manifest = Manifest()
        self.broken_lines: list[int] = []  # 1-based numbers of rows.jsonl lines that are not rows
        self._lock = None
        self._pid = None  # the process holding the lock: the only one that writes (store.writer)
        self._csv_written = -math.inf

    @classmethod
    def create(cls, root: Optional[Path], scenario_name: str, out: Optional[Path] = None,
               own: Optional[Path] = None) -> "RunFolder":
        """A new run folder, locked: ``out`` (new or empty but for ``own``, its --save-tensors
        folder), else a fresh ``root/<UTC time>-<name>`` (``root`` None: ``results_root()``)."""
        root = results_root(root)
        if out is None:
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            Path(root).mkdir(parents=True, exist_ok=True)
            for i in range(1, 10000):
                out = Path(root) / (f"{stamp}-{safe_name(scenario_name)}" + (f"-{i}" if i > 1 else ""))
                try:
                    out.mkdir()  # atomic: two runs started in the same second get two folders
                    break
                except FileExistsError:
                    continue
        else:
            out = Path(out)
            check_out(out, own)
            out.mkdir(parents=True, exist_ok=True)
        rf = cls(out)
        rf.lock()
        if _entries(out, own):  # another run took it between the check and the lock
            rf.unlock()
            check_out(out, own)
        return rf

    def lock(self) -> None:
        """Hold the folder's write lock (RunFolderError when another process holds it)."""
        if self._lock is None:
            self._lock, self._pid = _lock(self.path), os.getpid()

    def unlock(self) -> None:
        if self._lock is not None:
            release(self._lock)
            self._lock = None

    def start(self, manifest: Manifest | dict) -> None:
        """Write the manifest of a new run (marked incomplete, with its start time)."""
        self.manifest = manifest if isinstance(manifest, Manifest) else Manifest.from_json(manifest)
        self.manifest.update(status="incomplete", start_time=utc_now())
        record_load(self.manifest, "start")
        self.manifest.settings_sha256 = self.manifest.settings_hash()
        self.write_manifest()

    def write_manifest(self) -> None:
        leave_if_copy(self._pid)
        atomic_write(self.path / "manifest.json", json.dumps(self.manifest.to_json(), indent=2, default=str))

    def add(self, row: Row) -> None:
        """Append ``row`` to rows.jsonl; it counts (``self.rows``) only once it is written. A
        write that fails (a full disk) leaves no half line behind and names the file."""
        leave_if_copy(self._pid)
        path = self.path / "rows.jsonl"
        line = json.dumps(row.to_json(), default=str, allow_nan=False).encode() + b"\n"
        # unbuffered: a buffered file's truncate flushed the failing buffer first (cutting nothing)
        # and its close raised again, naming no file
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
            if size > 0 and os.pread(fd, 1, size - 1) != b"\n":  # a line a crash cut short must not swallow this one
                line = b"\n" + line
            try:
                view = memoryview(line)
                while view:  # in the OS's hands once written: a crash of this process loses no finished row
                    view = view[os.write(fd, view):]
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise OSError(e.errno, e.strerror or str(e), str(path)) from None
        finally:
            os.close(fd)
        self.rows.append(row)
        if time.monotonic() - self._csv_written >= CSV_EVERY_S:
            self.write_csv()

    def write_csv(self) -> None:
        leave_if_copy(self._pid)
        atomic_write(self.path / "results.csv", rows_csv(self.rows))
        self._csv_written = time.monotonic()

    def finish(self, complete: bool, **extra) -> None:
        """Mark the folder complete (or not) and let go of its lock (results.csv written first)."""
        with contextlib.suppress(OSError):  # a full disk: the manifest below says what matters
            self.write_csv()
        self.manifest.update(status="complete" if complete else "incomplete", end_time=utc_now(), **extra)
        record_load(self.manifest, "end")
        try:
            self.write_manifest()
        finally:
            if complete:  # nothing writes a complete folder again: no .lock left in it (removed while held)
                with contextlib.suppress(OSError):
                    (self.path / LOCK).unlink()
            self.unlock()

    def set_aside_broken_lines(self) -> Optional[str]:
        """Move the lines of rows.jsonl that are not rows (``broken_lines``: a line a crash cut
        short) to ``rows.broken.jsonl`` and rewrite results.csv from the rows; returns a note
        saying what moved (None: nothing did). Call it holding the lock."""
        rows_file, note = self.path / "rows.jsonl", None
        if self.broken_lines:
            broken = set(self.broken_lines)
            lines = split_lines(rows_file.read_bytes())
            kept = [ln for i, ln in enumerate(lines, 1) if i not in broken and ln.strip()]
            with open(self.path / "rows.broken.jsonl", "ab") as f:
                for i in sorted(broken):
                    f.write(lines[i - 1].rstrip(b"\n") + b"\n")
            atomic_write(rows_file, b"".join(ln if ln.endswith(b"\n") else ln + b"\n" for ln in kept).decode())
            note = (f"{len(broken)} line(s) of rows.jsonl that were not rows (line "
                    f"{', '.join(map(str, sorted(broken)))}) moved to {self.path / 'rows.broken.jsonl'}")
            self.broken_lines = []
        if self.rows or rows_file.is_file():
            self.write_csv()
        return note

    @classmethod
    def open_locked(cls, path: Path) -> "RunFolder":
        """An existing run folder, locked for writing (RunFolderError when another process
        holds it), with its rows (if any yet) and manifest read back; writes nothing."""
        rf = cls(Path(path))
        rf.lock()
        try:
            rows_file = rf.path / "rows.jsonl"
            if rows_file.is_file():  # absent: interrupted before the first row
                rf.rows, rf.broken_lines = read_rows(rows_file)
            rf.manifest = Manifest.from_json(read_manifest(rf.path / "manifest.json"))
        except BaseException:
            rf.unlock()
            raise
        return rf

    @classmethod
    def load(cls, path: Path) -> "RunFolder":
        """Read a run folder: every well-typed row of rows.jsonl (the others are counted in
        ``broken_lines`` and named in a RowsFileWarning) and its manifest (empty if unreadable)."""
        path = Path(path)
        rf = cls(path)
        rows_file = path / "rows.jsonl"
        if not rows_file.is_file():
            raise FileNotFoundError(f"{path}: not a run folder (no rows.jsonl)")
        rf.rows, rf.broken_lines = read_rows(rows_file)
        rf.manifest = Manifest.from_json(read_manifest(path / "manifest.json"))
        return rf


def read_rows(rows_file: Path) -> tuple[list[Row], list[int]]:
    """-> (the rows, the 1-based numbers of lines that are not rows). Warns when any are."""
    rows, broken = [], []
    with open(rows_file, "rb") as f:
        data = f.read()
    for i, raw in enumerate(split_lines(data), 1):
        if not raw.strip():
            continue
        try:
            rows.append(typed_row(json.loads(raw)))
        except (ValueError, TypeError, RecursionError):
            broken.append(i)
    if broken:
        shown = ", ".join(map(str, broken[:10])) + (f" and {len(broken) - 10} more" if len(broken) > 10 else "")
        warnings.warn(RowsFileWarning(
            f"{rows_file}: skipped {len(broken)} line(s) that are not result rows (line {shown}); "
            f"the other {len(rows)} rows are used"
        ), stacklevel=2)
    return rows, broken


def split_lines(data: bytes) -> list[bytes]:
    """The lines of a rows.jsonl, each with its ``\\n`` (the last may lack it): split on
    ``\\n`` only, the rule every reader and the ``--resume`` rewriter share (a lone ``\\r``
    inside a broken line must not make two lines of it for one and one for the other)."""
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    return lines + ([parts[-1]] if parts[-1] else [])


def read_manifest(path: Path) -> dict:
    """The manifest as a mapping; {} (and a warning) when it is missing, not JSON, or not an object."""
    try:
        man = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:
        warnings.warn(RowsFileWarning(f"{path}: unreadable ({type(e).__name__}); ignored"), stacklevel=2)
        return {}
    if not isinstance(man, dict):
        warnings.warn(RowsFileWarning(f"{path}: a JSON {type(man).__name__}, not an object; ignored"), stacklevel=2)
        return {}
    return man


def scenario_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
