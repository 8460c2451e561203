"""The triton backend's attention variants against the reference on a GPU (issue 21), in
bfloat16 and float16: every feature alone and all together, trees, chunked and bidirectional
prefills, decodes, page sizes 1 and 16, shuffled pages, split-K forced and not, head dims 64,
96, 128, 256. Run by scripts/gpu/gpu_triton_variants.sh; prints one line per (dtype, feature)
with the worst relative error and exits 1 on any failure.

  python3 scripts/gpu/gpu_triton_variants_check.py [--workers N]

The kernels compile in N worker processes at once (one CUDA context each: the GPU work is
small, the compiles are what takes time).
"""
from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor

FEATURES = {
    "plain": {},
    "window": dict(window=256),
    "window1": dict(window=1),
    "sinks": dict(sinks=True),
    "softcap": dict(softcap=30.0),
    "alibi": dict(alibi=True),
    "bidir": {},
    "fp8_e4m3": dict(kv_dtype="fp8_e4m3"),
    "fp8_e5m2_head": dict(kv_dtype="fp8_e5m2", kv_scale="per-head"),
    "hnd": dict(kv_order="HND"),
    "all": dict(window=300, sinks=True, softcap=30.0, alibi=True, kv_dtype="fp8_e4m3", kv_scale="per-head",
                kv_order="HND"),
}


def requests(feature: str):
    from attnbench.workload.batch import Request
    from attnbench.workload.trees import full, random_tree

    t40 = tuple(full({"depth": 3, "branching": 3}))
    t70 = tuple(random_tree({"nodes": 70, "max_depth": 8, "max_children": 4, "seed": 1}))
    bidir = feature in ("bidir", "all")
    return (
        Request("decode", 1, 3000), Request("decode", 1, 17), Request("decode", 1, 1200),
        Request("tree", len(t40), 1500, t40), Request("tree", len(t70), 700, t70),
        Request("prefill", 200, 0, causal=not bidir), Request("prefill", 100, 600, causal=not bidir),
        Request("prefill", 64, 333),
    )


def job(args):
    """One (dtype, feature, page, head dim): worst rel. error over the default plan and forced
    3-way splits, and the tolerance."""
    dtype, feature, page, d = args
    import torch

    from attnbench.backends.triton import TritonBackend
    from attnbench.workload.batch import BatchSpec, materialize
    from attnbench.workload.reference import compare, default_tolerance, reference_attention

    hq, hkv = (32, 8) if d <= 128 else (16, 8)
    spec = BatchSpec(requests(feature), hq, hkv, d, dtype=dtype, page_size=page, layout="shuffled",
                     **FEATURES[feature])
    b = materialize(spec, 1, "cuda")
    ref = reference_attention(b)[0]
    worst, notes = 0.0, []
    for kw in ({}, {"splits": 3}):
        be = TritonBackend(**kw)
        reasons = be.reasons(b)
        if reasons:
            return dtype, feature, page, d, float("inf"), 0.0, "; ".join(reasons)
        plan = be.plan(b)
        plan.out.fill_(float("nan"))
        out = be.run(plan)
        torch.cuda.synchronize()
        rel, _ = compare(out, ref)
        worst = max(worst, rel)
    return dtype, feature, page, d, worst, default_tolerance(b.dtype), ""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=8)
    a = ap.parse_args()
    jobs = []
    for dtype in ("bfloat16", "float16"):
        for f in FEATURES:
            jobs.append((dtype, f, 16, 128))
        for f in ("all", "plain"):
            jobs += [(dtype, f, 1, 128)] + [(dtype, f, 16, d) for d in (64, 96, 256)]
    import multiprocessing as mp

    bad = 0
    with ProcessPoolExecutor(a.workers, mp_context=mp.get_context("spawn")) as ex:
        for dtype, f, page, d, rel, tol, why in ex.map(job, jobs):
            ok = rel < tol
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {dtype:9s} {f:14s} page {page:3d} d {d:3d}  rel err {rel:.2e} "
                  f"(tolerance {tol:.1e}) {why}", flush=True)
    print(f"VARIANT CHECKS: {len(jobs) - bad} of {len(jobs)} within tolerance")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
