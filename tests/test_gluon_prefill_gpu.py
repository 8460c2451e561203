"""The Gluon prefill kernel (issue 33, prefill round 3; attnbench/kernels/prefill/gluon_kernels.py) on
a Hopper GPU against the reference: odd prefill lengths beside a chunked prefill and a decode,
pages of 64/128/256 keys, NHD and HND caches, head dims 64 and 128, GQA groups 1/4/8, with and
without forced splits (partials and the merge), the persistent grid's programs. Each case forces the route."""
from __future__ import annotations

import pytest
import torch

from attnbench.kernels.prefill import gluon
from attnbench.workload.batch import BatchSpec, Request, materialize

from .hopper import check_route, on_hopper

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

REQS = (Request("prefill", 300, 0), Request("prefill", 77, 200), Request("decode", 1, 150), Request("prefill", 129, 0))
CASES = [  # page, order, dtype, head dim, q heads, kv heads, splits, rows (block_m: tokens a unit x G)
    (256, "NHD", "bfloat16", 128, 8, 2, None, 512),  # 128 tokens a unit, 128-key tiles
    (256, "NHD", "bfloat16", 128, 8, 2, 3, 512),
    (128, "HND", "float16", 64, 16, 2, None, 512),  # G 8: 64 tokens a unit (one compute warpgroup)
    (64, "NHD", "bfloat16", 128, 4, 4, None, 128),  # G 1, 64-key tiles
    (128, "NHD", "float16", 128, 8, 1, 2, 512),
    (256, "NHD", "bfloat16", 128, 32, 8, None, 512),  # 224 items: more than an H100's or H200's SMs
]


# programs: the persistent grid's (0: one an SM; 5: five programs, each drawing many items from the counter)
@pytest.mark.parametrize("programs", [0, 5])
@pytest.mark.parametrize("page,order,dtype,d,hq,hkv,splits,rows", CASES)
def test_gluon_prefill_matches_the_reference(page, order, dtype, d, hq, hkv, splits, rows, programs):
    on_hopper("prefill")
    spec = BatchSpec(REQS, hq, hkv, d, dtype=dtype, page_size=page, kv_order=order, layout="shuffled")
    batch = materialize(spec, seed=page + d + hq, device="cuda")
    # 2 runs: the launch must leave its counter at 0 for the next one
    plan = check_route("gluon-prefill", batch, tuning=gluon.Tuning(programs=programs), runs=2, splits=splits)
    assert plan.cfg.block_m == rows and int(gluon._sched(plan.out.device, 1)[0]) == 0
    assert (plan.num_merge > 0) == (splits is not None)


@pytest.mark.parametrize("seed", range(40))
def test_auto_runs_random_prefill_batches_through_the_gluon_kernel(seed):
    """The default TritonBackend (auto: gluon-prefill since prefill round 8) on random batches it takes: 1-6
    causal prefills of 64-1500 tokens beside contexts of 0-3000, GQA groups 1-8, head dims 64/128, pages of
    64-512 keys in every layout, NHD or HND, fp16 or bf16, the output NaN-filled first."""
    on_hopper("prefill")
    import random

    from attnbench.workload.spec import LAYOUTS

    rng = random.Random(1000 + seed)
    hkv = rng.choice([1, 2, 4, 8])
    reqs = tuple(Request("prefill", rng.randint(64, 1500), rng.choice([0, 0, rng.randint(1, 3000)]))
                 for _ in range(rng.randint(1, 6)))
    spec = BatchSpec(reqs, hkv * rng.choice([1, 2, 4, 8]), hkv, rng.choice([64, 128]),
                     dtype=rng.choice(["float16", "bfloat16"]), page_size=rng.choice([64, 128, 256, 512]),
                     kv_order=rng.choice(["NHD", "HND"]), layout=rng.choice(LAYOUTS))
    check_route("gluon-prefill", materialize(spec, seed=seed, device="cuda"), auto=True)
