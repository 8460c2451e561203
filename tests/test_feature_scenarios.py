"""The batch features of issue 59 in the scenario language: the fields reach the BatchSpec, a bad
combination is one message naming the file, the field and the fix (exit 2), the schema lists the
fields, and each shipped example runs on the CPU through reference, sdpa, flex and triton (every
row ok, or skipped with a reason) and saves what scripts/gpu/check_saved.py needs."""
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.workload.messages import ScenarioError
from attnbench.workload.scenario import json_schema, load_text

from .scripts import load_script

runner = CliRunner()
HEAD = "model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: bfloat16"


def test_fields_reach_the_spec():
    text = (f"{HEAD}, rope: true, rope_theta: 5.0e5, rope_scale: 8, alibi: true, softcap: 3,"
            " score_order: alibi-softcap, q_dtype: fp8_e5m2}\n"
            "kv_cache: {k_scale: 0.25, v_scale: 4}\n"
            "batch: [{kind: prefill, query: 9, kv_len: 4, causal: false}, {kind: prefill, query: 3, kv_len: 10}]")
    spec = load_text(text, "f.yaml").scenario.batch_spec()
    assert (spec.rope, spec.rope_theta, spec.rope_scale, spec.score_order) == (True, 5e5, 8.0, "alibi-softcap")
    assert (spec.k_scale, spec.v_scale, spec.q_dtype, spec.alibi_first) == (0.25, 4.0, "fp8_e5m2", True)
    assert [(r.query, r.context, r.kv_len) for r in spec.requests] == [(9, -5, 4), (3, 7, 10)]
    assert spec.short_kv


def test_the_schema_lists_the_fields():
    s = json_schema()
    props = {name: set(d.get("properties", {})) for name, d in s["$defs"].items()}
    assert {"rope", "rope_theta", "rope_scale", "score_order", "q_dtype", "out_dtype", "out_scale"} <= props["ModelShape"]
    assert {"k_scale", "v_scale"} <= props["KVCache"] and "kv_len" in props["Group"]


BAD = [
    (f"{HEAD}}}\nbatch: [{{kind: prefill, query: 9, kv_len: 4}}]", "batch.0", "needs causal: false"),
    (f"{HEAD}}}\nbatch: [{{kind: prefill, query: 9, kv_len: 4, context: 2, causal: false}}]", "batch.0",
     "give context or kv_len, not both"),
    (f"{HEAD}}}\nbatch: [{{kind: decode, kv_len: 4}}]", "batch.0", "kv_len is for kind: prefill"),
    (f"{HEAD}}}\nkv_cache: {{k_scale: 2}}\nbatch: '1q4'", "kv_cache", "give both k_scale and v_scale"),
    (f"{HEAD}}}\nkv_cache: {{dtype: fp8_e4m3, k_scale: 2, v_scale: 1}}\nbatch: '1q4'", "kv_cache",
     "scales\\s+come from its data"),
    (f"{HEAD}}}\nkv_cache: {{k_scale: 0, v_scale: 1}}\nbatch: '1q4'", "kv_cache.k_scale", "greater than 0"),
    ("model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 15, rope: true}\nbatch: '1q4'", "model",
     "even head_dim"),
    ("model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32, q_dtype: fp8_e4m3}\nbatch: '1q4'",
     "model", "needs a 16-bit model"),
    (f"{HEAD}, score_order: alibi-first}}\nbatch: '1q4'", "model.score_order", "alibi-softcap"),
    ("model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32, out_dtype: fp8_e4m3}\nbatch: '1q4'",
     "model", "needs a 16-bit model"),
    (f"{HEAD}, out_dtype: fp8_e5m2}}\nbatch: '1q4'", "model.out_dtype", "fp8_e4m3"),
    (f"{HEAD}, out_dtype: fp8_e4m3, out_scale: 0}}\nbatch: '1q4'", "model.out_scale", "greater than 0"),
    ("model: {num_q_heads: 4, attention: mla, kv_lora_rank: 16, rope_dim: 8}\nkv_cache: {k_scale: 2, v_scale: 1}\n"
     "batch: '1q4'", "kv_cache", "for attention: mha"),
]


@pytest.mark.parametrize("text, field, needle", BAD)
def test_bad_combinations_are_one_message_exit_2(tmp_path, text, field, needle):
    with pytest.raises(ScenarioError, match=needle):
        load_text(text, "bad.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    r = runner.invoke(app, ["validate", str(p)])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "Traceback" not in out, r.output
    assert str(p) in out and field in out


EXAMPLES = {  # shipped scenario -> backends that must give ok rows (the others: skipped with a reason)
    "features-kv-scales-cpu": {"reference", "sdpa", "flex"},
    "features-short-kv-cpu": {"reference", "sdpa", "flex"},
    "features-rope-cpu": {"reference", "sdpa", "flex"},
    "features-alibi-softcap-order-cpu": {"reference", "sdpa", "flex"},
    "features-fp8-attention-cpu": {"reference"},
    "features-fp8-output-cpu": {"reference", "sdpa", "flex"},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_shipped_examples_run_on_cpu_and_check_independently(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out, saved = tmp_path / "run", tmp_path / "t"
    r = runner.invoke(app, ["run", name, "--device", "cpu", "-b", "reference", "-b", "sdpa", "-b", "flex", "-b", "triton",
                            "--out", str(out), "--save-tensors", str(saved), "-q", "--warmup-ms", "0", "--measure-ms", "1"])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "results.csv")
    df["reason"] = df.reason.fillna("")
    must = df[df.backend.isin(EXAMPLES[name])]
    assert set(must.status) == {"ok"} and (must.rel_err < must.tolerance).all(), must[["case_id", "backend", "reason"]]
    rest = df[~df.backend.isin(EXAMPLES[name])]
    assert set(rest.status) <= {"ok", "skipped"} and (rest[rest.status == "skipped"].reason != "").all()
    assert (rest[rest.status == "ok"].rel_err < rest[rest.status == "ok"].tolerance).all()
    blob = torch.load(sorted(saved.glob("*.pt"))[-1], weights_only=True)
    assert {"rope", "rope_theta", "rope_scale", "score_order", "q_dtype", "q_fp8", "q_scale", "k_scale", "out_dtype",
            "out_scale"} <= set(blob)
    assert load_script("scripts/gpu/check_saved.py").main([str(saved)]) == 0
    assert "every saved output matches" in capsys.readouterr().out


def test_check_saved_fails_an_output_that_ignores_rope(tmp_path):
    from attnbench.store.tensors import save_case_tensors
    from attnbench.workload.reference import reference_attention

    sf = load_text("model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, rope: true, rope_theta: 100}\n"
                   "batch: [{kind: prefill, query: 7, context: 5}, {kind: prefill, query: 6, kv_len: 3, causal: false}]",
                   "r.yaml")
    from attnbench.workload.batch import materialize

    b = materialize(sf.scenario.batch_spec(), 3)
    plain = materialize(load_text("model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16}\n"
                                  "batch: [{kind: prefill, query: 7, context: 5}, {kind: prefill, query: 6, kv_len: 3,"
                                  " causal: false}]", "p.yaml").scenario.batch_spec(), 3)
    outputs = {"right": reference_attention(b)[0], "no-rope": reference_attention(plain)[0]}
    save_case_tensors(tmp_path, "c", b, outputs)
    check = load_script("scripts/gpu/check_saved.py")
    assert check.main([str(tmp_path)]) == 1  # no-rope is off, right is not
    blob = torch.load(tmp_path / "c.pt", weights_only=True)
    ref = check.recompute(blob)
    assert ((blob["outputs"]["right"].double() - ref).norm() / ref.norm()) < 1e-6
