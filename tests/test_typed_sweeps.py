"""Issue 34: swept values are typed. ``[1k, 4k, 16k]`` is 1024, 4096, 16384 in params,
rows.jsonl, results.csv and JSON (text only when rendering); ``null`` is a value of its own in
tables and plots; plots order numbers by value (on the PNG: its ``attnbench x`` text chunk);
``-k`` compares a word with the typed value, so the YAML spelling (``dtype=fp8_e4m3``) picks
rows. Run folders written before (string values) read the same way."""
import csv
import json
import textwrap

import pytest
from rich.console import Console
from typer.testing import CliRunner

from attnbench.analyze.run_table import print_results
from attnbench.cli.app import app
from attnbench.store.row_parts import RowIdentity, RowTiming, RowWorkload
from attnbench.store.rows import Row
from attnbench.store.runfolder import RunFolder
from attnbench.workload.scenario import load, load_text
from attnbench.workload.select import parse_selector

cli = CliRunner()

SIZED = textwrap.dedent("""
    name: sized
    seed: 3
    device: cpu
    model: {num_q_heads: 2, num_kv_heads: 1, head_dim: 16, dtype: float32}
    kv_cache: {page_size: 16, layout: shuffled}
    batch:
      - {kind: decode, count: 1, context: 1k}
    sweep:
      batch.0.context: [1k, 2k]
      model.window: [null, 64]
    backends: [sdpa]
    timing: {warmup_ms: 0, measure_ms: 1, min_runs: 1, max_runs: 2}
""")


def test_sized_values_are_numbers_in_params():
    sf = load("decode-llama3-8b")
    assert [c.params["batch.0.context"] for c in sf.cases] == [1024, 1024, 4096, 4096, 16384, 16384]
    # case ids are made from the typed values and read as before
    assert [c.case_id for c in sf.cases][:2] == ["context=1k,page_size=16", "context=1k,page_size=256"]


def test_results_csv_rows_jsonl_and_json_hold_numbers(tmp_path):
    p = tmp_path / "sized.yaml"
    p.write_text(SIZED)
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(p), "--out", str(out), "--format", "json", "-b", "sdpa"])
    assert r.exit_code == 0, r.output
    recs = [x for x in json.loads(r.stdout) if x["backend"] == "sdpa"]
    assert [x["params"] for x in recs] == [{"batch.0.context": c, "model.window": w}
                                           for c in (1024, 2048) for w in (None, 64)]
    with open(out / "results.csv") as f:
        table = [x for x in csv.DictReader(f) if x["backend"] == "sdpa"]
    assert [(x["batch.0.context"], x["model.window"]) for x in table] == [
        ("1024", ""), ("1024", "64"), ("2048", ""), ("2048", "64")]
    jsonl = [json.loads(line)["params"] for line in (out / "rows.jsonl").read_text().splitlines()]
    assert jsonl[0] == {"batch.0.context": 1024, "model.window": None}


def _old_folder(path, case_params):
    """A run folder as attnbench wrote it before issue 34: sized values as text in params."""
    rf = RunFolder.create(path.parent, "decode-llama3-8b", path)
    rf.start({"scenario": "decode-llama3-8b", "scenario_sha256": "a" * 64, "overrides": [],
              "environment": {"device": "cpu test", "backends": {}}})
    for i, (case_id, params) in enumerate(case_params):
        for b, t in (("sdpa", 1.0), ("flex", 2.0)):
            rf.add(Row(RowIdentity("decode-llama3-8b", case_id, b, device="cpu test"),
                       workload=RowWorkload(params=params),
                       timing=RowTiming(median_ms=t * (1 + i), n=3, timing_method="cpu", samples_ms=[t] * 3,
                                        round_medians_ms=[t])))
    rf.finish(True)
    return path


def _x_order(png) -> str:
    from PIL import Image

    with Image.open(png) as im:
        return im.text["attnbench x"]


@pytest.mark.slow
def test_plot_of_decode_llama3_8b_orders_context_by_value(tmp_path):
    pytest.importorskip("matplotlib")
    old_text = {1024: "1k", 4096: "4k", 16384: "16k"}
    cases = [(c.case_id, {"batch.0.context": old_text[c.params["batch.0.context"]],
                          "kv_cache.page_size": c.params["kv_cache.page_size"]})
             for c in reversed(load("decode-llama3-8b").cases)]  # 16k first: text order and file order both wrong
    run = _old_folder(tmp_path / "old", cases)
    assert RunFolder.load(run).rows[0].workload.params == {"batch.0.context": 16384, "kv_cache.page_size": 256}
    r = cli.invoke(app, ["plot", str(run), "--x", "context", "--out", str(tmp_path / "plots")])
    assert r.exit_code == 0, r.output
    assert _x_order(tmp_path / "plots" / "time-vs-context.png") == "context: 1k 4k 16k"


@pytest.mark.slow
def test_null_is_a_value_of_its_own(tmp_path):
    pytest.importorskip("matplotlib")
    sf = load_text(SIZED, "sized.yaml")
    cases = [(c.case_id, c.params) for c in sf.cases]
    assert cases[0] == ("context=1k,window=null", {"batch.0.context": 1024, "model.window": None})
    run = _old_folder(tmp_path / "run", cases)
    r = cli.invoke(app, ["plot", str(run), "--x", "window", "--out", str(tmp_path / "plots")])
    assert r.exit_code == 0, r.output
    assert _x_order(tmp_path / "plots" / "time-vs-window.png") == "window: null 64"
    con = Console(width=120, record=True)
    print_results(RunFolder.load(run).rows, con)
    header, _rule, first = [ln.split() for ln in con.export_text().splitlines() if ln.strip()][:3]
    assert header[:3] == ["context", "window", "backend"] and first[:3] == ["1k", "null", "sdpa"]


@pytest.mark.parametrize("expr, picked", [
    ("dtype=fp8_e4m3", ["window=64,dtype=fp8-e4m3", "window=1k,dtype=fp8-e4m3"]),  # the YAML spelling
    ("dtype=fp8-e4m3", ["window=64,dtype=fp8-e4m3", "window=1k,dtype=fp8-e4m3"]),  # the case id's
    ("kv_dtype=float16", ["window=64,dtype=float16", "window=1k,dtype=float16"]),  # the table's name
    ("kv_cache.dtype=float16 and window=1024", ["window=1k,dtype=float16"]),  # 1024 is 1k
    ("window=1K,dtype=FP8_E4M3", ["window=1k,dtype=fp8-e4m3"]),
    ("fp8_e4m3", ["window=64,dtype=fp8-e4m3", "window=1k,dtype=fp8-e4m3"]),  # a bare word, as the YAML spells it
    ("fp8-e4m3", ["window=64,dtype=fp8-e4m3", "window=1k,dtype=fp8-e4m3"]),
])
def test_k_compares_with_the_typed_values(expr, picked):
    sf = load("variants-cpu")
    sel = parse_selector(expr)
    assert [c.case_id for c in sf.cases if sel(c.case_id, "sdpa", c.params)] == picked


def test_k_with_the_yaml_spelling_on_the_command_line():
    r = cli.invoke(app, ["run", "variants-cpu", "--list", "-k", "dtype=fp8_e4m3 and window=1024", "-b", "sdpa",
                         "--format", "json"])
    assert r.exit_code == 0, r.output
    assert [x["case_id"] for x in json.loads(r.stdout)] == ["window=1k,dtype=fp8-e4m3"]


def test_k_without_values_takes_the_yaml_spelling_too():
    """Where only the ids are known (``show -k``, ``compare runs -k``), ``_`` in a word also
    finds the id's ``-``."""
    sf = load("variants-cpu")
    for expr in ("dtype=fp8_e4m3", "fp8_e4m3 and window=1k"):
        sel = parse_selector(expr)
        assert [c.case_id for c in sf.cases if sel(c.case_id, "sdpa")] == (
            ["window=64,dtype=fp8-e4m3", "window=1k,dtype=fp8-e4m3"] if "and" not in expr else ["window=1k,dtype=fp8-e4m3"])


def test_k_null_and_text_only_selectors():
    sf = load_text(SIZED, "sized.yaml")
    sel = parse_selector("window=null")
    assert [c.case_id for c in sf.cases if sel(c.case_id, "sdpa", c.params)] == [
        "context=1k,window=null", "context=2k,window=null"]
    # a caller with only the ids matches key=value items of the id, as before
    assert parse_selector("context=2k")("context=2k,window=64", "sdpa")


@pytest.mark.slow
def test_plot_legend_names_a_backend_absent_from_the_first_panel(tmp_path):
    """flash-attn skips page 16 (its rows: no timing), so its line is only in the page-256 panel:
    the legend still names it (it once took the first panel's lines only)."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    rf = RunFolder.create(tmp_path, "decode-llama3-8b", tmp_path / "run")
    rf.start({"scenario": "decode-llama3-8b", "scenario_sha256": "a" * 64, "overrides": [],
              "environment": {"device": "cpu test", "backends": {}}})
    for page in (16, 256):
        for ctx in (1024, 4096):
            for b in ("sdpa", "flash-attn") if page == 256 else ("sdpa",):
                rf.add(Row(RowIdentity("decode-llama3-8b", f"context={ctx},page_size={page}", b, device="cpu test"),
                           workload=RowWorkload(params={"batch.0.context": ctx, "kv_cache.page_size": page}),
                           timing=RowTiming(median_ms=ctx / 1e3, n=3, timing_method="cpu", samples_ms=[ctx / 1e3] * 3,
                                            round_medians_ms=[ctx / 1e3])))
    rf.finish(True)
    r = cli.invoke(app, ["plot", str(tmp_path / "run"), "--x", "context", "--out", str(tmp_path / "plots")])
    assert r.exit_code == 0, r.output
    with Image.open(tmp_path / "plots" / "time-vs-context.png") as im:
        assert im.text["attnbench legend"] == "sdpa flash-attn"
