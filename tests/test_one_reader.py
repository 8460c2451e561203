"""Issue 37 item 10: one reader of run folders with one set of refusals. ``history add``,
``report``, ``plot``, ``baseline`` and ``check`` refuse the same damaged run folders, with the
same message: a second copy of a row (history used to keep the later, 100x slower copy while
saying "stored 5 rows"), a negative median (stored, shown as -3 ms), a row of another scenario
or of a backend the run never ran."""
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app

from .test_cli import TINY

cli = CliRunner()
pytestmark = pytest.mark.slow  # one real run (seconds on a shared CPU)


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("reader")
    scenario = root / "tiny.yaml"
    scenario.write_text(TINY)
    out = root / "run"
    r = cli.invoke(app, ["run", str(scenario), "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    return out


def _damaged(clean_run: Path, tmp_path: Path, change) -> Path:
    """A copy of the clean run with one more line: its first row, changed by ``change``."""
    out = tmp_path / "damaged"
    shutil.copytree(clean_run, out)
    first = json.loads((out / "rows.jsonl").read_text().splitlines()[0])
    change(first)
    with open(out / "rows.jsonl", "a") as f:
        f.write(json.dumps(first) + "\n")
    return out


def _slower(row):
    row.update(median_ms=row["median_ms"] * 100, samples_ms=[x * 100 for x in row["samples_ms"]])


DAMAGE = {
    "duplicate": (_slower, "repeats row 1"),
    "negative median": (lambda r: r.update(median_ms=-3.0), "median_ms = -3.0: not a finite time > 0 ms"),
    "another scenario": (lambda r: r.update(scenario="other"), "is of scenario 'other', not the run's 'tiny'"),
    "a backend never run": (lambda r: r.update(backend="flex"), "is of backend 'flex', which the run never ran"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_every_reader_refuses_what_check_refuses(clean_run, tmp_path, damage):
    change, words = DAMAGE[damage]
    run = _damaged(clean_run, tmp_path, change)
    before = (run / "rows.jsonl").read_bytes()
    commands = {
        "history add": ["history", "add", str(run), "--db", str(tmp_path / "h.sqlite")],
        "report": ["report", str(run), "-o", str(tmp_path / "r.html")],
        "plot": ["plot", str(run), "--x", "page_size", "--out", str(tmp_path / "plots")],
        "baseline": ["baseline", str(run), "--to", str(tmp_path / "b.json"), "--allow-few-rounds"],
        "check": ["check", str(run), "--baseline", str(clean_run)],
        "compare runs": ["compare", "runs", str(clean_run), str(run)],
    }
    for name, args in commands.items():
        r = cli.invoke(app, args)
        text = r.output.replace("\n", "")
        assert r.exit_code == 2, (name, r.output)
        assert "row 5 of rows.jsonl" in text and words in text, (name, text)
        assert "Traceback" not in r.output, name
    assert (run / "rows.jsonl").read_bytes() == before
    assert not (tmp_path / "h.sqlite").exists()
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "b.json").exists()
    assert not (tmp_path / "plots").exists()


def test_the_clean_run_is_read_by_every_command(clean_run, tmp_path):
    for args in (["history", "add", str(clean_run), "--db", str(tmp_path / "h.sqlite")],
                 ["report", str(clean_run), "-o", str(tmp_path / "r.html")],
                 ["baseline", str(clean_run), "--to", str(tmp_path / "b.json"), "--allow-few-rounds"]):
        r = cli.invoke(app, args)
        assert r.exit_code == 0, r.output
