"""The variants in the scenario language: fields reach the BatchSpec, bad combinations are one
message naming the field and the fix (exit 2), a run with every feature checks and saves what
scripts/gpu/check_saved.py needs to recompute it from the file alone."""
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.workload.messages import ScenarioError
from attnbench.workload.scenario import load_text

from .scripts import load_script

runner = CliRunner()
HEAD = "model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: bfloat16"

FULL = textwrap.dedent(
    """
    name: variants
    seed: 5
    device: cpu
    model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float16, window: 6, sinks: true, softcap: 3, alibi: true}
    kv_cache: {page_size: 3, layout: shuffled, dtype: fp8_e4m3, scale: per-head, order: HND}
    batch:
      - {kind: decode, count: 2, context: 19}
      - {kind: prefill, count: 1, query: 5, context: 3, causal: false}
      - {kind: prefill, count: 1, query: 4, context: 8}
      - {kind: tree, count: 1, context: 7, tree: {choices: [[0], [1], [0, 0], [0, 0, 0]]}}
    sweep:
      model.window: [2, 6]
    backends: [reference, sdpa, flex]
    timing: {warmup_ms: 1, measure_ms: 5, min_runs: 3}
    """
)


def test_fields_reach_the_spec():
    sf = load_text(FULL, "v.yaml")
    spec = sf.cases[0].scenario.batch_spec()
    assert (spec.window, spec.sinks, spec.softcap, spec.alibi) == (2, True, 3.0, True)
    assert (spec.kv_dtype, spec.kv_scale, spec.kv_order) == ("fp8_e4m3", "per-head", "HND")
    assert [r.causal for r in spec.requests] == [True, True, False, True, True]
    plain = load_text(f"{HEAD}}}\nbatch: '2q1s8'", "p.yaml").scenario.batch_spec()
    assert (plain.window, plain.sinks, plain.softcap, plain.alibi, plain.kv_dtype, plain.kv_order) == (
        None, False, None, False, None, "NHD")
    same = load_text(f"{HEAD}}}\nkv_cache: {{dtype: bfloat16}}\nbatch: '2q1s8'", "p.yaml").scenario.batch_spec()
    assert same.kv_dtype is None


BAD = [
    (f"{HEAD}, window: 0}}\nbatch: '1q4'", "model", "window must be >= 1"),
    (f"{HEAD}, softcap: 0}}\nbatch: '1q4'", "model", "softcap must be > 0"),
    (f"{HEAD}, softcap: -3}}\nbatch: '1q4'", "model", "softcap must be > 0"),
    # issue 37 item 12: a cap float32 cannot hold validated, then every sdpa/flex output was NaN
    (f"{HEAD}, softcap: 1.0e300}}\nbatch: '1q4'", "model", "softcap 1e\\+300 is outside float32's range"),
    (f"{HEAD}, softcap: 50}}\nbatch: '1q4'\nsweep: {{model.softcap: [50, 1.0e-300]}}", "model",
     "softcap 1e-300 is outside float32's range"),
    ("model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}\nkv_cache: {dtype: fp8_e4m3}\nbatch: '1q4'",
     "kv_cache.dtype fp8_e4m3", "set model.dtype to bfloat16 or float16"),
    (f"{HEAD}}}\nkv_cache: {{dtype: float16}}\nbatch: '1q4'", "kv_cache.dtype float16", "differs from model.dtype"),
    (f"{HEAD}}}\nkv_cache: {{dtype: fp8}}\nbatch: '1q4'", "kv_cache.dtype", "fp8_e4m3"),
    (f"{HEAD}}}\nkv_cache: {{order: NDH}}\nbatch: '1q4'", "kv_cache.order", "HND"),
    (f"{HEAD}}}\nbatch: [{{kind: decode, context: 4, causal: false}}]", "batch.0", "causal: false is for kind: prefill only"),
    (f"{HEAD}}}\nbatch: [{{kind: tree, context: 4, tree: {{chain: 2}}, causal: false}}]", "batch.0", "kind: prefill only"),
    (f"{HEAD}, window: 4}}\nbatch: '1q4'\nsweep: {{model.window: [8, 0]}}", "model", "window must be >= 1"),
]


@pytest.mark.parametrize("text, field, needle", BAD)
def test_bad_combinations_are_one_message_exit_2(tmp_path, text, field, needle):
    with pytest.raises(ScenarioError, match=needle):
        load_text(text, "bad.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    r = runner.invoke(app, ["validate", str(p)])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert str(p) in r.output and field in r.output and needle.replace("\\", "") in r.output.replace("\n", "")


@pytest.mark.slow
def test_a_softcap_beyond_the_model_dtype_runs_in_float32(tmp_path):
    """Issue 37 item 12: a cap float16 cannot hold (1e5 > 65504) but float32 can is computed in
    float32 by sdpa's eager path and by Flex: ok rows, no NaN."""
    p = tmp_path / "cap.yaml"
    p.write_text("name: cap\nmodel: {num_q_heads: 2, num_kv_heads: 1, head_dim: 16, dtype: float16, softcap: 1.0e5}\n"
                 "batch: '2q1s20'\ntiming: {warmup_ms: 0.1, measure_ms: 0.5, min_runs: 1}\n")
    out = tmp_path / "r"
    r = runner.invoke(app, ["run", str(p), "-b", "sdpa", "-b", "flex", "--out", str(out), "--format", "csv"])
    assert r.exit_code == 0, r.output
    rows = pd.read_csv(out / "results.csv")
    assert set(rows.status) == {"ok"} and len(rows) == 2, rows[["backend", "status", "reason"]]


def _check_saved():
    return load_script("scripts/gpu/check_saved.py")


@pytest.mark.slow
def test_a_run_with_every_feature_checks_skips_and_saves(tmp_path, capsys):
    p = tmp_path / "v.yaml"
    p.write_text(FULL)
    out, saved = tmp_path / "run", tmp_path / "tensors"
    r = runner.invoke(app, ["run", str(p), "--out", str(out), "--save-tensors", str(saved), "-q"])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "results.csv")
    ok = df[df.backend.isin(["reference", "sdpa"])]
    assert set(ok.status) == {"ok"} and (ok.rel_err < 5e-3).all()
    assert (df[df.backend == "sdpa"]["mode"] == "eager-softcap").all()
    flex = df[df.backend == "flex"]
    if (flex.status == "skipped").any():  # until its owner turns the features on
        assert flex.reason.str.contains("does not").all()
    assert "fp8_e4m3 KV per-head" in df.batch.iloc[0] and "non-causal prefill" in df.batch.iloc[0]
    blob = torch.load(saved / "window=2.pt", weights_only=True)
    assert blob["k_cache"].dtype == torch.float8_e4m3fn and blob["k_scale"].shape == (2,)
    assert blob["window"] == 2 and blob["softcap"] == 3 and blob["sinks"].shape == (4,) and blob["causal"][2] is False
    assert _check_saved().main([str(saved)]) == 0
    assert "every saved output matches" in capsys.readouterr().out
    # the independent check fails a saved output that ignores a feature
    blob["outputs"]["sdpa"] = blob["outputs"]["sdpa"] * 1.05
    torch.save(blob, saved / "window=2.pt")
    assert _check_saved().main([str(saved)]) == 1


SHIPPED = ["gpt-oss-sliding-layer", "gpt-oss-full-layer", "gemma2-local-layer", "llama3-70b-tp8-fp8-decode",
           "tree-eagle-fp8", "head-dim-sweep"]
SCALE = 16  # contexts and windows cut by this for the CPU (32k -> 2k, window 128 -> 8)


def _small(name: str, tmp_path: Path) -> Path:
    import yaml

    from attnbench.workload.builtin import builtin_path
    from attnbench.workload.units import parse_int

    doc = yaml.safe_load(builtin_path(name).read_text())
    for g in doc["batch"]:
        g["context"] = parse_int(g["context"]) // SCALE
        g["count"] = min(g.get("count", 1), 2)
    for key, values in doc.get("sweep", {}).items():
        if key.endswith(".context"):
            doc["sweep"][key] = [parse_int(v) // SCALE for v in values]
    m = doc["model"]
    if m.get("window"):
        m["window"] = m["window"] // SCALE
    group = m["num_q_heads"] // m["num_kv_heads"]
    m["num_kv_heads"] = min(m["num_kv_heads"], 2)
    m["num_q_heads"] = m["num_kv_heads"] * min(group, 4)
    doc.update(device="cpu", timing={"warmup_ms": 0, "measure_ms": 1, "min_runs": 1, "max_runs": 2})
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_variant_scenarios_on_cpu(name, tmp_path):
    """Each GPU scenario at CPU sizes (contexts and windows / 16, 2 requests a group, few heads):
    the reference and sdpa agree on every case, with the scenario's variants in force."""
    from attnbench.store.runfolder import RunFolder
    from attnbench.workload.scenario import load

    p = _small(name, tmp_path)
    r = runner.invoke(app, ["run", str(p), "-q", "-b", "reference", "-b", "sdpa", "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    rows = RunFolder.load(tmp_path / "run").rows
    assert len(rows) == 2 * len(load(p).cases)
    assert all(x.status.value == "ok" and x.correctness.rel_err < x.correctness.tolerance for x in rows), \
        [(x.id.case_id, x.reason) for x in rows]
    spec = load(p).cases[0].scenario.batch_spec()
    assert spec.window or spec.sinks or spec.softcap or spec.kv_dtype or name == "head-dim-sweep"


@pytest.mark.slow
def test_the_cpu_variants_scenario_runs_every_cpu_backend(tmp_path):
    r = runner.invoke(app, ["run", "variants-cpu", "--device", "cpu", "-b", "reference", "-b", "sdpa", "-b", "flex",
                            "--out", str(tmp_path / "run"), "-q", "--warmup-ms", "0", "--measure-ms", "1"])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(tmp_path / "run" / "results.csv", keep_default_na=False)
    assert len(df) == 3 * 4
    assert set(df[df.backend != "flex"].status) == {"ok"}
    assert set(df[df.backend == "flex"].status) <= {"ok", "skipped"}


NOISY = textwrap.dedent(
    """
    from dataclasses import dataclass
    import torch
    from attnbench.backend import Backend
    from attnbench.workload.reference import reference_attention

    @dataclass
    class Plan:
        batch: object
        mode: str = "fp8-q"
        rtol: float = 0.05
        rtol_reason: str = "q quantized to fp8_e4m3"

    class Noisy(Backend):
        name = "noisy-fp8q"
        capturable = False
        def plan(self, batch):
            return Plan(batch)
        def run(self, p):
            out, _ = reference_attention(p.batch)
            g = torch.Generator().manual_seed(0)
            return (out * (1 + 0.01 * torch.randn(out.shape, generator=g))).to(p.batch.dtype)
    """
)


def test_a_route_that_computes_lower_declares_its_tolerance(tmp_path):
    """A route computing below the batch's precision (an FP8-q route) raises the row's default
    tolerance by declaring plan.rtol, and the row says why; an explicit --rtol still rules."""
    bf = tmp_path / "noisy.py"
    bf.write_text(NOISY)
    sc = tmp_path / "s.yaml"
    sc.write_text("device: cpu\nmodel: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}\nbatch: '2q1s20'\n"
                  "timing: {warmup_ms: 0, measure_ms: 1, min_runs: 1, max_runs: 2}\n")
    r = runner.invoke(app, ["run", str(sc), "--backend-file", str(bf), "-b", "noisy-fp8q", "--out", str(tmp_path / "a"), "-q"])
    assert r.exit_code == 0, r.output
    row = pd.read_csv(tmp_path / "a" / "results.csv").iloc[0]
    assert row.status == "ok" and row.tolerance == 0.05 and 1e-3 < row.rel_err < 0.05
    assert "rtol 0.05: q quantized to fp8_e4m3" in row["mode"]
    r = runner.invoke(app, ["run", str(sc), "--backend-file", str(bf), "-b", "noisy-fp8q", "--rtol", "1e-4",
                            "--out", str(tmp_path / "b"), "-q"])
    assert r.exit_code == 1
    assert pd.read_csv(tmp_path / "b" / "results.csv").iloc[0].status == "mismatch"
