"""Issue 37 item 24: a SIGTERM that lands before the command's handler is installed ends the
process by the signal's default action. The supervising parent used to blame the backend whose
step it last heard of (none had run), and a run folder stopped between its making and its
manifest held only `.lock`, which --resume called "not a run folder". Now a signal from outside
blames no backend, such a folder is removed, and --resume of one says what happened."""
import signal

from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.cli.supervise import verdict
from attnbench.store.manifest import Manifest
from attnbench.store.row_parts import RowIdentity
from attnbench.store.rows import Row
from attnbench.store.runfolder import RunFolder

cli = CliRunner()
STEP = {"scenario": "tiny", "case_id": "page_size=4", "backend": "sdpa", "device": "cpu", "device_id": "host:cpu",
        "dtype": "float32", "page_size": 4, "layout": "shuffled", "batch": "b", "num_requests": 1, "num_tokens": 1,
        "params": {"kv_cache.page_size": 4}, "repro": ""}


def test_a_sigterm_from_outside_blames_no_backend(tmp_path, capsys):
    rf = RunFolder.create(tmp_path, "tiny", tmp_path / "run")
    rf.start(Manifest(scenario="tiny", backends_requested=["reference", "sdpa"]))
    rf.add(Row(RowIdentity(scenario="tiny", case_id="page_size=4", backend="reference"), status="skipped", reason="x"))
    rf.unlock()
    assert verdict(-signal.SIGTERM, None, [str(rf.path)], STEP) == 143
    assert len(RunFolder.load(rf.path).rows) == 1  # no error row for sdpa
    err = capsys.readouterr().err
    assert "recorded an error row" not in err and "a kill from outside is no backend's fault" in err


def test_a_folder_holding_only_its_lock_is_removed_and_resume_says_why(tmp_path, capsys):
    rf = RunFolder.create(tmp_path, "tiny", tmp_path / "run")  # made and locked; no manifest yet
    rf.unlock()
    r = cli.invoke(app, ["run", "--resume", str(rf.path), "-q"])
    assert r.exit_code == 2 and "holds no run yet" in r.output and f"--out {rf.path}" in r.output.replace("\n", ""), r.output
    assert verdict(-signal.SIGTERM, None, [str(rf.path)], None) == 143
    assert not rf.path.exists()
    assert "the run stopped before it began" in capsys.readouterr().err
