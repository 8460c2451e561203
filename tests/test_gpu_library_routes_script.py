"""scripts/gpu/gpu_library_routes.py exercised on the CPU at small shapes: every case of both groups
loads, and a group runs to rows (Flex measured and checked against the reference, FlashInfer
skipped with its reason here), so the one GPU run of the script is not spent on a typo."""
import io
import time

import pytest

from attnbench.measure.timing import TimingConfig
from attnbench.workload.scenario import load_text

from .scripts import load_script

g = load_script("scripts/gpu/gpu_library_routes.py")


def test_the_order_names_every_case_once():
    names = [c[0] for c in g.ordered_all()]
    assert sorted(names) == sorted(c[0] for c in g.CORE + g.VARIANTS) and len(set(names)) == len(names)


def test_every_case_loads():
    for name, text, backends in g.CORE + g.VARIANTS:
        assert load_text(text, name).cases, name
        assert backends


@pytest.mark.slow
def test_a_group_runs_to_rows_on_the_cpu():
    small = "{num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32, window: 5, sinks: true}"
    cases = [g.case("tiny tree", small, "  - {kind: tree, count: 2, context: 13, tree: {full: {depth: 2, branching: 2}}}",
                    4, ["flex", "flex:mask=dense", "flashinfer:route=xqa"])]
    rows = g.run_group(cases, time.time() + 60, TimingConfig(warmup_ms=0, measure_ms=1, min_runs=2), io.StringIO(), "cpu")
    by = {r["backend"]: r for r in rows}
    assert by["flex"]["status"] == "ok" and by["flex:mask=dense"]["status"] == "ok", rows
    assert by["flex"]["rel_err"] < 1e-4 and by["flex"]["plan_ms"] > 0
    assert by["flashinfer:route=xqa"]["status"] == "skipped"
    assert "|" in g._line(by["flex"])
    late = g.run_group(cases, time.time() - 1, TimingConfig(), io.StringIO(), "cpu")
    assert {r["status"] for r in late} == {"not run"}


@pytest.mark.slow
def test_flex_plan_table_on_the_cpu(monkeypatch):
    monkeypatch.setattr(g, "NOT_GPU", {f.stem for f in g.SCENARIOS.glob("*.yaml")} - {"variants-cpu"})
    monkeypatch.setattr(g, "SCENARIOS", g.SCENARIOS)
    rows = g.flex_plans(time.time() + 60, "cpu", per_scenario=1)
    assert rows and rows[0]["scenario"] == "variants-cpu" and rows[0]["cases"] == 1
    assert rows[0]["blocks_median_ms"] > 0 and rows[0]["dense_median_ms"] > 0
