"""What a tree costs: `compare_with` turns each case into tree / chain / decode variants, and
`attnbench tree-costs` reports their ratios per backend and case (a real small CPU run)."""
import json
import math
import textwrap

import pytest
from typer.testing import CliRunner

from attnbench.analyze.significance import REPORT_CONFIDENCE, compare_runs, round_logs
from attnbench.analyze.tree_costs import verdict
from attnbench.cli.app import app
from attnbench.store.runfolder import RunFolder
from attnbench.workload.scenario import ScenarioError, load_text

runner = CliRunner()

SCENARIO = textwrap.dedent(
    """
    name: tc
    seed: 1
    device: cpu
    model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
    kv_cache: {page_size: 4}
    batch:
      - {kind: tree, count: 2, context: 21, shared_prefix: 9, tree: {preset: eagle-mc_sim_7b_63}, compare_with: [chain, decode]}
      - {kind: decode, count: 1, context: 7}
    sweep: {batch.0.count: [1, 3]}
    backends: [reference, sdpa]
    timing: {warmup_ms: 1, measure_ms: 8, min_runs: 4, max_runs: 20, rounds: 4}
    """
)


def test_variants_replace_only_the_tree_group():
    sf = load_text(SCENARIO, "tc.yaml")
    assert [c.case_id for c in sf.cases] == [
        f"count={n},variant={v}" for n in (1, 3) for v in ("tree", "chain", "decode")
    ]
    by_id = {c.case_id: c.scenario.batch_spec().requests for c in sf.cases}
    tree, chain, dec = (by_id[f"count=3,variant={v}"] for v in ("tree", "chain", "decode"))
    assert [r.kind for r in tree] == ["tree"] * 3 + ["decode"]
    assert [(r.kind, r.query, r.context, r.shared_prefix) for r in chain[:3]] == [("prefill", 26, 21, 9)] * 3
    assert [(r.kind, r.query, r.context, r.shared_prefix) for r in dec[:3]] == [("decode", 1, 21, 9)] * 3
    assert tree[3] == chain[3] == dec[3]  # the other group stays as written


def test_only_the_groups_that_ask_are_replaced():
    text = SCENARIO.replace("- {kind: decode, count: 1, context: 7}",
                            "- {kind: tree, count: 1, context: 7, tree: {chain: 2}, compare_with: [decode]}")
    sf = load_text(text.replace("sweep: {batch.0.count: [1, 3]}", ""), "tc.yaml")
    by_id = {c.case_id: c.scenario.batch_spec().requests for c in sf.cases}
    assert list(by_id) == ["variant=tree", "variant=chain", "variant=decode"]
    assert [r.kind for r in by_id["variant=chain"]] == ["prefill", "prefill", "tree"]
    assert [r.kind for r in by_id["variant=decode"]] == ["decode"] * 3


def test_bad_variant_case_names_the_case():
    # the chain variant of a 5-node tree is valid; a variant the user cannot spell is refused
    with pytest.raises(ScenarioError, match=r"^tc.yaml: batch.0.compare_with.0: 'tree' is not one of chain, decode"):
        load_text(SCENARIO.replace("compare_with: [chain, decode]", "compare_with: [tree]"), "tc.yaml")


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("tc")
    (d / "tc.yaml").write_text(SCENARIO)
    r = runner.invoke(app, ["run", str(d / "tc.yaml"), "-q", "--out", str(d / "run")])
    assert r.exit_code == 0, r.output
    return d / "run"


def test_report_on_a_cpu_run(run_folder):
    r = runner.invoke(app, ["tree-costs", str(run_folder), "--gain", "1.2", "--format", "json"])
    assert r.exit_code == 0, r.output
    recs = json.loads(r.output)
    assert sorted((x["case"], x["point"]) for x in recs) == [
        (b, f"count={n}") for b in ("reference", "sdpa") for n in (1, 3)
    ]
    rows = {(x.id.backend, x.id.case_id): x for x in RunFolder.load(run_folder).rows}
    for x in recs:
        tree, chain, dec = (rows[(x["case"], f"{x['point']},variant={v}")] for v in ("tree", "chain", "decode"))
        assert x["requests"] == tree.workload.num_requests == int(x["point"][-1]) + 1
        assert x["tree_ms"] == pytest.approx(tree.timing.median_ms)
        assert len(tree.timing.round_medians_ms) == len(chain.timing.round_medians_ms) == 4
        want = compare_runs(round_logs(tree), round_logs(chain), REPORT_CONFIDENCE)
        assert (x["tree_over_chain"], x["chain_lo"], x["chain_hi"]) == pytest.approx((want.ratio, want.lo, want.hi))
        want = compare_runs(round_logs(tree), round_logs(dec), REPORT_CONFIDENCE)
        assert x["tree_over_decode"] == pytest.approx(want.ratio)
        assert 0 < x["chain_lo"] <= x["tree_over_chain"] <= x["chain_hi"] < math.inf  # 4 rounds: a finite interval
        assert x["decode_lo"] <= x["tree_over_decode"] <= x["decode_hi"]
        assert x["verdict"] == verdict(x["chain_lo"], x["chain_hi"], 1.2) != ""
        assert x["missing"] == ""


def test_report_table_and_markdown(run_folder):
    for fmt in ("table", "markdown"):
        r = runner.invoke(app, ["tree-costs", str(run_folder), "--format", fmt], env={"COLUMNS": "200"})
        assert r.exit_code == 0, r.output
        assert "tree/chain" in r.output and "tree/decode" in r.output and "count=3" in r.output


def test_verdicts():
    assert verdict(0.8, 0.9, 1.0) == "pays"
    assert verdict(1.1, 1.3, 1.0) == "does not pay"
    assert verdict(0.9, 1.1, 1.0) == "unclear"
    assert verdict(0.9, 1.1, None) == "" and verdict(math.nan, 1.0, 1.0) == ""


def test_report_needs_variants(tmp_path):
    (tmp_path / "t.yaml").write_text(SCENARIO.replace(", compare_with: [chain, decode]", "").replace("reference, sdpa", "sdpa"))
    assert runner.invoke(app, ["run", str(tmp_path / "t.yaml"), "-q", "--out", str(tmp_path / "run")]).exit_code == 0
    r = runner.invoke(app, ["tree-costs", str(tmp_path / "run")])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "no tree/chain/decode cases; run a scenario whose tree groups have compare_with: [chain, decode]" in r.output
    r = runner.invoke(app, ["tree-costs", str(tmp_path / "nothing")])
    assert r.exit_code == 2 and "nothing" in r.output
