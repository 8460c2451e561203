"""``attnbench history add/show``: real CPU runs of the quickstart stored in SQLite, trends
judged by the gate's check between consecutive points, concurrent writers, damaged files."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.analyze.compare import check
from attnbench.analyze.history_trends import trends
from attnbench.analyze.verdict import thresholds_for
from attnbench.cli.app import app
from attnbench.store.history import add_run, points
from attnbench.store.runfolder import RunFolder

cli = CliRunner()
RUN_ARGS = ["--device", "cpu", "-b", "reference", "-b", "sdpa", "--measure-ms", "5", "--warmup-ms", "1",
            "--set", "timing.rounds=6", "-q"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hist-runs")
    out = []
    for name in ("n1", "n2", "n3"):
        r = cli.invoke(app, ["run", "quickstart", *RUN_ARGS, "--out", str(root / name)])
        assert r.exit_code == 0, r.output
        out.append(root / name)
    return out


@pytest.mark.slow
def test_add_then_show_judges_each_point_against_the_one_before(runs, tmp_path):
    db = tmp_path / "h.sqlite"
    for i, run in enumerate(runs):
        r = cli.invoke(app, ["history", "add", str(run), "--db", str(db), "--commit", f"c0ffee{i}"])
        assert r.exit_code == 0 and "stored 4 rows" in r.output, r.output
    again = cli.invoke(app, ["history", "add", str(runs[0]), "--db", str(db)])
    assert again.exit_code == 0 and "already stored" in again.output
    pts = points(db)
    assert len(pts) == 12 and [p.run.git_commit for p in pts[::4]] == ["c0ffee0", "c0ffee1", "c0ffee2"]
    found = trends(pts, lambda case, backend, params: backend == "sdpa" and "16" in case)
    assert list(found) == [("quickstart", "page_size=16", "sdpa")]
    steps = found[("quickstart", "page_size=16", "sdpa")]
    assert steps[0].result is None and len(steps) == 3
    rows = [RunFolder.load(r).rows for r in runs]
    for i in (1, 2):  # the same verdict and ratio as attnbench check of the two runs, with its CPU default
        th = thresholds_for(rows[i], rows[i - 1])
        want = next(c for c in check(rows[i], rows[i - 1], th, gate=False).cases
                    if (c.case_id, c.backend) == ("page_size=16", "sdpa"))
        assert steps[i].result.verdict == want.verdict and steps[i].result.ratio == want.ratio
    shown = cli.invoke(app, ["history", "show", "--db", str(db), "-k", "sdpa", "--since", "2000-01-01"])
    assert shown.exit_code == 0 and shown.output.count("quickstart · page_size=") == 2, shown.output
    assert "c0ffee2" in shown.output
    later = cli.invoke(app, ["history", "show", "--db", str(db), "--since", "2999-01-01"])
    assert later.exit_code == 0 and "no stored point matches" in later.output


@pytest.mark.slow
def test_report_draws_the_history(runs, tmp_path):
    db = tmp_path / "h.sqlite"
    assert cli.invoke(app, ["history", "add", *map(str, runs), "--db", str(db)]).exit_code == 0
    out = tmp_path / "r.html"
    r = cli.invoke(app, ["report", str(runs[-1]), "-o", str(out), "--history", str(db), "-k", "reference"])
    assert r.exit_code == 0, r.output
    html = out.read_text()
    assert html.count('data-chart="trend"') == 2 and "<h2>History</h2>" in html
    section = html[html.index("<h2>History</h2>"):]
    assert "sdpa" not in section.split("<h2>", 2)[1]  # -k reference: only its lines


WRITER = """
import sys
from pathlib import Path
from attnbench.store.history import add_run
from attnbench.store.runfolder import RunFolder
db, runs = Path(sys.argv[1]), sys.argv[2:]
for r in runs:
    rf = RunFolder.load(Path(r))
    add_run(db, Path(r), rf.manifest, rf.rows, None)
"""


@pytest.mark.slow
def test_concurrent_writers_lose_nothing(runs, tmp_path):
    copies = []
    for i in range(16):  # other folders: other runs to the history
        copies.append(tmp_path / f"copy{i}")
        shutil.copytree(runs[i % len(runs)], copies[-1])
    db = tmp_path / "h.sqlite"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(db), *map(str, copies[w::4])],
                              stderr=subprocess.PIPE, text=True) for w in range(4)]
    for p in procs:
        _, errtext = p.communicate(timeout=300)
        assert p.returncode == 0, errtext
    pts = points(db)
    assert len({p.run.id for p in pts}) == 16 and len(pts) == 64


@pytest.mark.parametrize("content", [b"this is not a database at all" * 100, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_a_damaged_database_is_a_clear_message(runs, tmp_path, content):
    db = tmp_path / "h.sqlite"
    db.write_bytes(content)
    for args in (["history", "show", "--db", str(db)], ["history", "add", str(runs[0]), "--db", str(db)],
                 ["report", str(runs[0]), "-o", str(tmp_path / "r.html"), "--history", str(db)]):
        r = cli.invoke(app, args)
        assert r.exit_code == 2 and "not a usable attnbench history database" in r.output, (args, r.output)
        assert "Traceback" not in r.output


def test_another_sqlite_file_and_a_missing_one(runs, tmp_path):
    import sqlite3
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE t (x)")
    r = cli.invoke(app, ["history", "show", "--db", str(other)])
    assert r.exit_code == 2 and "without attnbench's history tables" in r.output
    r = cli.invoke(app, ["history", "show", "--db", str(tmp_path / "none.sqlite")])
    assert r.exit_code == 2 and "no history database there" in r.output
    r = cli.invoke(app, ["history", "show", "--db", str(other), "--since", "yesterday"])
    assert r.exit_code == 2 and "--since" in r.output


def test_a_stored_row_keeps_what_the_gate_needs(runs, tmp_path):
    rf = RunFolder.load(runs[0])
    db = tmp_path / "h.sqlite"
    add_run(db, runs[0], rf.manifest, rf.rows, "abc")
    back = {p.row.key: p.row for p in points(db)}
    for r in rf.rows:
        assert back[r.key].timing.round_medians_ms == r.timing.round_medians_ms and back[r.key].timing.median_ms == r.timing.median_ms
    import sqlite3
    with sqlite3.connect(db) as con:
        fp, opts, sha = con.execute("SELECT fingerprint, options, scenario_sha256 FROM runs").fetchone()
    assert json.loads(fp)["device"] == rf.manifest.device and json.loads(opts)["device"] == "cpu"
    assert sha == rf.manifest.scenario_sha256 and len(sha) == 64


def test_add_refuses_another_programs_sqlite_file_and_leaves_it_unchanged(runs, tmp_path):
    """Issue 37 item 18: `history add --db` on another program's SQLite file added attnbench's
    tables to it, exit 0."""
    import sqlite3
    other = tmp_path / "app.sqlite"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
        con.execute("INSERT INTO users VALUES (1, 'ada')")
    before = other.read_bytes()
    r = cli.invoke(app, ["history", "add", str(runs[0]), "--db", str(other)])
    assert r.exit_code == 2, r.output
    said = " ".join(r.output.split())
    assert "an SQLite database of another program (tables: users)" in said and "--db PATH" in said
    assert other.read_bytes() == before


def _chattr(flag: str, path: Path) -> bool:
    return shutil.which("chattr") is not None and subprocess.run(["chattr", flag, str(path)],
                                                                  capture_output=True).returncode == 0


def test_history_errors_say_what_happened_not_move_it_aside(runs, tmp_path):
    """Issue 37 item 19: every history error said "not a usable attnbench history database; move it
    aside and start a new one", also for a read-only file, a write that failed, a folder: advice that
    throws a good history away."""
    db = tmp_path / "h.sqlite"
    assert cli.invoke(app, ["history", "add", str(runs[0]), "--db", str(db)]).exit_code == 0
    r = cli.invoke(app, ["history", "show", "--db", str(tmp_path)])
    assert r.exit_code == 2 and "a folder, not a history database" in r.output and "move it aside" not in r.output
    if not _chattr("+i", db):  # an immutable file: what a read-only file system looks like to SQLite, even as root
        pytest.skip("chattr +i is not available here")
    try:
        before = db.read_bytes()
        r = cli.invoke(app, ["history", "add", str(runs[1]), "--db", str(db)])
        said = " ".join(r.output.split())
        assert r.exit_code == 2 and "cannot write there" in said and "move it aside" not in said, said
        assert db.read_bytes() == before
    finally:
        _chattr("-i", db)


@pytest.mark.slow
def test_a_write_that_fails_says_so_not_move_it_aside(runs, tmp_path):
    """Issue 37 item 19: a write that fails (a file-size limit here, in a child process; a full disk
    reads the same way) said "not a usable attnbench history database ... move it aside"."""
    import resource
    db = tmp_path / "f.db"
    full = subprocess.run([sys.executable, "-m", "attnbench", "history", "add", str(runs[1]), "--db", str(db)],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)))
    said = " ".join((full.stdout + full.stderr).split())
    assert full.returncode == 2 and "a read or write failed" in said and "move it aside" not in said, said[-800:]
    assert "nothing was stored and the history is unchanged" in said


def test_since_with_a_utc_offset_is_compared_as_time(runs, tmp_path):
    """Issue 37 item 20: `history show --since` compared ISO texts, so an offset let the wrong runs
    in and out."""
    db = tmp_path / "h.sqlite"
    for name, started in (("ten", "2026-01-01T10:00:00+00:00"), ("one", "2026-01-01T13:00:00+00:00")):
        copy = tmp_path / name
        shutil.copytree(runs[0], copy)
        man = json.loads((copy / "manifest.json").read_text())
        man["start_time"] = started
        (copy / "manifest.json").write_text(json.dumps(man))
        assert cli.invoke(app, ["history", "add", str(copy), "--db", str(db), "--commit", name]).exit_code == 0

    def shown(since):
        r = cli.invoke(app, ["history", "show", "--db", str(db), "--since", since, "--format", "json"])
        assert r.exit_code == 0, r.output
        return sorted({p["commit"] for p in json.loads(r.output)})

    assert shown("2026-01-01T14:00+02:00") == ["one"]  # 12:00 UTC
    assert shown("2026-01-01T11:00-03:00") == []  # 14:00 UTC
    assert shown("2026-01-01T09:30") == ["one", "ten"]  # no offset: UTC


@pytest.mark.slow
def test_a_history_that_lost_a_table_is_named_damaged_not_refilled(runs, tmp_path):
    """Issue 60 item 15: with its points table gone, `history add` said "already stored; kept",
    exit 0, re-created the table empty, and `history show` then said "no stored point matches"."""
    import sqlite3
    db = tmp_path / "h.sqlite"
    assert cli.invoke(app, ["history", "add", str(runs[0]), "--db", str(db)]).exit_code == 0
    with sqlite3.connect(db) as con:
        con.execute("DROP TABLE points")
    before = db.read_bytes()
    for args in (["history", "add", str(runs[0]), "--db", str(db)], ["history", "show", "--db", str(db)]):
        r = cli.invoke(app, args)
        said = " ".join(r.output.split())
        assert r.exit_code == 2 and "a damaged attnbench history: its table(s) points are gone" in said, (args, r.output)
        assert "move it aside" in said and "Traceback" not in r.output
    assert db.read_bytes() == before
