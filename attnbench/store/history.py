"""A history of runs in an embedded SQLite database (``attnbench history add/show``).

One ``runs`` row per stored run (when it started, the commit of the code under test (given,
else the one the run recorded), the scenario's name and text hash, its ``--set`` overrides, the
device fingerprint, the options) and its result
rows (``points``, each the run's Row as JSON, so that the gate's statistics can be applied
between consecutive points later). Default file: ``history.sqlite`` in attnbench's cache folder
(``$ATTNBENCH_CACHE_DIR`` or ``~/.cache/attnbench``).

Concurrent writers are safe: every write is one ``BEGIN IMMEDIATE`` transaction (SQLite's
write lock, taken at the start) with a busy timeout, so a second writer waits instead of
failing; a run already stored (same folder, same start time) is not stored twice. A file
that is not such a database (damaged, another program's) raises HistoryError naming it.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from attnbench.store.fingerprint import clean_fingerprint, fingerprint
from attnbench.store.manifest import Manifest
from attnbench.store.options import options_to_json
from attnbench.store.rows import Row, typed_row

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 60.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_key TEXT NOT NULL UNIQUE,
    added_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now')),
    started TEXT NOT NULL,
    run_path TEXT NOT NULL,
    git_commit TEXT,
    scenario TEXT NOT NULL,
    scenario_sha256 TEXT NOT NULL,
    device TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    options TEXT NOT NULL,
    attnbench TEXT NOT NULL,
    overrides TEXT  -- the run's --set KEY=VALUE texts as a JSON list (NULL: stored before they were)
);
CREATE TABLE IF NOT EXISTS points (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    scenario TEXT NOT NULL, case_id TEXT NOT NULL, backend TEXT NOT NULL,
    status TEXT NOT NULL, median_ms REAL, row TEXT NOT NULL,
    PRIMARY KEY (run_id, scenario, case_id, backend)
);
CREATE INDEX IF NOT EXISTS points_key ON points (scenario, case_id, backend);
"""


class HistoryError(ValueError):
    """The database cannot be used (damaged, not ours, a newer schema): the message says which file and why."""


def default_db() -> Path:
    root = os.environ.get("ATTNBENCH_CACHE_DIR") or Path.home() / ".cache" / "attnbench"
    return Path(root) / "history.sqlite"


@dataclass
class StoredRun:
    id: int
    started: str
    git_commit: Optional[str]
    device: str
    scenario: str
    scenario_sha256: str
    run_path: str
    fingerprint: dict = field(default_factory=dict)  # store.fingerprint's, as stored (host fields since they were recorded)
    overrides: Optional[list[str]] = None  # the run's --set texts (None: stored before they were recorded)


@dataclass
class Point:
    """One row of one stored run."""

    run: StoredRun
    row: Row


# SQLite's primary result codes (``sqlite3.Error.sqlite_errorcode & 0xff``) that say what happened
_PERM, _BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = 3, 5, 6, 8, 10, 11, 13, 14, 26


def _damaged(db: Path, e: Exception) -> HistoryError:
    """The error for what SQLite said: only a file that is damaged or not a database is to be moved
    aside; a read-only file system, a full disk, a lock or a path SQLite cannot open leave a good
    history that the fix (space, permissions, another path) makes usable again."""
    code = getattr(e, "sqlite_errorcode", None)
    code = code & 0xFF if isinstance(code, int) else None
    text = str(e).lower()
    if code == _READONLY or "readonly" in text or "read-only" in text:
        return HistoryError(f"{db}: cannot write there ({e}: a read-only file system or file); the history in it is "
                            "unchanged: make it writable, or pass another --db PATH")
    if code == _FULL or "disk is full" in text:
        return HistoryError(f"{db}: the disk is full ({e}); nothing was stored and the history is unchanged: "
                            "free some space and run it again")
    if code == _IOERR or "disk i/o error" in text:
        return HistoryError(f"{db}: a read or write failed ({e}: a full disk, a file-size limit (ulimit -f) or a "
                            "failing device); nothing was stored and the history is unchanged: fix that and run it again")
    if code in (_BUSY, _LOCKED) or "locked" in text:
        return HistoryError(f"{db}: another process held the database for {BUSY_TIMEOUT_S:g} s ({e}); "
                            "the history is unchanged: run it again when that process is done")
    if code in (_CANTOPEN, _PERM) or "unable to open" in text:
        what = "a folder" if db.is_dir() else "no file SQLite can open (its folder missing or not writable?)"
        return HistoryError(f"{db}: {what} ({e}); pass the database's file with --db PATH")
    return HistoryError(f"{db}: not a usable attnbench history database ({e}): damaged, or not a database; move "
                        "it aside and start a new one, or pass another --db PATH")


def _foreign(con: sqlite3.Connection, db: Path) -> None:
    """HistoryError when ``db`` is another program's SQLite database (tables, but no attnbench
    ``meta`` table): attnbench never adds its tables to it; or an attnbench history that lost a
    table (re-creating it empty hid the loss: "already stored; kept", then "no stored point matches")."""
    tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                                        "'sqlite_%' ORDER BY name").fetchall()]
    if tables and "meta" not in tables:
        shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        raise HistoryError(f"{db}: an SQLite database of another program (tables: {shown}), not an attnbench "
                           "history; it was not changed: pass a file of its own with --db PATH")
    _lost(con, db, tables)


def _lost(con: sqlite3.Connection, db: Path, tables: Optional[list[str]] = None) -> None:
    """HistoryError for an attnbench history (its ``meta`` table there) that lost another table."""
    if tables is None:
        tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()]
    lost = [t for t in ("runs", "points") if "meta" in tables and t not in tables]
    if lost:
        raise HistoryError(f"{db}: a damaged attnbench history: its table(s) {', '.join(lost)} are gone (the runs "
                           "stored in it are lost); it was not changed: move it aside and start a new one, or pass "
                           "another --db PATH")


@contextmanager
def connect(db: Path, write: bool) -> Iterator[sqlite3.Connection]:
    """An open database; with ``write`` one IMMEDIATE transaction (committed at the end,
    rolled back on an exception), the schema created when the file is new."""
    db = Path(db)
    if not write and db.is_dir():
        raise HistoryError(f"{db}: a folder, not a history database; pass the database's file with --db PATH")
    if not write and not db.is_file():
        raise HistoryError(f"{db}: no history database there (make one with attnbench history add RUN --db {db})")
    if write:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise HistoryError(f"{db}: cannot make its folder ({e.strerror or e}); pass another --db PATH") from None
    try:
        con = sqlite3.connect(str(db), timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as e:
        raise _damaged(db, e) from None
    try:
        con.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        con.execute("PRAGMA foreign_keys = ON")
        if write:
            con.execute("BEGIN IMMEDIATE")
            _foreign(con, db)
            _create(con)
        _check_schema(con, db)
        yield con
        if write:
            con.execute("COMMIT")
    except sqlite3.DatabaseError as e:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise _damaged(db, e) from None
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise
    finally:
        con.close()


def _create(con: sqlite3.Connection) -> None:
    for stmt in filter(str.strip, SCHEMA.split(";")):
        con.execute(stmt)
    con.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
    if not _has_overrides(con):  # a database made before the overrides were stored: add the column
        con.execute("ALTER TABLE runs ADD COLUMN overrides TEXT")


def _has_overrides(con: sqlite3.Connection) -> bool:
    return any(c[1] == "overrides" for c in con.execute("PRAGMA table_info(runs)").fetchall())


def _check_schema(con: sqlite3.Connection, db: Path) -> None:
    _lost(con, db)
    try:
        got = con.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    except sqlite3.OperationalError:
        got = None
    if got is None:
        raise HistoryError(f"{db}: an SQLite file without attnbench's history tables; pass another --db PATH")
    if got[0] != str(SCHEMA_VERSION):
        raise HistoryError(f"{db}: history schema {got[0]}, this attnbench reads {SCHEMA_VERSION}; "
                           "use the attnbench that wrote it, or another --db PATH")


def add_run(db: Path, run_path: Path, manifest: Manifest, rows: list[Row], commit: Optional[str]) -> tuple[int, bool]:
    """Store a run; -> (its id, whether it was new). A run stored before keeps its first entry.
    ``commit``: the code under test's (default: the git commit the run's manifest recorded,
    ``SHA+dirty`` where it recorded uncommitted edits to tracked files)."""
    env = manifest.environment or {}
    if not commit and env.get("git_commit"):  # the run's own; "+dirty": made with uncommitted edits
        commit = str(env["git_commit"]) + ("+dirty" if env.get("git_dirty") else "")
    started = manifest.start_time or ""
    key = f"{Path(run_path).resolve()}|{started}|{manifest.scenario_sha256 or ''}"
    fp = fingerprint(manifest, rows)
    opts = options_to_json(manifest.options) if manifest.options is not None else {}
    with connect(db, write=True) as con:
        old = con.execute("SELECT id FROM runs WHERE run_key = ?", (key,)).fetchone()
        if old:
            return int(old[0]), False
        cur = con.execute(
            "INSERT INTO runs (run_key, started, run_path, git_commit, scenario, scenario_sha256, device, "
            "fingerprint, options, attnbench, overrides) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key, started, str(Path(run_path).resolve()), commit, manifest.scenario or "",
             manifest.scenario_sha256 or "", fp["device"], json.dumps(fp, sort_keys=True),
             json.dumps(opts, sort_keys=True), manifest.attnbench or "", json.dumps(list(manifest.overrides or []))))
        run_id = int(cur.lastrowid)
        con.executemany(
            "INSERT OR REPLACE INTO points (run_id, scenario, case_id, backend, status, median_ms, row) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(run_id, r.id.scenario, r.id.case_id, r.id.backend, r.status.value,
              r.timing.median_ms if r.timing.median_ms == r.timing.median_ms else None, json.dumps(r.to_json()))
             for r in rows])
        return run_id, True


def when(text: Optional[str]) -> Optional[_dt.datetime]:
    """An ISO time as an aware datetime (one without an offset is UTC, as attnbench writes them);
    None when it does not parse."""
    try:
        t = _dt.datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def points(db: Path, since: Optional[str] = None) -> list[Point]:
    """Every stored row (of runs started on or after ``since``, an ISO date or time, compared as
    times: ``2026-11-27T14:00+02:00`` is 12:00 UTC), oldest run first."""
    after = when(since) if since else None
    if since and after is None:
        raise HistoryError(f"since {since!r}: not an ISO date or time")
    with connect(db, write=False) as con:
        q = ("SELECT r.id, r.started, r.git_commit, r.device, r.scenario, r.scenario_sha256, r.run_path, p.row, "
             "r.fingerprint, " + ("r.overrides " if _has_overrides(con) else "NULL ") +
             "FROM points p JOIN runs r ON r.id = p.run_id")
        got = con.execute(q + " ORDER BY r.id").fetchall()
    never = _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)
    got.sort(key=lambda g: (when(g[1]) or never, g[0]))  # by time, not by text: start times may carry offsets
    out, runs = [], {}
    for rid, started, commit, device, scen, sha, path, row, fp, sets in got:
        t = when(started)
        if after is not None and (t is None or t < after):
            continue  # started before --since (or a start time that is no time: it cannot be placed)
        if rid not in runs:
            runs[rid] = StoredRun(rid, started, commit, device, scen, sha, path, _stored_fingerprint(fp),
                                  _stored_overrides(sets))
        run = runs[rid]
        try:
            out.append(Point(run, typed_row(json.loads(row))))
        except (ValueError, TypeError) as e:
            raise _damaged(db, f"run {rid}: a stored row does not read back: {e}") from None
    return out


def _stored_overrides(text: Optional[str]) -> Optional[list[str]]:
    """Stored --set texts read back (None: not recorded, or not a list of texts)."""
    try:
        got = json.loads(text) if text is not None else None
    except (TypeError, ValueError):
        return None
    return [str(x) for x in got] if isinstance(got, list) else None


def _stored_fingerprint(text: str) -> dict:
    """A stored fingerprint read back ({} when it does not parse: it only decides what is compared)."""
    try:
        fp = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return clean_fingerprint(fp) if isinstance(fp, dict) else {}
