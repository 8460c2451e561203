"""Issue 60 item 1: who owns a --save-tensors folder. The owner check used to run once, before
any case file existed, and read only the first 8 `.pt` files sorted: two runs started at once
into one new folder both passed it (the second replaced the first's outputs, both exit 0), and
eight stray `.pt` files named before the case files hid the owner. Now the folder's owner is
named in its `.attnbench-owner` file, read and written under an exclusive lock."""
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.tensors import OWNER_FILE

from .test_cli import TINY

cli = CliRunner()
ONE = ["--set", "sweep={}", "-q"]


def _files(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.pt"))}


def test_stray_pt_files_named_first_hide_no_owner(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    tensors = tmp_path / "t"
    r = cli.invoke(app, ["run", str(tmp_path / "tiny.yaml"), "--out", str(tmp_path / "a"), "--save-tensors", str(tensors),
                         *ONE])
    assert r.exit_code == 0, r.output
    assert (tensors / OWNER_FILE).read_text().strip() == str(tmp_path / "a")
    for i in range(8):  # sorted before the case file (page_size=4.pt)
        torch.save(torch.zeros(1), tensors / f"a{i}.pt")
    kept = _files(tensors)
    r = cli.invoke(app, ["run", str(tmp_path / "tiny.yaml"), "--out", str(tmp_path / "b"), "--save-tensors", str(tensors),
                         *ONE])
    assert r.exit_code == 2 and f"holds the case files of the run {tmp_path / 'a'}" in r.output.replace("\n", ""), r.output
    assert _files(tensors) == kept and not (tmp_path / "b").exists()


BLOCKS = '''
import os, time
from pathlib import Path
from attnbench.backends.sdpa import SdpaBackend

class Blocks(SdpaBackend):
    name = "blocks"

    def convert(self, batch):
        Path(os.environ["ATTNBENCH_TEST_STARTED"]).write_text("in convert")
        go, t0 = Path(os.environ["ATTNBENCH_TEST_GO"]), time.monotonic()
        while not go.exists() and time.monotonic() - t0 < 300:
            time.sleep(0.05)
        return super().convert(batch)
'''


@pytest.mark.slow
def test_two_runs_started_at_once_into_one_tensors_folder_one_is_refused(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    plugin, tensors = tmp_path / "blocks.py", tmp_path / "t"
    plugin.write_text(textwrap.dedent(BLOCKS))
    started, go = tmp_path / "started", tmp_path / "go"
    env = {**os.environ, "ATTNBENCH_TEST_STARTED": str(started), "ATTNBENCH_TEST_GO": str(go)}
    first = subprocess.Popen([sys.executable, "-m", "attnbench", "run", str(tmp_path / "tiny.yaml"), "--out",
                              str(tmp_path / "a"), "--save-tensors", str(tensors), "--backend-file", str(plugin),
                              "-b", "blocks", "-b", "sdpa", *ONE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        t0 = time.monotonic()
        while not started.exists():  # the first run is inside its first backend: no case file written yet
            assert first.poll() is None and time.monotonic() - t0 < 300, first.communicate()
            time.sleep(0.05)
        assert not list(tensors.glob("*.pt"))
        r = cli.invoke(app, ["run", str(tmp_path / "tiny.yaml"), "--out", str(tmp_path / "b"), "--save-tensors",
                             str(tensors), *ONE])
        assert r.exit_code == 2 and f"holds the case files of the run {tmp_path / 'a'}" in r.output.replace("\n", ""), \
            r.output
        assert not (tmp_path / "b").exists()
    finally:
        go.write_text("go")
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    [saved] = tensors.glob("*.pt")
    blob = torch.load(saved, weights_only=True)
    assert blob["run"] == str(tmp_path / "a") and sorted(blob["outputs"]) == ["blocks", "sdpa"]
