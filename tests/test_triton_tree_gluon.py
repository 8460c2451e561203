"""The Gluon tree option's host side on the CPU (issue 33, tree round 1): which batches its plan shapes for
the kernel, the plan it makes (one unit a request and split, 64-key tiles) and that the option falls back
to the shipped kernel where the Gluon kernel cannot run (the CPU: Gluon has no interpreter), with the
reference's outputs. The kernel itself runs on a GPU: tests/test_gluon_tree_gpu.py."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from .interpreted import import_interpreted

# the shipped kernels interpreted on a CPU machine, before anything imports them compiled
import_interpreted("attnbench.backends.triton_kernels", "attnbench.backends.triton_paged")

from attnbench.backends import triton_tree_gluon as tree  # noqa: E402
from attnbench.backends.triton_paged import TritonBackend  # noqa: E402
from attnbench.workload import trees  # noqa: E402
from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402
from attnbench.workload.reference import compare, reference_attention  # noqa: E402

FULL13 = tuple(trees.full({"depth": 2, "branching": 3}))


@pytest.fixture(autouse=True)
def _interpret():
    """The CPU runs the shipped kernels under Triton's interpreter (tests/interpreted.py): alone,
    this file imported them compiled and failed on triton's "0 active drivers". A patch of its
    own: a test's monkeypatch.undo() leaves it set."""
    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "1")
        yield


def _trees(*ctxs, hq=8, hkv=2, d=128, dtype="float16", page_size=16, nodes=13, **kw):
    parents = FULL13 if nodes == 13 else (-1,) + tuple(range(nodes - 1))
    reqs = tuple(Request("tree", nodes, c, parents) for c in ctxs)
    return materialize(BatchSpec(reqs, hq, hkv, d, dtype=dtype, page_size=page_size, **kw), 1)


def test_wanted_takes_tree_batches_up_to_three_warpgroups_and_nothing_else(monkeypatch):
    """On a Hopper GPU (patched in): 16-bit tree batches of head dim 64/128, pages of 8-32 keys or a multiple
    of 64, no variant, at most 192 rows a request (query tokens x G); each thing it does not take says so."""
    monkeypatch.setattr(tree, "hopper", lambda device: True)
    assert tree.wanted(_trees(100, 0))
    assert tree.wanted(_trees(100, page_size=256, d=64))
    assert tree.wanted(_trees(100, page_size=8, nodes=48))  # 48 x 4 = 192 rows
    assert tree.unwanted(_trees(100, nodes=49)).startswith("196 rows a request")
    assert tree.unwanted(_trees(100, hq=16, nodes=25)).startswith("200 rows")  # G 8
    for kw in (dict(page_size=4), dict(page_size=48), dict(d=96)):
        assert tree.unwanted(_trees(100, **kw)).startswith("head dim"), kw
    assert tree.unwanted(_trees(100, dtype="float32")) == "not a 16-bit q with a 16-bit or FP8 (e4m3 / e5m2) cache"
    for variant in (dict(window=32), dict(sinks=True), dict(softcap=30.0), dict(alibi=True)):
        assert tree.unwanted(_trees(100, **variant)) == "an attention variant", variant
    for kv in ("fp8_e4m3", "fp8_e5m2"):  # tree round 2: FP8 caches, their scales per tensor or per head
        for scale in ("per-tensor", "per-head"):
            assert tree.wanted(_trees(100, kv_dtype=kv, kv_scale=scale, dtype="bfloat16")), (kv, scale)
    fp8 = _trees(100, kv_dtype="fp8_e4m3")
    fp8.k_scale = None  # an FP8 cache without its scales
    assert tree.unwanted(fp8).startswith("not a 16-bit q with")
    assert tree.unwanted(_trees(100, kv_dtype="fp8_e4m3", window=32)) == "an attention variant"
    no_tree = materialize(BatchSpec((Request("decode", 1, 40),), 8, 2, 128, dtype="float16", page_size=16), 1)
    assert tree.unwanted(no_tree) == "no tree"
    monkeypatch.setattr(tree, "hopper", lambda device: False)
    assert tree.unwanted(_trees(100)) == "not a Hopper GPU"


@pytest.mark.slow
@pytest.mark.parametrize("hq,hkv,nodes,block_m,warpgroups", [(8, 2, 13, 64, 1), (8, 2, 40, 256, 3),
                                                             (16, 2, 24, 256, 3), (4, 4, 33, 64, 1)])
def test_the_option_plans_one_unit_a_request_and_split_and_matches_the_reference(monkeypatch, hq, hkv, nodes,
                                                                                 block_m, warpgroups):
    """Where wanted (patched here) the plan's row block holds a whole request (block_m = G x the longest
    request, rounded up to a power of two; ``warpgroups`` = its rows in 64s) with 64-key tiles, so its units
    are (request, split); forced splits start on 64-key tiles. The CPU runs the plan through the shipped
    kernel (Gluon has no interpreter) and matches the reference; a config the caller sets wins."""
    monkeypatch.setattr(tree, "wanted", lambda batch: True)
    b = materialize(BatchSpec((Request("tree", nodes, 150, (-1,) + tuple(range(nodes - 1))), Request("decode", 1, 77),
                               Request("tree", 3, 0, (-1, 0, 0))), hq, hkv, 32, dtype="float32", page_size=16), 2)
    for splits in (None, 3):
        p = TritonBackend(tree="gluon", splits=splits).plan(b)
        assert (p.cfg.block_m, p.cfg.block_n, p.cfg.block_nf) == (block_m, 64, 64)
        assert tree.warpgroups(p) == warpgroups
        units = p.units.cpu().numpy()
        per_request = {(int(u[0]), int(u[7])) for u in units}
        assert len(per_request) == len(units)  # one unit a (request, split)
        assert all(int(u[4]) % 64 == 0 for u in units)  # kv_lo on a 64-key tile
        assert compare(TritonBackend(tree="gluon", splits=splits).run(p), reference_attention(b)[0])[0] < 1e-4
    assert TritonBackend(tree="gluon", block_m=16).plan(b).cfg.block_m == 16


def test_off_hopper_the_option_changes_nothing():
    """Off Hopper (the CPU here) the plan keeps the shipped config and the row's mode says nothing more."""
    b = _trees(100, 0, dtype="float32", d=32)
    shipped, gluon = TritonBackend().plan(b), TritonBackend(tree="gluon").plan(b)
    assert shipped.cfg == gluon.cfg and gluon.mode == "interpreted (TRITON_INTERPRET=1)"
    assert "Hopper" in tree.fit(gluon)


def test_on_hopper_a_refused_tree_batchs_row_says_why(monkeypatch):
    """On a Hopper GPU (patched in) a tree batch the option does not take keeps the shipped kernel, and the
    row's 'ran as' gives unwanted's reason."""
    monkeypatch.setattr(tree, "hopper", lambda device: True)
    p = TritonBackend(tree="gluon").plan(_trees(100, page_size=48))
    assert "shipped kernel, not Gluon's tree kernel: head dim 128, page 48" in p.mode, p.mode
    assert TritonBackend(tree="gluon").plan(materialize(BatchSpec((Request("decode", 1, 40),), 8, 2, 32), 1)).mode \
        == "interpreted (TRITON_INTERPRET=1)"


def test_the_option_is_checked():
    with pytest.raises(ValueError, match="tree 'gl'"):
        TritonBackend(tree="gl")


def test_the_tree_round_script_parses_and_names_existing_variants():
    """scripts/gpu/gpu_gluon_tree_round.sh (one device call: the GPU tests and the timing rows) is valid bash
    and its default variants exist in scripts/dev/triton_variants.py."""
    from .scripts import round_script_variants

    rc, default, names = round_script_variants("scripts/gpu/gpu_gluon_tree_round.sh")
    assert rc == 0
    assert default and set(default) <= names, set(default) - names


@pytest.mark.slow
def test_the_option_keeps_its_split_partials_16_bit(monkeypatch):
    """Where the plan is shaped for the Gluon tree kernel its split partials are in the batch's 16-bit dtype
    (HALF_PARTIALS: the merge launch 3.3 us instead of 9.5 on an H200); float32 elsewhere, and everywhere
    with HALF_PARTIALS off; the CPU's fallback run still matches the reference."""
    import torch

    monkeypatch.setattr(tree, "wanted", lambda batch: True)
    b = _trees(3000, 1500, d=64)
    p = TritonBackend(tree="gluon", splits=2).plan(b)
    assert p.num_merge and p.po.dtype == torch.float16
    assert compare(TritonBackend(tree="gluon", splits=2).run(p), reference_attention(b)[0])[0] < 1e-2
    assert TritonBackend(tree="", splits=2).plan(b).po.dtype == torch.float32
    monkeypatch.setattr(tree, "HALF_PARTIALS", False)
    assert TritonBackend(tree="gluon", splits=2).plan(b).po.dtype == torch.float32


def test_the_gluon_tree_plan_counts_its_splits_in_waves(monkeypatch):
    """The Gluon tree kernel runs one program an SM at a time, so its plan's splits keep the programs within
    one wave where that is cheaper: gpu/ragged-trees' contexts (4096, 100, 2000, 3000, 777, 1, 2048 under
    40-node trees, 8 KV heads) on 132 SMs take chunks of 17 tiles (112 programs), where counting work took 13
    (144 programs: a second wave); 8 x 40 trees at 4k keep 2 splits (128 programs)."""
    import numpy as np

    from attnbench.backends import triton_plan as tp
    from attnbench.backends import triton_step as ts

    ragged = np.array([65, 3, 33, 48, 13, 1, 33])
    assert tp.large_chunk(ragged, 65, 132, 8) == 13 and ts.wave_chunk(np.bincount(ragged), 132, 8) == 17
    assert ts.wave_chunk(np.bincount([65] * 8), 132, 8) == 33
    monkeypatch.setattr(tree, "wanted", lambda batch: True)
    monkeypatch.setattr(tp, "num_sms", lambda device: 132)
    parents = (-1,) + tuple(range(39))
    b = materialize(BatchSpec(tuple(Request("tree", 40, c, parents) for c in (4096, 100, 2000, 3000, 777, 1, 2048)),
                              32, 8, 128, dtype="float16", page_size=16), 1)
    p = TritonBackend(tree="gluon").plan(b)
    assert p.units.shape[0] * 8 == 112
    assert TritonBackend(tree="").plan(b).units.shape[0] > 14  # the one-launch kernel's rule, unchanged


def test_a_plan_the_kernel_fits_is_run_by_it(monkeypatch):
    """The plan decides once whether the Gluon tree kernel runs it (fit passing: the row's 'ran as' names the
    kernel) and run launches it then, not the one-launch kernel (here fit and the launch are stand-ins: Gluon
    has no interpreter); a plan fit refuses runs the one-launch kernel and matches the reference."""
    calls = []
    monkeypatch.setattr(tree, "hopper", lambda device: True)
    b = _trees(300, 0, dtype="float32", d=32)
    monkeypatch.setattr(tree, "fit", lambda p: "")
    monkeypatch.setattr(tree, "run", lambda p: calls.append(p) or True)
    be = TritonBackend(tree="gluon")
    p = be.plan(b)
    assert p.gluon_tree and p.mode.endswith("gluon tree kernel")
    assert be.run(p) is p.out and calls == [p]
    monkeypatch.setattr(tree, "fit", lambda p: "not here")
    be.forget_shapes()  # (the route is worked out once per step shape: test_the_route_is_worked_out_once_...)
    p = be.plan(b)
    assert not p.gluon_tree and "shipped kernel, not Gluon's tree kernel" in p.mode
    assert compare(be.run(p), reference_attention(b)[0])[0] < 1e-4 and len(calls) == 1


def test_the_route_is_worked_out_once_per_step_shape_and_cache_layout(monkeypatch):
    """The route notes (which kernel runs the plan, or why not Gluon's) are the step shape's and the cache
    layout's: later steps of the shape (other tensors, the same layout) reuse them and run what the first
    ran; a q of other strides works them out again, and so does a new shape."""
    monkeypatch.setattr(tree, "hopper", lambda device: True)
    monkeypatch.setattr(tree, "run", lambda p: True)
    real, seen = tree.route_note, []
    monkeypatch.setattr(tree, "route_note", lambda p: seen.append(p) or real(p))
    be = TritonBackend(tree="gluon")
    b = _trees(300, 0, dtype="bfloat16", d=64)
    first = be.plan(b)
    assert first.gluon_tree and first.mode.endswith(tree.RAN)
    for seed in (2, 3):
        p = be.plan(materialize(b.spec, seed))
        assert (p.gluon_tree, p.mode) == (first.gluon_tree, first.mode)
    assert len(seen) == 1
    strided = torch.empty(b.q.shape[0], b.q.shape[2], b.q.shape[1], dtype=b.q.dtype).transpose(1, 2)
    strided.copy_(b.q)  # the same values, its head dim not contiguous: fit refuses it
    p = be.plan(dataclasses.replace(b, q=strided))
    assert len(seen) == 2 and not p.gluon_tree and "last dimension contiguous" in p.mode
    assert be.plan(b).gluon_tree and len(seen) == 2
    be.plan(_trees(300, 20, dtype="bfloat16", d=64))  # another shape (two requests)
    assert len(seen) == 3


@pytest.mark.slow
@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_fit_takes_an_fp8_plan_and_refuses_its_variants(monkeypatch, kv):
    """FP8 caches (tree round 2): fit passes an FP8 plan of a tree batch (the FP8 flag is no variant) and still
    refuses one with a window; the CPU fallback of the shaped plan matches the reference."""
    monkeypatch.setattr(tree, "hopper", lambda device: True)
    b = _trees(300, 77, kv_dtype=kv, dtype="bfloat16")
    p = TritonBackend(tree="gluon").plan(b)
    assert p.feat.fp8 and tree.fit(p) == ""
    assert (p.cfg.block_m, p.cfg.block_n) == (64, 64)
    assert "no attention variant" in tree.fit(TritonBackend(tree="gluon").plan(_trees(300, kv_dtype=kv, window=40)))
    monkeypatch.setattr(tree, "hopper", lambda device: False)  # the run below: the one-launch kernel on the CPU
    assert compare(TritonBackend(tree="gluon").run(TritonBackend(tree="gluon").plan(b)),
                   reference_attention(b)[0])[0] < 3e-2


@pytest.mark.parametrize("order", ["NHD", "HND"])
def test_fits_cache_check_agrees_with_the_launchs_view(order):
    """fit's stride check (no view made at plan time) takes exactly the caches the launch's 2-d view takes."""
    from attnbench.backends.triton_prefill_gluon import kv_view

    b = _trees(100, kv_order=order, page_size=64)
    for t in (b.k_cache, b.v_cache, b.k_cache[:, :32], b.v_cache[..., :64]):
        assert tree.kv_ok(t) == (kv_view(t) is not None)
    assert tree.kv_ok(b.k_cache)


@pytest.mark.slow
def test_decodes_alone_are_taken_only_as_the_decodes_setting_says(monkeypatch):
    """DECODES (variants triton-dec-f8 / triton-dec-gl, tree round 2): batches of decodes alone stay with the
    one-launch kernel by default ("no tree"); "fp8" takes them on FP8 caches, "all" on any; a batch with a
    longer query never."""
    monkeypatch.setattr(tree, "hopper", lambda device: True)

    def decodes(kv=None, q=1):
        kind = "decode" if q == 1 else "prefill"
        return materialize(BatchSpec(tuple(Request(kind, q, c) for c in (4000, 17)), 32, 8, 128, dtype="bfloat16",
                                     page_size=16, kv_dtype=kv), 1)

    assert tree.unwanted(decodes("fp8_e4m3")) == "no tree"
    monkeypatch.setattr(tree, "DECODES", "fp8")
    assert tree.wanted(decodes("fp8_e4m3")) and tree.unwanted(decodes()) == "no tree"
    monkeypatch.setattr(tree, "DECODES", "all")
    assert tree.wanted(decodes()) and tree.unwanted(decodes("fp8_e4m3", q=5)) == "no tree"
    p = TritonBackend(tree="gluon").plan(decodes())
    assert tree.warpgroups(p) == 1 and (p.cfg.block_m, p.cfg.block_n) == (16, 64)


def test_fp8_staging_slots_fill_the_shared_memory_budget(monkeypatch):
    """FP8 launches get as many 16 KB staging slots (head dim 128) as FP8_SMEM holds beside Q (16 KB a
    warpgroup) and the ring (32 KB a slot): 3 for a 3-warpgroup tree with 3 ring slots (192 KB in all; the
    sm_90 build, with its scratch, 221 KB of 227), 5 with 2 ring slots, 7 for one warpgroup, 15 (8 KB each) at
    head dim 64; a set STAGES8 wins."""
    assert tree.staging_slots(3, 128) == 3 and tree.staging_slots(1, 128) == 5 and tree.staging_slots(3, 64) == 15
    monkeypatch.setattr(tree, "STAGES_FP8", 2)
    assert tree.staging_slots(3, 128) == 5 and tree.staging_slots(1, 128) == 7
    monkeypatch.setattr(tree, "STAGES8", 4)
    assert tree.staging_slots(1, 128) == 4
