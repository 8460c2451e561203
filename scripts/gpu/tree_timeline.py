"""Where the Gluon tree kernel's time goes inside a launch (issue 33: the 4k trees' start and end), on the GPU
machine from the repo root:

    python3 scripts/gpu/tree_timeline.py [--contexts 1k 2k 4k 8k 16k] [--pages 16 256] [--fp8] [--runs 5]
        [--const PIPE_S=2 ...]

Each case is 8 requests of a 40-node full tree (depth 3, branching 3) over the context, Llama-3-8B's heads (32 / 8,
head dim 128, bf16; ``--fp8``: an FP8 e4m3 cache too), shuffled pages: the shape of tree-verify-llama3-8b. The
default triton backend plans it; the kernel is then launched with its timestamps on (triton_tree_gluon.CLOCKS,
gluon_clocks.stamp: the SMs' %globaltimer and %clock64 at each step of every partition). One line a case, medians
over the programs of the last of ``--runs`` clocked launches (us):

- ``start``: a program's start (its first instruction) after the launch's first program's (the spread), max / median;
- ``setup``: from a program's start to its compute partition 0 running (shared memory, barriers, the partitions);
- ``q``: compute partition 0's Q rows gathered into shared memory;
- ``first``: then its first tile waited for and S = Q K^T of it (the TMA's first trip; 16-bit caches: PIPE_S);
- ``tile``: each unmasked tile after (the steady state), ``masked``: each tile past ``full_end`` (the tree's nodes);
- ``end``: the last partition's epilogue (partials or output written); ``span``: a program's first to last stamp;
- ``kernel``: the launch's first program's start to its last stamp (the kernel as its own clock sees it; the
  merge launch and the gaps are not in it: attnbench's ``--profile`` rows have them).

The intervals are clock64 cycles turned to us by each program's globaltimer span over its cycles (the SM clock the
launch ran at, printed as MHz). Exit 2 without a Hopper GPU.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from attnbench.kernels.tree import gluon as tree
from attnbench.backends.triton import TritonBackend
from attnbench.kernels.shared.plan import COL
from attnbench.workload import trees
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.units import parse_int



def batch_of(context: int, page: int, fp8: bool, device: str = "cuda"):
    tree40 = tuple(trees.full({"depth": 3, "branching": 3}))
    extra = dict(kv_dtype="fp8_e4m3", kv_scale="per-tensor") if fp8 else {}
    spec = BatchSpec(tuple(Request("tree", 40, context, tree40) for _ in range(8)), 32, 8, 128, dtype="bfloat16",
                     page_size=page, layout="shuffled", **extra)
    return materialize(spec, seed=context + page, device=device)


def _slots() -> int:
    """gluon_clocks.SLOTS (imported here: the Gluon module needs a triton with Gluon, this script's CPU test not)."""
    from attnbench.kernels.tree import clocks as gluon_clocks

    return gluon_clocks.SLOTS


def clocked(be, plan, runs: int) -> torch.Tensor:
    """The stamps of the last of ``runs`` launches: [programs, 4 rows (3 compute partitions, the loader), 2 slots]."""
    clk = torch.zeros(plan.units.shape[0] * plan.batch.num_kv_heads, 4, 2 * _slots(), dtype=torch.int64,
                      device="cuda")
    tree.CLOCKS = clk
    try:
        for _ in range(runs):
            clk.zero_()
            be.run(plan)
        torch.cuda.synchronize()
    finally:
        tree.CLOCKS = None
    return clk.cpu()


def intervals(clk: torch.Tensor, plan) -> dict:
    """The medians (us) of one launch's stamps: see the module's docstring."""
    units = plan.units.cpu()
    n_kv = plan.batch.num_kv_heads
    last = tree.warpgroups(plan) - 1
    s = clk.shape[-1] // 2  # (gluon_clocks.SLOTS)
    gt, cy = clk[..., :s].double(), clk[..., s:].double()
    t0 = gt[:, 3, 2].min()
    rows = {k: [] for k in ("setup", "q", "first", "tile", "masked", "end", "span", "mhz")}
    for w in range(clk.shape[0]):
        u = units[w // n_kv]
        lo, hi, full = (int(u[COL[c]]) for c in ("kv_lo", "kv_hi", "full_end"))
        n = -(-(hi - lo) // tree.BLOCK_N)
        n_full = min(max(full - lo, 0) // tree.BLOCK_N, n)
        span_ns = gt[w, last, 5] - gt[w, 3, 2]
        span_cy = cy[w, last, 5] - cy[w, 3, 2]
        if span_cy <= 0 or cy[w, 0, 5] == 0:
            continue  # a program without rows (no stamps past its start)
        us = span_ns / span_cy / 1e3  # us a cycle
        c = cy[w, 0]
        rows["setup"].append((c[0] - cy[w, 3, 2]) * us)
        rows["q"].append((c[1] - c[0]) * us)
        piped = c[2] != 0  # (PIPE_S 0, FP8 caches: no stamp of the first tile's S)
        if piped:
            rows["first"].append((c[2] - c[1]) * us)
        if n_full > 1:
            rows["tile"].append((c[3] - c[2]) * us / (n_full - 1) if piped else (c[3] - c[1]) * us / n_full)
        if n > n_full:
            rows["masked"].append((c[4] - c[3]) * us / (n - n_full))
        rows["end"].append((cy[w, last, 5] - cy[w, last, 4]) * us)
        rows["span"].append(span_ns / 1e3)
        rows["mhz"].append(1.0 / us)
    out = {k: float(statistics.median(v)) if v else float("nan") for k, v in rows.items()}
    starts = (gt[:, 3, 2] - t0) / 1e3
    out["start_max"], out["start_med"] = float(starts.max()), float(starts.median())
    out["kernel"] = float((gt[:, :3, 5].max() - t0) / 1e3)
    out["programs"] = clk.shape[0]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", nargs="+", default=["1k", "2k", "4k", "8k", "16k"])
    ap.add_argument("--pages", nargs="+", type=int, default=[16])
    ap.add_argument("--fp8", action="store_true", help="an FP8 e4m3 cache beside each bf16 case")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--const", nargs="*", default=[], metavar="NAME=INT",
                    help="triton_tree_gluon's constants for these launches, e.g. PIPE_S=2")
    args = ap.parse_args(argv)
    for kv in args.const:
        name, value = kv.split("=")
        if not hasattr(tree, name):
            ap.error(f"--const {kv}: triton_tree_gluon has no constant {name}")
        setattr(tree, name, int(value))
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("tree_timeline: needs a Hopper GPU (the Gluon tree kernel)", file=sys.stderr)
        return 2
    print(torch.cuda.get_device_name(), "| us, medians over programs | intervals from clock64 at the launch's MHz")
    head = ("case", "programs", "tiles", "start max/med", "setup", "q", "first", "tile", "masked", "end", "span",
            "kernel", "MHz")
    print(" | ".join(head))
    for ctx in args.contexts:
        for page in args.pages:
            for fp8 in ([False, True] if args.fp8 else [False]):
                batch = batch_of(parse_int(ctx), page, fp8)
                be = TritonBackend()
                plan = be.plan(batch)
                if tree.RAN not in plan.mode:
                    print(f"{ctx} page {page}: ran as {plan.mode!r}, not the Gluon tree kernel")
                    continue
                be.run(plan)  # compiled before the clocked build
                r = intervals(clocked(be, plan, args.runs), plan)
                u = plan.units.cpu()
                tiles = int(((u[:, COL["kv_hi"]] - u[:, COL["kv_lo"]] + 63) // 64).max())
                name = f"{ctx} p{page}{' fp8' if fp8 else ''}"
                print(f"{name} | {r['programs']} | {tiles} | {r['start_max']:.2f}/{r['start_med']:.2f} | "
                      f"{r['setup']:.2f} | {r['q']:.2f} | {r['first']:.2f} | {r['tile']:.3f} | {r['masked']:.2f} | {r['end']:.2f} | {r['span']:.1f} | "
                      f"{r['kernel']:.1f} | {r['mhz']:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
