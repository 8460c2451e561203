"""Ceilings stay put (issue 24 item 2): measured once per device and dtype, a new dtype adds
its matmul rate without touching the rest, only `attnbench ceilings --measure` replaces
them; a row above 100% of its ceiling says the ceiling is wrong instead of printing 220%."""
from __future__ import annotations

import itertools
import json

import pytest
import torch
from typer.testing import CliRunner

from attnbench.analyze.tables import fmt_roofline, row_notes
from attnbench.cli.app import app
from attnbench.measure import ceilings as cl
from attnbench.store.row_parts import RowIdentity, RowRoofline
from attnbench.store.rows import Row

CPU = torch.device("cpu")


@pytest.fixture
def fake_measure(tmp_path, monkeypatch):
    """Each measurement returns a new value (as a busy machine would): whatever is reused
    shows as the first value."""
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path))
    calls = []
    count = itertools.count(1)

    def memory(device):
        k = next(count)
        calls.append("memory")
        return {"copy_tbps": 0.01 * k, "read_tbps": 0.02 * k}

    def matmul(device, dtype):
        calls.append(dtype)
        return 0.1 * next(count)

    monkeypatch.setattr(cl, "measure_memory", memory)
    monkeypatch.setattr(cl, "measure_matmul", matmul)
    return calls


def test_a_new_dtype_adds_its_rate_and_keeps_the_rest(fake_measure):
    a = cl.ceilings_for(CPU, "float32", threads=1)
    assert fake_measure == ["memory", "float32"]
    b = cl.ceilings_for(CPU, "bfloat16", threads=1)
    assert fake_measure == ["memory", "float32"]  # a CPU's 16-bit rate is its float32 rate (issue 35): kept, not measured
    assert b.matmul_tflops["bfloat16"] == b.matmul_tflops["float32"] == a.matmul_tflops["float32"]
    assert (b.copy_tbps, b.read_tbps) == (a.copy_tbps, a.read_tbps)
    c = cl.ceilings_for(CPU, "float32", threads=1)
    assert c == b and len(fake_measure) == 2  # nothing measured again
    assert set(c.measured_at) == {"memory", "float32", "bfloat16"}
    # CPU ceilings are kept per thread count (rows run with one thread by default)
    d = cl.ceilings_for(CPU, "float16", threads=2)
    assert fake_measure[2:] == ["memory", "float16"]  # (measured in float32 on a CPU)
    assert cl.ceilings_for(CPU, "float32", threads=2) == d and len(fake_measure) == 4


def test_a_concurrent_writer_is_not_overwritten(fake_measure):
    cl.ceilings_for(CPU, "float32", threads=1)
    path, key = cl.cache_path(), cl.cache_key(CPU, 1)
    doc = json.loads(path.read_text())
    doc[key]["matmul_tflops"]["float16"] = 7.0  # another process added float16 meanwhile
    path.write_text(json.dumps(doc))
    cl.ceilings_for(CPU, "bfloat16", threads=1)
    kept = json.loads(path.read_text())[key]["matmul_tflops"]
    assert kept["float16"] == 7.0 and set(kept) == {"float32", "float16", "bfloat16"}


def test_only_remeasure_replaces(fake_measure):
    a = cl.ceilings_for(CPU, "float32", threads=1)
    before, after = cl.remeasure(CPU, ["float32"], threads=1)
    assert before == a and after.copy_tbps != a.copy_tbps and after.matmul_tflops["float32"] != a.matmul_tflops["float32"]
    assert cl.ceilings_for(CPU, "float32", threads=1) == after


def test_ceilings_command_shows_and_remeasures(fake_measure):
    cli = CliRunner()
    r = cli.invoke(app, ["ceilings"])
    assert r.exit_code == 0 and "no ceilings kept yet" in r.output
    cl.ceilings_for(CPU, "float32", threads=1)
    r = cli.invoke(app, ["ceilings"])
    assert r.exit_code == 0 and "float32 0.2" in r.output, r.output
    r = cli.invoke(app, ["ceilings", "--measure", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "before: copy 0.01" in r.output and fake_measure[-2:] == ["memory", "float32"]
    r = cli.invoke(app, ["ceilings", "--measure", "--device", "cpu", "--dtype", "float33"])
    assert r.exit_code == 2 and "--dtype float33" in r.output


def test_a_row_above_its_ceiling_blames_the_ceiling():
    row = Row(RowIdentity(scenario="s", case_id="c", backend="sdpa"), status="ok",
              roofline=RowRoofline(pct_of_ceiling=220.0, bound="compute"))
    assert fmt_roofline(row) == "ceiling?"
    assert any("the ceiling is wrong" in n and "attnbench ceilings --measure" in n for n in row_notes(row, {}))
    row.roofline.pct_of_ceiling = 54.0
    row.roofline.bound = "memory"
    assert fmt_roofline(row) == "54% mem" and not any("ceiling" in n for n in row_notes(row, {}))


# ---------------------------------------------------------------------------- issue 35 item 5
def test_a_ceiling_is_the_best_of_several_rounds(monkeypatch):
    """A busy spell during one measurement no longer becomes the kept ceiling (copy bandwidth read
    11.5 and 21.2 GB/s minutes apart on one CPU): every value is the best of ROUNDS rounds."""
    rounds = iter([2.0, 1.0, 2.0, 2.0, 2.0] * 20)  # seconds per round: only the second ran unloaded
    monkeypatch.setattr(cl, "median_seconds", lambda fn, device, reps: next(rounds))
    assert cl.ROUNDS >= 3
    rate = cl.measure_matmul(CPU, "float32")
    assert rate == pytest.approx(2 * 1024**3 / 1.0 / 1e12)  # the unloaded round, not the median call's 2 s


TINY_F32 = """\
name: tiny
seed: 3
device: cpu
model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
kv_cache: {page_size: 4}
batch: [{kind: decode, count: 2, context: 64}]
sweep: {batch.0.context: [64, 128]}
backends: [reference, sdpa]
timing: {warmup_ms: 1, measure_ms: 5, min_runs: 3}
"""


def test_a_run_that_beats_a_kept_ceiling_measures_it_again_once(fake_measure, tmp_path, monkeypatch):
    monkeypatch.setattr(cl, "_RAISED", {})
    monkeypatch.setattr(cl, "measure_memory", lambda d: fake_measure.append("memory") or
                        {"copy_tbps": 1.0, "read_tbps": 1.0})
    monkeypatch.setattr(cl, "measure_matmul", lambda d, t: fake_measure.append(t) or 100.0)
    key = cl.cache_key(CPU, 1)
    low = {"device_name": "cpu test", "copy_tbps": 1e-9, "read_tbps": 1e-9, "matmul_tflops": {"float32": 1e-9},
           "measured_at": {"memory": "2020-01-01T00:00:00+00:00", "float32": "2020-01-01T00:00:00+00:00"}}
    cl.cache_path().write_text(json.dumps({key: low}))  # measured under a heavy load, long ago
    p = tmp_path / "t.yaml"
    p.write_text(TINY_F32)
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", str(p), "-q", "--out", str(out), "--format", "csv"])
    assert r.exit_code == 0, r.output
    assert fake_measure == ["memory", "float32"]  # once, for the first row above 100%, not per row
    kept = json.loads(cl.cache_path().read_text())[key]
    assert kept["copy_tbps"] == 1.0 and kept["matmul_tflops"]["float32"] == 100.0
    assert kept["measured_at"]["memory"] > "2020"
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    sdpa = [x for x in rows if x["backend"] == "sdpa"]
    assert len(sdpa) == 2 and all(0 < x["pct_of_ceiling"] < 100 for x in sdpa), sdpa
    oracle = [x for x in rows if x["backend"] == "reference"]
    assert oracle and all(x["pct_of_ceiling"] is None and x["tbps"] is None and x["bound"] == "" for x in oracle)
