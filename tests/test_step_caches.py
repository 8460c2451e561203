"""A timed plan redoes what an engine redoes every step (issue 24 item 11): the tree requests'
inputs (Batch.trees) and the request masks lived on the batch, so every timed plan after the
first reused them and plan_ms left that work out. docs/semantics.md has the table of what is
per step and what is reused."""
from __future__ import annotations

import textwrap

import torch

from attnbench.execute.options import RunOptions
from attnbench.execute.runner import Runner
from attnbench.workload import batch as batch_mod
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.scenario import load_text
from attnbench.workload.trees import from_choices

TREES = textwrap.dedent("""
    name: steps
    seed: 4
    device: cpu
    model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
    kv_cache: {page_size: 4, layout: shuffled}
    batch:
      - {kind: decode, count: 2, context: 19}
      - {kind: tree, count: 2, context: 7, tree: {choices: [[0], [1], [0, 0]]}}
    timing: {warmup_ms: 0, measure_ms: 2, min_runs: 3}
""")


def test_new_step_drops_the_per_step_data_and_keeps_the_host_lengths():
    tree = tuple(from_choices([[0], [1], [0, 0]]))
    b = materialize(BatchSpec((Request("decode", 1, 9), Request("tree", len(tree), 5, tree)), 4, 2, 16,
                              dtype="float32", page_size=4), 0)
    trees, host, mask = b.trees, b.host, b.mask(1)
    assert b.trees is trees and b.mask(1) is mask  # within a step: built once
    b.new_step()
    assert b.trees is not trees and b.mask(1) is not mask and b.host is host
    assert torch.equal(b.trees.parents, trees.parents) and torch.equal(b.mask(1), mask)


def test_timed_plans_and_converts_rebuild_the_tree_inputs(monkeypatch):
    calls = []
    real = batch_mod.tree_inputs

    def counting(spec, device):
        calls.append(1)
        return real(spec, device)

    monkeypatch.setattr(batch_mod, "tree_inputs", counting)
    rows = list(Runner(load_text(TREES, "steps.yaml"), RunOptions(backends=["sdpa"], measure_ceilings=False)).rows())
    assert rows[0].status == "ok", rows[0].reason
    # convert and plan are each timed over >= 2 warm-up calls and >= 1 timed call (more while the
    # budget lasts: a loaded machine gave 8 in all), one step each, every call rebuilding them
    assert len(calls) >= 6, len(calls)


class _CountTensorMaking(torch.overrides.TorchFunctionMode):
    """Counts the torch calls that make or move a tensor (a host-to-device copy on a GPU)."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in ("tensor", "to", "as_tensor"):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def test_a_plan_from_the_host_arrays_makes_no_device_copy():
    """Issue 34: the tree inputs uploaded which requests are trees and their slots (two copies no
    backend read) and every device copy in every plan step, although flash-attn's plan reads
    only the host arrays: its plan_ms held copies it never used. Device copies are made on use."""
    tree = tuple(from_choices([[0], [1], [0, 0]]))
    b = materialize(BatchSpec((Request("decode", 1, 9), Request("tree", len(tree), 5, tree)), 4, 2, 16,
                              dtype="float32", page_size=4), 0)
    b.new_step()
    with _CountTensorMaking() as made:
        t = b.trees  # what flash-attn's plan and unsupported() read:
        n = len(tree)
        assert (t.tmax, t.sizes.tolist(), t.reqs.tolist(), t.parents_host.shape) == (n, [n], [1], (1, n))
    assert made.calls == []
    with _CountTensorMaking() as made:
        assert t.reqs_t.tolist() == [1] and t.topology_id_t.tolist() == [0]
        assert t.parents.tolist() == [list(tree)]
    assert len(made.calls) == 3  # one copy each, on first use
