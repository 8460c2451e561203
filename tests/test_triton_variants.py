"""The triton backend's attention variants (issue 21) against the float64 reference, on the
CPU under Triton's interpreter: FP8 caches (e4m3/e5m2, per-tensor/per-head scales), sliding
windows, sinks, soft-cap, ALiBi, bidirectional prefill, the HND cache order and head dims
64/96/256, each alone and all together, with trees, chunked prefills and decodes, page
sizes 1 and 16, shuffled layouts, forced KV splits (the sink counted once across the merge)
and small row blocks. float32/float16 only (bfloat16 ``tl.dot`` is wrong in the interpreter);
FP8 caches need a 16-bit model dtype, so those run in float16. The GPU run is
scripts/gpu/validate.sh (the GPU test suite and the shipped scenarios, scripts/gpu/scenarios/ among them).
"""
from __future__ import annotations

import pytest
import torch

from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.masks import first_needed_slot
from attnbench.workload.reference import compare, reference_attention
from attnbench.workload.trees import from_choices, random_tree

from .test_triton_backend import CHOICES, INTERPRETED, TritonBackend, need_interpreter, tree
from .interpreted import interpret_on_cpu  # noqa: F401 (an autouse fixture)

TOL = {"float32": 1e-4, "float16": 3e-3}
T70 = tuple(random_tree({"nodes": 70, "max_depth": 6, "max_children": 4, "seed": 3}))
MIXED = (
    Request("prefill", 12, 0, causal=False),  # bidirectional (only with the "bidir" feature)
    Request("decode", 1, 40),
    tree(from_choices(CHOICES), 25),
    Request("prefill", 5, 11),  # chunked prefill
    Request("decode", 1, 0),
    Request("prefill", 9, 30, causal=False),  # bidirectional over a context
)
FEATURES = {
    "window": dict(window=6),
    "window1": dict(window=1),
    "sinks": dict(sinks=True),
    "softcap": dict(softcap=0.8),
    "alibi": dict(alibi=True),
    "bidir": dict(),
    "fp8-e4m3": dict(kv_dtype="fp8_e4m3"),
    "fp8-e5m2-head": dict(kv_dtype="fp8_e5m2", kv_scale="per-head"),
    "hnd": dict(kv_order="HND"),
    "all": dict(window=7, sinks=True, softcap=1.5, alibi=True, kv_dtype="fp8_e4m3", kv_scale="per-head",
                kv_order="HND"),
}
# plan settings: the default heuristic; forced splits with 16-key tiles (the split merge);
# 16-row blocks (several row blocks per request)
CONFIGS = {"default": {}, "split": dict(splits=3, block_n=16), "rows16": dict(block_m=16, block_n=16)}


def requests_for(feature, reqs=MIXED):
    """Bidirectional prefills only where the feature asks for them (with "bidir" and "all")."""
    if feature in ("bidir", "all"):
        return tuple(reqs)
    return tuple(Request(r.kind, r.query, r.context, r.tree_parents) if not r.causal else r for r in reqs)


def run_variant(feature, *, reqs=MIXED, dtype=None, page=16, hq=4, hkv=2, d=32, layout="shuffled", seed=0,
                poison=False, **backend_kw):
    need_interpreter()
    f = FEATURES[feature]
    dtype = dtype or ("float16" if "kv_dtype" in f else "float32")
    spec = BatchSpec(requests_for(feature, reqs), hq, hkv, d, dtype=dtype, page_size=page, layout=layout, **f)
    batch = materialize(spec, seed)
    be = TritonBackend(**backend_kw)
    assert be.reasons(batch) == []
    ref, _ = reference_attention(batch)
    if poison:
        poison_outside_windows(batch)
    plan = be.plan(batch)
    plan.out.fill_(float("nan"))  # every element must be written
    out = be.run(plan)
    rel, _ = compare(out, ref)
    assert rel < TOL[dtype], f"{feature} rel err {rel}"
    return out, plan


def poison_outside_windows(batch):
    """NaN in every K/V slot below each request's first needed slot (its window's start), so
    a kernel that reads any of them (V enters the P.V product even where P is 0) is caught."""
    for i, r in enumerate(batch.requests):
        first = first_needed_slot(r, batch.window)
        for slot in range(first):
            page = int(batch.block_table[i, slot // batch.page_size])
            for cache in (batch.k_cache, batch.v_cache):
                row = cache[page, slot % batch.page_size]
                if row.element_size() == 1:  # FP8: 0x7f is NaN in e4m3fn and e5m2
                    row.view(torch.uint8).fill_(0x7F)
                else:
                    row.fill_(float("nan"))


@pytest.mark.slow
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_variant(feature, page, config):
    run_variant(feature, page=page, seed=page, **CONFIGS[config])


@pytest.mark.slow
@pytest.mark.parametrize("feature", ["window", "sinks", "softcap", "alibi", "bidir", "hnd"])
def test_variant_float16(feature):
    run_variant(feature, dtype="float16", page=3, layout="interleaved", splits=2, block_n=16)


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 80, 96, 256])
@pytest.mark.parametrize("feature", ["all", "sinks"])
def test_head_dims(d, feature):
    """80 and 96 run in 128 padded lanes (masked loads and stores); the poisoned NaN output buffer
    shows a lane written past the head dim would be caught by the shape's own check. 80 (which
    scripts/gpu/random_scenarios.py draws) was a skipped row though the kernel computes it."""
    reqs = (Request("decode", 1, 30), tree(from_choices(CHOICES), 9), Request("prefill", 6, 5, causal=False))
    run_variant(feature, reqs=reqs, d=d, hq=2, hkv=1, page=16, splits=2, block_n=16)


@pytest.mark.slow
@pytest.mark.parametrize("page", [1, 3, 16])
@pytest.mark.parametrize("feature", ["window", "window1", "all"])
def test_window_never_reads_outside(feature, page):
    """K/V slots below every row's window hold NaN: the output stays right, so they are never
    read; the plan starts each row block's key range at its window's tile."""
    reqs = (Request("decode", 1, 70), tree(from_choices(CHOICES), 50), Request("prefill", 6, 40),
            Request("decode", 1, 3))
    _, plan = run_variant(feature, reqs=reqs, page=page, poison=True, splits=2, block_n=16)
    window = FEATURES[feature]["window"]
    for i, r in enumerate(reqs):  # one row block each: its key range starts on its window's tile
        start = int(plan.units[plan.units[:, 0] == i, 4].min())
        assert start == first_needed_slot(r, window) // 16 * 16


def test_window_keeps_decode_work_flat():
    """A windowed decode reads the same number of key tiles at any context."""
    need_interpreter()

    def tiles(ctx):
        spec = BatchSpec((Request("decode", 1, ctx),) * 2, 4, 2, 32, dtype="float32", page_size=16, window=20)
        plan = TritonBackend(block_n=16).plan(materialize(spec, 0))
        u = plan.units
        return int(((u[:, 5] - u[:, 4] + 15) // 16).sum())

    assert tiles(100) == tiles(3000) <= 2 * 3


@pytest.mark.slow
@pytest.mark.parametrize("feature", ["all", "window"])
def test_large_tree(feature):
    """A 70-node tree (two ancestor words per row) with the window on node depths."""
    reqs = (Request("tree", len(T70), 17, T70), Request("decode", 1, 33))
    run_variant(feature, reqs=reqs, page=16, splits=2, block_n=16)


@pytest.mark.slow
def test_sink_counted_once_across_splits():
    """Sinks with 1, 2 and 4 splits give the same output (the sink joins split 0 only)."""
    reqs = (Request("decode", 1, 60), Request("prefill", 3, 50))
    outs = [run_variant("sinks", reqs=reqs, splits=s, block_n=16)[0] for s in (1, 2, 4)]
    assert torch.allclose(outs[0], outs[1], atol=1e-5) and torch.allclose(outs[0], outs[2], atol=1e-5)


def test_capabilities_declared():
    """Every variant is declared, so no variant batch is skipped for the triton backend."""
    cls = TritonBackend
    assert cls.supports_window and cls.supports_sinks and cls.supports_softcap and cls.supports_alibi
    assert cls.supports_noncausal and set(cls.kv_dtypes) == {"fp8_e4m3", "fp8_e5m2"}
    assert set(cls.kv_scales) == {"per-tensor", "per-head"} and set(cls.kv_orders) == {"NHD", "HND"}
    assert 80 in cls.head_dims and 96 in cls.head_dims


def test_cpu_in_fresh_process():
    """If another module imported triton first (compiled), run this file's CPU tests afresh."""
    if INTERPRETED:
        return
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                         env=env, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["triton-fp8-decode", "triton-window-decode", "triton-fp8-trees"])
def test_gpu_target_scenarios_run_on_the_cpu(name, tmp_path):
    """scripts/gpu/scenarios/'s triton scenarios, end to end through `attnbench run` with the
    triton backend at tiny shapes (float16: FP8 caches and the interpreter both need it)."""
    need_interpreter()
    from pathlib import Path

    import pandas as pd
    from typer.testing import CliRunner

    from attnbench.cli.app import app

    path = Path(__file__).resolve().parent.parent / "scripts" / "gpu" / "scenarios" / f"{name}.yaml"
    sets = ["model.num_q_heads=4", "model.num_kv_heads=2", "model.head_dim=32", "model.dtype=float16",
            "batch.0.context=150"] + (["kv_cache.dtype=fp8_e4m3"] if "fp8" in name else [])  # bf16 clashes with float16
    args = ["run", str(path), "--device", "cpu", "-b", "triton", "--out", str(tmp_path / "run"), "-q",
            "--warmup-ms", "0", "--measure-ms", "1"]
    for s in sets:
        args += ["--set", s]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    df = pd.read_csv(tmp_path / "run" / "results.csv", keep_default_na=False)
    assert set(df.status) == {"ok"}, df[["case_id", "backend", "status", "reason"]]
    assert (df.backend == "triton").any()
