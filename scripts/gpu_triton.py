"""GPU check + timing of the triton backend (run on the device machine).

  python3 scripts/gpu_triton.py [--sweep NAME ...] [--quick] [--out DIR]

1. copy bandwidth (1 GiB device-to-device, read + write counted);
2. correctness of bf16/fp16 cases against the reference (poisoned output, rel. error);
3. timing (CUDA graph replays, triton.testing.do_bench_cudagraph median) of the issue's cases
   against the memory floor (K/V + q + out bytes once / measured copy bandwidth), for the
   default config and each named sweep's variants.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
from triton.testing import do_bench_cudagraph

from attnbench.backends import triton_plan as tp
from attnbench.backends.triton_paged import TritonBackend
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention
from attnbench.workload.trees import chain, full, random_tree

T40 = tuple(full({"depth": 3, "branching": 3}))
T8 = tuple(random_tree({"nodes": 8, "max_depth": 3, "max_children": 3, "seed": 2}))
T64 = tuple(random_tree({"nodes": 64, "max_depth": 7, "max_children": 4, "seed": 1}))
T70 = tuple(random_tree({"nodes": 70, "max_depth": 8, "max_children": 4, "seed": 3}))


def tree(parents, ctx):
    return Request("tree", len(parents), ctx, parents)


# name -> (requests, page size)
CASES = {
    "decode-4k-p16": ([Request("decode", 1, 4096)] * 8, 16),
    "decode-4k-p256": ([Request("decode", 1, 4096)] * 8, 256),
    "decode-4k-p1": ([Request("decode", 1, 4096)] * 8, 1),
    "decode-16k-p16": ([Request("decode", 1, 16384)] * 8, 16),
    "tree40-4k-p16": ([tree(T40, 4096)] * 8, 16),
    "tree40-4k-p256": ([tree(T40, 4096)] * 8, 256),
    "tree8-1k-p16": ([tree(T8, 1024)] * 8, 16),
    "tree64-16k-p16": ([tree(T64, 16384)] * 8, 16),
    "chain40-4k-p16": ([Request("prefill", 40, 4096)] * 8, 16),
    "prefill-512x8-p16": ([Request("prefill", 512, 0)] * 8, 16),
    "mixed-p16": ([Request("prefill", 512, 0)] * 2 + [Request("decode", 1, 4096)] * 8
                  + [tree(T40, 4096)] * 2, 16),
}
CHECK_ONLY = {
    "odd": ([Request("decode", 1, 17), Request("prefill", 33, 1), tree(T70, 500), tree(chain(9), 0),
             Request("prefill", 100, 700)], (1, 3, 16, 256)),
}

# name -> list of (label, backend kwargs, plan module overrides)
SWEEPS = {
    "decode": [
        ("bn64", {"block_n": 64}, {}),
        ("bn32st4", {"block_n": 32, "num_stages": 4}, {}),
    ],
    "tree": [
        ("bn32", {"block_n": 32}, {}),
        ("bn32st4", {"block_n": 32, "num_stages": 4}, {}),
        ("bn16", {"block_n": 16}, {}),
        ("unfused", {"fused_merge": False}, {}),
    ],
}
SWEEP_CASES = {"decode": ["decode-4k-p16", "decode-4k-p256"],
               "tree": ["tree40-4k-p16", "tree40-4k-p256", "tree64-16k-p16"]}


def copy_bandwidth() -> float:
    n = 1 << 29  # 1 GiB of bf16
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    del a, b
    return 2 * n * 2 / (ms * 1e-3)


def min_bytes(batch) -> int:
    el = batch.q.element_size()
    kv = sum(r.kv_len for r in batch.requests) * batch.num_kv_heads * batch.head_dim * 2 * el
    return kv + 2 * batch.q.numel() * el


def flops(batch) -> float:
    """Useful FLOPs: 4 * D per allowed (query head, key) pair."""
    total = 0
    for r in batch.requests:
        if r.tree_parents is None:
            pairs = r.query * r.context + r.query * (r.query + 1) // 2
        else:
            from attnbench.workload.trees import depths
            pairs = r.query * r.context + sum(d + 1 for d in depths(r.tree_parents))
        total += pairs
    return 4.0 * batch.head_dim * batch.num_q_heads * total


def make(reqs, page, dtype="bfloat16", seed=1):
    return materialize(BatchSpec(tuple(reqs), 32, 8, 128, dtype=dtype, page_size=page), seed, "cuda")


def check(be, batch) -> float:
    p = be.plan(batch)
    p.out.fill_(float("nan"))
    out = be.run(p)
    if out.is_cuda:
        torch.cuda.synchronize()
    return compare(out, reference_attention(batch)[0])[0]


def bench(be, batch) -> tuple[float, float, object]:
    p = be.plan(batch)
    be.run(p)  # compile
    torch.cuda.synchronize()
    ms = do_bench_cudagraph(lambda: be.run(p), rep=100, return_mode="median")
    # the graph-replayed output is checked too
    rel = compare(p.out, reference_attention(batch)[0])[0]
    return ms * 1e3, rel, p


def kernel_info(be) -> dict:
    k = getattr(be, "last_kernel", None)
    md = getattr(k, "metadata", None)
    return dict(regs=getattr(k, "n_regs", None), spills=getattr(k, "n_spills", None),
                smem=getattr(md, "shared", None))


def with_overrides(over):
    saved = {k: getattr(tp, k) for k in over}
    for k, v in over.items():
        setattr(tp, k, v)
    return saved


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", nargs="*", default=[])
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    print(f"device {torch.cuda.get_device_name()} sms {torch.cuda.get_device_properties(0).multi_processor_count}"
          f" torch {torch.__version__} triton {triton.__version__}", flush=True)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    rows, worst = [], 0.0
    if not a.no_check:
        t0 = time.time()
        for name, (reqs, pages) in CHECK_ONLY.items():
            for page in pages:
                for dt in ("bfloat16", "float16"):
                    rel = check(TritonBackend(), make(reqs, page, dt))
                    worst = max(worst, rel)
                    print(f"check {name} page {page} {dt}: rel {rel:.2e}", flush=True)
        for name in a.cases:
            reqs, page = CASES[name]
            rel16 = check(TritonBackend(), make(reqs, page, "float16", seed=3))
            worst = max(worst, rel16)
            print(f"check {name} float16: rel {rel16:.2e}", flush=True)
        print(f"checks done in {time.time() - t0:.0f}s, worst rel {worst:.2e}", flush=True)
    variants = [("default", {}, {}, list(a.cases))]
    for s in a.sweep:
        variants += [(lab, kw, over, SWEEP_CASES[s]) for lab, kw, over in SWEEPS[s]]
    for label, kw, over, cases in variants:
        saved = with_overrides(over)
        try:
            for name in cases:
                reqs, page = CASES[name]
                batch = make(reqs, page)
                be = TritonBackend(**kw)
                us, rel, p = bench(be, batch)
                floor = min_bytes(batch) / bw * 1e6
                tf = flops(batch) / (us * 1e-6) / 1e12
                row = dict(variant=label, case=name, us=round(us, 1), floor_us=round(floor, 1),
                           pct_floor=round(100 * floor / us, 1), tflops=round(tf, 1), rel=rel,
                           units=int(p.units.shape[0]), merge_rows=p.num_merge, splits=int(p.po.shape[0]),
                           cfg=vars(p.cfg), **kernel_info(be))
                rows.append(row)
                worst = max(worst, rel)
                print(json.dumps(row), flush=True)
                del batch, p
                torch.cuda.empty_cache()
        finally:
            with_overrides(saved)
    if "prefill-512x8-p16" in a.cases:  # SDPA's flash kernel on the same tokens, dense and MHA layout
        q = torch.randn(8, 32, 512, 128, device="cuda", dtype=torch.bfloat16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            fn()
            us = do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
        print(json.dumps(dict(variant="sdpa-flash", case="prefill-512x8 dense", us=round(us, 1))), flush=True)
        rows.append(dict(variant="sdpa-flash", case="prefill-512x8", us=us, floor_us=0, pct_floor=0, tflops=0,
                         rel=0, units=0, splits=0))
    with open(os.path.join(a.out, "gpu_triton.json"), "w") as f:
        json.dump(dict(copy_bw=bw, rows=rows, worst_rel=worst), f, indent=1)
    print(f"\n{'variant':10} {'case':20} {'us':>8} {'floor':>7} {'%floor':>7} {'TF/s':>6} {'rel':>8} units splits")
    for r in rows:
        print(f"{r['variant']:10} {r['case']:20} {r['us']:8.1f} {r['floor_us']:7.1f} {r['pct_floor']:7.1f} "
              f"{r['tflops']:6.1f} {r['rel']:8.1e} {r['units']:5} {r['splits']}")
    print(f"worst rel {worst:.2e}")
    return 0 if worst < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
