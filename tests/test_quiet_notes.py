"""Quiet, honest notes (issue 58 item 6): notes alike but for their numbers are one line with a
count; the progress bar on a terminal starts no thread that the CPU timer would see; the
manifest keeps the load average at the start and the end of a run, and `show` and the report
say so when it was above the cores."""
from __future__ import annotations

import io
import json
import threading

from rich.console import Console
from typer.testing import CliRunner

from attnbench.analyze.run_table import print_results
from attnbench.analyze.tables import numbered_notes
from attnbench.cli.app import app
from attnbench.cli.progress import CaseBar, progress_for
from attnbench.store.manifest import Manifest, load_note
from attnbench.store.row_parts import RowIdentity, RowTiming
from attnbench.store.rows import Row

cli = CliRunner()


def _row(case: str, backend: str, note: str) -> Row:
    return Row(RowIdentity("s", case, backend), timing=RowTiming(median_ms=1.0, n=5, samples_ms=[1.0] * 5,
                                                                  timing_method="cpu-process", timing_note=note))


def _threads_note(ms: float) -> str:
    return (f"other threads of the process worked during the calls (the median call: {ms:.4g} ms of CPU time in "
            f"all threads, {ms / 3:.4g} ms in the calling one, wall {ms:.4g} ms): timed by the process's CPU clock")


def test_notes_alike_but_for_their_numbers_are_one_line_with_a_count():
    rows = [_row(f"seed={i}", "flex", _threads_note(1.5 + i)) for i in range(26)]
    rows.append(_row("seed=0", "sdpa", "ran on a Tuesday"))
    notes, refs = numbered_notes(rows)
    assert len(notes) == 2, notes
    assert notes[0].startswith("flex: other threads") and "(26 rows alike" in notes[0]
    assert refs[:26] == [["1"]] * 26 and refs[26] == ["2"] and "rows alike" not in notes[1]
    con = Console(width=80, record=True)
    print_results(rows, con)
    assert sum("other threads" in ln for ln in con.export_text().splitlines()) == 1


def test_identical_notes_need_no_count_and_re_run_lines_stay_apart():
    rows = [_row(f"seed={i}", "flex", "the same words") for i in range(3)]
    notes, _ = numbered_notes(rows)
    assert notes == ["flex: the same words"]


def test_the_terminal_bar_starts_no_thread():
    """rich's refresh thread drew the bar while rows were timed in this process: the CPU timer saw
    the process's clock run ahead of the calling thread's and moved rows to the process clock, on
    a terminal only."""
    out = io.StringIO()
    con = Console(file=out, force_terminal=True, width=80)
    before = threading.active_count()
    with progress_for(con, {"a": 2}, "tiny", quiet=False) as bar:
        assert isinstance(bar, CaseBar)
        assert threading.active_count() == before
        bar.advance("a", "sdpa", "ok")
        assert "sdpa: ok" in out.getvalue()  # drawn when a row finishes


def test_load_note_only_above_the_cores():
    busy = Manifest(load={"cores": 2, "start": [6.5, 4.0, 2.0], "end": [1.0, 1.0, 1.0]})
    assert "load average 6.5 at its start and 1 at its end (1 minute) on 2 cores" in load_note(busy)
    assert load_note(Manifest(load={"cores": 2, "start": [1.5, 1, 1], "end": [2, 1, 1]})) == ""
    assert load_note(Manifest()) == ""  # a run made before the load was kept
    assert load_note(Manifest.from_json({"load": {"cores": "two", "start": "high"}})) == ""


def test_a_run_keeps_its_load_and_show_reports_a_busy_machine(tiny, tmp_path):
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(tiny), "--out", str(out), "-q", "-k", "page_size=4 and sdpa"])
    assert r.exit_code == 0, r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["load"]["cores"] >= 1 and len(m["load"]["start"]) == 3 and len(m["load"]["end"]) == 3
    m["load"] = {"cores": 2, "start": [9.0, 9.0, 9.0], "end": [11.0, 9.0, 9.0]}
    (out / "manifest.json").write_text(json.dumps(m))
    r = cli.invoke(app, ["show", str(out)], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "load average 9 at its start and 11 at its end" in r.output, r.output
    report = tmp_path / "r.html"
    r = cli.invoke(app, ["report", str(out), "-o", str(report)])
    assert r.exit_code == 0, r.output
    assert "load average 9 at its start" in report.read_text()
    m["load"] = {"cores": 2, "start": [1.0, 1.0, 1.0], "end": [1.0, 1.0, 1.0]}
    (out / "manifest.json").write_text(json.dumps(m))
    r = cli.invoke(app, ["show", str(out)], env={"COLUMNS": "200"})
    assert "load average" not in r.output
