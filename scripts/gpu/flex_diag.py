#!/usr/bin/env python3
"""Flex's block mask on the GPU (issue 32), in one command:

    python3 scripts/gpu/flex_diag.py            # on the GPU machine, about 1-2 minutes
    python3 scripts/gpu/flex_diag.py --device cpu   # small shapes, block 16, fused kernel emulated

Builds the batches of the H100 failure (16 trees of 60 nodes at 8k then 16 decodes at 3k,
8 q / 1 kv heads, pages 16 and 256; 4 small trees at 16 and 1k context and a 300-token prefill,
32/8 heads, page 256) and the mixed batch of tests/test_variants_gpu.py with windows, sinks,
ALiBi and soft-cap, all bf16 with shuffled pages. For each it runs flex with ``mask=blocks``
(BlockMask.from_kv_blocks), ``mask=dense`` (create_block_mask) and, for the failing cases,
``old-layout`` (the same block lists with the head axis at stride 0, as before the fix), and
prints the relative error of every request against the float64 reference (``*`` above the
bf16 tolerance, with the number of heads off for the bad ones). Per batch it also prints the
block lists' strides, whether the Triton kernel's offset formula finds each row's own lists,
whether the mask it then applies is the mask_mod's (``WRONG`` lines where not), and where the
lists differ from create_block_mask's (``_flex_audit.compare_lists``).

On the CPU eager Flex ignores the block lists, so there (and on the GPU with ``--emulate``) the
output of the fused kernel is also emulated from the lists as it reads them. Exit status 1 when
a ``blocks`` or ``dense`` run is off (``old-layout`` is expected to be off on mixed batches).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from attnbench.backend import make_backend  # noqa: E402
from attnbench.backends import flex as flex_mod  # noqa: E402
from attnbench.backends._flex_audit import (  # noqa: E402
    compare_lists, emulate_kernel, kernel_block_sets, mask_errors, stride_problems)
from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402
from attnbench.workload.reference import compare, default_tolerance, reference_attention  # noqa: E402
from attnbench.workload.trees import parse_tree, random_tree  # noqa: E402


def _trees_then_decodes(small: bool, page: int):
    n, ctx, dctx, count = (12, 150, 60, 4) if small else (60, 8192, 3072, 16)
    depth, kids = (4, 4) if small else (7, 10)
    reqs = [Request("tree", n, ctx, tuple(random_tree({"nodes": n, "max_depth": depth, "max_children": kids, "seed": s})))
            for s in range(count)]
    reqs += [Request("decode", 1, dctx)] * count
    heads = (4, 1, 32) if small else (8, 1, 128)
    return reqs, heads, page


def _small_trees_and_prefill(small: bool, page: int):
    ctxs, pre = ((4, 4, 70, 70), 40) if small else ((16, 16, 1024, 1024), 300)
    reqs = []
    for i, c in enumerate(ctxs):
        n = 5 + 3 * i if small else 10 + 5 * i
        reqs.append(Request("tree", n, c, tuple(random_tree({"nodes": n, "max_depth": 4, "max_children": 4, "seed": 20 + i}))))
    reqs.append(Request("prefill", pre, 0))
    heads = (8, 2, 32) if small else (32, 8, 128)
    return reqs, heads, page


def _mixed(small: bool, page: int):
    """tests/test_variants_gpu.py's batch (with its non-causal prefill)."""
    eagle = tuple(parse_tree({"preset": "eagle-mc_sim_7b_63"}))
    if small:
        t = tuple(random_tree({"nodes": 9, "max_depth": 3, "max_children": 3, "seed": 2}))
        reqs = [Request("decode", 1, c) for c in (60, 7, 150)]
        reqs += [Request("prefill", 9, 40), Request("prefill", 20, 0)]
        reqs += [Request("tree", len(t), 77, t), Request("tree", len(t), 13, t), Request("prefill", 12, 0, causal=False)]
        return reqs, (8, 2, 32), page
    reqs = [Request("decode", 1, c) for c in (1000, 77, 3000)]
    reqs += [Request("prefill", 33, 500), Request("prefill", 64, 0)]
    reqs += [Request("tree", len(eagle), 777, eagle), Request("tree", len(eagle), 130, eagle)]
    reqs.append(Request("prefill", 40, 0, causal=False))
    return reqs, (32, 8, 128), page


# name -> (builder, page size, variants, run the old layout too)
CASES = {
    "trees8k+decodes3k p16": (_trees_then_decodes, 16, {}, True),
    "trees8k+decodes3k p256": (_trees_then_decodes, 256, {}, False),
    "trees8k+decodes3k W1000+sinks+alibi p16": (_trees_then_decodes, 16, dict(window=1000, sinks=True, alibi=True), False),
    "small-trees+prefill300 p256": (_small_trees_and_prefill, 256, {}, True),
    "mixed plain p16": (_mixed, 16, {}, False),
    "mixed window128 p16": (_mixed, 16, dict(window=128), True),
    "mixed sinks p16": (_mixed, 16, dict(sinks=True), False),
    "mixed window128+sinks p16": (_mixed, 16, dict(window=128, sinks=True), False),
    "mixed alibi p16": (_mixed, 16, dict(alibi=True), True),
    "mixed softcap p16": (_mixed, 16, dict(softcap=50.0), False),
    "mixed all p16": (_mixed, 16, dict(window=100, sinks=True, softcap=30.0, alibi=True), False),
}
SMALL_WINDOWS = {1000: 50, 128: 20, 100: 15}


def build(name: str, device: str, small: bool, seed: int = 0):
    builder, page, variants, _ = CASES[name]
    reqs, (hq, hkv, d), page = builder(small, page)
    if small:
        page = {16: 3, 256: 16}[page]
        if "window" in variants:
            variants = {**variants, "window": SMALL_WINDOWS[variants["window"]]}
    spec = BatchSpec(tuple(reqs), hq, hkv, d, "bfloat16", page, "shuffled", **variants)
    return materialize(spec, seed=seed, device=device)


def old_layout(bm):
    """The same block lists with the head axis at stride 0 (numpy's ``x[:, None]``), as
    kv_block_lists made them before the fix: what the H100 runs read."""
    from torch.nn.attention.flex_attention import BlockMask

    def z(x):
        if x is None:
            return None
        host = np.ascontiguousarray(x.cpu().numpy()[:, 0])[:, None]
        return torch.from_numpy(host).to(x.device)

    kw = dict(BLOCK_SIZE=bm.BLOCK_SIZE, mask_mod=bm.mask_mod, seq_lengths=bm.seq_lengths)
    try:
        return BlockMask.from_kv_blocks(z(bm.kv_num_blocks), z(bm.kv_indices), z(bm.full_kv_num_blocks),
                                        z(bm.full_kv_indices), compute_q_blocks=False, **kw)
    except TypeError:
        return BlockMask.from_kv_blocks(z(bm.kv_num_blocks), z(bm.kv_indices), z(bm.full_kv_num_blocks),
                                        z(bm.full_kv_indices), **kw)


def per_request(batch, out, ref, tol):
    """``[(label, rel err, heads off)]`` per request, in batch order."""
    rows, s = [], 0
    for r in batch.requests:
        o, f = out[s:s + r.query].float(), ref[s:s + r.query]
        rel = compare(o, f)[0]
        heads = sum(compare(o[:, h], f[:, h])[0] > tol for h in range(o.shape[1])) if rel > tol else 0
        kind = r.kind if r.causal else "nc-prefill"
        rows.append((f"{kind}{r.query if r.kind != 'decode' else ''}@{r.context}", rel, heads))
        s += r.query
    return rows


def print_requests(rows, tol, nheads, width: int = 6):
    cells = [f"r{i} {lab} {rel:.1e}{'*' if rel > tol else ''}" for i, (lab, rel, _) in enumerate(rows)]
    for i in range(0, len(cells), width):
        print("      " + "  ".join(cells[i:i + width]))
    bad = [(i, lab, h) for i, (lab, rel, h) in enumerate(rows) if rel > tol]
    if bad:
        print(f"      off: {len(bad)}/{len(rows)} requests; heads off: "
              + ", ".join(f"r{i} {h}/{nheads}" for i, _, h in bad[:12]) + (" ..." if len(bad) > 12 else ""))


def describe_lists(bm, dense_bm, batch, qmax, lmax, tag):
    probs = stride_problems(bm)
    kp, kf = kernel_block_sets(bm, lmax, kernel=True)
    lp, lf = kernel_block_sets(bm, lmax, kernel=False)
    wrong_rows = ((kp != lp) | (kf != lf)).any(-1).any(-1)[:, 0].nonzero().flatten().tolist()
    print(f"    {tag}: strides {'ok' if not probs else '; '.join(probs)}; kernel finds each row's own lists: "
          + ("yes" if not wrong_rows else f"NO for rows {wrong_rows[:10]}{' ...' if len(wrong_rows) > 10 else ''}"))
    real = torch.arange(qmax)[None, :] < torch.as_tensor(batch.host.query_lens)[:, None]
    errs = mask_errors(bm, bm.mask_mod, batch.num_requests, qmax, lmax, rows=real)
    for key, what in (("hidden", "visible keys the kernel never scores"), ("exposed", "masked keys the kernel scores")):
        items = errs[key]
        if items:
            ex = "; ".join(f"row {z} qblock {q}: {n}" for z, q, n in items[:4])
            print(f"      WRONG: {len(items)} (row, q block) with {what}: {ex}{' ...' if len(items) > 4 else ''}")
    if not any(errs.values()):
        print("      the mask the kernel applies from these lists is the mask_mod's on every real row")
    d = compare_lists(bm, dense_bm, lmax, kernel=True)
    for key, what in (("missing", "kv blocks create_block_mask reads and these lists do not (right where only "
                                  "padding rows, which the output drops, see them: the line above says)"),
                      ("full_vs_partial", "kv blocks full here, partial in create_block_mask"),
                      ("extra", "kv blocks read here that create_block_mask skips (time only)")):
        items = d[key]
        if items:
            ex = "; ".join(f"row {z} qblock {q}: {ks[:6]}{'...' if len(ks) > 6 else ''}" for z, q, ks in items[:3])
            print(f"      vs create_block_mask: {len(items)} (row, q block) with {what}: {ex}")
    if not any(d.values()):
        print("      vs create_block_mask: the same lists")


def run_case(name, args, small):
    dev = args.device
    batch = build(name, dev, small)
    tol = default_tolerance(batch.dtype)
    ref, _ = reference_attention(batch)
    qmax, lmax = int(batch.host.query_lens.max()), int(batch.host.kv_lens.max())
    reqs = batch.requests
    print(f"\n== {name}: {len(reqs)} requests, Qmax {qmax}, Lmax {lmax}, heads {batch.num_q_heads}/{batch.num_kv_heads}, "
          f"d {batch.head_dim}, page {batch.page_size}, block {flex_mod.BLOCK}")
    plans = {m: (make_backend(f"flex:mask={m}"),) for m in ("blocks", "dense")}
    for m, (be,) in plans.items():
        plans[m] = (be, be.prepare(batch))
    dense_bm = plans["dense"][1].block_mask
    describe_lists(plans["blocks"][1].block_mask, dense_bm, batch, qmax, lmax, "blocks")
    runs = [("blocks", *plans["blocks"]), ("dense", *plans["dense"])]
    if CASES[name][3] and not args.no_old:
        be, p = plans["blocks"]
        old = type(p)(**{**p.__dict__, "block_mask": old_layout(p.block_mask)})
        describe_lists(old.block_mask, dense_bm, batch, qmax, lmax, "old-layout")
        runs.append(("old-layout", be, old))
    failed = False
    emulate = args.emulate or dev == "cpu"
    for tag, be, p in runs:
        t0 = time.perf_counter()
        out = be.run(p)
        if dev == "cuda":
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        rows = per_request(batch, out, ref, tol)
        whole = compare(out, ref)[0]
        bad = sum(r[1] > tol for r in rows)
        expect_bad = tag == "old-layout"
        if bad and not expect_bad:
            failed = True
        label = "ran" if dev == "cuda" else "eager (ignores the lists)"
        print(f"  {tag:10s} {label}: whole {whole:.2e}, {bad}/{len(rows)} requests off (tol {tol:g}), {secs:.1f} s"
              + (" incl. compile" if dev == "cuda" else ""))
        print_requests(rows, tol, batch.num_q_heads)
        if emulate:
            eo = emulate_kernel(be, p)
            erows = per_request(batch, eo, ref, tol)
            ebad = sum(r[1] > tol for r in erows)
            if ebad and not expect_bad:
                failed = True
            print(f"  {tag:10s} fused kernel emulated from its lists: whole {compare(eo, ref)[0]:.2e}, "
                  f"{ebad}/{len(erows)} requests off")
            if ebad:
                print_requests(erows, tol, batch.num_q_heads)
    return failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="small shapes (the default on the CPU)")
    ap.add_argument("--block", type=int, default=None, help="Flex's block size (default 128; 16 with small shapes)")
    ap.add_argument("--only", action="append", default=[], help="run the cases whose name contains this (repeatable)")
    ap.add_argument("--emulate", action="store_true", help="also emulate the fused kernel from its lists (always on the CPU)")
    ap.add_argument("--no-old", action="store_true", help="skip the old-layout runs")
    args = ap.parse_args(argv)
    small = args.small or args.device == "cpu"
    saved = flex_mod.BLOCK
    flex_mod.BLOCK = args.block or (16 if small else 128)
    try:
        return _run(args, small)
    finally:
        flex_mod.BLOCK = saved


def _run(args, small) -> int:
    if args.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    print(f"torch {torch.__version__}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
          + (f", triton {__import__('triton').__version__}" if args.device == "cuda" else ""))
    t0 = time.perf_counter()
    names = [n for n in CASES if not args.only or any(o in n for o in args.only)]
    failed = [n for n in names if run_case(n, args, small)]
    print(f"\n{len(names) - len(failed)}/{len(names)} batches right with blocks and dense; {time.perf_counter() - t0:.0f} s")
    if failed:
        print("off: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
