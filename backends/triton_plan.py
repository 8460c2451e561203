"""Host-side plan of the Triton backend: tile sizes, work units, split-KV, tree bitmasks.

Everything data-dependent happens here, once, on the host (the batch's ``requests`` carry
every length), so that ``run`` is two kernel launches over preallocated tensors: no host
sync, no allocation, capturable in a CUDA graph.

Work decomposition
------------------
A *row block* is up to ``BLOCK_Q`` consecutive query tokens of one request; the kernel puts
the ``G`` query heads of one KV head times those tokens on the M side of its ``tl.dot``
(row ``m`` = token ``m // G``, head ``m % G``), so each K/V tile is read once per KV head.
``BLOCK_M = clamp(next_pow2(G * max query len), 16, 128)`` (64 for head_dim 256), or 64
when 64-row blocks pad at least 20% fewer rows than 128-row ones (160 rows: 192 vs 256).

A *unit* is one row block and one contiguous range of key tiles (a KV split); the grid is
``(units, num_kv_heads)``. Units are ordered request, split, row block, so the row blocks
that read the same keys run side by side and share them through L2.

Split-KV heuristic (documented in docs/triton_notes.md)
-------------------------------------------------------
Let ``base = row_blocks * Hkv`` programs and ``target = waves * SMs``, with 2 waves when
``BLOCK_M <= 32`` (decode-like, memory-bound, several CTAs per SM) and 1 wave for larger row
blocks (trees, prefill: compute-bound, one CTA per SM, where every extra split costs partial
writes; measured on an H200: tree40 115 us at 1 wave vs 140 us at 2). On the CPU
interpreter ``SMs = 4``. If ``base >= target`` nothing is split. Otherwise the total
number of key tiles over all row blocks is cut into chunks of
``chunk = max(MIN_CHUNK_TILES, ceil(total_tiles * Hkv / target))`` tiles, so programs get
about equal work whatever the lengths (a 16k request gets 4x the splits of a 4k one); a row
block with more than one chunk is split, at most ``MAX_SPLITS`` ways. A split of a row block
of ``G * q`` rows covers at least ``PARTIAL_KEYS_PER_ROW * G * q`` keys, so its float32
partial rows cost at most ~1/8 of the K/V bytes it reads (16-bit caches). Split rows write
float32 partial outputs and natural-log LSEs; a second kernel merges them.

Tree masks
----------
For every query token of a tree request, ``W = ceil(max_tree_nodes / 64)`` int64 words: bit
``k`` of word ``w`` is set iff node ``64 w + k`` is an ancestor of the token's node or the node
itself. The kernel reads one word per (row, key) of the few tiles that hold tree keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from attnbench.workload.batch import Batch
from attnbench.workload.trees import ancestor_mask

WAVES = 2
WAVES_LARGE_M = 1
MIN_CHUNK_TILES = 4
MAX_SPLITS = 64
PARTIAL_KEYS_PER_ROW = 8
CPU_SMS = 4
# columns of the int32 unit table, in order; the kernel reads them by these names
# (triton_kernels.py turns each into a constexpr offset), the table is padded to UNIT_COLS
UNIT_COLUMNS = (
    "req",  # request index (its block-table row)
    "q_start",  # packed index of the row block's first query token
    "q_count",  # query tokens in the row block
    "ctx",  # the request's context length
    "kv_lo",  # first key slot of this unit's split
    "kv_hi",  # one past its last key slot
    "full_end",  # key slots below this are visible to every row (no mask)
    "split",  # index of this split
    "prow",  # first partial row of a split row block (-1: not split)
    "tree",  # 1 for a tree request
    "q0",  # index of the block's first token within its request
    "nsplit",  # splits of this row block
    "block",  # row-block index (the fused merge's arrival counter)
)
UNIT_COLS = 16


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@dataclass
class Config:
    block_m: int
    block_q: int
    block_n: int
    num_warps: int
    num_stages: int


def choose_config(batch: Batch, block_n: Optional[int] = None, num_warps: Optional[int] = None,
                  num_stages: Optional[int] = None, block_m: Optional[int] = None) -> Config:
    g = batch.num_q_heads // batch.num_kv_heads
    d = batch.head_dim
    wide = batch.q.element_size() > 2  # float32 (interpreter, or exact runs on the GPU): smaller tiles fit smem
    cap = (32 if d >= 256 else 64) if wide else (64 if d >= 256 else 128)
    rows = g * batch.max_query_len
    bm = block_m or min(max(16, next_pow2(rows)), max(cap, next_pow2(g)))
    if block_m is None and bm == 128 and 64 * math.ceil(rows / 64) < 0.8 * 128 * math.ceil(rows / 128):
        bm = 64  # e.g. a 40-node tree, G=4: 160 rows -> 3 x 64 = 192 computed instead of 2 x 128 = 256
    bq = max(1, bm // g)
    if block_n is None:
        # decode-sized row blocks (<= 16 rows): 32-key tiles measured faster on an H100 (54 vs
        # 57 us); a 32-row block (an 8-node tree, G=4) was slower with them (31 vs 21 us)
        block_n = 32 if d >= 256 or bm <= 16 else 64
        if wide:
            block_n = 16 if d >= 256 else 32
    if block_n > 64:
        raise ValueError("block_n must be <= 64: a key tile reads at most two 64-node tree-mask words")
    if num_warps is None:
        num_warps = 8 if bm * d >= 128 * 128 else 4
    if num_stages is None:
        num_stages = 2 if d >= 256 or wide else 3
    return Config(bm, bq, block_n, num_warps, num_stages)


def tree_words(batch: Batch) -> tuple[torch.Tensor, bool]:
    """``[N, W]`` int64 ancestor bitmasks per query token (zeros for non-tree tokens)."""
    trees = [(s, r) for s, r in zip(batch.query_start, batch.requests) if r.tree_parents is not None]
    tmax = max((r.query for _, r in trees), default=1)
    w = max(1, math.ceil(tmax / 64))
    words = np.zeros((max(1, batch.num_tokens), w * 8), dtype=np.uint8)
    for s, r in trees:
        m = ancestor_mask(r.tree_parents).numpy()  # [T, T]
        packed = np.packbits(m, axis=1, bitorder="little")  # [T, ceil(T/8)] bytes, little-endian bits
        words[s : s + r.query, : packed.shape[1]] = packed
    return torch.from_numpy(words.view("<i8").copy()), bool(trees)


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_SMS


def build_units(batch: Batch, cfg: Config, sms: int, splits: Optional[int] = None):
    """Returns ``(units [U, UNIT_COLS] int32, merge [R, 2] int32, max_splits, row_blocks)``.

    ``splits``: None for the heuristic, or a fixed number of splits for every row block
    (tests use it to force both paths)."""
    bn, bq = cfg.block_n, cfg.block_q
    blocks = []  # (req, q_start_global, q_count, ctx, kv_end, full_end, is_tree, q0)
    for i, (s, r) in enumerate(zip(batch.query_start, batch.requests)):
        tree = r.tree_parents is not None
        for q0 in range(0, r.query, bq):
            qc = min(bq, r.query - q0)
            kv_end = r.context + q0 + qc
            full_end = r.context if tree else r.context + q0 + 1
            blocks.append((i, s + q0, qc, r.context, kv_end, full_end, int(tree), q0))
    tiles = [math.ceil(b[4] / bn) for b in blocks]
    nsplit = _split_counts(batch, cfg, sms, splits, blocks, tiles)
    # no empty splits: n splits of ceil(tiles / n) tiles each may need fewer than n
    nsplit = [math.ceil(t / math.ceil(t / n)) if t else 1 for t, n in zip(tiles, nsplit)]
    units, merge = [], []
    prow = 0
    # order: request, split, row block (row blocks of one request reading the same keys adjacent)
    by_req: dict[int, list[int]] = {}
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
    u = torch.tensor(units, dtype=torch.int32).reshape(-1, UNIT_COLS)
    m = torch.tensor(merge, dtype=torch.int32).reshape(-1, 2)
    return u, m, max(nsplit), len(blocks)


def _split_counts(batch: Batch, cfg: Config, sms: int, splits: Optional[int], blocks: list, tiles: list[int]) -> list[int]:
    """Splits per row block: forced (``splits``), or the heuristic of the module docstring."""
    if splits is not None:
        return [max(1, min(splits, t)) for t in tiles]
    hkv = batch.num_kv_heads
    g = batch.num_q_heads // hkv
    bn = cfg.block_n
    # small row blocks (decode) are memory-bound and fit several CTAs per SM: 2 waves;
    # large ones (trees, prefill) are compute-bound, one CTA per SM: 1 wave (fewer partials)
    target = (WAVES if cfg.block_m <= 32 else WAVES_LARGE_M) * sms
    if len(blocks) * hkv >= target:
        return [1] * len(blocks)
    chunk = max(MIN_CHUNK_TILES, math.ceil(sum(tiles) * hkv / target))
    nsplit = []
    for b, t in zip(blocks, tiles):
        # a split writes G*q float32 partial rows: keep that under 1/8 of its K/V bytes
        floor_tiles = math.ceil(PARTIAL_KEYS_PER_ROW * g * b[2] / bn)
        nsplit.append(max(1, min(MAX_SPLITS, math.ceil(t / max(chunk, floor_tiles)))))
    return nsplit
