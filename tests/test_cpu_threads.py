"""CPU rows are timed with one intra-op thread unless --threads says otherwise; the count is
recorded in every row and in the manifest, and the process's setting is restored."""
from __future__ import annotations

import json

import pandas as pd
import torch
from typer.testing import CliRunner

from attnbench.cli import app

from .test_cli import TINY

runner = CliRunner()


def test_threads_default_one_and_flag(tmp_path):
    (tmp_path / "t.yaml").write_text(TINY)
    before = torch.get_num_threads()
    for flag, want in (([], 1), (["--threads", "2"], 2)):
        out = tmp_path / f"run{want}"
        r = runner.invoke(app, ["run", str(tmp_path / "t.yaml"), "--out", str(out), "-q", "-b", "sdpa", *flag])
        assert r.exit_code == 0, r.output
        df = pd.read_csv(out / "results.csv")
        assert set(df.threads) == {want}
        assert json.loads((out / "manifest.json").read_text())["options"]["threads"] == (None if not flag else 2)
        assert torch.get_num_threads() == before


def test_threads_must_be_positive(tmp_path):
    (tmp_path / "t.yaml").write_text(TINY)
    r = runner.invoke(app, ["run", str(tmp_path / "t.yaml"), "--threads", "0", "-q"])
    assert r.exit_code == 2 and "--threads 0" in r.output
