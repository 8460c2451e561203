"""The Gluon tree kernel (issue 33, tree round 1; attnbench/kernels/tree/gluon_kernels.py) on a Hopper GPU
against the reference: full, random and chain trees over contexts of odd lengths (none included), beside
decodes and a short causal chunk, pages of 8 to 256 keys in every layout, NHD and HND caches, head dims 64
and 128, GQA groups 1/4/8, with and without forced splits (partials and the merge), the output NaN-filled
first; and FP8 caches (tree round 2: e4m3 / e5m2, scales per tensor or per head, widened by the loader).
Each case asserts the Gluon kernel launched."""
from __future__ import annotations

import random

import pytest
import torch

from attnbench.kernels.tree import gluon as tree
from attnbench.workload import trees
from attnbench.workload.batch import BatchSpec, Request, materialize

from .hopper import check_route, on_hopper

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def full_tree(depth: int, branching: int) -> tuple:
    return tuple(trees.full({"depth": depth, "branching": branching}))


def random_tree(nodes: int, rng: random.Random) -> tuple:
    return (-1,) + tuple(rng.randrange(i) for i in range(1, nodes))


FULL40 = full_tree(3, 3)
TREES40 = tuple(Request("tree", 40, ctx, FULL40) for ctx in (1000, 4095, 64, 0, 2049))
MIXED = (Request("tree", 13, 777, full_tree(2, 3)), Request("decode", 1, 1500), Request("tree", 8, 3000, tuple(range(-1, 7))),
         Request("prefill", 10, 300), Request("tree", 40, 0, FULL40), Request("decode", 1, 0))
SMALL = (Request("tree", 24, 1999, random_tree(24, random.Random(3))), Request("tree", 13, 513, full_tree(2, 3)),
         Request("decode", 1, 700))
CASES = [  # requests, page, order, dtype, head dim, q heads, kv heads, splits
    (TREES40, 16, "NHD", "bfloat16", 128, 8, 2, None),  # 8 x 40 at page 16: 4 boxes a tile
    (TREES40, 16, "NHD", "bfloat16", 128, 8, 2, 3),
    (TREES40, 256, "HND", "float16", 128, 8, 2, None),
    (TREES40, 64, "NHD", "bfloat16", 64, 8, 2, 2),
    (TREES40, 8, "HND", "bfloat16", 128, 4, 1, None),
    (TREES40, 32, "NHD", "float16", 64, 4, 4, 4),  # G 1: one warpgroup
    (MIXED, 16, "NHD", "bfloat16", 128, 32, 8, None),
    (MIXED, 128, "HND", "bfloat16", 128, 32, 8, 5),
    (SMALL, 16, "NHD", "bfloat16", 128, 16, 2, None),  # G 8: 24 nodes = 192 rows
    (SMALL, 512, "NHD", "float16", 64, 16, 2, 3),
]


# the kernel's tuning (tree.Tuning): ring slots, pipe: pipe_s (the next tile's S issued early; 2 slots its least)
@pytest.mark.parametrize("stages,pipe", [(4, 1), (2, 0), (4, 0), (2, 1)], ids=["default", "s2", "s4-pipe0", "s2-pipe1"])
@pytest.mark.parametrize("reqs,page,order,dtype,d,hq,hkv,splits", CASES)
def test_gluon_tree_matches_the_reference(reqs, page, order, dtype, d, hq, hkv, splits, stages, pipe):
    on_hopper("tree")
    spec = BatchSpec(reqs, hq, hkv, d, dtype=dtype, page_size=page, kv_order=order, layout="shuffled")
    batch = materialize(spec, seed=page + d + hq, device="cuda")
    plan = check_route("gluon-tree", batch, tuning=tree.Tuning(stages=stages, pipe_s=pipe), runs=2, splits=splits)
    if splits:  # forced splits: partials and the merge (the plan may split on its own without)
        assert plan.num_merge > 0


FP8_CASES = [  # requests, page, order, kv dtype, scale, head dim, q heads, kv heads, splits
    (TREES40, 16, "NHD", "fp8_e4m3", "per-tensor", 128, 8, 2, None),
    (TREES40, 256, "HND", "fp8_e5m2", "per-head", 128, 8, 2, 3),
    (TREES40, 8, "NHD", "fp8_e4m3", "per-head", 64, 8, 2, None),
    (MIXED, 16, "HND", "fp8_e4m3", "per-head", 128, 32, 8, 5),
    (MIXED, 64, "NHD", "fp8_e5m2", "per-tensor", 64, 32, 8, None),
    (SMALL, 32, "NHD", "fp8_e4m3", "per-tensor", 128, 16, 2, 2),  # G 8: 192 rows
    (SMALL, 512, "HND", "fp8_e5m2", "per-head", 128, 16, 2, None),
]


# ring: stages_fp8 (the staging slots: as many as fit beside it)
@pytest.mark.parametrize("ring", [3, 2], ids=["default", "ring2"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("reqs,page,order,kv,scale,d,hq,hkv,splits", FP8_CASES)
def test_gluon_tree_fp8_matches_the_reference(reqs, page, order, kv, scale, d, hq, hkv, splits, dtype, ring):
    """FP8 caches: TMA into staging slots, widened to float16 by the loader, q to float16, the scales folded
    into the scores and the output; the reference dequantizes in float32."""
    on_hopper("tree")
    spec = BatchSpec(reqs, hq, hkv, d, dtype=dtype, page_size=page, kv_order=order, layout="shuffled", kv_dtype=kv,
                     kv_scale=scale)
    batch = materialize(spec, seed=page + d + hq + len(kv), device="cuda")
    plan = check_route("gluon-tree", batch, tuning=tree.Tuning(stages_fp8=ring), runs=2, splits=splits)
    assert plan.feat.fp8
    if splits:
        assert plan.num_merge > 0


@pytest.mark.parametrize("seed", range(40))
def test_random_tree_batches_run_through_the_gluon_kernel(seed):
    """TritonBackend() (auto) on random tree batches it runs through the Gluon kernel: 1-9 random
    trees of 2-48 nodes (<= 192 rows with G) beside decodes, contexts of 0-5000, GQA groups 1-8, head dims
    64/128, pages of 8-512 keys in every layout, NHD or HND, fp16 or bf16; seeds 30-39 with FP8 caches."""
    on_hopper("tree")
    rng = random.Random(seed)
    hkv = rng.choice([1, 2, 8])
    g = rng.choice([1, 2, 4, 8])
    most = min(48, 192 // g)
    reqs = []
    for _ in range(rng.randint(1, 9)):
        ctx = rng.choice([0, rng.randint(1, 200), rng.randint(1, 5000)])
        if rng.random() < 0.25:
            reqs.append(Request("decode", 1, ctx))
        else:
            n = rng.randint(2, most)
            reqs.append(Request("tree", n, ctx, random_tree(n, rng)))
    if all(r.kind == "decode" for r in reqs):
        reqs.append(Request("tree", 3, 10, (-1, 0, 0)))
    fp8 = dict(kv_dtype=rng.choice(["fp8_e4m3", "fp8_e5m2"]), kv_scale=rng.choice(["per-tensor", "per-head"])) \
        if seed >= 30 else {}  # seeds 30-39: FP8 caches (tree round 2)
    spec = BatchSpec(tuple(reqs), hkv * g, hkv, rng.choice([64, 128]), dtype=rng.choice(["float16", "bfloat16"]),
                     page_size=rng.choice([8, 16, 32, 64, 128, 256, 512]), kv_order=rng.choice(["NHD", "HND"]),
                     layout=rng.choice(["contiguous", "shuffled", "shuffled-within"]), **fp8)
    check_route("gluon-tree", materialize(spec, seed=seed, device="cuda"), auto=True)


@pytest.mark.parametrize("nodes,g,ctx,page,splits", [
    (150, 1, 1000, 16, None),  # three 64-node words: tiles spanning two of them at an odd offset
    (192, 1, 63, 8, 3),  # a tile starting one key before the nodes, split units cutting through the nodes
    (96, 2, 4097, 32, None),
    (130, 1, 0, 64, 2),  # a tree over no context: the nodes start on a tile
    (70, 1, 5000, 256, None),
])
def test_trees_of_more_than_64_nodes(nodes, g, ctx, page, splits):
    """Trees whose ancestor masks take two or three 64-bit words, at contexts that put the words' edges inside the
    key tiles, beside a shorter tree and a decode: gluon_tree_mask's word arithmetic (``row_bits``: a tile across
    two words, a tile starting in the context) against the reference."""
    on_hopper("tree")
    rng = random.Random(nodes + ctx)
    reqs = (Request("tree", nodes, ctx, random_tree(nodes, rng)), Request("tree", 13, ctx + 77, full_tree(2, 3)),
            Request("decode", 1, 333))
    spec = BatchSpec(reqs, 4 * g, 4, 128, dtype="bfloat16", page_size=page, layout="shuffled")
    check_route("gluon-tree", materialize(spec, seed=nodes, device="cuda"), runs=2, splits=splits)
