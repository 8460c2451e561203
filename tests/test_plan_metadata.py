"""The per-step metadata the backends' plans build by array and tensor ops, against the
per-request constructions they replaced (tests/old_metadata.py), on random batches: random
trees (static and dynamic, shared and distinct shapes), odd lengths, every page layout. Plus
the per-topology cache of static trees, the convert/plan split, and convert_ms in the rows."""
from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
import torch

from attnbench.backends import _dense, _metadata
from attnbench.workload import tokens
from attnbench.kernels.shared import plan as tp
from attnbench.backends._common_libs import build_tree_split
from attnbench.backends._flex_blocks import row_tables
from attnbench.workload.batch import LAYOUTS, BatchSpec, Request, materialize
from attnbench.workload.trees import ancestor_mask, ancestor_masks, depths, random_tree

from . import old_metadata as old


def any_tree(rng: random.Random, most: int) -> tuple:
    """A random tree of 1..most nodes: bushy, deep or a chain."""
    n = rng.randint(1, most)
    if rng.random() < 0.2:
        return tuple(random_tree({"nodes": n, "max_depth": n, "max_children": 1, "seed": 0}))  # a chain
    depth, kids = rng.randint(1, 12), rng.randint(2, 6)
    n = min(n, sum(kids ** d for d in range(depth + 1)))
    return tuple(random_tree({"nodes": n, "max_depth": depth, "max_children": kids, "seed": rng.randint(0, 999)}))


def random_requests(rng: random.Random, dynamic: bool) -> list[Request]:
    shapes = [any_tree(rng, 70) for _ in range(3)]
    reqs = []
    for _ in range(rng.randint(1, 7)):
        kind = rng.choice(["decode", "prefill", "tree", "tree"])
        ctx = rng.choice([0, 1, rng.randint(2, 90)])
        if kind == "decode":
            reqs.append(Request("decode", 1, ctx))
        elif kind == "prefill":
            reqs.append(Request("prefill", rng.randint(1, 40), ctx))
        else:
            p = rng.choice(shapes)
            reqs.append(Request("tree", len(p), ctx, p, dynamic and rng.random() < 0.7))
    return reqs


def random_batch(seed: int, dynamic: bool = False, trees_only: bool = False):
    rng = random.Random(seed)
    reqs = random_requests(rng, dynamic)
    if trees_only or not any(r.tree_parents for r in reqs):
        p = any_tree(rng, 40)
        reqs.append(Request("tree", len(p), rng.randint(0, 50), p, dynamic))
    if trees_only:
        reqs = [r for r in reqs if r.tree_parents is not None]
    hkv = rng.choice([1, 2])
    spec = BatchSpec(tuple(reqs), hkv * rng.choice([1, 3, 4]), hkv, 8, "float32", rng.choice([1, 3, 16]),
                     rng.choice(LAYOUTS))
    return materialize(spec, seed)


SEEDS = range(12)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
def test_ancestor_masks_equal_the_per_tree_loop(seed):
    rng = random.Random(seed)
    trees = [any_tree(rng, 130) for _ in range(4)]
    tmax = max(map(len, trees))
    parents = torch.full((len(trees), tmax), -1, dtype=torch.int32)
    for b, t in enumerate(trees):
        parents[b, : len(t)] = torch.tensor(t)
    got = ancestor_masks(parents)
    deepest = max(max(depths(t)) for t in trees)
    assert torch.equal(ancestor_masks(parents, deepest), got)  # fewer steps when the depth is known
    if deepest > 1:  # and the step count matters: one step short misses the deepest ancestors
        assert not torch.equal(ancestor_masks(parents, (1 << (deepest.bit_length() - 1)) - 1), got)
    for b, t in enumerate(trees):
        want = torch.eye(tmax, dtype=torch.bool)
        want[: len(t), : len(t)] = ancestor_mask(t)
        assert torch.equal(got[b], want)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_masks_and_layouts_equal_the_per_request_construction(seed, dynamic):
    b = random_batch(seed, dynamic)
    assert torch.equal(_metadata.custom_mask_flat(b), old.custom_mask_flat(b))
    assert torch.equal(_dense.padded_mask(b), old.padded_mask(b))
    for got, want in zip(_metadata.flashinfer_page_layout(b), old.flashinfer_page_layout(b)):
        assert torch.equal(got.cpu(), want)
    qmax = b.max_query_len
    tmax = max(b.trees.tmax, 1)
    q_causal, q_tree_base, tree_anc = old.flex_tables(b)
    t = row_tables(b, qmax, b.max_kv_len)
    assert torch.equal(t.hi, q_causal.long()) and torch.equal(t.tree_base, q_tree_base.long())
    got = _metadata.padded_tree_masks(b, qmax, tmax)
    real = torch.arange(qmax)[None, :, None] < torch.from_numpy(b.host.query_lens)[:, None, None]
    assert torch.equal(got & real, tree_anc)  # rows past a tree's end (padding) are never read


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_tree_split_and_words_equal_the_per_request_construction(seed, dynamic):
    b = random_batch(seed, dynamic)
    ts = build_tree_split(b)
    q_index, kv_slot, mask, real = old.tree_split(b)
    assert torch.equal(ts.q_index, q_index) and torch.equal(ts.kv_slot, kv_slot)
    assert torch.equal(ts.mask, mask) and torch.equal(ts.real, real)
    words, has_tree = tp.tree_words(b)
    assert has_tree and torch.equal(words, old.tree_words(b))


@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_units_equal_the_per_request_construction(seed, splits):
    b = random_batch(seed)
    for sms in (1, 4, 132):
        for block_m in (None, 16, 64):
            cfg = tp.choose_config(b, block_m=block_m)
            got, want = tp.build_units(b, cfg, sms, splits), old.build_units(b, cfg, sms, splits)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (sms, block_m)
            assert got[2:] == want[2:]


@pytest.mark.parametrize("seed", range(40))
def test_split_counts_equal_the_candidate_loop(seed):
    """The heuristic scores every candidate split count at once (issue 33); the loop over
    candidates it replaced picks the same counts, ties and the early stop included."""
    rng = np.random.default_rng(seed)
    nblk = int(rng.integers(1, 200))
    tiles = rng.integers(1, rng.choice([8, 200, 5000]), nblk)
    rows = rng.integers(1, 256, nblk)
    bm, bn = int(rng.choice([16, 32, 64, 128])), int(rng.choice([16, 32, 64]))
    cfg = tp.Config(bm, max(1, bm // 4), bn, int(rng.choice([4, 8])), int(rng.choice([2, 3, 4])), bn,
                    rng.choice([None, 168]))
    for sms in (1, 4, 132):
        for hkv in (1, 8):
            got = tp.split_counts(tiles, rows, cfg, 128, sms, hkv)
            assert np.array_equal(got, old.split_counts_loop(tiles, rows, cfg, 128, sms, hkv)), (sms, hkv)


def plan_batch(seed: int, dynamic: bool, window: bool):
    """A random batch (trees of every spelling, pages of 1, 3 or 16), with a window or not."""
    b = random_batch(seed, dynamic)
    if not window:
        return b
    spec = b.spec
    w = random.Random(seed).choice([1, 5, 40])
    spec = BatchSpec(spec.requests, spec.num_q_heads, spec.num_kv_heads, spec.head_dim, spec.dtype,
                     spec.page_size, spec.layout, window=w)
    return materialize(spec, seed)


@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_plan_tables_equal_the_old_plan(monkeypatch, seed, dynamic, window):
    """Every table the triton plan uploads (in one copy) equals what the plan before issue 33
    built: units and merge rows from the split-candidate loop, the tree words built by torch
    ops (pointer doubling, packed topologies), the zeroed merge counters, the positions."""
    from attnbench.kernels.shared import features as tf
    from attnbench.kernels.mla.plan import tree_words as mla_words
    from attnbench.backends.triton import TritonBackend

    b = plan_batch(seed, dynamic, window)
    words, has_tree = tp.host_tree_words(b)
    want, want_tree = old.device_tree_words(b)
    assert has_tree == want_tree and np.array_equal(words, want.numpy())
    assert np.array_equal(mla_words(b)[0], old.mla_tree_words(b)[0].numpy())
    for splits in (None, 2):
        for sms in (4, 132):
            monkeypatch.setattr(tp, "num_sms", lambda dev: sms)
            p = TritonBackend(splits=splits).plan(b)
            monkeypatch.setattr(tp, "split_counts", old.split_counts_loop)
            positions = tf.token_positions(b) if window else None
            units, merge, _, blocks = tp.build_units(b, p.cfg, sms, splits, positions)
            monkeypatch.undo()
            assert torch.equal(p.units, units) and p.units.dtype == torch.int32
            assert torch.equal(p.merge, merge if len(merge) else torch.zeros(1, 2, dtype=torch.int32))
            assert torch.equal(p.anc, want) and torch.equal(p.sem, torch.zeros(blocks, b.num_kv_heads, dtype=torch.int32))
            if window:
                assert np.array_equal(positions, old.token_positions(b))
                assert torch.equal(p.feat.positions, torch.from_numpy(positions.astype(np.int32)))
            for t in (p.units, p.merge, p.anc, p.sem):
                assert t.is_contiguous() and t.data_ptr() % 16 == 0  # as the separate copies were


@pytest.mark.parametrize("seed", range(30))
def test_tree_inputs_equal_the_per_request_construction(seed):
    """A step's tree inputs (parents, deepest depth, topology ids) equal the per-request and
    per-node loops they replaced (issue 33), for trees deep and shallow, repeated and not."""
    b = random_batch(seed, dynamic=seed % 2 == 1)
    t = b.trees
    parents, max_depth, ids = old.tree_inputs_fields(b.spec)
    assert np.array_equal(t.parents_host, parents) and t.parents_host.dtype == np.int32
    assert t.max_depth == max_depth and np.array_equal(t.topology_id, ids)


def count_calls(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_static_topologies_are_built_once_across_plans(monkeypatch):
    """A static tree's masks and packed words are derived once per topology; every later
    plan (a new batch with the same shapes: the next engine step) only gathers them."""
    from attnbench.backends.flex import FlexBackend
    from attnbench.backends.sdpa import SdpaBackend

    tokens.topology_masks.cache_clear()
    calls = count_calls(monkeypatch, tokens, "ancestor_masks")
    shape = tuple(random_tree({"nodes": 23, "max_depth": 4, "max_children": 3, "seed": 1234}))
    spec = BatchSpec((Request("tree", 23, 40, shape), Request("decode", 1, 9), Request("tree", 23, 5, shape)),
                     4, 2, 8, "float32", 4, "shuffled")
    for step in range(3):
        batch = materialize(spec, step)
        for be in (SdpaBackend(), FlexBackend()):
            be.plan(be.convert(batch))
        build_tree_split(batch)
        tp.tree_words(batch)
    assert len(calls) == 1  # the first plan built the topology's masks, on this device


def test_dynamic_trees_are_rebuilt_every_plan(monkeypatch):
    calls = count_calls(monkeypatch, _metadata, "ancestor_masks")
    shape = tuple(random_tree({"nodes": 19, "max_depth": 5, "max_children": 3, "seed": 4321}))
    spec = BatchSpec((Request("tree", 19, 40, shape, True), Request("decode", 1, 9)), 4, 2, 8, "float32", 4)
    batch = materialize(spec, 0)
    for _ in range(3):
        _metadata.tree_masks(batch)
    assert len(calls) == 3
    assert torch.equal(_metadata.tree_masks(batch)[0], ancestor_mask(shape))


def test_scenario_marks_trees_dynamic():
    from attnbench.workload.scenario import ScenarioError, load_text

    base = """
model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
device: cpu
batch:
  - {kind: tree, count: 2, context: 7, tree: TREE}
  - {kind: tree, count: 1, context: 7, tree: {chain: 3}}
"""
    sf = load_text(base.replace("TREE", "{random: {nodes: 9, seed: 3}, dynamic: true}"))
    reqs = sf.scenario.batch_spec().requests
    assert [r.tree_dynamic for r in reqs] == [True, True, False]
    assert materialize(sf.scenario.batch_spec(), 0).trees.dynamic
    sf = load_text(base.replace("TREE", "{preset: eagle-dynamic-d5}"))
    assert sf.scenario.batch_spec().requests[0].tree_dynamic
    with pytest.raises(ScenarioError, match=r"batch\.0: tree\.dynamic: expected true or false"):
        load_text(base.replace("TREE", "{chain: 2, dynamic: maybe}"))


@pytest.mark.slow
def test_plan_gets_what_convert_returned_and_rows_report_convert_ms(tmp_path):
    """SDPA's gather and dense mask are convert_ms, its plan is what is left; backends that
    convert nothing report 0. The column is in the CSV."""
    from typer.testing import CliRunner

    from attnbench.cli.app import app

    text = """
name: conv
device: cpu
model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
kv_cache: {page_size: 4}
batch:
  - {kind: decode, count: 2, context: 19}
  - {kind: tree, count: 2, context: 7, tree: {random: {nodes: 9, seed: 3}, dynamic: true}}
backends: [reference, sdpa, flex]
timing: {warmup_ms: 1, measure_ms: 3, min_runs: 2}
"""
    p = tmp_path / "conv.yaml"
    p.write_text(text)
    r = CliRunner().invoke(app, ["run", str(p), "--out", str(tmp_path / "run"), "-q"])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(tmp_path / "run" / "results.csv").set_index("backend")
    assert "convert_ms" in df.columns and set(df.status) == {"ok"}
    assert df.loc["reference", "convert_ms"] == 0
    assert df.loc["sdpa", "convert_ms"] > 0 and df.loc["flex", "convert_ms"] > 0
    assert np.allclose(df.step_ms, df.plan_ms + df.median_ms)
    assert "dynamic tree(9)" in df.loc["sdpa", "batch"]
