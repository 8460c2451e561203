"""Issue 34: ``RunOptions`` is frozen once built. What is derived later (the backends' resolved
specs, the run folder a run writes into) makes new options, so the options a runner was made with,
an ``--isolate`` child's job and the manifest never change under one another."""
import dataclasses
import json

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.execute.executors import ExecutorSpec, open_runner
from attnbench.execute.isolate import IsolatedRunner
from attnbench.execute.options import RunOptions
from attnbench.workload.scenario import load_text

from .test_cli import TINY

cli = CliRunner()


def test_built_options_cannot_be_changed():
    opts = RunOptions(backends=["sdpa"], device="cpu")
    for field, value in (("run", "/elsewhere"), ("profile_dir", None), ("backend_specs", {}), ("backends", None)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(opts, field, value)
    assert dataclasses.replace(opts, run="/r").run == "/r" and opts.run is None


def _isolated():
    sf = load_text(TINY, "tiny.yaml", ["sweep={}"])
    opts = RunOptions(backends=["sdpa", "reference"], device="cpu")
    return opts, open_runner(sf, opts, ExecutorSpec("local", isolate=True, timeout=60), scenario_path="tiny.yaml",
                             overrides=["sweep={}"], backend_files=[])


def test_the_runner_keeps_its_resolved_specs_in_options_of_its_own():
    opts, runner = _isolated()
    assert opts.backend_specs is None  # the caller's options: as given
    assert set(runner.opts.backend_specs) == {"sdpa", "reference"}


def test_a_runner_writing_into_a_folder_is_a_new_one_and_its_children_are_told(tmp_path):
    opts, runner = _isolated()
    made_with = runner.opts
    writing = runner.writing_to(str(tmp_path / "run"), tmp_path / "run" / "profiles")
    assert type(writing) is IsolatedRunner  # still isolated (not the local runner it wraps)
    assert writing.opts.run == str(tmp_path / "run") and writing.opts.profile_dir == tmp_path / "run" / "profiles"
    assert writing.opts.backend_specs == made_with.backend_specs
    assert runner.opts is made_with and made_with.run is None and made_with.profile_dir is None
    assert writing.job.options.run == str(tmp_path / "run") and runner.job.options.run is None


def test_the_manifest_records_the_run_folder_in_the_options(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(TINY)
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(tiny), "-b", "reference", "--out", str(out), "-q", "--set", "sweep={}",
                         "--set", "timing.rounds=1", "--measure-ms", "1", "--warmup-ms", "1"])
    assert r.exit_code == 0, r.output
    options = json.loads((out / "manifest.json").read_text())["options"]
    assert options["run"] == str(out.resolve()) and options["profile_dir"] is None
    assert options["backend_specs"] == {"reference": {}}
