"""The triton backend's defaults after issue 33's defaults round (the kernel notes in git history (triton_notes.md)), on the
CPU under Triton's interpreter: what ``TritonBackend()`` now does by default, against the
float64 reference on random batches (decodes, trees, prefills, chunked prefills, odd lengths,
shuffled pages of 1-256 slots, float16/float32, FP8 e4m3/e5m2 caches with per-tensor and
per-head scales):

- prefill batches without trees or variants take the prefill route (on a Hopper GPU the gluon-prefill
  route where it takes the batch; here, on the CPU, the Triton prefill kernel); decode-only batches,
  trees and variants keep the paged route;
- FP8 decode configs (row blocks <= 32 rows) read V as int16 words (``V_WORDS``); the tree
  config does not;
- decode splits count bytes in flight: an FP8 cache gets twice the 16-bit programs target,
  16-bit and wider caches split exactly as before;
- MLA decodes and trees of more than 64 heads run 128-row units with two value programs
  (waves 1 on decodes, 2 with a tree); 16-head and prefill batches keep round 1's config.

``route=paged`` keeps the one-launch kernel reachable; the GPU test at the end runs the same defaults
compiled. Behaviour only, never timings.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from attnbench.kernels.paged.launch import v_words
from attnbench.kernels.shared import plan as tp
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention
from attnbench.workload.trees import chain, from_choices, random_tree

from .interpreted import import_interpreted
from .test_triton_backend import CHOICES, TOL, TritonBackend, need_interpreter, tree

ROOT = Path(__file__).resolve().parent.parent
_pk, _mk = import_interpreted("attnbench.kernels.prefill.kernels", "attnbench.kernels.mla.kernels")
from attnbench.kernels.mla import plan as triton_mla  # noqa: E402
from .interpreted import interpret_on_cpu  # noqa: F401 (an autouse fixture)

FP8_TOL = 3e-3


def run(be, batch):
    """Plan, run (the output poisoned first: every element must be written), compare."""
    need_interpreter()
    plan = be.plan(batch)
    plan.out.fill_(float("nan"))
    out = be.run(plan)
    return compare(out, reference_attention(batch)[0])[0], plan


def _decodes(kv_dtype, ctx=(4100, 4100), d=128, dtype="float16"):
    spec = BatchSpec(tuple(Request("decode", 1, c) for c in ctx), 4, 1, d, dtype=dtype, page_size=16,
                     layout="shuffled", kv_dtype=kv_dtype)
    return materialize(spec, 0)


def _nsplit(be, batch):
    plan = be.plan(batch)
    return plan.units[:, tp.COL["nsplit"]].numpy(), plan.cfg


def test_split_rule_gives_fp8_twice_the_programs_and_keeps_bf16():
    """The same batch (2 decodes of 4k on the CPU's 4 SMs): the 16-bit cache's 4 splits per row
    block are the old rule's (WAVES x SMs programs), the FP8 cache's 8 (2x the programs, as 2x
    fewer bytes per key); ``fp8_split=1`` (choose_config's argument) gives FP8 the 16-bit plan."""
    half, fp8 = _decodes(None), _decodes("fp8_e4m3")
    n16, cfg16 = _nsplit(TritonBackend(), half)
    n8, cfg8 = _nsplit(TritonBackend(), fp8)
    assert cfg16.wave_scale == 1.0 and cfg8.wave_scale == 1.9 and cfg16.block_nf == cfg8.block_nf == 64
    tiles = np.full(2, -(-4101 // 64))
    old = -(-tiles // max(tp.MIN_CHUNK_TILES, -(-int(tiles.sum()) // (tp.WAVES * tp.CPU_SMS))))  # the rule before
    assert set(n16) == set(old) == {4} and set(n8) == {8}
    for fp8_split, want in ((1, 4), (4, 13)):  # 4: chunks of 5 of the 65 tiles
        cfg = tp.choose_config(fp8, fp8_split=fp8_split)
        assert set(tp.build_units(fp8, cfg, tp.CPU_SMS)[0][:, tp.COL["nsplit"]].numpy()) == {want}
    assert tp.choose_config(half, fp8_split=1) == cfg16  # bf16/fp16: the same plan either way
    # the same rule through the reference construction (build_units) and the fast path (triton_step)
    for batch, cfg, n in ((half, cfg16, n16), (fp8, cfg8, n8)):
        units, _, smax, _ = tp.build_units(batch, cfg, tp.CPU_SMS)
        assert smax == n.max() and (units[:, tp.COL["nsplit"]].numpy() == n).all()


def test_split_rule_at_the_gpu_sizes():
    """On 132 SMs (H100/H200), 8 KV heads: 8 x 16k decodes (16385 keys: 257 tiles of 64) split 5
    ways on bf16 (as before) and 8 on FP8 (512 programs, one wave: 93.2 us on an H200 where the
    unrounded 2x rule's 9 measured 120.1 and 5 splits 111.7); a 16-bit cache is split as before and an FP8 one never less, at every size of the
    GPU round; float32 caches keep the 16-bit rule."""
    c16, c8 = (tp.choose_config(_decodes(k, ctx=(2100,))) for k in (None, "fp8_e4m3"))
    assert tp.choose_config(_decodes(None, ctx=(2100,), dtype="float32")).wave_scale == 1.0

    def splits(cfg, b, ctx):
        t = np.full(b, -(-(ctx + 1) // cfg.block_nf))
        return int(tp.split_counts(t, np.full(b, 4), cfg, 128, 132, 8).max())

    assert (splits(c16, 8, 16384), splits(c8, 8, 16384)) == (5, 8)
    c8x1 = tp.choose_config(_decodes("fp8_e4m3", ctx=(2100,)), fp8_split=2)  # triton-f8s-x1: the unrounded ratio
    assert splits(c8x1, 8, 16384) == 9
    old = tp.Config(c16.block_m, c16.block_q, c16.block_n, c16.num_warps, c16.num_stages, c16.block_nf)
    for b, ctx in ((32, 4096), (16, 8192), (4, 32768), (64, 2048), (1, 1 << 17)):
        assert splits(c16, b, ctx) == splits(old, b, ctx) <= splits(c8, b, ctx), (b, ctx)


def _random_requests(rng: random.Random, kind: str) -> tuple:
    reqs = []
    for _ in range(rng.randint(2, 4)):
        k = rng.choice(["decode", "prefill", "tree"] if kind == "mixed" else [kind])
        ctx = rng.choice([0, 1, rng.randint(2, 300)])
        if k == "decode":
            reqs.append(Request("decode", 1, ctx))
        elif k == "prefill":
            reqs.append(Request("prefill", rng.randint(2, 45), ctx))
        else:
            p = random_tree({"nodes": rng.randint(1, 20), "max_depth": 4, "max_children": 3, "seed": rng.randint(0, 99)})
            reqs.append(tree(tuple(p), ctx))
    if kind == "prefill":
        reqs.append(Request("decode", 1, rng.randint(0, 200)))  # a decode beside the prefills
    return tuple(reqs)


CASES = [(seed, kind, kv) for seed, (kind, kv) in enumerate(
    [(k, kv) for k in ("decode", "prefill", "tree", "mixed") for kv in (None, "fp8_e4m3", "fp8_e5m2")] * 2)]


@pytest.mark.slow
@pytest.mark.parametrize("seed,kind,kv_dtype", CASES)
def test_defaults_on_random_batches(seed, kind, kv_dtype):
    """Random decodes / prefills / trees / mixes at odd lengths, pages 1-256 shuffled, through
    ``TritonBackend()``; which route ran follows the batch."""
    rng = random.Random(seed)
    reqs = _random_requests(rng, kind)
    hkv = rng.choice([1, 2])
    dtype = "float16" if kv_dtype else rng.choice(["float16", "float32"])  # FP8 caches take 16-bit queries
    page = rng.choice([1, 3, 16, 256])
    spec = BatchSpec(reqs, hkv * rng.choice([1, 4]), hkv, rng.choice([32, 64]), dtype=dtype, page_size=page,
                     layout="shuffled", kv_dtype=kv_dtype, kv_scale=rng.choice(["per-tensor", "per-head"]))
    be = TritonBackend()
    rel, plan = run(be, materialize(spec, seed))
    assert rel < (FP8_TOL if kv_dtype else TOL[dtype]), f"{kind} {kv_dtype} {dtype} page {page}: rel err {rel}"
    prefill = any(r.kind == "prefill" for r in reqs) and not plan.has_tree and not kv_dtype
    assert plan.route.name == ("prefill" if prefill else "paged")
    assert bool(v_words(plan.cfg, plan.batch, bool(kv_dtype), True)) == (bool(kv_dtype) and plan.cfg.block_m <= 32)


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_v_words_cvt_falls_back_to_the_shifts_in_the_interpreter_and_matches(kv_dtype):
    """On the CPU (the interpreter) the decode config's words are split by shifts and match the reference at odd
    lengths on shuffled pages (the cvt path itself runs in test_gpu_triton_defaults)."""
    need_interpreter()
    reqs = (Request("decode", 1, 1000), Request("decode", 1, 333), Request("decode", 1, 5))
    spec = BatchSpec(reqs, 4, 2, 32, dtype="float16", page_size=16, layout="shuffled", kv_dtype=kv_dtype,
                     kv_scale="per-head")
    rel, plan = run(TritonBackend(), materialize(spec, 7))
    assert rel < FP8_TOL and plan.cfg.block_m <= 32


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype,kv_scale,page", [("fp8_e4m3", "per-head", 16), ("fp8_e5m2", "per-tensor", 3)])
def test_fp8_decodes_take_v_words_and_more_splits(kv_dtype, kv_scale, page):
    """FP8 decodes at odd lengths, split by the FP8 rule (more splits than the same batch on a
    float16 cache), V read as words: right, and the tree config beside them stays byte-wise."""
    need_interpreter()
    reqs = (Request("decode", 1, 1000), Request("decode", 1, 333), Request("decode", 1, 5))
    spec = BatchSpec(reqs, 4, 2, 32, dtype="float16", page_size=page, layout="shuffled", kv_dtype=kv_dtype,
                     kv_scale=kv_scale)
    be = TritonBackend()
    rel, plan = run(be, materialize(spec, page))
    assert rel < FP8_TOL, f"{kv_dtype} page {page}: rel err {rel}"
    assert plan.cfg.block_m <= 32 and v_words(plan.cfg, plan.batch, True, True) and plan.num_merge > 0
    half = materialize(BatchSpec(reqs, 4, 2, 32, dtype="float16", page_size=page, layout="shuffled"), page)
    assert plan.units.shape[0] > TritonBackend().plan(half).units.shape[0]
    t = (tree(from_choices(CHOICES), 50),)  # G 8 x 5 nodes: 40 rows, a 64-row block
    tree_spec = BatchSpec(t, 16, 2, 32, dtype="float16", page_size=page, kv_dtype=kv_dtype, kv_scale=kv_scale)
    rel, plan = run(be, materialize(tree_spec, 1))
    assert rel < FP8_TOL and plan.cfg.block_m > 32 and not v_words(plan.cfg, plan.batch, True, True)


@pytest.mark.slow
@pytest.mark.parametrize("page", [16, 256])
def test_prefills_take_the_prefill_route_and_route_paged_does_not(page):
    """A fresh and a chunked prefill (odd lengths) and a decode beside them: auto runs the prefill route (on the
    CPU: the Triton prefill kernel), route=paged the one-launch kernel; a decode-only batch never takes the
    prefill route."""
    need_interpreter()
    reqs = (Request("prefill", 45, 0), Request("prefill", 19, 37), Request("decode", 1, 70))
    batch = materialize(BatchSpec(reqs, 8, 2, 32, dtype="float16", page_size=page, layout="shuffled"), page)
    for be, want in ((TritonBackend(), "prefill"), (TritonBackend(route="paged"), "paged")):
        rel, plan = run(be, batch)
        assert rel < TOL["float16"] and plan.route.name == want, (want, rel)
    decodes = materialize(BatchSpec((Request("decode", 1, 70), Request("decode", 1, 3)), 8, 2, 32,
                                    dtype="float16", page_size=page), 1)
    rel, plan = run(TritonBackend(), decodes)
    assert rel < TOL["float16"] and plan.route.name == "paged"


def _mla(hq, reqs, seed=0):
    spec = BatchSpec(tuple(reqs), hq, 1, 48, "float16", 16, "shuffled", attention="mla", kv_lora_rank=32, rope_dim=16)
    return materialize(spec, seed)


MLA_TREE = tuple(from_choices([[0], [1], [0, 0], [0, 1]]))


@pytest.mark.slow
@pytest.mark.parametrize("reqs,waves", [
    ((Request("decode", 1, 301), Request("decode", 1, 3), Request("decode", 1, 64)), 1),
    ((Request("tree", 3, 130, tuple(chain(2))), Request("tree", len(MLA_TREE), 45, MLA_TREE),
      Request("decode", 1, 77)), 2),
], ids=["decodes", "trees"])
def test_mla_over_64_heads_takes_128_row_units(reqs, waves):
    """128 heads (one token fills a 128-row unit): decodes with waves 1, a batch with trees
    with waves 2, two value programs, right at odd lengths."""
    be = TritonBackend()
    rel, plan = run(be, _mla(128, reqs, waves))
    assert rel < TOL["float16"], f"rel err {rel}"
    assert (plan.cfg.block_m, plan.cfg.value_chunks, plan.cfg.tail_stages, plan.cfg.waves) == (128, 2, 1, waves)


def test_mla_rule_leaves_16_heads_and_prefills():
    """Plan only: 16 heads (decodes, an MTP chain) and a 128-head batch with a prefill keep
    ``choose_config``'s own config."""
    chains = [Request("decode", 1, 300), Request("tree", 3, 130, tuple(chain(2)))]
    for batch in (_mla(16, chains), _mla(128, chains + [Request("prefill", 3, 9)])):
        assert triton_mla.default_config(batch) == {}
        assert TritonBackend().plan(batch).cfg == triton_mla.choose_config(batch)
    assert triton_mla.default_config(_mla(128, chains)) == dict(triton_mla.WIDE, waves=2)


GPU_SCRIPT = textwrap.dedent(
    """
    import torch
    from attnbench.workload.batch import BatchSpec, Request, materialize
    from attnbench.workload.reference import compare, reference_attention
    from attnbench.workload.trees import chain, full
    from attnbench.backends.triton import TritonBackend
    from attnbench.kernels.paged.launch import v_words
    t40 = tuple(full({"depth": 3, "branching": 3}))
    worst = {}
    def check(name, spec, tol, **kw):
        b = materialize(spec, 1, "cuda")
        be = TritonBackend(**kw)
        assert be.reasons(b) == [], be.reasons(b)
        plan = be.plan(b)
        rel = compare(be.run(plan), reference_attention(b)[0])[0]
        worst[name] = max(worst.get(name, 0.0), rel)
        assert rel < tol, (name, spec, rel)
        return be, plan
    for kv, tree_scale in (("fp8_e4m3", "per-head"), ("fp8_e5m2", "per-tensor")):
        for page, win, scale in ((1, None, "per-tensor"), (16, 1000, "per-head"), (256, None, "per-head")):
            reqs = tuple(Request("decode", 1, c) for c in (2047, 4100, 9000, 17, 3000))
            be, plan = check("fp8 decode", BatchSpec(reqs, 32, 8, 128, "bfloat16", page, kv_dtype=kv,
                                                     kv_scale=scale, window=win), 3e-2)
            assert plan.cfg.block_m <= 32 and v_words(plan.cfg, plan.batch, True, False) and plan.cfg.wave_scale == 1.9
        reqs = tuple(Request("tree", len(t40), c, t40) for c in (1000, 4000)) + (Request("decode", 1, 5000),)
        be, plan = check("fp8 tree", BatchSpec(reqs, 32, 8, 128, "bfloat16", 16, kv_dtype=kv, kv_scale=tree_scale),
                         3e-2)
        assert not v_words(plan.cfg, plan.batch, True, False)
        for d, page in ((128, 16), (64, 1), (256, 256)):  # the cvt words on the paged route
            reqs = tuple(Request("decode", 1, c) for c in (2047, 4100, 17))
            be, plan = check("fp8 decode cvt", BatchSpec(reqs, 32, 8, d, "bfloat16", page, kv_dtype=kv,
                                                         kv_scale="per-head"), 3e-2, route="paged")
            assert v_words(plan.cfg, plan.batch, True, False) == 2
    for d in (64, 96, 256):
        check("fp8 head dims", BatchSpec((Request("decode", 1, 3333), Request("decode", 1, 70)), 16, 4, d,
                                         "float16", 16, kv_dtype="fp8_e4m3", kv_scale="per-head"), 3e-2)
    for page in (1, 16, 256):
        for ctx in (0, 3000):
            reqs = (Request("prefill", 1024, ctx), Request("prefill", 333, ctx + 17), Request("decode", 1, 500))
            be, plan = check("prefill", BatchSpec(reqs, 32, 8, 128, "bfloat16", page), 1e-2)
            assert plan.route.name == "prefill", plan.mode  # (a decode beside: auto leaves gluon-prefill)
    for hq in (128, 16):
        for reqs in ([Request("decode", 1, c) for c in (16384, 5000, 77)],
                     [Request("tree", 3, c, tuple(chain(2))) for c in (16384, 3000)] + [Request("tree", len(t40), 2000, t40)]):
            be, plan = check(f"mla {hq}", BatchSpec(tuple(reqs), hq, 1, 576, "bfloat16", 64, attention="mla",
                                                   kv_lora_rank=512, rope_dim=64), 1.5e-2)
            decodes = all(r.kind == "decode" for r in reqs)  # the Gluon MLA kernel's (thirteenth session)
            assert (plan.route.name == "gluon-mla") == decodes and (plan.cfg.block_m == 128) == (hq == 128 and not decodes), plan.cfg
    print("WORST", worst)
    """
)


@pytest.mark.gpu
def test_gpu_triton_defaults():
    """The defaults compiled on a GPU (~24 kernels to compile): FP8 decodes (v_words, the FP8
    split rule; e4m3/e5m2, per-tensor/per-head scales, pages 1/16/256, a window, head dims
    64/96/256; the cvt words on the paged route), FP8 trees, the
    prefill kernel on 4 x 1k-like prefills at pages 1/16/256 with and without context, MLA
    decodes (the Gluon MLA kernel) and trees at 128 heads (128-row units) and 16 (unchanged). The FP8 decodes' word
    paths run on the paged route (``route="paged"``); auto's (the Gluon decode kernel where it takes the batch:
    tests/test_gluon_decode_gpu.py) runs the first ones."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", GPU_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "WORST" in res.stdout
