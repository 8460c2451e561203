"""The ``triton`` backend against the float64 reference.

CPU: the kernels run under Triton's interpreter. ``triton.jit`` reads TRITON_INTERPRET when
the kernel module is imported, so this module imports it with the variable set, restores the
environment, and sets the variable again (monkeypatch) only while its own tests run.
float32 and float16 only: bfloat16 ``tl.dot`` is wrong in the interpreter (the kernel notes in git history (triton_notes.md)).
GPU (``-m gpu``): compiled kernels, bfloat16 included, in a subprocess without the interpreter.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from .interpreted import import_interpreted

# the kernels interpreted on a CPU machine (tests/interpreted.py says why and when)
triton_kernels, _paged = import_interpreted("attnbench.kernels.paged.kernels", "attnbench.backends.triton")
TritonBackend, triton_mode = _paged.TritonBackend, _paged.triton_mode

from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402
from attnbench.workload.reference import compare, reference_attention  # noqa: E402
from attnbench.workload.trees import chain, from_choices, random_tree  # noqa: E402
from .interpreted import interpret_on_cpu  # noqa: F401 (an autouse fixture)

# True when this process imported triton before this module (compiled mode): the CPU tests
# then run in a fresh subprocess (test_cpu_in_fresh_process) instead of here.
INTERPRETED = triton_kernels.INTERPRETED and triton_mode() == "interpreted"
TOL = {"float32": 1e-4, "float16": 3e-3}
CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0]]


def tree(parents, context):
    return Request("tree", len(parents), context, tuple(parents))


def need_interpreter():
    if not INTERPRETED:
        pytest.skip("triton was imported compiled in this process: see test_cpu_in_fresh_process")


def check(reqs, *, hq=4, hkv=2, d=32, dtype="float32", page=3, layout="shuffled", seed=0, **backend_kw):
    need_interpreter()
    spec = BatchSpec(tuple(reqs), hq, hkv, d, dtype=dtype, page_size=page, layout=layout)
    batch = materialize(spec, seed)
    be = TritonBackend(**backend_kw)
    assert be.reasons(batch) == []
    plan = be.plan(batch)
    plan.out.fill_(float("nan"))  # poison: every element must be written
    out = be.run(plan)
    assert out.shape == batch.q.shape and out.dtype == batch.q.dtype
    ref, _ = reference_attention(batch)
    rel, _ = compare(out, ref)
    assert rel < TOL[dtype], f"rel err {rel}"
    return out, plan


# (name, requests, page, layout)
CASES = [
    ("decode", [Request("decode", 1, c) for c in (0, 16, 32, 70)], 16, "shuffled"),
    ("prefill", [Request("prefill", q, 0) for q in (1, 17, 33)], 3, "reversed"),
    ("chunked", [Request("prefill", 9, 40), Request("prefill", 20, 13)], 1, "interleaved"),
    ("tree-choices", [tree(from_choices(CHOICES), 10), tree(from_choices(CHOICES), 0)], 3, "shuffled"),
    ("tree-random70", [tree(random_tree({"nodes": 70, "max_depth": 6, "max_children": 4, "seed": 3}), 17)], 16,
     "shuffled-within"),
    ("tree-chain", [tree(chain(8), 33)], 1, "contiguous"),
    # dynamic trees (rebuilt every plan by pointer doubling): two shapes, one past 64 nodes
    ("tree-dynamic", [Request("tree", len(p), c, tuple(p), True) for p, c in (
        (random_tree({"nodes": 67, "max_depth": 9, "max_children": 3, "seed": 5}), 20),
        (random_tree({"nodes": 12, "max_depth": 4, "max_children": 3, "seed": 6}), 0))] + [Request("decode", 1, 9)],
     16, "shuffled"),
    ("mixed", [Request("prefill", 12, 0), Request("decode", 1, 40), tree(from_choices(CHOICES), 25),
               Request("prefill", 5, 11), Request("decode", 1, 0)], 3, "interleaved"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,reqs,page,layout", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cases(name, reqs, page, layout, dtype):
    check(reqs, dtype=dtype, page=page, layout=layout)


def shared_reqs():
    """A decode group sharing 2 whole pages and a copied partial one (page 3: 7 of 11 tokens),
    a tree group sharing its whole context, and a request of its own between them."""
    t = tuple(from_choices(CHOICES))
    return ([Request("decode", 1, 11, shared_prefix=7, prefix_group=0)] * 3 + [Request("prefill", 4, 9)]
            + [Request("tree", len(t), 9, t, shared_prefix=9, prefix_group=2)] * 2)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["contiguous", "shuffled", "shuffled-within", "reversed", "interleaved"])
def test_shared_prefix_pages(layout):
    check(shared_reqs(), page=3, layout=layout)
    check(shared_reqs(), page=3, layout=layout, splits=3, block_n=16)


@pytest.mark.slow
@pytest.mark.parametrize("name,reqs,page,layout", CASES, ids=[c[0] for c in CASES])
def test_split_kv(name, reqs, page, layout):
    """Small key tiles and forced splits: the partial + LSE merge path, empty splits included."""
    _, plan = check(reqs, page=page, layout=layout, splits=3, block_n=16)
    if any(r.kv_len > 16 for r in reqs):
        assert plan.num_merge > 0


@pytest.mark.slow
@pytest.mark.parametrize("page,block_n", [(16, 16), (32, 16), (256, 64), (24, 16), (512, 64), (1024, 32)])
def test_tile_in_page(page, block_n):
    """Pages holding whole key tiles (one block-table read per tile) and pages that do not; pages
    past 256 slots (512 came up in held-out random batches on an H200, where triton refused them)."""
    reqs = [Request("decode", 1, 1300), tree(from_choices(CHOICES), 600), Request("prefill", 20, 50)]
    check(reqs, page=page, block_n=block_n, dtype="float16", splits=2)


@pytest.mark.slow
@pytest.mark.parametrize("name,reqs,page,layout", CASES, ids=[c[0] for c in CASES])
def test_small_row_blocks(name, reqs, page, layout):
    """Several row blocks per request (BLOCK_Q = 16 // G = 8 tokens): the causal bound must
    use each token's index within its request, not within its block."""
    _, plan = check(reqs, page=page, layout=layout, block_m=16, block_n=16, dtype="float16")
    assert plan.cfg.block_q == 8


@pytest.mark.slow
@pytest.mark.parametrize("page", [16, 3])
def test_wide_unmasked_tiles(page):
    """block_nf: the unmasked loop steps 32 keys, the masked one 16; splits start on 32."""
    reqs = [Request("decode", 1, 150), tree(from_choices(CHOICES), 70), Request("prefill", 20, 50)]
    _, plan = check(reqs, page=page, block_n=16, block_nf=32, dtype="float16", splits=2)
    assert plan.cfg.block_nf == 32 and (plan.units[:, 4] % 32 == 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("hq,hkv", [(2, 2), (8, 2), (6, 2)])
def test_gqa_groups(hq, hkv):
    reqs = [Request("decode", 1, 29), tree(from_choices(CHOICES), 7), Request("prefill", 6, 3)]
    check(reqs, hq=hq, hkv=hkv, page=16, dtype="float16")


@pytest.mark.parametrize("d", [64, 128])
def test_head_dims(d):
    check([Request("decode", 1, 20), tree(from_choices(CHOICES), 5)], d=d, hq=2, hkv=1, page=16)


def test_heuristic_splits_long_decode():
    """The default plan splits a long decode on the CPU's pretend 4 SMs."""
    _, plan = check([Request("decode", 1, 600)], hq=4, hkv=1, page=16, block_n=16)
    assert plan.num_merge == 1 and plan.po.shape[0] > 1


def test_chain_tree_equals_prefill():
    need_interpreter()
    parents = chain(6)
    a = materialize(BatchSpec((tree(parents, 21),), 4, 2, 32, dtype="float32", page_size=3), 5)
    b = materialize(BatchSpec((Request("prefill", 7, 21),), 4, 2, 32, dtype="float32", page_size=3), 5)
    be = TritonBackend()
    oa, ob = be.run(be.plan(a)), be.run(be.plan(b))
    assert torch.allclose(oa, ob, atol=1e-5)


def test_refusals(monkeypatch):
    need_interpreter()
    be = TritonBackend()
    bf = materialize(BatchSpec((Request("decode", 1, 4),), 2, 1, 32, dtype="bfloat16"), 0)
    assert any("bfloat16" in r for r in be.reasons(bf))
    odd = materialize(BatchSpec((Request("decode", 1, 4),), 2, 1, 48, dtype="float32"), 0)
    assert any("head_dim" in r for r in be.reasons(odd))
    gqa = materialize(BatchSpec((Request("decode", 1, 4),), 3, 2, 32, dtype="float32"), 0)
    assert any("multiple" in r for r in be.reasons(gqa))
    monkeypatch.delenv("TRITON_INTERPRET")
    ok = materialize(BatchSpec((Request("decode", 1, 4),), 2, 1, 32, dtype="float32"), 0)
    assert any("TRITON_INTERPRET=1" in r for r in be.reasons(ok))


def test_cpu_in_fresh_process():
    """If another module imported triton first (compiled), run this file's CPU tests afresh."""
    if INTERPRETED:
        return
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                         env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]


GPU_SCRIPT = textwrap.dedent(
    """
    import torch
    from attnbench.workload.batch import BatchSpec, Request, materialize
    from attnbench.workload.reference import compare, reference_attention
    from attnbench.workload.trees import from_choices, full, random_tree
    from attnbench.backends.triton import TritonBackend
    t40 = tuple(full({"depth": 3, "branching": 3}))
    t70 = tuple(random_tree({"nodes": 70, "max_depth": 8, "max_children": 4, "seed": 1}))
    cases = [
        [Request("decode", 1, c) for c in (1000, 2047, 17, 4096)],
        [Request("tree", len(t40), c, t40) for c in (1000, 3000)] + [Request("tree", 70, 500, t70)],
        [Request("prefill", 300, 0), Request("prefill", 100, 700)],
        [Request("prefill", 64, 0), Request("decode", 1, 900), Request("tree", len(t40), 1500, t40)],
    ]
    worst = 0.0
    for dtype in ("bfloat16", "float16"):
        for page in (1, 16, 256):
            for reqs in cases:
                b = materialize(BatchSpec(tuple(reqs), 32, 8, 128, dtype=dtype, page_size=page), 1, "cuda")
                be = TritonBackend()
                assert be.reasons(b) == [], be.reasons(b)
                out = be.run(be.plan(b))
                rel, _ = compare(out, reference_attention(b)[0])
                worst = max(worst, rel)
                assert rel < 1e-2, (dtype, page, reqs, rel)
    print("WORST", worst)
    """
)


@pytest.mark.gpu
def test_gpu_bf16():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", GPU_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "WORST" in res.stdout


def test_programs_per_sm():
    """Shared memory and registers decide how many programs share an SM (H100/H200)."""
    from attnbench.kernels.shared import plan as tp

    assert tp.ctas_per_sm(tp.Config(64, 16, 64, 4, 3), 128) == 2  # 112 KB of smem, 255 registers
    assert tp.ctas_per_sm(tp.Config(64, 16, 32, 4, 3, 32, 168), 128) == 3  # 64 KB, 168 registers
    assert tp.ctas_per_sm(tp.Config(128, 32, 64, 8, 3), 128) == 1
    assert tp.ctas_per_sm(tp.Config(64, 16, 64, 4, 4), 128) == 1  # 144 KB


def test_split_counts_latency_model():
    """Large row blocks: split only where fewer rounds of shorter programs win (long uniform
    trees), never for short trees or a causal prefill; decode keeps its 2-wave chunks."""
    import math

    from attnbench.kernels.shared import plan as tp

    cfg = tp.Config(64, 16, 64, 4, 3)
    tree = lambda ctx: tp.split_counts([math.ceil((ctx + 40) / 64)] * 24, [160] * 24, cfg, 128, 132, 8)
    assert set(tree(1024)) == {1} and set(tree(4096)) == {1} and set(tree(16384)) == {4}
    three = tp.Config(64, 16, 32, 4, 3, 32, 168)  # 3 programs per SM: 2 splits fill them at 4k
    assert set(tp.split_counts([math.ceil(4136 / 32)] * 24, [160] * 24, three, 128, 132, 8)) == {2}
    prefill = [math.ceil((q0 + 32) / 64) for _ in range(4) for q0 in range(0, 1024, 32)]
    assert set(tp.split_counts(prefill, [128] * 128, tp.Config(128, 32, 64, 8, 3), 128, 132, 8)) == {1}
    assert set(tp.split_counts([128] * 8, [4] * 8, tp.Config(16, 4, 32, 4, 3), 128, 132, 8)) == {4}


def test_interpreted_rows_say_so():
    """Under TRITON_INTERPRET=1 the plan's mode (copied into each row) names the interpreter."""
    _, plan = check([Request("decode", 1, 20)])
    assert plan.mode.startswith("interpreted")
