"""The Gluon prefill kernel (issue 33, prefill round 3; attnbench/kernels/prefill/gluon_kernels.py) on
a Hopper GPU against the reference: odd prefill lengths beside a chunked prefill and a decode,
pages of 64/128/256 keys, NHD and HND caches, head dims 64 and 128, GQA groups 1/4/8, with and
without forced splits (partials and the merge). Each case asserts the Gluon kernel launched."""
from __future__ import annotations

import pytest
import torch

from attnbench.kernels.prefill import gluon
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention

from attnbench.backends.triton import TritonBackend

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

REQS = (Request("prefill", 300, 0), Request("prefill", 77, 200), Request("decode", 1, 150), Request("prefill", 129, 0))
CASES = [  # page, order, dtype, head dim, q heads, kv heads, splits, rows (block_m: tokens a unit x G)
    (256, "NHD", "bfloat16", 128, 8, 2, None, 512),  # scripts/dev/triton_variants.py's triton-pf-gl
    (256, "NHD", "bfloat16", 128, 8, 2, 3, 512),
    (128, "HND", "float16", 64, 16, 2, None, 512),  # G 8: 64 tokens a unit (one compute warpgroup)
    (64, "NHD", "bfloat16", 128, 4, 4, None, 128),  # G 1, 64-key tiles
    (128, "NHD", "float16", 128, 8, 1, 2, 512),
    (256, "NHD", "bfloat16", 128, 32, 8, None, 512),  # 224 items: more than an H100's or H200's SMs
]


@pytest.fixture
def launches(monkeypatch):
    seen = []
    real = gluon.run

    def counting(p, heavy_first):
        seen.append(gluon.block_n(p))
        return real(p, heavy_first)

    monkeypatch.setattr(gluon, "run", counting)
    return seen


@pytest.mark.parametrize("early_page", [False, True])  # the loader's block-table read before its slot wait
@pytest.mark.parametrize("split_rows", [True, False])  # 128 rows as 2 partitions of 4 warps, or one of 8
# 5: five programs, each walking many items; dyn: the persistent grid drawing items from a counter (dyn5: 5 programs),
# told with Q's barrier (DYNAMIC 1) or an item barrier (d2: DYNAMIC 2)
@pytest.mark.parametrize("persistent", [False, True, 5, "dyn", "dyn5", "d2", "d2-5"])
@pytest.mark.parametrize("page,order,dtype,d,hq,hkv,splits,rows", CASES)
def test_gluon_prefill_matches_the_reference(page, order, dtype, d, hq, hkv, splits, rows, persistent, split_rows,
                                             early_page, launches, monkeypatch):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon prefill kernel is written for Hopper (sm_90)")
    dynamic = isinstance(persistent, str)
    monkeypatch.setattr(gluon, "PERSISTENT", bool(persistent))  # one program per SM walking the items, or one per item
    monkeypatch.setattr(gluon, "PROGRAMS", 5 if persistent in (5, "dyn5", "d2-5") else 0)
    monkeypatch.setattr(gluon, "DYNAMIC", (2 if persistent.startswith("d2") else 1) if dynamic else 0)
    monkeypatch.setattr(gluon, "SPLIT_ROWS", split_rows)
    monkeypatch.setattr(gluon, "EARLY_PAGE", early_page)
    be = TritonBackend(block_m=rows, splits=splits)
    spec = BatchSpec(REQS, hq, hkv, d, dtype=dtype, page_size=page, kv_order=order, layout="shuffled")
    batch = materialize(spec, seed=page + d + hq, device="cuda")
    plan = be.plan(batch)
    assert gluon.fit(plan) == "", gluon.fit(plan)
    ref = reference_attention(batch)[0]
    for _ in range(2 if dynamic else 1):  # dynamic: the launch must leave its counter at 0 for the next one
        plan.out.fill_(float("nan"))  # every element must be written
        out = be.run(plan)
        torch.cuda.synchronize()
        rel = compare(out, ref)[0]
        assert launches and rel < 1e-2, (launches, rel)
    if dynamic:
        assert int(gluon._sched(out.device, 1)[0]) == 0
    assert (plan.num_merge > 0) == (splits is not None)


@pytest.mark.parametrize("seed", range(40))
def test_the_default_triton_backend_runs_random_prefill_batches_through_the_gluon_kernel(seed, launches):
    """The default TritonBackend (the gluon option on since prefill round 8) on random batches the
    default plan shapes for the Gluon kernel: 1-6 causal prefills of 64-1500 tokens beside contexts of
    0-3000, GQA groups 1-8, head dims 64/128, pages of 64-512 keys in every layout, NHD or HND, fp16 or
    bf16, the output NaN-filled first; the row's mode must name the Gluon kernel."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon prefill kernel is written for Hopper (sm_90)")
    import random

    from attnbench.workload.spec import LAYOUTS

    rng = random.Random(1000 + seed)
    hkv = rng.choice([1, 2, 4, 8])
    reqs = tuple(Request("prefill", rng.randint(64, 1500), rng.choice([0, 0, rng.randint(1, 3000)]))
                 for _ in range(rng.randint(1, 6)))
    spec = BatchSpec(reqs, hkv * rng.choice([1, 2, 4, 8]), hkv, rng.choice([64, 128]),
                     dtype=rng.choice(["float16", "bfloat16"]), page_size=rng.choice([64, 128, 256, 512]),
                     kv_order=rng.choice(["NHD", "HND"]), layout=rng.choice(LAYOUTS))
    batch = materialize(spec, seed=seed, device="cuda")
    assert gluon.wanted(batch), spec
    be = TritonBackend()
    plan = be.plan(batch)
    assert plan.mode == "gluon prefill kernel", (plan.mode, spec)
    plan.out.fill_(float("nan"))
    out = be.run(plan)
    torch.cuda.synchronize()
    rel = compare(out, reference_attention(batch)[0])[0]
    assert launches and rel < 1e-2, (rel, spec)
