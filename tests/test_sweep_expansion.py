"""Sweep expansion (workload/scenario.py ``expand_sweep``): each case sets its swept paths on a
copy of those paths alone (issue 59: copying the whole file per case made loading quadratic in
the cases), and no case's values leak into another case or into the loaded document."""
import copy
import textwrap

import pytest

import attnbench.workload.scenario as scenario_mod
from attnbench.workload.dotted import own_path
from attnbench.workload.scenario import load_text


def _sweep(n: int) -> str:
    batches = ", ".join(f"[{{kind: decode, count: {1 + i % 3}, context: {10 + i}}}]" for i in range(n))
    return textwrap.dedent(f"""
        model: {{num_q_heads: 4, num_kv_heads: 2, head_dim: 16}}
        batch:
          - {{kind: decode, count: 1, context: 8}}
          - {{kind: prefill, count: 1, query: 3, context: 5}}
        sweep:
          batch.1.context: [1, 2]
          model.head_dim: [16, 32]
          batch: [{batches}]
        """)


def test_cases_get_their_own_values_and_leave_the_document_alone():
    text = _sweep(3)
    sf = load_text(text, "s.yaml")
    raw_before = copy.deepcopy(sf.raw)
    assert len(sf.cases) == 2 * 2 * 3
    for c in sf.cases:
        sc = c.scenario
        assert sc.model.head_dim == c.params["model.head_dim"]
        # the later key (batch) replaces the whole batch: batch.1.context then has no group 1
        assert len(sc.batch) == 1 and sc.batch[0].context == c.params["batch"][0]["context"]
    assert sf.raw == raw_before == load_text(text, "s.yaml").raw


def test_own_path_copies_only_the_path():
    shared_group, other = {"kind": "decode", "context": 8}, {"kind": "decode", "context": 9}
    doc = {"batch": [shared_group, other], "model": {"head_dim": 16}}
    case = dict(doc)
    own_path(case, "batch.0.context")
    case["batch"][0]["context"] = 99
    assert shared_group["context"] == 8 and doc["batch"][0] is shared_group  # the original is untouched
    assert case["batch"][1] is other and case["model"] is doc["model"]  # the rest is shared, not copied
    own_path(case, "batch.7.context")  # past the list: nothing to copy (set_path names the problem)
    own_path(case, "model.head_dim.x")  # inside a scalar: likewise


@pytest.mark.parametrize("n", [4, 40])
def test_expansion_does_not_deep_copy_per_case(monkeypatch, n):
    calls = []
    real = copy.deepcopy

    def counting(x, *a, **k):
        calls.append(1)
        return real(x, *a, **k)

    monkeypatch.setattr(scenario_mod.copy, "deepcopy", counting)
    sf = load_text(_sweep(n), "s.yaml")
    assert len(sf.cases) == 4 * n
    assert len(calls) <= 1  # the loaded document once, whatever the number of cases
