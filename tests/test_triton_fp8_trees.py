"""FP8 trees through the paged route's tree config (64/128-row blocks: the FP8 tile converted in the kernel,
both dots in float16) and through the gluon-tree route's plan (one row block a request, 64-key tiles, 16-bit
partials; run by the paged launch: Gluon has no interpreter). Under Triton's interpreter, against the float64
reference: random trees (odd sizes, odd contexts, shuffled pages 1/3/16), e4m3 and e5m2, per-tensor and per-head
scales, GQA 4 and 8, split and unsplit, float16 and bfloat16 queries (the interpreter's bf16 ``tl.dot`` is wrong:
bf16 only through the float16 dots).
"""
from __future__ import annotations

import random

import pytest

from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention
from attnbench.workload.trees import random_tree

from attnbench.kernels import routes
from attnbench.kernels.tree import gluon as tree_route

from .test_triton_backend import TritonBackend, need_interpreter, tree
from .interpreted import interpret_on_cpu  # noqa: F401 (an autouse fixture)


def _batch(seed, *, kv_dtype="fp8_e4m3", kv_scale="per-tensor", page=16, hq=8, hkv=2, dtype="float16", d=32):
    """Random trees of 17-45 nodes (>= 64 rows at G >= 4: the tree config) after odd contexts, and a
    decode beside them (its row block: 16 rows, the decode config)."""
    rng = random.Random(seed)
    reqs = [tree(random_tree({"nodes": rng.choice((17, 29, 40, 45)), "max_children": rng.choice((2, 3, 5)),
                              "seed": seed * 7 + i}), rng.choice((1, 37, 70, 131))) for i in range(2)]
    reqs.append(Request("decode", 1, rng.choice((45, 99))))
    spec = BatchSpec(tuple(reqs), hq, hkv, d, dtype=dtype, page_size=page, layout="shuffled", kv_dtype=kv_dtype,
                     kv_scale=kv_scale)
    return materialize(spec, seed)


def _run(batch, route="paged", splits=None):
    need_interpreter()
    plan = TritonBackend(route=route, splits=splits).plan(batch)
    assert plan.cfg.block_m >= 64 and plan.has_tree and plan.feat.fp8  # the tree config
    plan.out.fill_(float("nan"))  # every element must be written
    out = routes.BY_NAME["paged"].launch(plan)
    assert not out.isnan().any()
    return compare(out.float(), reference_attention(batch)[0])[0]


@pytest.mark.slow
@pytest.mark.parametrize("splits", [None, 3])
@pytest.mark.parametrize("kv_dtype,kv_scale,page,hq", [
    ("fp8_e4m3", "per-tensor", 16, 8), ("fp8_e5m2", "per-head", 3, 8), ("fp8_e4m3", "per-head", 1, 16)])
@pytest.mark.parametrize("route", ["paged", "gluon-tree"])
def test_fp8_trees_match_the_reference(monkeypatch, route, kv_dtype, kv_scale, page, hq, splits):
    monkeypatch.setattr(tree_route, "reasons", lambda batch: [])  # the gluon-tree plan on the CPU
    paged = route == "paged"  # (the gluon-tree route: pages of 8-32 or 64k keys, <= 192 rows a request)
    b = _batch(3, kv_dtype=kv_dtype, kv_scale=kv_scale, page=page if paged else 16, hq=hq if paged else 8)
    assert _run(b, route, splits) < 3e-2


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 2e-2), ("float16", 3e-3)])
def test_fp8_trees_take_bfloat16_and_float16_queries(dtype, tol):
    """bfloat16 queries reach the interpreter's dots as float16 (FP8_F16), so they are right there too."""
    assert _run(_batch(5, dtype=dtype, kv_dtype="fp8_e5m2")) < tol
