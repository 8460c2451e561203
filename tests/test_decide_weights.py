"""`attnbench decide` with weights at the ends of a float's range, and its exports (issue 60,
items 9, 13 and 16): totals are weighted means with each weight taken relative to the largest,
so that no sum underflows or overflows; weights whose product leaves a float's range are refused
with a message; two exports to one path are refused before anything is written."""
import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.row_parts import RowIdentity, RowTiming, RowWorkload
from attnbench.store.rows import Row, Status
from attnbench.store.runfolder import RunFolder
from attnbench.workload.scenario import load_text

cli = CliRunner()


def _scenario(weights: str, keys: int = 1) -> str:
    sweep = "  batch.0.context: [16, 32]\n" + ("  model.head_dim: [16, 32]\n" if keys == 2 else "")
    return textwrap.dedent("""\
        name: w
        device: cpu
        model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
        batch: [{kind: decode, count: 2, context: 16}]
        timing: {rounds: 8}
        sweep:
        """) + sweep + "weights:\n" + weights


def _run(tmp_path: Path, text: str, times: dict) -> Path:
    """A complete run folder: backend b's case times are ``times[b]`` (one per case, 8 rounds)."""
    sf = load_text(text)
    rf = RunFolder.create(tmp_path, "w", tmp_path / "run")
    rf.start({"scenario": "w", "scenario_path": "w.yaml", "scenario_text": text, "overrides": [],
              "environment": {"device": "cpu test"}})
    for i, case in enumerate(sf.cases):
        for backend, per_case in times.items():
            ms = per_case[i]
            rounds = [ms * (1 + 0.001 * k) for k in range(8)]
            rf.add(Row(RowIdentity(scenario="w", case_id=case.case_id, backend=backend), status=Status.OK,
                       workload=RowWorkload(params=dict(case.params), batch=f"shape {i}"),
                       timing=RowTiming(round_medians_ms=rounds, samples_ms=rounds, median_ms=rounds[4], n=8,
                                        timing_method="cpu", plan_ms=0.0, convert_ms=0.0)))
    rf.finish(True)
    return tmp_path / "run"


@pytest.mark.parametrize("weight", ["5.0e-324", "1.0e-300", "1.0e+308"])
def test_weights_at_a_floats_ends_give_the_same_decision_as_weights_of_1(tmp_path, weight):
    # sdpa wins both cases, 1 ms against 2 and 3 ms against 4
    run = _run(tmp_path, _scenario(f"  batch.0.context: [{weight}, {weight}]\n"),
               {"flex": [2.0, 4.0], "sdpa": [1.0, 3.0]})
    r = cli.invoke(app, ["decide", str(run), "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["best_single"] == "sdpa" and set(doc["dispatch"].values()) == {"sdpa"}
    got = {t["backend"]: t["per_step_ms"] for t in doc["backends"]}
    # a total is the center of its round means (docs/decide.md): rounds 1 + 0.001 k, k = 0..7, center 1.0035
    assert got["sdpa"] == pytest.approx(2.0 * 1.0035, rel=1e-6) and got["flex"] == pytest.approx(3.0 * 1.0035, rel=1e-6)
    assert doc["dispatch_total"]["per_step_ms"] == pytest.approx(got["sdpa"])
    assert cli.invoke(app, ["decide", str(run)]).exit_code == 0  # the table too


def test_unequal_weights_far_apart_still_weigh(tmp_path):
    run = _run(tmp_path, _scenario("  batch.0.context: [1.0e-300, 1.0e+300]\n"), {"flex": [1.0, 4.0], "sdpa": [2.0, 3.0]})
    doc = json.loads(cli.invoke(app, ["decide", str(run), "--format", "json"]).output)
    got = {t["backend"]: t["per_step_ms"] for t in doc["backends"]}
    assert doc["best_single"] == "sdpa" and got["sdpa"] == pytest.approx(3.0 * 1.0035, rel=1e-6)  # the center of its rounds


def test_weights_whose_product_leaves_a_floats_range_are_refused(tmp_path):
    for weights in ("  batch.0.context: [1.0e+200, 1.0e+200]\n  model.head_dim: [1.0e+200, 1]\n",
                    "  batch.0.context: [1.0e-200, 1]\n  model.head_dim: [1.0e-200, 1]\n"):
        (tmp_path / "w.yaml").write_text(_scenario(weights, keys=2))
        r = cli.invoke(app, ["validate", str(tmp_path / "w.yaml")])
        assert r.exit_code == 2 and "beyond what a float holds" in r.output and "Traceback" not in r.output, r.output


def test_the_same_path_for_both_exports_is_refused_before_writing(tmp_path):
    run = _run(tmp_path, _scenario("  batch.0.context: [2, 1]\n"), {"flex": [2.0, 4.0], "sdpa": [1.0, 3.0]})
    out = tmp_path / "d.out"
    for same in (out, tmp_path / "." / "d.out"):
        r = cli.invoke(app, ["decide", str(run), "--export-json", str(out), "--export-markdown", str(same)])
        assert r.exit_code == 2 and "--export-json and --export-markdown name one file" in r.output, r.output
        assert not out.exists()
