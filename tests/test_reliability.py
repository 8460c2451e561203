"""Issue 13, part one: exits and messages that tell the truth for failures inside a run and
for flags that used to be ignored or give tracebacks. (Run folders: test_runfolder_safety.py.)
"""
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.backend import registry
from attnbench.backend.files import load_backend_file
from attnbench.cli.app import app
from attnbench.execute.runner import RunOptions, Runner
from attnbench.workload.scenario import load_text

from .test_cli import TINY

cli = CliRunner()
BAD_FILE = str(Path(__file__).with_name("misbehaving_backends.py"))


@pytest.fixture
def bad_backends():
    names = load_backend_file(BAD_FILE)
    yield
    for n in names:
        registry._EXTRA.pop(n, None)


@pytest.mark.parametrize("rounds", [1, 3])
def test_an_exception_during_timing_is_reported_as_itself(bad_backends, rounds):
    sf = load_text(TINY.replace("min_runs: 3}", f"min_runs: 3, rounds: {rounds}}}"), "tiny.yaml", ["sweep={}"])
    cls = registry.get_backend_class("raises_late")
    cls.calls = 0
    rows = list(Runner(sf, RunOptions(backends=["raises_late", "sdpa"], measure_ceilings=False)).rows())
    by = {r.id.backend: r for r in rows}
    assert by["raises_late"].status == "error"
    assert by["raises_late"].reason == "RuntimeError: illegal memory access on call 4"
    assert by["sdpa"].status == "ok"  # the next backend of the case is untouched


@pytest.mark.slow
@pytest.mark.parametrize("dev", ["gpu", "cuda:x", "cuda:", "CPU", "cuda:0:1"])
def test_bad_device_names_are_a_message_and_exit_2(tiny, tmp_path, dev):
    r = cli.invoke(app, ["run", str(tiny), "--device", dev, "--out", str(tmp_path / "o"), "-q"])
    assert r.exit_code == 2, r.output
    assert f"device {dev!r}: not a device name" in r.output and "cuda:N" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "o").exists()
    r = cli.invoke(app, ["compare", "backends", str(tiny), "-b", "sdpa", "-b", "reference", "--device", dev,
                         "--out", str(tmp_path / "c"), "-q"])
    assert r.exit_code == 2 and "not a device name" in r.output, r.output


@pytest.mark.slow
@pytest.mark.parametrize("typo, meant", [("spda", "'sdpa'"), ("SDPA", "'sdpa'"), ("flash", "'flash-attn' or 'flash-attn4' or 'flashinfer'"),
                                         ("Reference", "'reference'")])
def test_unknown_backend_names_say_what_was_meant(tiny, tmp_path, typo, meant):
    r = cli.invoke(app, ["run", str(tiny), "-b", typo, "--out", str(tmp_path / "o"), "-q"])
    assert r.exit_code == 2 and f"did you mean {meant}?" in r.output and "valid names" in r.output, r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.replace("backends: [reference, sdpa]", f"backends: [reference, {typo}]"))
    r = cli.invoke(app, ["validate", str(tiny), str(bad)])
    assert r.exit_code == 2, r.output
    assert f"{bad}: backends.1: unknown backend {typo!r}; did you mean {meant}?" in r.output.replace("\n", "")
    assert "✓" in r.output  # the good file still passes


def test_validate_knows_backend_file_names(tmp_path):
    registry._EXTRA.clear()  # a backend file another test loaded (its 'nan' among them) is not this test's
    s = tmp_path / "s.yaml"
    s.write_text(TINY.replace("backends: [reference, sdpa]", "backends: [nan, sdpa]"))
    r = cli.invoke(app, ["validate", str(s)])
    assert r.exit_code == 2 and "unknown backend 'nan'" in r.output
    r = cli.invoke(app, ["validate", str(s), "--backend-file", BAD_FILE])
    assert r.exit_code == 0, r.output
    registry._EXTRA.clear()
