"""The ``triton`` backend's MLA path (triton_mla.py) against the float64 reference, under
Triton's interpreter (float32 and float16: bfloat16 tl.dot is wrong there). The module imports
the kernels with TRITON_INTERPRET=1, as tests/test_triton_backend.py does, and re-runs itself
in a fresh process when triton was imported compiled before it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from .interpreted import import_interpreted

# the kernels interpreted on a CPU machine (tests/interpreted.py says why and when)
triton_mla_kernels, _paged = import_interpreted("attnbench.kernels.mla.kernels", "attnbench.backends.triton")
TritonBackend, triton_mode = _paged.TritonBackend, _paged.triton_mode

from attnbench.kernels.mla import plan as triton_mla  # noqa: E402
from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402
from attnbench.workload.reference import compare, reference_attention  # noqa: E402
from attnbench.workload.trees import chain, from_choices, random_tree  # noqa: E402
from .interpreted import interpret_on_cpu  # noqa: F401 (an autouse fixture)

INTERPRETED = triton_mla_kernels.INTERPRETED and triton_mode() == "interpreted"
TOL = {"float32": 1e-4, "float16": 3e-3}
TREE = tuple(from_choices([[0], [1], [0, 0], [0, 1], [1, 0]]))
BIG_TREE = tuple(random_tree({"nodes": 70, "max_depth": 6, "max_children": 4, "seed": 3}))  # 2 bitmask words
MIXED = [
    Request("decode", 1, 300),
    Request("tree", len(TREE), 20, TREE),
    Request("prefill", 5, 9),  # chunked prefill
    Request("decode", 1, 3),
    Request("tree", 4, 0, tuple(chain(3))),
]


def check(reqs, *, hq=4, rank=64, rope=16, dtype="float32", page=4, layout="shuffled", seed=0, splits=None):
    if not INTERPRETED:
        pytest.skip("triton was imported compiled in this process: see test_cpu_in_fresh_process")
    spec = BatchSpec(tuple(reqs), hq, 1, rank + rope, dtype, page, layout,
                     attention="mla", kv_lora_rank=rank, rope_dim=rope)
    batch = materialize(spec, seed)
    be = TritonBackend(splits=splits)
    assert be.reasons(batch) == []
    plan = be.plan(batch)
    assert isinstance(plan, triton_mla.MlaPlan)
    plan.out.fill_(float("nan"))  # every element must be written
    out = be.run(plan)
    assert out.shape == batch.out_shape and out.dtype == batch.dtype
    rel, _ = compare(out, reference_attention(batch)[0])
    assert rel < TOL[dtype], f"rel err {rel}"
    return plan


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("page, layout", [(1, "shuffled"), (4, "shuffled"), (16, "reversed"), (3, "interleaved")])
def test_mixed_batch(dtype, page, layout):
    check(MIXED, dtype=dtype, page=page, layout=layout, seed=page)


@pytest.mark.parametrize("splits", [2, 5])
@pytest.mark.slow
def test_split_keys_are_merged(splits):
    plan = check(MIXED, splits=splits, hq=2, rank=32)
    assert plan.num_merge > 0 and int((plan.units[:, 5] >= 0).sum()) > 0


@pytest.mark.slow
def test_sixteen_heads_several_tokens_a_unit_and_wide_trees():
    plan = check([Request("tree", 4, 40, tuple(chain(3))), Request("tree", len(BIG_TREE), 33, BIG_TREE),
                  Request("decode", 1, 65)], hq=16, rank=32, page=8, dtype="float16")
    assert plan.cfg.block_m == 64 and plan.anc.shape[1] == 2


@pytest.mark.slow
def test_plan_splits_long_decodes_by_itself():
    plan = check([Request("decode", 1, 2000), Request("decode", 1, 700)], hq=16, rank=32)
    assert plan.num_merge == 32  # both decodes split: 16 heads each


def test_unit_table_covers_every_row_and_key_once():
    spec = BatchSpec(tuple(MIXED), 4, 1, 80, "float32", 4, attention="mla", kv_lora_rank=64, rope_dim=16)
    batch = materialize(spec, 0)
    cfg = triton_mla.MlaConfig(16, 16, 4, 1)
    units, merge, smax = triton_mla.build_units(batch, cfg, sms=4, splits=3)
    seen = {}
    for b, row0, nrows, k0, k1, split, prow0, tree in units.tolist():
        assert k1 > k0 and k0 % 16 == 0 and bool(tree) == (MIXED[b].tree_parents is not None)
        for r in range(row0, row0 + nrows):
            seen.setdefault((b, r), []).append((k0, k1))
    for b, r in enumerate(MIXED):
        for row in range(r.query * 4):
            spans = sorted(seen.pop((b, row)))
            assert spans[0][0] == 0 and all(a[1] == c[0] for a, c in zip(spans, spans[1:]))
            tok = row // 4
            assert spans[-1][1] >= (r.kv_len if r.tree_parents else r.context + tok + 1)
    assert not seen and smax <= 3


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("splits", [None, 3])
def test_noncausal_prefills_run(dtype, splits):
    """causal: false (held-out random MLA draws have it, on one token and on several): every
    key of the request, computed instead of refused, beside causal prefills, decodes and a tree."""
    reqs = [Request("prefill", 1, 0, causal=False), Request("decode", 1, 1), Request("prefill", 7, 6),
            Request("prefill", 9, 70, causal=False), Request("prefill", 1, 130, causal=False),
            Request("tree", len(TREE), 20, TREE)]
    plan = check(reqs, dtype=dtype, page=8, layout="interleaved", seed=3, splits=splits)
    assert sorted(set(plan.units[:, 7].tolist())) == [0, 1, 2]


def test_dims_the_kernel_cannot_take_are_a_reason():
    spec = BatchSpec((Request("decode", 1, 5),), 4, 1, 72, "float32", 4, attention="mla", kv_lora_rank=48, rope_dim=24)
    why = TritonBackend().reasons(materialize(spec, 0))
    assert any("powers of two" in w and "kv_lora_rank 48" in w for w in why)


def test_cpu_in_fresh_process():
    """If another module imported triton first (compiled), run this file's CPU tests afresh."""
    if INTERPRETED:
        return
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                         env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]


@pytest.mark.gpu
def test_gpu_mla_against_reference():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    code = (
        "import torch\n"
        "from attnbench.workload.batch import BatchSpec, Request, materialize\n"
        "from attnbench.workload.reference import compare, reference_attention\n"
        "from attnbench.workload.trees import full\n"
        "from attnbench.backends.triton import TritonBackend\n"
        "t = tuple(full({'depth': 3, 'branching': 3}))\n"
        "worst = 0.0\n"
        "for hq in (16, 128):\n"
        "    reqs = (Request('decode', 1, 5000), Request('tree', len(t), 3000, t), Request('prefill', 100, 700))\n"
        "    spec = BatchSpec(reqs, hq, 1, 576, 'bfloat16', 64, attention='mla', kv_lora_rank=512, rope_dim=64)\n"
        "    b = materialize(spec, 0, 'cuda')\n"
        "    be = TritonBackend()\n"
        "    out = be.run(be.plan(b))\n"
        "    worst = max(worst, compare(out, reference_attention(b)[0])[0])\n"
        "print(worst)\n"
        "assert worst < 1.5e-2\n"
        # float32 (mla-tiny's dtype) against float32's tolerance: the H100 gave 1.1e-3 with TF32 dots
        "from attnbench.workload.reference import default_tolerance\n"
        "spec = BatchSpec(reqs, 4, 1, 80, 'float32', 16, attention='mla', kv_lora_rank=64, rope_dim=16)\n"
        "b = materialize(spec, 0, 'cuda')\n"
        "rel = compare(be.run(be.plan(b)), reference_attention(b)[0])[0]\n"
        "print('float32', rel)\n"
        "assert rel < default_tolerance(torch.float32), rel\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
