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
    assert fake_measure == ["memory", "float32", "bfloat16"]  # only the missing rate
    assert (b.copy_tbps, b.read_tbps, b.matmul_tflops["float32"]) == (a.copy_tbps, a.read_tbps, a.matmul_tflops["float32"])
    c = cl.ceilings_for(CPU, "float32", threads=1)
    assert c == b and len(fake_measure) == 3  # nothing measured again
    assert set(c.measured_at) == {"memory", "float32", "bfloat16"}
    # CPU ceilings are kept per thread count (rows run with one thread by default)
    cl.ceilings_for(CPU, "float32", threads=2)
    assert fake_measure[3:] == ["memory", "float32"]


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
    row = Row(scenario="s", case_id="c", backend="sdpa", status="ok", pct_of_ceiling=220.0, bound="compute")
    assert fmt_roofline(row) == "ceiling?"
    assert any("the ceiling is wrong" in n and "attnbench ceilings --measure" in n for n in row_notes(row, {}))
    row.pct_of_ceiling = 54.0
    row.bound = "memory"
    assert fmt_roofline(row) == "54% mem" and not any("ceiling" in n for n in row_notes(row, {}))
