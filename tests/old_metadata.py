"""The per-request metadata constructions the backends used before they were vectorized
(a Python loop over requests and tree nodes each), kept here only as the oracle that
tests/test_plan_metadata.py compares the vectorized ones with. Not collected by pytest."""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from attnbench.kernels.shared import plan as tp
from attnbench.workload.tokens import token_ids, topology_masks
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


# -- triton's plan before issue 33 (a Python loop over split candidates; tree words built on
# the device by torch ops); tests/test_plan_metadata.py compares the numpy host plan with these


def split_counts_loop(tiles, rows, cfg, head_dim: int, sms: int, hkv: int) -> np.ndarray:
    """triton_plan.split_counts as it was: one candidate split count at a time."""
    t = np.asarray(tiles, dtype=np.int64)
    if cfg.block_m <= 32:
        if len(t) * hkv >= tp.WAVES * sms:
            return np.ones_like(t)
        chunk = max(tp.MIN_CHUNK_TILES, -(-int(t.sum()) * hkv // (tp.WAVES * sms)))
        floor_tiles = -(-tp.PARTIAL_KEYS_PER_ROW * np.asarray(rows, dtype=np.int64) // cfg.block_nf)
        return np.maximum(1, np.minimum(tp.MAX_SPLITS, -(-t // np.maximum(chunk, floor_tiles))))
    slots = sms * tp.ctas_per_sm(cfg, head_dim)
    longest = int(t.max()) if len(t) else 1
    best = None
    for n in range(1, tp.MAX_SPLITS + 1):
        chunk = -(-longest // n)
        span = chunk + tp.PROGRAM_TILES
        work = hkv * int((t + tp.PROGRAM_TILES * -(-t // chunk)).sum())
        score = -(-work // (slots * span)) * span + (n > 1) * n * tp.SPLIT_TILES
        if best is None or score < best[0]:
            best = (score, chunk)
        if chunk <= tp.MIN_CHUNK_TILES:
            break
    return np.maximum(1, -(-t // best[1]))


def device_tree_words(batch) -> tuple[torch.Tensor, bool]:
    """``[N, W]`` int64 ancestor bitmasks per query token (zeros for non-tree tokens), on the
    batch's device, and whether the batch has a tree."""
    t = batch.trees
    dev = batch.device
    w = max(1, math.ceil(t.tmax / 64))
    n = max(1, batch.num_tokens)
    if not t.tmax:
        return torch.zeros(n, w, dtype=torch.int64, device=dev), False
    if t.dynamic:  # rebuilt each plan, straight as words
        table = _with_zero_row(ancestor_words(t.parents, w, t.max_depth))
        row_of_tree = np.arange(len(t.reqs)) * t.tmax
    else:  # static: packed once per topology
        table = _packed_topologies(t.topologies, t.tmax, str(dev))
        row_of_tree = t.topology_id * t.tmax
    src = np.full(n, table.shape[0] - 1, dtype=np.int64)  # the zero row
    first = np.cumsum(t.sizes) - t.sizes
    node = np.arange(int(t.sizes.sum())) - np.repeat(first, t.sizes)
    src[token_ids(batch, t.reqs)] = np.repeat(row_of_tree, t.sizes) + node
    return table[torch.from_numpy(src).to(dev)], True


def ancestor_words(parents: torch.Tensor, words: int, max_depth: int) -> torch.Tensor:
    """``[Bt, T]`` parent arrays -> ``[Bt, T, words]`` int64 ancestor bitmasks, by pointer
    doubling on the words themselves (as ``trees.ancestor_masks`` does on bool rows), on the
    parents' device. Padding nodes (parent -1) point at the root: their rows are never read."""
    bt, t = parents.shape
    dev = parents.device
    node = torch.arange(t, device=dev)
    bits = _bit_weights(str(dev))
    own = bits[node % 64][:, None] if words == 1 else torch.where(
        torch.arange(words, device=dev) == (node // 64)[:, None], bits[node % 64][:, None], 0)
    acc = own.expand(bt, t, words).clone()
    up = parents.long().clamp(min=0)  # the root is its own parent
    rows = torch.arange(bt, device=dev)[:, None]
    for _ in range(max_depth.bit_length()):  # 2^steps > the deepest depth
        acc |= acc[rows, up]
        up = up[rows, up]
    return acc


def pack_bits(mask: torch.Tensor, words: int) -> torch.Tensor:
    """``[..., T, T]`` bool -> ``[..., T, words]`` int64: bit k of word w is column 64 w + k."""
    pad = words * 64 - mask.shape[-1]
    m = torch.nn.functional.pad(mask, (0, pad)).view(*mask.shape[:-1], words, 64)
    return (m.long() * _bit_weights(str(mask.device))).sum(-1)


@functools.lru_cache(maxsize=8)
def _bit_weights(device: str) -> torch.Tensor:
    # bit 63 is the sign bit: its weight is -2**63, and sums of distinct bits never carry
    return torch.tensor([1 << k for k in range(63)] + [-(1 << 63)], dtype=torch.int64, device=device)


def _with_zero_row(packed: torch.Tensor) -> torch.Tensor:
    """``[K, T, W]`` -> ``[K * T + 1, W]``: the rows, then one all-zero row."""
    flat = packed.reshape(-1, packed.shape[-1])
    return torch.cat([flat, flat.new_zeros(1, flat.shape[1])])


@functools.lru_cache(maxsize=64)
def _packed_topologies(topologies: tuple, tmax: int, device: str) -> torch.Tensor:
    """The packed words of static topologies plus a zero row, once per (topologies, size, device)."""
    return _with_zero_row(pack_bits(topology_masks(topologies, tmax, device), max(1, math.ceil(tmax / 64))))


def mla_tree_words(batch) -> tuple[torch.Tensor, bool]:
    """``[N, W]`` int64 ancestor-or-self bitmasks (bit j of a tree token: node j is itself or
    an ancestor), built once per tree topology; zeros for other tokens."""
    t = batch.trees
    if not len(t.reqs):
        return torch.zeros(1, 1, dtype=torch.int64), False
    words = -(-t.tmax // 64)
    packed = []
    for parents in t.topologies:
        m = np.zeros((len(parents), words * 64), dtype=bool)
        m[:, : len(parents)] = ancestor_mask(parents).numpy()
        packed.append(np.packbits(m, axis=1, bitorder="little").view(np.int64))
    anc = np.zeros((batch.num_tokens, words), dtype=np.int64)
    starts = batch.host.query_start_loc
    for b, size, topo in zip(t.reqs, t.sizes, t.topology_id):
        anc[starts[b] : starts[b] + size] = packed[topo]
    return torch.from_numpy(anc), True




def tree_inputs_fields(spec):
    """(parents, max_depth, topology ids) as workload.batch.tree_inputs built them: a loop over
    tree requests and a Python step per node of each topology."""
    from attnbench.workload.trees import depths

    reqs = [i for i, r in enumerate(spec.requests) if r.tree_parents is not None]
    index: dict = {}
    ids = [index.setdefault(spec.requests[i].tree_parents, len(index)) for i in reqs]
    sizes = [spec.requests[i].query for i in reqs]
    parents = np.full((len(reqs), max(max(sizes, default=0), 1)), -1, dtype=np.int32)
    for b, i in enumerate(reqs):
        parents[b, : sizes[b]] = spec.requests[i].tree_parents
    return parents, max((max(depths(p)) for p in index), default=0), np.array(ids, dtype=np.int64)


def token_positions(batch) -> np.ndarray:
    """triton_features.token_positions as it was: one array step per tree column."""
    h = batch.host
    n = int(h.query_lens.sum())
    req = np.repeat(np.arange(len(h.query_lens)), h.query_lens)
    pos = h.context_lens[req] + np.arange(n) - h.query_start_loc[req]
    t = batch.trees
    if t.tmax:
        par = t.parents_host.astype(np.int64)
        depth = np.zeros_like(par)
        rows = np.arange(par.shape[0])
        for j in range(1, par.shape[1]):  # parent[j] < j: its depth is known
            depth[:, j] = depth[rows, np.maximum(par[:, j], 0)] + 1
        real = np.arange(par.shape[1])[None, :] < t.sizes[:, None]
        ctx = np.repeat(h.context_lens[t.reqs], t.sizes)
        pos[token_ids(batch, t.reqs)] = ctx + depth[real]
    return pos
