"""`attnbench run/validate/schema/backends` through the real command line (CliRunner)."""
import json
import textwrap

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli.app import app

runner = CliRunner()

TINY = textwrap.dedent(
    """
    name: tiny
    seed: 3
    device: cpu
    model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
    kv_cache: {page_size: 4, layout: shuffled}
    batch:
      - {kind: decode, count: 2, context: 19}
      - {kind: prefill, count: 1, query: 5, context: 3}
      - {kind: tree, count: 1, context: 7, tree: {choices: [[0], [1], [0, 0]]}}
    sweep:
      kv_cache.page_size: [4, 8]
    backends: [reference, sdpa]
    timing: {warmup_ms: 1, measure_ms: 5, min_runs: 3}
    """
)


def test_run_writes_a_run_folder(tiny, tmp_path):
    out = tmp_path / "run"
    tensors = tmp_path / "tensors"
    r = runner.invoke(app, ["run", str(tiny), "--out", str(out), "--save-tensors", str(tensors), "-q"])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 4
    for col in ["case_id", "backend", "status", "reason", "plan_ms", "median_ms", "rel_err", "max_abs_err", "kv_cache.page_size"]:
        assert col in df.columns
    assert set(df.status) == {"ok"}
    assert (df.median_ms > 0).all() and (df.n >= 3).all()
    assert sorted(df["kv_cache.page_size"].unique()) == [4, 8]
    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "complete" and man["seed"] == 3
    for k in ("command", "scenario_text", "scenario_sha256", "start_time", "end_time", "environment"):
        assert k in man
    assert man["environment"]["torch"] == torch.__version__
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert all(len(r["samples_ms"]) == r["n"] for r in rows)
    # saved tensors load with weights_only and reproduce the case
    blob = torch.load(tensors / "page_size=4.pt", weights_only=True)
    assert blob["q"].shape == (2 + 5 + 4, 4, 16)
    assert blob["k_cache"].shape[1:] == (4, 2, 16)
    assert blob["block_table"].dtype == torch.int32
    assert blob["kinds"] == ["decode", "decode", "prefill", "tree"]
    assert blob["tree_parents"][3] == [-1, 0, 0, 1]
    assert set(blob["outputs"]) == {"reference", "sdpa"}
    assert "page_size" in r.output and "sdpa" in r.output  # the swept value is a column: page_size, then 4 and 8
    assert any(ln.split()[:2] == ["4", "reference"] for ln in r.output.splitlines() if ln.strip())


def test_set_override_and_backend_flag(tiny, tmp_path):
    r = runner.invoke(
        app, ["run", str(tiny), "--out", str(tmp_path / "o"), "--set", "model.head_dim=8", "--set", "sweep={}", "-b", "sdpa", "-q"]
    )
    assert r.exit_code == 0, r.output
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert list(df.backend) == ["sdpa"] and list(df.case_id) == ["default"]


BAD = [
    ("model: {num_q_heads: 4, num_kv_heads: 3, head_dim: 16}\nbatch: '1q1s4'", "model", "multiple of num_kv_heads"),
    ("model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16}\nbatch: [{kind: tree, context: 3, tree: {choices: [[1, 0]]}}]", "batch.0", "add [1]"),
    ("model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16}\nbatch: 'garbage'", "batch", "<count>q<query>"),
    ("model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16}\nbatch: '1q4'\nkv_cache: {page_size: 0}", "kv_cache.page_size", "greater than or equal to 1"),
    ("model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16}\nbatch: '1q4'\nsweep: {batch.3.context: [1]}", "sweep.batch.3.context", "no item"),
    ("batch: '1q4'", "model", "required"),
    ("{{{", "", "not valid YAML"),
]


@pytest.mark.slow
@pytest.mark.parametrize("text, field, needle", BAD)
def test_bad_scenarios_are_one_message_exit_2(tmp_path, text, field, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    for cmd in (["run", str(p), "-q"], ["validate", str(p)]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 2, r.output
        assert "Traceback" not in r.output
        assert str(p) in r.output and field in r.output and needle in r.output


def test_bad_flags(tiny, tmp_path):
    r = runner.invoke(app, ["run", str(tiny), "-b", "nope", "-q"])
    assert r.exit_code == 2 and "unknown backend 'nope'" in r.output and "sdpa" in r.output
    r = runner.invoke(app, ["run", str(tiny), "--set", "model.head_dim", "-q"])
    assert r.exit_code == 2 and "KEY=VALUE" in r.output
    r = runner.invoke(app, ["run", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and "no such scenario file" in r.output


def test_validate_and_schema(tiny):
    r = runner.invoke(app, ["validate", str(tiny), "attnbench/scenarios/quickstart.yaml"])
    assert r.exit_code == 0 and "2 case(s)" in r.output
    r = runner.invoke(app, ["schema"])
    schema = json.loads(r.output)
    assert "model" in schema["properties"] and "batch" in schema["properties"]


BROKEN_BACKENDS = '''
import torch
from attnbench.backend import Backend

class Wrong(Backend):
    name = "wrong"
    def plan(self, batch):
        return batch
    def run(self, batch):
        return torch.ones_like(batch.q)

class Raises(Backend):
    name = "raises"
    def plan(self, batch):
        raise RuntimeError("kernel exploded")
    def run(self, plan):
        pass

class Stale(Backend):
    """Computes once in plan and returns that buffer forever: the poisoned re-check catches it."""
    name = "stale"
    def plan(self, batch):
        from attnbench.workload.reference import reference_attention
        return reference_attention(batch)[0].to(batch.dtype)
    def run(self, out):
        return out

class Picky(Backend):
    name = "picky"
    def unsupported(self, batch):
        return [f"page_size {batch.page_size} not supported; use 256"]
    def plan(self, batch):
        return None
    def run(self, plan):
        return None
'''


def test_failing_backends_are_rows_and_good_rows_survive(tiny, tmp_path):
    f = tmp_path / "broken.py"
    f.write_text(BROKEN_BACKENDS)
    out = tmp_path / "run"
    args = ["run", str(tiny), "--out", str(out), "--backend-file", str(f), "-q"]
    for b in ("sdpa", "wrong", "raises", "stale", "picky"):
        args += ["-b", b]
    r = runner.invoke(app, args)
    assert r.exit_code == 1, r.output
    df = pd.read_csv(out / "results.csv", keep_default_na=False)
    by = {b: df[df.backend == b] for b in df.backend.unique()}
    assert set(by["sdpa"].status) == {"ok"}
    assert set(by["wrong"].status) == {"mismatch"} and "exceeds tolerance" in by["wrong"].reason.iloc[0]
    assert set(by["raises"].status) == {"error"} and "kernel exploded" in by["raises"].reason.iloc[0]
    assert set(by["stale"].status) == {"mismatch"} and "NaN" in by["stale"].reason.iloc[0]
    assert set(by["picky"].status) == {"skipped"} and "use 256" in by["picky"].reason.iloc[0]
    assert len(df) == 10


def test_backends_command():
    r = runner.invoke(app, ["backends"])
    assert r.exit_code == 0
    assert "sdpa" in r.output and "flash-attn" in r.output


ROUND_BACKENDS = '''
from attnbench.backend import Backend
from attnbench.workload.reference import reference_attention

CALLS = []

class A(Backend):
    name = "round_a"
    def plan(self, batch):
        return reference_attention(batch)[0].to(batch.dtype)
    def run(self, out):
        CALLS.append(self.name)
        return out.clone()

class B(A):
    name = "round_b"
'''


def test_rounds_interleave_the_backends_of_a_case(tiny, tmp_path):
    """timing.rounds: the backends of a case take turns, so their samples span the same time."""
    f = tmp_path / "rounds.py"
    f.write_text(ROUND_BACKENDS)
    out = tmp_path / "run"
    r = runner.invoke(
        app,
        ["run", str(tiny), "--out", str(out), "--backend-file", str(f), "-b", "round_a", "-b", "round_b",
         "--set", "sweep={}", "--set", "timing.rounds=3", "-q"],
    )
    assert r.exit_code == 0, r.output
    from attnbench.backend import get_backend_class

    calls = get_backend_class("round_a").run.__globals__["CALLS"]
    turns = [calls[0]]
    for c in calls[1:]:
        if c != turns[-1]:
            turns.append(c)
    # the checked first run of each, then 3 timing rounds taken in turn
    assert turns == ["round_a", "round_b"] * 4
    df = pd.read_csv(out / "results.csv")
    assert set(df.status) == {"ok"} and (df.n >= 5).all()


def test_mixed_timing_methods_get_one_note_per_case():
    from attnbench.analyze.run_table import results_table
    from attnbench.store.row_parts import RowIdentity, RowTiming
    from attnbench.store.rows import Row

    rows = [
        Row(RowIdentity("s", "c1", "sdpa"), timing=RowTiming(median_ms=1.0, timing_method="cuda-graph")),
        Row(RowIdentity("s", "c1", "fi"), timing=RowTiming(median_ms=2.0, timing_method="cuda-events")),
        Row(RowIdentity("s", "c2", "sdpa"), timing=RowTiming(median_ms=1.0, timing_method="cuda-graph")),
    ]
    _, notes, _, _ = results_table(rows)
    assert notes == ["timing methods differ in this case: cuda-graph: sdpa; cuda-events: fi"]


def test_validate_reports_every_error_at_once_with_given_and_meant(tmp_path):
    """Seven mistakes, seven lines, in one go: each names the field, what was given and the
    closest valid spelling (a sweep key and a backend too, though the model failed first)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent("""
        name: bad
        device: cpu
        model: {num_q_heads: 8, num_kv_heads: 2, head_dim: 64, dtype: float23}
        kv_cache: {page_size: 16, layout: shuffeld}
        batch:
          - {kind: decod, count: 4, context: 300}
          - {kind: prefill, count: 1, query: 37, contxt: 64}
        sweep:
          kv_cache.page_sise: [16, 64]
        backends: [sdpa, flexx]
        timing: {warmup_ms: 5, measure_ms: 0}
    """))
    r = runner.invoke(app, ["validate", str(bad)])
    assert r.exit_code == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    want = [
        "model.dtype: 'float23' is not one of float32, float16, bfloat16; did you mean float32?",
        "kv_cache.layout: 'shuffeld' is not one of contiguous, shuffled, shuffled-within, reversed, interleaved; "
        "did you mean shuffled?",
        "batch.0.kind: 'decod' is not one of prefill, decode, tree; did you mean decode?",
        "batch.1.contxt: unknown key; did you mean context?",
        "timing.measure_ms: Input should be greater than 0 (given: 0)",
        "sweep.kv_cache.page_sise: kv_cache has no key 'page_sise'; did you mean sweep.kv_cache.page_size?",
        "backends.1: unknown backend 'flexx'; did you mean 'flex'?",
    ]
    text = " ".join(r.stderr.split())
    for w in want:
        assert w in text, (w, r.stderr)
    assert len(lines) == len(want)
