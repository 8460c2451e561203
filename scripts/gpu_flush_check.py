"""The cold-L2 flush must add nothing to the call it precedes (GPU only).

For decode and tree batches of Llama-3-8B shapes (32 query / 8 KV heads, d=128, bf16, page
16, shuffled), each backend's plan is built once and its ``run`` timed by attnbench's own
timer (``attnbench.measure.timing.time_run``: CUDA graph replays, one flush before each)
under every flush kind: none (warm L2), ``write`` (zero a 2xL2 buffer: what attnbench did
first), ``read`` (sum a 2xL2 buffer: the default now) and ``write+read``. The kinds are
interleaved over several repeats, so a slow spell hits all of them alike; each cell is the
median of the repeats' medians.

The check: on a decode whose KV cache is >= 10x the L2 (8 x 16k here: 537 MB against 50 MB
on an H100), nothing useful survives in L2 between calls, so the cold (read-flush) and warm
medians must agree within 2%. A flush that leaves dirty lines behind fails it.

    python3 scripts/gpu_flush_check.py [--repeats 5] [--backends sdpa,triton]
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from attnbench import backend as registry
from attnbench.measure.metrics import device_name
from attnbench.measure.timing import FLUSH_MODES, TimingConfig, time_run
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.trees import random_tree

SHAPE = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, dtype="bfloat16", page_size=16, layout="shuffled")


def cases() -> dict[str, BatchSpec]:
    tree = tuple(random_tree({"nodes": 40, "seed": 1}))
    return {
        "decode 8x4k": BatchSpec(requests=(Request("decode", 1, 4096),) * 8, **SHAPE),
        "decode 8x16k": BatchSpec(requests=(Request("decode", 1, 16384),) * 8, **SHAPE),
        "tree 8x40 @4k": BatchSpec(requests=(Request("tree", 40, 4096, tree),) * 8, **SHAPE),
    }


def measure(spec: BatchSpec, backend: str, repeats: int, device: torch.device) -> dict[str, float]:
    batch = materialize(spec, 0, device)
    be = registry.get_backend_class(backend)()
    if be.unsupported(batch):
        return {}
    plan = be.plan(batch)
    kinds = ["none", *FLUSH_MODES]
    per: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(repeats):
        for k in kinds:
            cfg = TimingConfig(warmup_ms=5, measure_ms=40, cold_l2=k != "none", flush=k if k != "none" else "read")
            res = time_run(lambda: be.run(plan), device, cfg, capturable=type(be).capturable)
            per[k].append(statistics.median(res.samples_ms) * 1e3)
    return {k: statistics.median(v) for k, v in per.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backends", default="sdpa,triton")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_flush_check: needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    print(f"device: {device_name(device)}; L2 {l2 / 2**20:.0f} MiB; medians in us (median of {args.repeats} interleaved repeats)")
    print(f"| case | backend | KV / L2 | none (warm) | {' | '.join(FLUSH_MODES)} | read vs warm |")
    print("|---|---|---|---|" + "---|" * len(FLUSH_MODES) + "---|")
    failed = False
    for label, spec in cases().items():
        kv_ratio = spec.memory_bytes() / l2
        for b in args.backends.split(","):
            if registry.get_backend_class(b).unavailable():
                continue
            med = measure(spec, b, args.repeats, device)
            if not med:
                continue
            gap = med["read"] / med["none"] - 1
            verdict = ""
            if spec.requests[0].kind == "decode" and kv_ratio >= 10:
                ok = abs(gap) <= 0.02
                failed |= not ok
                verdict = " PASS" if ok else " FAIL (> 2%)"
            cells = " | ".join(f"{med[k]:.1f}" for k in FLUSH_MODES)
            print(f"| {label} | {b} | {kv_ratio:.1f}x | {med['none']:.1f} | {cells} | {gap:+.1%}{verdict} |")
    print("flush check:", "FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
