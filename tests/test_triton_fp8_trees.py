"""Issue 33's FP8 trees round 1 (docs/triton_notes.md): ``TritonBackend(kv_a=...)`` computes the
tree config's dots with the FP8 tile as the A operand (S^T = K Q^T for "k", O^T = V^T P^T for "v"),
so the converted tile is fed from registers instead of going through shared memory a second time.
Under Triton's interpreter, against the float64 reference: random trees (odd sizes, odd
contexts, shuffled pages 1/3/16), e4m3 and e5m2, per-tensor and per-head scales, GQA 4 and 8,
split and unsplit, float16 and bfloat16 queries (the interpreter's bf16 ``tl.dot`` is wrong: bf16
only through the float16 dots), and the named variants of scripts/dev/triton_variants.py. The
option is off by default and reaches only FP8 caches on 64/128-row blocks.
"""
from __future__ import annotations

import random

import pytest

from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention
from attnbench.workload.trees import random_tree

from .test_triton_backend import TritonBackend, need_interpreter, tree
from .test_triton_fp8_variants import VARIANTS

TREE_VARIANTS = sorted(n for n in VARIANTS if n.startswith("triton-f8t"))


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _batch(seed, *, kv_dtype="fp8_e4m3", kv_scale="per-tensor", page=16, hq=8, hkv=2, dtype="float16", d=32):
    """Random trees of 17-45 nodes (>= 64 rows at G >= 4: the tree config) after odd contexts, and a
    decode beside them (its row block: 16 rows, where ``kv_a`` does not apply)."""
    rng = random.Random(seed)
    reqs = [tree(random_tree({"nodes": rng.choice((17, 29, 40, 45)), "max_children": rng.choice((2, 3, 5)),
                              "seed": seed * 7 + i}), rng.choice((1, 37, 70, 131))) for i in range(2)]
    reqs.append(Request("decode", 1, rng.choice((45, 99))))
    spec = BatchSpec(tuple(reqs), hq, hkv, d, dtype=dtype, page_size=page, layout="shuffled", kv_dtype=kv_dtype,
                     kv_scale=kv_scale)
    return materialize(spec, seed)


def _run(be, batch, splits=None):
    need_interpreter()
    be.splits = splits
    plan = be.plan(batch)
    assert plan.cfg.block_m >= 64 and plan.has_tree  # the tree config: the option is live
    plan.out.fill_(float("nan"))  # every element must be written
    out = be.run(plan)
    assert not out.isnan().any()
    return compare(out, reference_attention(batch)[0])[0]


def test_the_option_is_off_by_default_and_checked():
    assert TritonBackend().kv_a == ""
    assert {"triton-f8t-k", "triton-f8t-kv"} <= set(TREE_VARIANTS)
    assert VARIANTS["triton-f8t-k"]().kv_a == "k"
    with pytest.raises(ValueError):
        TritonBackend(kv_a="q")


@pytest.mark.slow
@pytest.mark.parametrize("splits", [None, 3])
@pytest.mark.parametrize("kv_dtype,kv_scale,page,hq", [
    ("fp8_e4m3", "per-tensor", 16, 8), ("fp8_e4m3", "per-head", 1, 16), ("fp8_e5m2", "per-head", 3, 8),
    ("fp8_e5m2", "per-tensor", 16, 16)])
@pytest.mark.parametrize("kv_a", ["k", "v", "kv"])
def test_kv_a_matches_the_reference(kv_a, kv_dtype, kv_scale, page, hq, splits):
    seed = len(kv_a) * 11 + page + hq + (splits or 0)
    batch = _batch(seed, kv_dtype=kv_dtype, kv_scale=kv_scale, page=page, hq=hq)
    assert batch.k_cache.element_size() == 1 and batch.q.abs().max() > 0 and batch.k_cache.float().abs().max() > 0
    rel = _run(TritonBackend(kv_a=kv_a), batch, splits)
    assert rel < 3e-3, f"kv_a {kv_a} {kv_dtype} {kv_scale} page {page} hq {hq} splits {splits}: rel err {rel}"


@pytest.mark.slow
@pytest.mark.parametrize("kv_a", ["k", "kv"])
@pytest.mark.parametrize("dtype,fp8_f16,tol", [("bfloat16", True, 2e-2), ("float16", False, 3e-3)])
def test_kv_a_bfloat16_queries_and_q_dtype_dots(kv_a, dtype, fp8_f16, tol):
    """bf16 queries through the float16 dots (``fp8_f16``: the interpreter computes them right);
    ``fp8_f16`` off, float16 queries: the tiles converted to q's dtype. (FP8 caches take 16-bit
    queries only: no float32 case.)"""
    rel = _run(TritonBackend(kv_a=kv_a, fp8_f16=fp8_f16), _batch(5, dtype=dtype, kv_scale="per-head", page=3), None)
    assert rel < tol, f"kv_a {kv_a} {dtype} fp8_f16 {fp8_f16}: rel err {rel}"


@pytest.mark.slow
@pytest.mark.parametrize("name", TREE_VARIANTS)
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_tree_variants_match_the_reference(name, kv_dtype):
    rel = _run(VARIANTS[name](), _batch(len(name), kv_dtype=kv_dtype, kv_scale="per-head", page=16, d=64), None)
    assert rel < 3e-3, f"{name} {kv_dtype}: rel err {rel}"


@pytest.mark.slow
def test_the_option_reaches_the_launch():
    """``KV_A`` as launched: both bits for an FP8 tree batch with "kv", 0 by default and for a
    16-bit cache (the option is for FP8 tiles only)."""
    import attnbench.backends.triton_kernels as tk

    seen = []
    real = tk.paged_attention_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                seen.append(kw["KV_A"])
                return real[grid](*a, **kw)
            return launch

    batch = _batch(9, kv_scale="per-head", page=3)
    tk.paged_attention_kernel = Spy()
    try:
        _run(TritonBackend(kv_a="kv"), batch)
        _run(TritonBackend(), batch)
        bf16 = _batch(9, kv_dtype=None, page=3)
        be = TritonBackend(kv_a="kv")
        be.run(be.plan(bf16))
    finally:
        tk.paged_attention_kernel = real
    assert seen == [3, 0, 0]  # FP8 tree config: both bits; off by default; 16-bit caches never
