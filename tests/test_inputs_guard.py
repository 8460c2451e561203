"""A backend that writes into its inputs (K/V cache, q, block table, from a thread left
running) or returns an input as its output gets an ``error`` row naming the tensor; the
backends after it, the reference included, are unaffected."""
from __future__ import annotations

import textwrap

import pytest

from attnbench.backend import registry
from attnbench.execute.inputs import aliased_inputs, clone_batch, modified_inputs
from attnbench.execute.runner import RunOptions, Runner
from attnbench.workload.scenario import load_text

from . import corrupting_backends as cb

SCENARIO = textwrap.dedent(
    """
    name: guard
    seed: 5
    device: cpu
    model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
    kv_cache: {page_size: 4, layout: shuffled}
    batch:
      - {kind: decode, count: 2, context: 19}
      - {kind: tree, count: 1, context: 7, tree: {choices: [[0], [1], [0, 0]]}}
    timing: {warmup_ms: 1, measure_ms: 4, min_runs: 3, rounds: ROUNDS}
    """
)

CULPRITS = {
    "writes-k-cache": "k_cache",
    "writes-q": "q",
    "writes-block-table": "block_table",
    "output-is-q": "q",
    "late-writer": "v_cache",
}


@pytest.fixture(autouse=True)
def _registered():
    for cls in (cb.WritesKCache, cb.WritesQ, cb.WritesBlockTable, cb.OutputIsQ, cb.LateWriter):
        registry.register(cls)
    yield
    for name in CULPRITS:
        registry._EXTRA.pop(name, None)


@pytest.mark.slow
@pytest.mark.parametrize("rounds", [1, 2])
@pytest.mark.parametrize("culprit", sorted(CULPRITS))
def test_culprit_is_an_error_and_the_others_are_unaffected(culprit, rounds):
    sf = load_text(SCENARIO.replace("ROUNDS", str(rounds)), "guard.yaml")
    rows = list(Runner(sf, RunOptions(backends=[culprit, "reference", "sdpa"])).rows())
    by = {r.id.backend: r for r in rows}
    bad = by[culprit]
    assert bad.status == "error", (bad.status, bad.reason)
    assert CULPRITS[culprit] in bad.reason
    assert "modified its inputs" in bad.reason or "aliases its inputs" in bad.reason
    for other in ("reference", "sdpa"):
        assert by[other].status == "ok", (other, by[other].status, by[other].reason)


def test_guard_functions_on_a_real_batch():
    from attnbench.execute.options import RunOptions as _  # noqa: F401  (same import path as the runner)
    from attnbench.workload.batch import materialize

    sf = load_text(SCENARIO.replace("ROUNDS", "1"), "guard.yaml")
    batch = materialize(sf.cases[0].scenario.batch_spec(), 5, "cpu")
    own = clone_batch(batch)
    assert modified_inputs(batch, own) == []
    assert own.k_cache.data_ptr() != batch.k_cache.data_ptr()
    own.v_cache.view(-1)[7] = float("nan")  # NaN over a value: told apart bit by bit
    own.context_lens[0] += 1
    assert modified_inputs(batch, own) == ["v_cache", "context_lens"]
    assert aliased_inputs(own.q[1:], own) == ["q"]
    assert aliased_inputs(own.q.clone(), own) == []
