"""The Gluon decode kernel (issue 33, decode round 1; attnbench/kernels/decode/gluon_kernels.py) on a Hopper GPU
against the reference: FP8 caches (e4m3 / e5m2, scales per tensor or per head) and 16-bit ones, decodes over
contexts of odd lengths (none included: the decode's own key alone), pages of 16 to 512 keys in every layout, NHD
and HND caches, head dims 64 and 128, GQA groups 1 to 16, forced splits (partials and the merge) or the plan's own,
the ring's slots 2 to 4, pages by TMA boxes or by cp.async (``Tuning.copy_below``, ``copy_dims``), sliding windows (of 1
key to more than the context), sinks and soft-capping alone and together, the output NaN-filled first. Each case
forces the route (16-bit caches, which auto leaves to the paged route, included)."""
from __future__ import annotations

import random

import pytest
import torch

from attnbench.kernels.decode import gluon as dec
from attnbench.workload.batch import BatchSpec, Request, materialize

from .hopper import check_route, on_hopper

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ODD = tuple(Request("decode", 1, ctx) for ctx in (0, 1, 63, 64, 65, 1000, 4097, 16383))
LONG = tuple(Request("decode", 1, ctx) for ctx in (16384, 9000, 12345, 20000))
CASES = [  # requests, page, order, q dtype, kv dtype (None: q's), scale, head dim, q heads, kv heads, splits
    (ODD, 16, "NHD", "bfloat16", "fp8_e4m3", "per-tensor", 128, 32, 8, None),  # 4 boxes a tile
    (ODD, 16, "HND", "float16", "fp8_e5m2", "per-head", 128, 32, 8, 3),
    (ODD, 32, "NHD", "bfloat16", "fp8_e4m3", "per-head", 64, 8, 8, None),  # G 1, 2 boxes a tile
    (ODD, 32, "HND", "float16", "fp8_e4m3", "per-tensor", 128, 16, 1, 2),  # G 16: every MMA row used
    (ODD, 64, "NHD", "bfloat16", "fp8_e5m2", "per-tensor", 64, 16, 2, None),  # G 8
    (ODD, 256, "HND", "bfloat16", "fp8_e4m3", "per-head", 128, 8, 4, 5),  # G 2, a tile inside a page
    (LONG, 16, "NHD", "bfloat16", "fp8_e4m3", "per-head", 128, 32, 8, None),  # the plan's splits
    (LONG, 512, "NHD", "float16", "fp8_e5m2", "per-tensor", 128, 32, 8, None),
    (ODD, 16, "NHD", "bfloat16", None, None, 128, 32, 8, None),  # 16-bit caches (route forced): ldmatrix, no words
    (ODD, 128, "HND", "float16", None, None, 64, 16, 4, 3),
]


def _check(batch, tuning=None, runs: int = 2, **options):
    on_hopper("decode")
    return check_route("gluon-decode", batch, tuning=tuning, runs=runs, **options)


# ring slots; pages under 64 keys by TMA boxes or by cp.async (COPY_BELOW)
@pytest.mark.parametrize("stages,copy", [(3, 0), (2, 0), (4, 0), (2, 64), (3, 64)],
                         ids=["s3", "s2", "s4", "s2-copy", "s3-copy"])
@pytest.mark.parametrize("reqs,page,order,dtype,kv,scale,d,hq,hkv,splits", CASES)
def test_gluon_decode_matches_the_reference(reqs, page, order, dtype, kv, scale, d, hq, hkv, splits, stages, copy):
    tuning = dec.Tuning(stages=stages, copy_below=copy, copy_dims=(64, 128))
    fp8 = dict(kv_dtype=kv, kv_scale=scale) if kv else {}
    spec = BatchSpec(reqs, hq, hkv, d, dtype=dtype, page_size=page, kv_order=order, layout="shuffled", **fp8)
    batch = materialize(spec, seed=page + d + hq + stages, device="cuda")
    plan = _check(batch, tuning, splits=splits)
    assert plan.feat.fp8 == bool(kv)
    if splits:  # forced splits: partials and the merge
        assert plan.num_merge > 0


VARIANT_REQS = tuple(Request("decode", 1, ctx) for ctx in (0, 1, 63, 64, 65, 130, 1000, 4097, 16383))
VARIANTS = [  # window, sinks, softcap, page, kv dtype, splits
    (1, False, None, 16, "fp8_e4m3", None),  # the decode's own key alone
    (17, False, None, 16, "fp8_e5m2", 3),  # a window inside one tile, split units past it
    (64, True, None, 32, "fp8_e4m3", None),
    (100, False, None, 64, "fp8_e4m3", 2),  # straddling a tile boundary
    (1000, True, 30.0, 16, "fp8_e4m3", 4),
    (5000, False, 8.0, 256, "fp8_e5m2", None),
    (20000, True, None, 16, "fp8_e4m3", None),  # wider than every context
    (None, True, None, 64, "fp8_e5m2", 5),  # sinks with split units: split 0 counts the sink once
    (None, False, 5.0, 16, "fp8_e4m3", None),
    (333, True, 20.0, 128, None, 3),  # 16-bit cache
]


@pytest.mark.parametrize("window,sinks,softcap,page,kv,splits", VARIANTS)
def test_gluon_decode_variants_match_the_reference(window, sinks, softcap, page, kv, splits):
    """Sliding windows, sinks and soft-capping on the Gluon decode kernel, NaN-filled output, against the
    reference (whose sinks are drawn large enough that a kernel dropping them fails)."""
    tuning = dec.Tuning(copy_below=64 if window and window % 2 else 0, copy_dims=(64, 128))
    fp8 = dict(kv_dtype=kv, kv_scale="per-head") if kv else {}
    spec = BatchSpec(VARIANT_REQS, 32, 8, 128, dtype="bfloat16", page_size=page, layout="shuffled", window=window,
                     sinks=sinks, softcap=softcap, **fp8)
    plan = _check(materialize(spec, seed=page + (window or 7), device="cuda"), tuning, splits=splits)
    assert plan.feat.constexprs()["WINDOW"] == bool(window) and plan.feat.constexprs()["SINK"] == sinks


TILE128 = [  # page, kv dtype, window, sinks, splits: head dim 64 on 128-key tiles (TILES)
    (16, "fp8_e4m3", None, False, None),  # cp.async
    (32, "fp8_e5m2", 100, True, 3),
    (64, "fp8_e4m3", None, False, 2),  # two boxes a tile
    (256, "fp8_e4m3", 300, False, None),  # a tile inside a page
    (128, "fp8_e5m2", None, True, 5),
]


@pytest.mark.parametrize("copy", [64, 0], ids=["copy", "tma"])
@pytest.mark.parametrize("page,kv,window,sinks,splits", TILE128)
def test_head_dim_64_on_128_key_tiles(page, kv, window, sinks, splits, copy):
    spec = BatchSpec(VARIANT_REQS, 32, 4, 64, dtype="bfloat16", page_size=page, layout="shuffled", window=window,
                     sinks=sinks, kv_dtype=kv, kv_scale="per-head")
    plan = _check(materialize(spec, seed=page + 3, device="cuda"), dec.Tuning(copy_below=copy), splits=splits)
    assert plan.cfg.block_nf == 128


@pytest.mark.parametrize("seed", range(32))
def test_random_decode_batches_run_through_the_gluon_kernel(seed):
    """Random decode batches the option takes: 1-12 decodes over contexts of 0-20000, GQA groups 1-16, head dims
    64/128, pages of 16-512 keys in every layout, NHD or HND, bf16 or fp16 q, e4m3 or e5m2 scaled per tensor or
    per head, a window of 1-8000 keys, sinks and soft-capping each drawn (seeds 18-23: 16-bit caches, the route
    forced)."""
    # cp.async: every page of odd seeds, TMA boxes every page of the others
    tuning = dec.Tuning(copy_below=1 << 20 if seed % 2 else 0, copy_dims=(64, 128))
    rng = random.Random(seed)
    hkv = rng.choice([1, 2, 4, 8])
    g = rng.choice([1, 2, 4, 8, 16])
    reqs = tuple(Request("decode", 1, rng.choice([0, rng.randint(1, 300), rng.randint(1, 20000)]))
                 for _ in range(rng.randint(1, 12)))
    fp8 = dict(kv_dtype=rng.choice(["fp8_e4m3", "fp8_e5m2"]), kv_scale=rng.choice(["per-tensor", "per-head"])) \
        if not 18 <= seed < 24 else {}
    d, dtype = rng.choice([64, 128]), rng.choice(["float16", "bfloat16"])
    page = max(dec.MIN_PAGE, rng.choice([8, 16, 32, 64, 128, 256, 512]))  # (page 8: auto's paged route)
    variants = dict(window=rng.choice([None, None, rng.randint(1, 200), rng.randint(1, 8000)]),
                    sinks=rng.random() < 0.4, softcap=rng.choice([None, None, 10.0, 50.0]))
    spec = BatchSpec(reqs, hkv * g, hkv, d, dtype=dtype, page_size=page, kv_order=rng.choice(["NHD", "HND"]),
                     layout=rng.choice(["contiguous", "shuffled", "shuffled-within"]), **variants, **fp8)
    _check(materialize(spec, seed=seed, device="cuda"), tuning, splits=rng.choice([None, None, 2, 7]))
