"""The per-request metadata constructions the backends used before they were vectorized
(a Python loop over requests and tree nodes each), kept here only as the oracle that
tests/test_plan_metadata.py compares the vectorized ones with. Not collected by pytest."""
from __future__ import annotations

import math

import numpy as np
import torch

from attnbench.backends import triton_plan as tp
from attnbench.workload.trees import ancestor_mask


def custom_mask_flat(batch):
    return torch.cat([batch.mask(i).reshape(-1) for i in range(batch.num_requests)])


def padded_mask(batch):
    b, qmax, lmax = batch.num_requests, batch.max_query_len, batch.max_kv_len
    m = torch.zeros(b, 1, qmax, lmax, dtype=torch.bool)
    for i, r in enumerate(batch.requests):
        m[i, 0, : r.query, : r.kv_len] = batch.mask(i)
        m[i, 0, r.query :, 0] = True
    return m


def flashinfer_page_layout(batch):
    ps = batch.page_size
    table = batch.block_table.cpu()
    counts, rows, last = [], [], []
    for i, r in enumerate(batch.requests):
        n = -(-r.kv_len // ps)
        counts.append(n)
        rows.append(table[i, :n])
        last.append(r.kv_len - (n - 1) * ps)
    indptr = torch.zeros(len(counts) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(counts, dtype=torch.int32), 0)
    return indptr, torch.cat(rows).to(torch.int32), torch.tensor(last, dtype=torch.int32)


def flex_tables(batch):
    """(q_causal, q_tree_base, tree_anc) as flex's plan built them."""
    b, qmax = batch.num_requests, batch.max_query_len
    tmax = max((r.query for r in batch.requests if r.tree_parents is not None), default=1)
    q_causal = torch.zeros(b, qmax, dtype=torch.int32)
    q_tree_base = torch.full((b, qmax), 1 << 30, dtype=torch.int32)
    tree_anc = torch.zeros(b, qmax, tmax, dtype=torch.bool)
    for i, r in enumerate(batch.requests):
        if r.tree_parents is None:
            q_causal[i, : r.query] = r.context + torch.arange(r.query, dtype=torch.int32)
        else:
            q_causal[i, : r.query] = r.context - 1
            q_tree_base[i, : r.query] = r.context
            tree_anc[i, : r.query, : r.query] = ancestor_mask(r.tree_parents)
    return q_causal, q_tree_base, tree_anc


def tree_split(batch):
    """(q_index, kv_slot, mask, real) of the prefix + dense-tree split, per request."""
    reqs = [i for i, r in enumerate(batch.requests) if r.tree_parents is not None]
    ps = batch.page_size
    starts = batch.query_start
    table = batch.block_table.cpu().long()
    tmax = max(batch.requests[i].query for i in reqs)
    bt = len(reqs)
    q_index = torch.zeros(bt, tmax, dtype=torch.long)
    kv_slot = torch.zeros(bt, tmax, dtype=torch.long)
    mask = torch.eye(tmax, dtype=torch.bool).repeat(bt, 1, 1)
    real = []
    for b, i in enumerate(reqs):
        r = batch.requests[i]
        t = r.query
        q_index[b, :t] = torch.arange(starts[i], starts[i] + t)
        slots = torch.arange(r.context, r.kv_len)
        kv_slot[b, :t] = table[i, slots // ps] * ps + slots % ps
        mask[b, :t, :t] = ancestor_mask(r.tree_parents)
        real.extend(range(b * tmax, b * tmax + t))
    return q_index.reshape(-1), kv_slot.reshape(-1), mask, torch.tensor(real)


def tree_words(batch):
    trees = [(s, r) for s, r in zip(batch.query_start, batch.requests) if r.tree_parents is not None]
    tmax = max((r.query for _, r in trees), default=1)
    w = max(1, math.ceil(tmax / 64))
    words = np.zeros((max(1, batch.num_tokens), w * 8), dtype=np.uint8)
    for s, r in trees:
        packed = np.packbits(ancestor_mask(r.tree_parents).numpy(), axis=1, bitorder="little")
        words[s : s + r.query, : packed.shape[1]] = packed
    return torch.from_numpy(words.view("<i8").copy())


def build_units(batch, cfg, sms, splits=None):
    bn, bq = cfg.block_nf, cfg.block_q
    hkv = batch.num_kv_heads
    blocks = []
    for i, (s, r) in enumerate(zip(batch.query_start, batch.requests)):
        tree = r.tree_parents is not None
        for q0 in range(0, r.query, bq):
            qc = min(bq, r.query - q0)
            kv_end = r.context + q0 + qc
            full_end = r.context if tree else r.context + q0 + 1
            blocks.append((i, s + q0, qc, r.context, kv_end, full_end, int(tree), q0))
    tiles = [math.ceil(b[4] / bn) for b in blocks]
    if splits is not None:
        nsplit = [max(1, min(splits, t)) for t in tiles]
    else:  # the heuristic itself is tested on its own (test_triton_backend.py)
        g = batch.num_q_heads // hkv
        nsplit = [int(n) for n in tp.split_counts(tiles, [g * b[2] for b in blocks], cfg, batch.head_dim, sms, hkv)]
    nsplit = [math.ceil(t / math.ceil(t / n)) if t else 1 for t, n in zip(tiles, nsplit)]
    units, merge = [], []
    prow = 0
    by_req: dict = {}
    for k, b in enumerate(blocks):
        by_req.setdefault(b[0], []).append(k)
    for req, ks in by_req.items():
        rows_of = {}
        for k in ks:
            if nsplit[k] > 1:
                rows_of[k] = prow
                for t in range(blocks[k][2]):
                    merge.append((blocks[k][1] + t, nsplit[k]))
                prow += blocks[k][2]
        for sp in range(max(nsplit[k] for k in ks)):
            for k in ks:
                if sp >= nsplit[k]:
                    continue
                i, qs, qc, ctx, kv_end, full_end, tree, q0 = blocks[k]
                per = math.ceil(tiles[k] / nsplit[k])
                lo = sp * per * bn
                hi = min(kv_end, (sp + 1) * per * bn)
                row = rows_of.get(k, -1)
                units.append((i, qs, qc, ctx, lo, hi, full_end, sp, row, tree, q0, nsplit[k], k, 0, 0, 0))
    u = torch.tensor(units, dtype=torch.int32).reshape(-1, tp.UNIT_COLS)
    m = torch.tensor(merge, dtype=torch.int32).reshape(-1, 2)
    return u, m, max(nsplit), len(blocks)
