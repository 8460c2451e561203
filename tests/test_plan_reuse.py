"""The triton plan's per-shape caches (triton_step.py, issue 33): one backend planning step
after step gives the tables the reference constructions build from scratch (``build_units``,
``host_tree_words``, ``token_positions``; MLA: ``triton_mla.build_units``), whether the next
step keeps its lengths, grows its contexts (the cached shape is kept, the key side rebuilt),
changes its query lengths (another shape), or brings a dynamic tree with other parents of
the same size; and an earlier plan's tables are not overwritten by later plans."""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from attnbench.kernels.shared import features as tf
from attnbench.kernels.mla import plan as tm
from attnbench.kernels.shared import plan as tp
from attnbench.backends.triton import TritonBackend
from attnbench.workload.batch import Request, materialize
from attnbench.workload.scenario import load
from attnbench.workload.trees import random_tree

from .test_plan_metadata import plan_batch
from .scripts import load_script

ROOT = Path(__file__).resolve().parent.parent


def reference(b, cfg, sms, splits) -> dict:
    """What the plan must upload, built from scratch by the reference functions."""
    positions = tf.token_positions(b) if tf.needs_positions(b) else None
    units, merge, _, blocks = tp.build_units(b, cfg, sms, splits, positions)
    want = {"units": units, "merge": merge if len(merge) else torch.zeros(1, 2, dtype=torch.int32),
            "anc": torch.from_numpy(tp.host_tree_words(b)[0]),
            "sem": torch.zeros(blocks, b.num_kv_heads, dtype=torch.int32)}
    if positions is not None:
        want["positions"] = torch.from_numpy(positions.astype(np.int32))
    return want


def got(p) -> dict:
    out = {"units": p.units, "merge": p.merge, "anc": p.anc, "sem": p.sem}
    if p.feat.positions is not None:
        out["positions"] = p.feat.positions
    return {k: v.clone() for k, v in out.items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def with_requests(b, reqs, seed):
    return materialize(dataclasses.replace(b.spec, requests=tuple(reqs)), seed)


def steps(b, seed):
    """The batch, the same again, its contexts grown (same shape), its query lengths changed
    (another shape), odd lengths, and dynamic trees re-drawn with the same sizes."""
    rng = random.Random(seed)
    reqs = b.spec.requests
    grown = [dataclasses.replace(r, context=r.context + rng.choice([1, 7, 64, 300])) for r in reqs]
    other = [dataclasses.replace(r, query=r.query + 3) if r.kind == "prefill" else r for r in reqs]
    other.append(Request("prefill", rng.choice([1, 5, 17, 33]), rng.randint(0, 97)))
    redrawn = [dataclasses.replace(r, tree_parents=tuple(random_tree(
        {"nodes": r.query, "max_depth": r.query, "max_children": rng.randint(1, 4), "seed": rng.randint(0, 99)})))
        if r.tree_dynamic else r for r in reqs]
    yield b
    yield b
    for k, rs in enumerate((grown, other, redrawn, reqs)):
        yield with_requests(b, rs, seed + k + 1)


@pytest.mark.slow
@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("seed", range(10))
def test_a_reused_plan_equals_a_fresh_one(monkeypatch, seed, dynamic, window):
    b0 = plan_batch(seed, dynamic, window)
    for splits in (None, 2):
        for sms in (4, 132):
            monkeypatch.setattr(tp, "num_sms", lambda dev: sms)
            be = TritonBackend(splits=splits)
            kept = []
            for b in steps(b0, seed):
                b.new_step()
                p = be.plan(b)
                fresh = TritonBackend(splits=splits).plan(b)
                want = reference(b, p.cfg, sms, splits)
                assert p.cfg == fresh.cfg and same(got(p), want) and same(got(fresh), want), (splits, sms)
                assert p.num_merge == (len(want["merge"]) if int(want["merge"].abs().sum()) else 0)
                for t in (p.units, p.merge, p.anc, p.sem):
                    assert t.is_contiguous() and t.data_ptr() % 16 == 0
                kept.append((p, want))
            for p, want in kept:  # no later plan wrote into an earlier plan's tables
                assert same(got(p), want)
            assert len(be.planner.shapes) >= 2  # another shape (other query lengths) was planned


def test_a_grown_context_keeps_the_shape_and_rebuilds_the_key_side():
    rng = random.Random(3)
    b = plan_batch(3, False, False)
    be = TritonBackend()
    be.plan(b)
    shapes = dict(be.planner.shapes)
    for _ in range(3):  # decode steps: every context one longer, the query side as it was
        b = with_requests(b, [dataclasses.replace(r, context=r.context + 1) for r in b.spec.requests], rng.randint(0, 99))
        p = be.plan(b)
        assert same(got(p), reference(b, p.cfg, tp.num_sms(b.device), None))
    assert all(be.planner.shapes.get(k) is v for k, v in shapes.items()) and len(be.planner.shapes) == len(shapes)


def mla_batches():
    sf = load(ROOT / "attnbench/scenarios/mla-tiny.yaml", [])
    for case in sf.cases:
        b = materialize(case.scenario.batch_spec(), case.scenario.seed)
        reqs = b.spec.requests
        yield b
        yield b
        yield with_requests(b, [dataclasses.replace(r, context=r.context + 33) for r in reqs], 5)
        yield with_requests(b, [dataclasses.replace(r, query=r.query + 2) if r.kind == "prefill" else r
                                for r in reqs], 6)
        yield with_requests(b, [dataclasses.replace(r, context=r.context * 9 + 700) for r in reqs], 7)
        # the same lengths with bidirectional prefills: a new shape (their keys end at kv_len, kind 2)
        yield with_requests(b, [dataclasses.replace(r, causal=False) if r.kind == "prefill" else r for r in reqs], 8)


@pytest.mark.parametrize("splits", [None, 1, 3])
def test_a_reused_mla_plan_equals_a_fresh_one(splits):
    be, kept = TritonBackend(splits=splits), []
    for b in mla_batches():
        for sms in (4, 132):
            b.new_step()
            p = tm.plan(b, sms, True, splits, shapes=be.planner.mla_shapes, staging=be.planner.staging)
            units, merge, s = tm.build_units(b, tm.choose_config(b), sms, splits)
            want = [torch.from_numpy(units), torch.from_numpy(merge if len(merge) else np.zeros((1, 2), np.int32)),
                    torch.from_numpy(b.host.context_lens.astype(np.int32)),
                    torch.from_numpy(b.host.query_start_loc[:-1].astype(np.int32)),
                    torch.from_numpy(tp.host_tree_words(b)[0])]
            tables = [p.units, p.merge, p.ctx, p.qstart, p.anc]
            assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(tables, want))
            assert p.num_merge == len(merge) and p.po.shape[0] == s and p.has_tree == bool(b.trees.tmax)
            kept.append(([t.clone() for t in tables], tables))
    assert all(all(torch.equal(a, c) for a, c in zip(x, y)) for x, y in kept)


@pytest.mark.gpu
@pytest.mark.parametrize("pinned", ["0", "1"])
def test_on_a_gpu_each_plan_keeps_the_tables_it_sent(monkeypatch, pinned):
    """On CUDA the tables go up in one copy: by default from a pageable buffer of the plan's own,
    with ATTNBENCH_TRITON_PINNED_STAGING=1 from a pinned block of torch's caching host allocator
    (``non_blocking``; the block is handed out again only after its copy has completed). Every
    plan's device tables equal the reference, and stay so while later plans are made."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    monkeypatch.setenv("ATTNBENCH_TRITON_PINNED_STAGING", pinned)
    be, kept = TritonBackend(), []
    assert be.planner.staging.pinned == (pinned == "1")
    for seed in range(9):
        b = plan_batch(seed, seed % 2 == 1, seed % 3 == 0)
        b = materialize(b.spec, seed, "cuda")
        for _ in range(2):  # the same step again: a pinned block freed by the last plan comes back
            b.new_step()
            p = be.plan(b)
            kept.append((p, reference(b, p.cfg, tp.num_sms(b.device), None)))
    torch.cuda.synchronize()
    for p, want in kept:
        assert same({k: v.cpu() for k, v in got(p).items()}, want)


def test_a_plan_without_splits_shares_partials_no_kernel_touches(monkeypatch):
    """Unsplit plans (no partial row, no merge) share one [1, 1, ...] partial output and LSE per
    backend; a split plan gets partials of its own, sized to its merge rows."""
    monkeypatch.setattr(tp, "num_sms", lambda dev: 132)
    b = plan_batch(0, False, False)
    be = TritonBackend(splits=1)
    p, q = be.plan(b), be.plan(b)
    assert p.num_merge == 0 and p.po is q.po and p.pl is q.pl and p.po.shape[:2] == (1, 1)
    s = TritonBackend(splits=2).plan(b)
    assert s.num_merge and s.po.shape[1] == s.num_merge and s.pl.shape[1] == s.num_merge and s.po is not p.po
    m = next(iter(mla_batches()))
    mp = tm.plan(m, 132, True, 1, shapes=be.planner.mla_shapes, staging=be.planner.staging)
    assert mp.num_merge == 0 and mp.po.shape[:2] == (1, 1) and mp.po is tm.plan(m, 132, True, 1, staging=be.planner.staging).po


@pytest.mark.parametrize("layout", ["all-trees", "uneven-trees", "mixed"])
@pytest.mark.parametrize("seed", range(4))
def test_dynamic_tree_words_are_the_reference_on_every_token_layout(seed, layout):
    """A dynamic step's words (``triton_stage.Words``: doubling over the tree tokens only, then
    one slice when they are one run of tokens, else one scatter) equal ``host_tree_words``: every
    token a tree's of one size (the slice), trees of different sizes, trees among other requests."""
    rng = random.Random(seed)
    sizes = [rng.choice([3, 40, 61, 70])] * 5 if layout == "all-trees" else [rng.randint(1, 70) for _ in range(5)]
    reqs = []
    for n in sizes:
        reqs.append(Request("tree", n, rng.randint(0, 90), tuple(random_tree(
            {"nodes": n, "max_depth": n, "max_children": rng.randint(1, 4), "seed": rng.randint(0, 99)})), True))
        if layout == "mixed":
            reqs.append(Request("decode", 1, rng.randint(1, 90)))
    b = with_requests(plan_batch(seed, True, False), reqs, seed)
    be = TritonBackend()
    for _ in range(2):
        b.new_step()
        p = be.plan(b)
        assert torch.equal(p.anc, torch.from_numpy(tp.host_tree_words(b)[0]))
    words = next(iter(be.planner.shapes.values()))[1].words
    assert (words.span is not None) == (layout != "mixed") and (words.real is None) == (layout == "all-trees")


def test_split_counts_past_the_bincount_range_equal_the_candidate_loop():
    """Row blocks of more than 65536 key tiles take np.unique instead of np.bincount."""
    from . import old_metadata as old

    rng = np.random.default_rng(7)
    tiles = np.concatenate([rng.integers(1, 5000, 20), rng.integers(60000, 90000, 4)])
    rows = rng.integers(40, 256, len(tiles))
    cfg = tp.Config(64, 16, 32, 8, 2, 32, 168)
    for sms in (4, 132):
        assert np.array_equal(tp.split_counts(tiles, rows, cfg, 128, sms, 8), old.split_counts_loop(tiles, rows, cfg, 128, sms, 8))


def test_the_step_split_pick_is_the_reference_pick():
    """triton_step.large_chunk (one product with a per-(longest, slots, hkv) work table, or the
    reference past DENSE_CELLS) picks triton_plan.large_chunk's chunk: ragged and equal tile
    counts, 1 to 3000 tiles, 4 to 1056 program slots, 1 to 8 KV heads."""
    from attnbench.kernels.shared import step as ts

    rng = np.random.default_rng(3)
    for _ in range(2000):
        t = rng.integers(1, int(rng.choice([2, 5, 17, 66, 130, 260, 600, 3000])) + 1, int(rng.integers(1, 200)))
        if rng.random() < 0.3:
            t[:] = t.max()
        slots, hkv = int(rng.choice([4, 8, 132, 264, 396, 1056])), int(rng.choice([1, 2, 4, 8]))
        assert ts.large_chunk(t, np.bincount(t), slots, hkv) == tp.large_chunk(t, int(t.max()), slots, hkv)


def test_the_mla_default_config_is_taken_per_shape(monkeypatch):
    """The backend's MLA overrides (``default_config``: 128 heads, decodes and trees) are part of
    the cached shape: one backend planning a 128-head decode batch, then with a tree (waves 2),
    then with a prefill (the default config), then the decodes again gives every step the config
    and tables of a fresh backend's plan and of ``build_units`` from scratch."""
    monkeypatch.setattr(tp, "num_sms", lambda dev: 132)
    b0 = next(iter(mla_batches()))
    wide = dataclasses.replace(b0.spec, num_q_heads=128)
    reqs = wide.requests
    decodes = [r for r in reqs if r.kind == "decode"]
    steps = [decodes, decodes + [r for r in reqs if r.kind == "tree"], reqs, decodes]
    be = TritonBackend()
    for k, rs in enumerate(steps):
        b = materialize(dataclasses.replace(wide, requests=tuple(rs)), k)
        p, fresh = be.plan(b), TritonBackend().plan(b)
        cfg = tm.choose_config(b, **tm.default_config(b))
        units, merge, s = tm.build_units(b, cfg, 132, None)
        assert p.cfg == fresh.cfg == cfg and p.mode == fresh.mode
        assert torch.equal(p.units, torch.from_numpy(units)) and torch.equal(p.units, fresh.units)
        assert p.num_merge == len(merge) and p.po.shape[0] == s


@pytest.mark.slow
def test_every_shipped_case_plans_the_reference_splits_on_4_and_132_sms(monkeypatch):
    """Every shipped MHA case (batches without cache data, as triton_plan_time.py times them): the
    plan's units and merge rows are build_units' at 4 and at 132 SMs. Larger row blocks (trees of
    40 nodes at G=4: 64 rows) pick their splits for all the GPU's program slots, SMs x programs per
    SM; plan round 4's fast path passed one SM's programs as the whole GPU's and under-split 41 of
    these 111 cases at 132 SMs (gpu/tree-shapes: 20 units and 12 merge rows where the reference
    plans 51 and 132), while every test here used batches whose split count the SM count does not
    change."""
    tpt = load_script("scripts/dev/triton_plan_time.py")
    shapes: dict = {}
    checked = 0
    for name, case in tpt.cases(tpt.SHIPPED, {"cpu-sweep"}):
        if "mla" in name:
            continue  # triton_mla's plan: test_a_reused_mla_plan_equals_a_fresh_one
        b = tpt.light_batch(case.scenario.batch_spec(), case.scenario.seed, "cpu")
        for sms in (4, 132):
            monkeypatch.setattr(tp, "num_sms", lambda dev, s=sms: s)
            p = TritonBackend().plan(b)
            units, merge, _, _ = tp.build_units(b, p.cfg, sms, None,
                                                tf.token_positions(b) if tf.needs_positions(b) else None)
            assert torch.equal(p.units, units), (name, case.case_id, sms)
            assert p.num_merge == len(merge), (name, case.case_id, sms)
            shapes.setdefault(f"{name}/{case.case_id}", set()).add(tuple(p.units.shape))
        checked += 1
    assert checked >= 100
    assert len(shapes["gpu-tree-shapes/page_size=16"]) == 2  # this batch's split pick depends on the SM count
