"""Issue 37 item 25: `--save-tensors` inside `--out` used to create the tensors folder first and
then refuse `--out` as not empty (leaving the folder behind); now `--out OUT --save-tensors
OUT/tensors` runs, and an `--out` refused for what it holds gets no tensors folder made in it."""
import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli.app import app


cli = CliRunner()


@pytest.mark.slow
def test_save_tensors_inside_a_new_out_runs(tiny, tmp_path):
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(tiny), "--out", str(out), "--save-tensors", str(out / "tensors"), "-q",
                         "--set", "sweep={}"])
    assert r.exit_code == 0, r.output
    (case_file,) = (out / "tensors").glob("*.pt")
    saved = torch.load(case_file, weights_only=True)
    assert set(saved["outputs"]) == {"reference", "sdpa"}


def test_an_out_refused_for_what_it_holds_gets_no_tensors_folder(tiny, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = cli.invoke(app, ["run", str(tiny), "--out", str(out), "--save-tensors", str(out / "tensors"), "-q"])
    assert r.exit_code == 2 and "not empty" in r.output, r.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
