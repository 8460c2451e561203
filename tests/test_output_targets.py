"""Issue 37, data loss 1 and 2: one rule for every file a command writes (report -o, import -o,
baseline --to, history add --db): never over something that is not a regular file (a device
such as /dev/null, a fifo, a socket, a folder, a symbolic link to one), never over an input of
the command, never over a run folder's own files or into a folder below a run folder."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.outputs import check_write_target
from attnbench.store.runfolder import RunFolderError, atomic_write

from .test_cli import TINY

cli = CliRunner()
TRACE = Path(__file__).resolve().parents[1] / "attnbench" / "scenarios" / "traces" / "synthetic-serving.jsonl"


@pytest.fixture(scope="module")
def made_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("made")
    (d / "tiny.yaml").write_text(TINY)
    r = cli.invoke(app, ["run", str(d / "tiny.yaml"), "--out", str(d / "run"), "-q"])
    assert r.exit_code == 0, r.output
    return d / "run"


@pytest.fixture
def run(made_run, tmp_path):
    shutil.copytree(made_run, tmp_path / "run")
    (tmp_path / "run" / ".lock").unlink(missing_ok=True)
    return tmp_path / "run"


@pytest.fixture
def trace(tmp_path):
    t = tmp_path / "trace.jsonl"
    shutil.copyfile(TRACE, t)
    return t


def _write(cmd: str, run: Path, trace: Path, target: Path):
    args = {
        "report": ["report", str(run), "-o", str(target)],
        "import": ["import", str(trace), "-o", str(target)],
        "baseline": ["baseline", str(run), "--to", str(target)],
        "history": ["history", "add", str(run), "--db", str(target)],
    }[cmd]
    return cli.invoke(app, args)


FLAGS = {"report": "--out/-o", "import": "--out/-o", "baseline": "--to", "history": "--db"}


@pytest.mark.parametrize("cmd", ["report", "import", "baseline", "history"])
@pytest.mark.parametrize("how", ["fifo", "link to a fifo"])
def test_a_target_that_is_not_a_regular_file_is_refused_and_kept(cmd, how, run, trace, tmp_path):
    # a fifo stands in for /dev/null: as root, `report RUN -o /dev/null` replaced the device
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = fifo
    if how != "fifo":
        target = tmp_path / "link"
        target.symlink_to(fifo)
    r = _write(cmd, run, trace, target)
    assert r.exit_code == 2, r.output
    assert FLAGS[cmd] in r.output and str(target) in r.output and "not a regular file" in r.output, r.output
    assert "choose another path" in r.output or "elsewhere" in r.output, r.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    if how != "fifo":
        assert target.is_symlink() and os.readlink(target) == str(fifo)
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_folder_as_report_or_import_target_is_refused(run, trace, tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    for cmd in ("report", "import"):
        r = _write(cmd, run, trace, d)
        assert r.exit_code == 2 and "a folder" in r.output and "--out/-o" in r.output, r.output
        assert d.is_dir() and list(d.iterdir()) == []


def test_import_never_replaces_its_trace(trace, tmp_path):
    before = trace.read_bytes()
    r = cli.invoke(app, ["import", str(trace), "-o", str(trace)])
    assert r.exit_code == 2 and "an input of this command" in r.output, r.output
    assert trace.read_bytes() == before
    link = tmp_path / "same.yaml"
    link.symlink_to(trace)
    r = cli.invoke(app, ["import", str(trace), "-o", str(link)])
    assert r.exit_code == 2 and "an input of this command" in r.output, r.output
    assert trace.read_bytes() == before


def test_report_never_replaces_its_history(run, tmp_path):
    db = tmp_path / "h.db"
    assert cli.invoke(app, ["history", "add", str(run), "--db", str(db)]).exit_code == 0
    before = db.read_bytes()
    r = cli.invoke(app, ["report", str(run), "--history", str(db), "-o", str(db)])
    assert r.exit_code == 2 and "an input of this command" in r.output, r.output
    assert db.read_bytes() == before


@pytest.mark.parametrize("cmd,name", [("report", "rows.jsonl"), ("report", "manifest.json"),
                                      ("report", "results.csv"), ("import", "rows.jsonl"),
                                      ("import", "manifest.json"), ("history", "rows.jsonl")])
def test_no_command_writes_over_a_run_folders_files(cmd, name, run, trace):
    before = (run / name).read_bytes()
    r = _write(cmd, run, trace, run / name)
    assert r.exit_code == 2 and "of the run folder" in r.output and FLAGS[cmd] in r.output, r.output
    assert (run / name).read_bytes() == before


def test_nor_into_a_folder_below_a_run_folder_but_beside_its_files_is_fine(run, trace):
    (run / "plots").mkdir()
    for cmd in ("report", "import"):
        r = _write(cmd, run, trace, run / "plots" / "x.out")
        assert r.exit_code == 2 and "of the run folder" in r.output, r.output
        assert not (run / "plots" / "x.out").exists()
    r = _write("report", run, trace, run / "report.html")
    assert r.exit_code == 0, r.output
    r = _write("import", run, trace, run / "scenario.yaml")
    assert r.exit_code == 0, r.output


def test_the_rule_and_atomic_write_refuse_a_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(RunFolderError, match="--x .*fifo.*not a regular file"):
        check_write_target(fifo, "--x")
    with pytest.raises(OSError, match="not a regular file"):
        atomic_write(fifo, "text")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert check_write_target(tmp_path / "new.txt", "--x") == tmp_path / "new.txt"


# ---------------------------------------------------------------- data loss 4: --save-tensors
def _saved(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.pt"))}


def test_save_tensors_into_another_runs_tensors_is_refused(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    one = ["run", str(tmp_path / "tiny.yaml"), "-q", "--set", "sweep={}"]
    r = cli.invoke(app, [*one, "--out", str(tmp_path / "a"), "--save-tensors", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    kept = _saved(tmp_path / "t")
    assert kept
    r = cli.invoke(app, [*one, "--out", str(tmp_path / "b"), "--save-tensors", str(tmp_path / "t")])
    assert r.exit_code == 2 and "--save-tensors" in r.output and "holds the case files of the run" in r.output, r.output
    assert str(tmp_path / "a") in r.output
    assert _saved(tmp_path / "t") == kept and not (tmp_path / "b" / "rows.jsonl").exists()
    # inside another run's folder, or a run folder itself (another's, or this run's own --out)
    r = cli.invoke(app, [*one, "--out", str(tmp_path / "c"), "--save-tensors", str(tmp_path / "a" / "tensors")])
    assert r.exit_code == 2 and "inside the run folder" in r.output, r.output
    assert not (tmp_path / "a" / "tensors").exists()
    before = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir() if p.is_file()}
    r = cli.invoke(app, [*one, "--out", str(tmp_path / "d"), "--save-tensors", str(tmp_path / "a")])
    assert r.exit_code == 2 and "a run folder" in r.output, r.output
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir() if p.is_file()} == before
    r = cli.invoke(app, [*one, "--out", str(tmp_path / "e"), "--save-tensors", str(tmp_path / "e")])
    assert r.exit_code == 2 and "a run folder" in r.output, r.output
    # this run's own tensors folder inside its own --out is its own
    r = cli.invoke(app, [*one, "--out", str(tmp_path / "f"), "--save-tensors", str(tmp_path / "f" / "tensors")])
    assert "inside the run folder" not in r.output and "a run folder (its" not in r.output, r.output


@pytest.mark.slow
def test_plot_never_writes_a_png_over_a_fifo_or_through_a_link(run, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    out.mkdir()
    elsewhere = tmp_path / "precious.txt"
    elsewhere.write_text("keep me")
    r = cli.invoke(app, ["plot", str(run), "--x", "page_size", "--out", str(out)])
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in out.glob("*.png"))
    assert names
    for p in out.glob("*.png"):
        p.unlink()
    os.mkfifo(out / names[0])
    r = cli.invoke(app, ["plot", str(run), "--x", "page_size", "--out", str(out)])
    assert r.exit_code == 2 and names[0] in r.output and "not a regular file" in r.output, r.output
    assert stat.S_ISFIFO(os.lstat(out / names[0]).st_mode)
    os.unlink(out / names[0])
    (out / names[0]).symlink_to(elsewhere)
    r = cli.invoke(app, ["plot", str(run), "--x", "page_size", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert elsewhere.read_text() == "keep me" and not (out / names[0]).is_symlink()


def test_another_programs_manifest_json_above_makes_no_run_folder(trace, tmp_path):
    (tmp_path / "manifest.json").write_text('{"name": "a web app", "version": 2}')
    (tmp_path / "docs").mkdir()
    r = cli.invoke(app, ["import", str(trace), "-o", str(tmp_path / "docs" / "s.yaml")])
    assert r.exit_code == 0, r.output
