"""Comparisons that can give a verdict with the shipped settings (issue 24 item 7): `compare
backends -b sdpa -b flex` on the quickstart printed `7.906× … unclear` for an 8x gap (one
timing round), and `calibrate scenarios/quickstart.yaml` exited 2 (5 rounds needed). Both
now run with 10 rounds when the scenario has too few, and say so."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attnbench.analyze.significance import GATE_CONFIDENCE, REPORT_CONFIDENCE, rounds_needed
from attnbench.cli.app import app
from attnbench.cli.rounds import with_enough_rounds
from attnbench.workload.scenario import load

SHIPPED = sorted((Path(__file__).resolve().parents[1] / "attnbench" / "scenarios").rglob("*.yaml"))
ONE_ROUND = textwrap.dedent("""
    name: one-round
    seed: 2
    device: cpu
    model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
    kv_cache: {page_size: 4, layout: shuffled}
    batch:
      - {kind: decode, count: 2, context: 19}
    timing: {warmup_ms: 0, measure_ms: 10, min_runs: 10}
""")
cli = CliRunner()


@pytest.mark.slow
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_scenario_gets_enough_rounds(path):
    for need in (rounds_needed(REPORT_CONFIDENCE, paired=True), rounds_needed(GATE_CONFIDENCE)):
        sets, _ = with_enough_rounds(path, [], need)
        assert all(c.scenario.timing.rounds >= need for c in load(path, sets).cases), (path.name, need, sets)


def test_rounds_asked_for_are_kept(tmp_path):
    s = tmp_path / "s.yaml"
    s.write_text(ONE_ROUND)
    assert with_enough_rounds(s, ["timing.rounds=3"], 6) == (["timing.rounds=3"], None)
    sets, note = with_enough_rounds(s, [], 6)
    assert sets == ["timing.rounds=10"] and "1 round(s)" in note


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_compare_backends_of_a_one_round_scenario_runs_enough_rounds(tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    s = tmp_path / "s.yaml"
    s.write_text(ONE_ROUND)
    r = cli.invoke(app, ["compare", "backends", str(s), "-b", "sdpa", "-b", "reference", "--baseline", "sdpa",
                         "--format", "json", "--results-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "running with --set timing.rounds=10" in r.stderr
    recs = {x["backend"]: x for x in json.loads(r.stdout)}
    assert recs["reference"]["rounds"] == "10 paired"


@pytest.mark.slow
def test_calibrate_works_on_a_one_round_scenario(tmp_path, one_thread):
    s = tmp_path / "s.yaml"
    s.write_text(ONE_ROUND)
    r = cli.invoke(app, ["calibrate", str(s), "--runs", "2", "--out", str(tmp_path / "cal"), "-b", "sdpa",
                         "--slowdown", "3", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert "running with --set timing.rounds=10" in r.stderr
    first = json.loads(r.stdout[: r.stdout.index("]") + 1])
    assert first[0]["checks"] == 2 and first[1]["slowdown"] == "3×"
