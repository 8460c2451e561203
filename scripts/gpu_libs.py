"""Validate the library backends (flash-attn, xformers, FlashInfer) on a GPU against the
float64 reference, and time them roughly (CUDA events, median). Run by scripts/gpu_libs.sh.

    python3 scripts/gpu_libs.py --backends xformers flashinfer [--out DIR]

Prints one line per (backend, case): route (mode), relative / max-abs error, plan and run
times, or the skip reason. Exits 1 if any case mismatches or errors.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
try:
    importlib.import_module("attnbench.backends")
except ImportError:  # not installed: map attnbench.backends onto ./backends
    import backends as _b

    sys.modules["attnbench.backends"] = _b

from attnbench.backend import get_backend_class  # noqa: E402
from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402
from attnbench.workload.reference import compare, reference_attention  # noqa: E402
from attnbench.workload.trees import chain, full, random_tree  # noqa: E402

PAGE = {"flash-attn": 256, "xformers": 64, "flashinfer": 16}
TOL = 1.5e-2


def tree(parents, context):
    return Request("tree", len(parents), context, tuple(parents))


def cases(page: int):
    t40 = full({"depth": 3, "branching": 3})
    trnd = random_tree({"nodes": 40, "max_depth": 8, "max_children": 4, "seed": 1})
    dec = Request("decode", 1, 4095)
    yield "decode B=8 ctx4096", [dec] * 8, page, "shuffled"
    yield "decode ragged", [Request("decode", 1, c) for c in (4095, 17, 1000, 2500, 1, 300)], page, "shuffled"
    yield "prefill 2x1024", [Request("prefill", 1024, 0)] * 2, page, "contiguous"
    yield "chunked 4x(256@2048)", [Request("prefill", 256, 2048)] * 4, page, "shuffled"
    yield "chunked ragged", [Request("prefill", q, c) for q, c in ((200, 1000), (17, 3000), (333, 50))], page, "shuffled"
    yield "mixed", [dec] * 4 + [Request("prefill", 8, 1500)] * 2 + [Request("prefill", 512, 1024)], page, "interleaved"
    yield "decode+1-token prefill", [dec] * 4 + [Request("prefill", 1, 100)] * 2, page, "shuffled"
    yield "tree full3^3 (40) B=8 ctx4096", [tree(t40, 4096)] * 8, page, "shuffled"
    yield "tree random40 B=8", [tree(trnd, c) for c in (4096, 100, 2000, 3000, 777, 4096, 1, 2048)], page, "shuffled"
    yield "tree chain9 B=8", [tree(chain(8), 4096)] * 8, page, "shuffled"
    yield "tree+decode", [tree(t40, 2000)] * 2 + [dec] * 3, page, "shuffled-within"
    yield "tree ctx0", [tree(t40, 0), tree(t40, 500)], page, "shuffled"
    yield "2 tree shapes", [tree(t40, 1000), tree(trnd, 1000)], page, "reversed"
    yield "page 16 (reason?)", [dec] * 2, 16, "shuffled"


def time_ms(fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def graph_us(fn, iters=20):
    """Median time of one replay of ``fn`` captured in a CUDA graph (None if capture fails)."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return time_ms(g.replay, iters=iters) * 1e3
    except Exception as e:  # noqa: BLE001
        print(f"    (graph capture failed: {type(e).__name__}: {str(e)[:200]})")
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", nargs="+", default=list(PAGE))
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    args = ap.parse_args()
    print(f"torch {torch.__version__} cuda {torch.version.cuda} device {torch.cuda.get_device_name()}", flush=True)
    rows, bad = [], 0
    for name in args.backends:
        cls = get_backend_class(name)
        why = cls.unavailable()
        print(f"== {name}: {cls.version() if why is None else 'UNAVAILABLE: ' + why}", flush=True)
        if why:
            rows.append({"backend": name, "status": "unavailable", "reason": why})
            continue
        for case, reqs, page, layout in cases(PAGE[name]):
            sp = BatchSpec(tuple(reqs), args.hq, args.hkv, args.d, "bfloat16", page, layout)
            b = materialize(sp, 1234, "cuda")
            be = cls()
            row = {"backend": name, "version": cls.version(), "case": case, "page": page, "layout": layout}
            reasons = be.reasons(b)
            if reasons:
                row.update(status="skipped", reason="; ".join(reasons))
                print(f"  {case:32s} skipped: {row['reason']}", flush=True)
                rows.append(row)
                continue
            try:
                t0 = time.perf_counter()
                p = be.prepare(b)
                torch.cuda.synchronize()
                plan_ms = (time.perf_counter() - t0) * 1e3
                t0 = time.perf_counter()
                out = be.run(p)
                torch.cuda.synchronize()
                first_ms = (time.perf_counter() - t0) * 1e3
                ref, _ = reference_attention(b)
                rel, mx = compare(out, ref)
                run_ms = time_ms(lambda: be.run(p))
                plan_ms2 = time_ms(lambda: be.prepare(b), iters=5, warmup=1)
                gus = graph_us(lambda: be.run(p)) if cls.capturable else None
                ok = rel < TOL
                bad += not ok
                row.update(status="ok" if ok else "mismatch", mode=p.mode, rel=rel, max_abs=mx,
                           run_us=run_ms * 1e3, graph_us=gus, plan_ms=plan_ms2, first_call_ms=first_ms, first_plan_ms=plan_ms)
                print(f"  {case:32s} {row['status']:8s} mode={p.mode:26s} rel={rel:.2e} max={mx:.2e} "
                      f"run={run_ms * 1e3:8.1f}us graph={'%.1fus' % gus if gus else 'n/a':>9s} plan={plan_ms2:6.2f}ms first={first_ms:.0f}ms", flush=True)
            except Exception as e:
                bad += 1
                row.update(status="error", error=f"{type(e).__name__}: {e}")
                print(f"  {case:32s} ERROR {type(e).__name__}: {str(e)[:600]}", flush=True)
                traceback.print_exc(limit=4)
            rows.append(row)
            del b
            torch.cuda.empty_cache()
    out = Path(args.out) / f"gpu_libs_{'_'.join(args.backends)}.json"
    try:
        out.write_text(json.dumps(rows, indent=1, default=str))
    except OSError:
        pass
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
