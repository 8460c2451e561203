"""The Gluon tree option's host side on the CPU (issue 33, tree round 1): which batches its plan shapes for
the kernel, the plan it makes (one unit a request and split, 64-key tiles) and that the option falls back
to the shipped kernel where the Gluon kernel cannot run (the CPU: Gluon has no interpreter), with the
reference's outputs. The kernel itself runs on a GPU: tests/test_gluon_tree_gpu.py."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from .interpreted import import_interpreted, interpret_on_cpu  # noqa: F401 (an autouse fixture)

# the shipped kernels interpreted on a CPU machine, before anything imports them compiled (alone,
# this file imported them compiled and failed on triton's "0 active drivers")
import_interpreted("attnbench.kernels.paged.kernels", "attnbench.backends.triton")

from attnbench.kernels import routes  # noqa: E402
from attnbench.kernels.tree import gluon as tree  # noqa: E402
from attnbench.backends.triton import TritonBackend  # noqa: E402
from attnbench.workload import trees  # noqa: E402
from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402
from attnbench.workload.reference import compare, reference_attention  # noqa: E402


FULL13 = tuple(trees.full({"depth": 2, "branching": 3}))


def _trees(*ctxs, hq=8, hkv=2, d=128, dtype="float16", page_size=16, nodes=13, **kw):
    parents = FULL13 if nodes == 13 else (-1,) + tuple(range(nodes - 1))
    reqs = tuple(Request("tree", nodes, c, parents) for c in ctxs)
    return materialize(BatchSpec(reqs, hq, hkv, d, dtype=dtype, page_size=page_size, **kw), 1)


def _first(reasons: list[str]) -> str:
    return reasons[0] if reasons else ""


def test_reasons_take_tree_batches_up_to_three_warpgroups_and_nothing_else(monkeypatch):
    """On a Hopper GPU (patched in): 16-bit tree batches of head dim 64/128, pages of 8-32 keys or a multiple
    of 64, no variant, at most 192 rows a request (query tokens x G); each thing it does not take says so."""
    monkeypatch.setattr(tree, "hopper", lambda device: True)
    assert tree.reasons(_trees(100, 0)) == []
    assert tree.reasons(_trees(100, page_size=256, d=64)) == []
    assert tree.reasons(_trees(100, page_size=8, nodes=48)) == []  # 48 x 4 = 192 rows
    assert _first(tree.reasons(_trees(100, nodes=49))).startswith("196 rows a request")
    assert _first(tree.reasons(_trees(100, hq=16, nodes=25))).startswith("200 rows")  # G 8
    for kw in (dict(page_size=4), dict(page_size=48), dict(d=96)):
        assert "takes head dim 64/128" in _first(tree.reasons(_trees(100, **kw))), kw
    assert "16-bit q" in _first(tree.reasons(_trees(100, dtype="float32")))
    for variant, words in ((dict(window=32), "window"), (dict(sinks=True), "sinks"), (dict(softcap=30.0), "soft"),
                           (dict(alibi=True), "ALiBi")):
        assert words in _first(tree.reasons(_trees(100, **variant))), variant
    for kv in ("fp8_e4m3", "fp8_e5m2"):  # tree round 2: FP8 caches, their scales per tensor or per head
        for scale in ("per-tensor", "per-head"):
            assert tree.reasons(_trees(100, kv_dtype=kv, kv_scale=scale, dtype="bfloat16")) == [], (kv, scale)
    fp8 = _trees(100, kv_dtype="fp8_e4m3")
    fp8.k_scale = None  # an FP8 cache without its scales
    assert "16-bit q" in _first(tree.reasons(fp8))
    no_tree = materialize(BatchSpec((Request("decode", 1, 40),), 8, 2, 128, dtype="float16", page_size=16), 1)
    assert _first(tree.reasons(no_tree)).startswith("no tree")
    monkeypatch.setattr(tree, "hopper", lambda device: False)
    assert tree.reasons(_trees(100)) == ["the Gluon tree kernel needs a Hopper GPU (sm_90)"]


@pytest.mark.slow
@pytest.mark.parametrize("hq,hkv,nodes,block_m,warpgroups", [(8, 2, 13, 64, 1), (8, 2, 40, 256, 3),
                                                             (16, 2, 24, 256, 3), (4, 4, 33, 64, 1)])
def test_the_route_plans_one_unit_a_request_and_split_and_matches_the_reference(monkeypatch, hq, hkv, nodes,
                                                                                block_m, warpgroups):
    """The route's plan holds a whole request in a row block (block_m = G x the longest request, rounded up to
    a power of two; ``warpgroups`` = its rows in 64s) with 64-key tiles, so its units are (request, split);
    forced splits start on 64-key tiles. The CPU runs the plan through the paged route's launch (Gluon has no
    interpreter) and matches the reference; tile options are refused by the route."""
    monkeypatch.setattr(tree, "reasons", lambda batch: [])
    b = materialize(BatchSpec((Request("tree", nodes, 150, (-1,) + tuple(range(nodes - 1))), Request("decode", 1, 77),
                               Request("tree", 3, 0, (-1, 0, 0))), hq, hkv, 32, dtype="float32", page_size=16), 2)
    for splits in (None, 3):
        p = TritonBackend(route="gluon-tree", splits=splits).plan(b)
        assert p.route.name == "gluon-tree" and (p.cfg.block_m, p.cfg.block_n, p.cfg.block_nf) == (block_m, 64, 64)
        assert tree.warpgroups(p) == warpgroups
        units = p.units.cpu().numpy()
        per_request = {(int(u[0]), int(u[7])) for u in units}
        assert len(per_request) == len(units)  # one unit a (request, split)
        assert all(int(u[4]) % 64 == 0 for u in units)  # kv_lo on a 64-key tile
        assert compare(routes.BY_NAME["paged"].launch(p), reference_attention(b)[0])[0] < 1e-4
    assert "sets block_m itself" in TritonBackend(route="gluon-tree", block_m=16).unsupported(b)[-1]
    assert TritonBackend(block_m=16).plan(b).cfg.block_m == 16  # auto: the paged route takes the tiles


def test_off_hopper_auto_runs_the_paged_route_and_a_forced_route_is_skipped():
    """Off Hopper (the CPU here) auto runs the paged kernel and says so; route=gluon-tree refuses the batch."""
    b = _trees(100, 0, dtype="float32", d=32)
    p = TritonBackend().plan(b)
    assert p.route.name == "paged" and p.mode == "interpreted (TRITON_INTERPRET=1); paged (Triton paged kernel)"
    assert TritonBackend(route="gluon-tree").unsupported(b) == ["route gluon-tree: the Gluon tree kernel needs a Hopper GPU (sm_90)"]


def test_a_plan_the_kernel_fits_is_run_by_it_and_one_it_does_not_falls_back(monkeypatch):
    """The plan records the route once; run launches it (a stand-in here: Gluon has no interpreter). A plan
    whose tiles the kernel does not fit runs on the paged route under auto (the mode says why) and matches the
    reference; a forced route raises instead."""
    calls = []
    monkeypatch.setattr(tree, "hopper", lambda device: True)
    b = _trees(300, 0, dtype="float16", d=64)
    gluon = routes.BY_NAME["gluon-tree"]
    monkeypatch.setitem(routes.BY_NAME, "gluon-tree", dataclasses.replace(gluon, launch=lambda p: calls.append(p)
                                                                          or p.out))
    monkeypatch.setattr(routes, "AUTO", tuple(routes.BY_NAME[r.name] for r in routes.AUTO))
    be = TritonBackend()
    p = be.plan(b)
    assert p.route.name == "gluon-tree" and p.mode.endswith("gluon-tree (Gluon tree kernel)")
    assert be.run(p) is p.out and calls == [p]
    monkeypatch.setattr(tree, "fit", lambda p: "not here")
    monkeypatch.setattr(routes, "AUTO", tuple(dataclasses.replace(r, fit=tree.fit) if r.name == "gluon-tree" else r
                                              for r in routes.AUTO))
    be.forget_shapes()
    p = be.plan(b)
    assert p.route.name == "paged" and p.mode.endswith("paged (Triton paged kernel), not gluon-tree: not here")
    assert compare(be.run(p).float(), reference_attention(b)[0])[0] < 1e-2 and len(calls) == 1


@pytest.mark.slow
def test_the_route_keeps_its_split_partials_16_bit(monkeypatch):
    """The route's plan keeps its split partials in the batch's 16-bit dtype (HALF_PARTIALS: the merge launch
    3.3 us instead of 9.5 on an H200); the paged route's are float32; the shaped plan matches the reference."""
    monkeypatch.setattr(tree, "reasons", lambda batch: [])
    b = _trees(3000, 1500, d=64)
    p = TritonBackend(route="gluon-tree", splits=2).plan(b)
    assert p.num_merge and p.po.dtype == torch.float16
    assert compare(routes.BY_NAME["paged"].launch(p), reference_attention(b)[0])[0] < 1e-2
    assert TritonBackend(route="paged", splits=2).plan(b).po.dtype == torch.float32


def test_the_gluon_tree_plan_counts_its_splits_in_waves(monkeypatch):
    """The Gluon tree kernel runs one program an SM at a time, so its plan's splits keep the programs within
    one wave where that is cheaper: gpu/ragged-trees' contexts (4096, 100, 2000, 3000, 777, 1, 2048 under
    40-node trees, 8 KV heads) on 132 SMs take chunks of 17 tiles (112 programs), where counting work took 13
    (144 programs: a second wave); 8 x 40 trees at 4k keep 2 splits (128 programs)."""
    import numpy as np

    from attnbench.kernels.shared import plan as tp
    from attnbench.kernels.shared import step as ts

    ragged = np.array([65, 3, 33, 48, 13, 1, 33])
    assert tp.large_chunk(ragged, 65, 132, 8) == 13 and ts.wave_chunk(np.bincount(ragged), 132, 8) == 17
    assert ts.wave_chunk(np.bincount([65] * 8), 132, 8) == 33
    monkeypatch.setattr(tree, "reasons", lambda batch: [])
    monkeypatch.setattr(tp, "num_sms", lambda device: 132)
    parents = (-1,) + tuple(range(39))
    b = materialize(BatchSpec(tuple(Request("tree", 40, c, parents) for c in (4096, 100, 2000, 3000, 777, 1, 2048)),
                              32, 8, 128, dtype="float16", page_size=16), 1)
    p = TritonBackend(route="gluon-tree").plan(b)
    assert p.units.shape[0] * 8 == 112
    assert TritonBackend(route="paged").plan(b).units.shape[0] > 14  # the one-launch kernel's rule, unchanged


def test_the_route_is_selected_once_per_step_shape_and_cache_layout(monkeypatch):
    """The route is the step shape's and the cache layout's: later steps of the shape (other tensors, the same
    layout) reuse it; a q of other strides selects again (and its reasons refuse the route), so does a new
    shape."""
    monkeypatch.setattr(tree, "hopper", lambda device: True)
    real, seen = routes.select, []
    monkeypatch.setattr(routes, "select", lambda b, o: seen.append(b) or real(b, o))
    be = TritonBackend()
    b = _trees(300, 0, dtype="bfloat16", d=64)
    first = be.plan(b)
    assert first.route.name == "gluon-tree"
    for seed in (2, 3):
        assert be.plan(materialize(b.spec, seed)).route is first.route
    assert len(seen) == 1
    strided = torch.empty(b.q.shape[0], b.q.shape[2], b.q.shape[1], dtype=b.q.dtype).transpose(1, 2)
    strided.copy_(b.q)  # the same values, its head dim not contiguous
    assert "last dimension contiguous" in tree.reasons(dataclasses.replace(b, q=strided))[0]
    assert be.plan(dataclasses.replace(b, q=strided)).route.name == "paged" and len(seen) == 2
    assert be.plan(b).route.name == "gluon-tree" and len(seen) == 2
    be.plan(_trees(300, 20, dtype="bfloat16", d=64))  # another shape (two requests)
    assert len(seen) == 3


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_the_route_takes_an_fp8_tree_batch_and_refuses_its_variants(monkeypatch, kv):
    """FP8 caches (tree round 2): the route takes an FP8 tree batch and plans it for the kernel; it refuses one
    with a window; the shaped plan matches the reference through the paged launch."""
    monkeypatch.setattr(tree, "hopper", lambda device: True)
    b = _trees(300, 77, kv_dtype=kv, dtype="float16")
    p = TritonBackend().plan(b)
    assert p.route.name == "gluon-tree" and p.feat.fp8 and (p.cfg.block_m, p.cfg.block_n) == (64, 64)
    assert "window" in tree.reasons(_trees(300, kv_dtype=kv, window=40))[0]
    assert compare(routes.BY_NAME["paged"].launch(p).float(), reference_attention(b)[0])[0] < 3e-2


def test_fp8_staging_slots_fill_the_shared_memory_budget():
    """FP8 launches get as many 16 KB staging slots (head dim 128) as FP8_SMEM holds beside Q (16 KB a
    warpgroup) and the ring (32 KB a slot): 3 for a 3-warpgroup tree with 3 ring slots (192 KB in all; the
    sm_90 build, with its scratch, 221 KB of 227), 5 with 2 ring slots, 7 for one warpgroup, 15 (8 KB each) at
    head dim 64."""
    assert tree.staging_slots(3, 128) == 3 and tree.staging_slots(1, 128) == 5 and tree.staging_slots(3, 64) == 15
    two = tree.Tuning(stages_fp8=2)
    assert tree.staging_slots(3, 128, two) == 5 and tree.staging_slots(1, 128, two) == 7
