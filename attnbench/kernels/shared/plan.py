"""Host-side plan of the Triton backend: tile sizes, work units, split-KV, tree bitmasks.

Everything data-dependent happens here, by numpy array ops on the batch's host lengths
(``batch.host``) and tree inputs (``batch.trees``), with no Python loop over requests, row
blocks, tree nodes or split candidates. ``build_units`` and ``host_tree_words`` define the
tables; the backend's plan builds the same values per step through ``shared/step.py`` (the
query side cached per shape) into one host buffer, and every table reaches the device in one
copy (the unit table, merge rows, tree words, the fused merge's zeroed counters, positions):
on a GPU a plan costs one host-to-device copy and the output buffer's allocation (and the
partial buffers' when a row block splits; issue 33: separate copies, memsets and the
device-side tree build cost 0.38-1.84 ms of host time a step on an H100 machine); ``run`` is two kernel launches
over preallocated tensors: no host sync, no allocation, capturable in a CUDA graph.

Work decomposition
------------------
A *row block* is up to ``BLOCK_Q`` consecutive query tokens of one request; the kernel puts
the ``G`` query heads of one KV head times those tokens on the M side of its ``tl.dot``
(row ``m`` = token ``m // G``, head ``m % G``), so each K/V tile is read once per KV head.
``BLOCK_M = clamp(next_pow2(G * max query len), 16, 128)`` (64 for head_dim 256), or 64
when 64-row blocks pad at least 20% fewer rows than 128-row ones (160 rows: 192 vs 256) and
the longest request has at least ``LONG_KEYS`` keys. 64-row blocks of 16-bit d=128 caches
use 32-key tiles under a 168-register cap: 3 programs per SM instead of 2. Decode-sized row
blocks (<= 16 rows, d 128, 16-bit queries) with at least ``LONG_KEYS`` keys run the unmasked
loop in 64-key tiles (``block_nf``; the masked tail keeps 32).

A *unit* is one row block and one contiguous range of key tiles (a KV split); the grid is
``(units, num_kv_heads)``. Units are ordered request, split, row block, so the row blocks
that read the same keys run side by side and share them through L2.

Split-KV heuristic (``split_counts``; the kernel notes in git history (triton_notes.md), rounds 5-8)
-----------------------------------------------------------------------
Row blocks of <= 32 rows (decode-like, memory-bound): enough programs for 2 waves of the
SMs (4 on the CPU interpreter; FP8 caches twice as many: ``wave_scale``), the key tiles cut
into chunks of about equal size, at most ``MAX_SPLITS`` per row block, each split at least
``PARTIAL_KEYS_PER_ROW * G * q`` keys so its float32 partial rows cost at most ~1/8 of the
K/V bytes it reads (~1/4 for FP8). Larger row blocks
(trees, prefill) are latency-bound per program: the heuristic scores each candidate chunk
by rounds x the longest program (+ start-up) + a cost per split, with the programs that fit
on an SM at once from the config's shared memory and registers (``ctas_per_sm``). Split
rows write float32 partial outputs and natural-log LSEs; a second kernel merges them.

Tree masks
----------
For every query token of a tree request, ``W = ceil(max_tree_nodes / 64)`` int64 words: bit
``k`` of word ``w`` is set iff node ``64 w + k`` is an ancestor of the token's node or the node
itself. The kernel reads one word per (row, key) of the few tiles that hold tree keys. The
words of static trees are packed once per topology (cached); dynamic trees' are rebuilt in
every plan, as words, by pointer doubling on the host (``ancestor_words``: bit_length(depth)
numpy steps). Each token then takes its row of the table by one gather (non-tree tokens keep
an all-zero row).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from attnbench.workload.batch import Batch

from attnbench.kernels.shared import features as tf
from attnbench.workload.tokens import token_ids, topology_masks

WAVES = 2
MIN_CHUNK_TILES = 4
MAX_SPLITS = 64
PARTIAL_KEYS_PER_ROW = 8
CPU_SMS = 4
LONG_KEYS = 2048  # keys of the longest request from which 64-row blocks take 3 programs per SM
PROGRAM_TILES = 4  # start-up of a program (q load, pipeline fill), in key tiles
SPLIT_TILES = 3  # partial outputs + merge, per split, in key tiles
SMEM_PER_SM = 228 * 1024  # Hopper (H100/H200)
REGS_PER_SM = 65536
# columns of the int32 unit table, in order; the kernel reads them by these names
# (paged/kernels.py turns each into a constexpr offset), the table is padded to UNIT_COLS
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
    "full_lo",  # sliding window: key slots at or past this are inside every row's window (0: none)
    "bidir",  # 1 for a bidirectional prefill (causal: false): every row sees every key
    "win_lo",  # sliding window: the first key slot any row sees (slots below it are never read)
)
UNIT_COLS = 16
COL = {name: i for i, name in enumerate(UNIT_COLUMNS)}


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@dataclass
class Config:
    block_m: int
    block_q: int
    block_n: int
    num_warps: int
    num_stages: int
    block_nf: int = 0  # key tile of the unmasked loop (0: block_n); splits start at its multiples
    maxnreg: Optional[int] = None  # register cap per thread (None: the compiler's choice)
    wave_scale: float = 1.0  # decode split rule: programs per SM relative to a 16-bit cache's (``wave_scale``)

    def __post_init__(self):
        self.block_nf = self.block_nf or self.block_n


def choose_config(batch: Batch, block_n: Optional[int] = None, num_warps: Optional[int] = None,
                  num_stages: Optional[int] = None, block_m: Optional[int] = None,
                  block_nf: Optional[int] = None, maxnreg: Optional[int] = None,
                  fp8_split: Optional[float] = None) -> Config:
    g = batch.num_q_heads // batch.num_kv_heads
    d = next_pow2(batch.head_dim)  # 96 runs padded to 128 (the extra lanes masked)
    wide = batch.q.element_size() > 2  # float32 (interpreter, or exact runs on the GPU): smaller tiles fit smem
    cap = (32 if d >= 256 else 64) if wide else (64 if d >= 256 else 128)
    rows = g * int(batch.host.query_lens.max())
    bm = block_m or min(max(16, next_pow2(rows)), max(cap, next_pow2(g)))
    # long: enough keys per row block that 3 programs per SM pay (below, rounds 6-7)
    window = tf.window_of(batch) or math.inf  # a window bounds the keys a row block reads
    h = batch.host
    keys = int(np.minimum(h.kv_lens, window + h.query_lens).max(initial=0))
    long = wide or d != 128 or keys >= LONG_KEYS
    if block_m is None and bm == 128 and long and 64 * math.ceil(rows / 64) < 0.8 * 128 * math.ceil(rows / 128):
        # e.g. a 40-node tree, G=4: 160 rows -> 3 x 64 = 192 computed instead of 2 x 128 = 256;
        # at 1k keys the two 128-row programs ran faster (36 vs 40-43 us on an H100)
        bm = 64
    bq = max(1, bm // g)
    if block_n is None:
        # decode-sized row blocks (<= 16 rows): 32-key tiles measured faster on an H100 (54 vs
        # 57 us); a 32-row block (an 8-node tree, G=4) was slower with them (31 vs 21 us)
        block_n = 32 if d >= 256 or bm <= 16 else 64
        if wide:
            block_n = 16 if d >= 256 else 32
        elif bm == 64 and d == 128 and maxnreg is None and long:
            # 64-row blocks (a 40-node tree, G=4) are latency-bound per program: 32-key tiles
            # with at most 168 registers fit 3 programs per SM (64 KB of shared memory each)
            # instead of 2; with the split heuristic's 2 splits, tree40 at 4k, page 16 ran
            # 105 us instead of 121 on an H100 (the kernel notes in git history (triton_notes.md), round 6)
            block_n, maxnreg = 32, 168
    if block_n > 64:
        raise ValueError("block_n must be <= 64: a key tile reads at most two 64-node tree-mask words")
    if num_warps is None:
        num_warps = 8 if bm * d >= 128 * 128 else 4
    if num_stages is None:
        num_stages = 2 if d >= 256 or wide else 3
    if block_nf and (block_nf < block_n or block_nf % block_n):  # 0: block_n, without the 64-key rule below
        raise ValueError(f"block_nf {block_nf} must be a multiple of block_n {block_n}")
    if block_nf is None and bm <= 16 and block_n == 32 and d == 128 and not wide and keys >= LONG_KEYS:
        # long decodes: 64-key unmasked tiles (masked tail still 32), half the loop iterations per
        # byte; 8 x 16k, page 16 on an H200: bf16 139 vs 154 us, FP8 163 vs 189 (issue 33, FP8 round 1)
        block_nf = 64
    return Config(bm, bq, block_n, num_warps, num_stages, block_nf or block_n, maxnreg, wave_scale(batch, fp8_split))


FP8_BYTES_MARGIN = 0.95  # wave_scale's margin under the bytes ratio


def wave_scale(batch: Batch, fp8_split: Optional[float] = None) -> float:
    """The decode split rule's programs per SM relative to a 16-bit cache's (issue 33, FP8 round 2).

    The rule counts bytes in flight: a decode program steps one key tile at a time (its tile
    clock, not DRAM, sets its pace), so what keeps DRAM busy is the bytes of the tiles all
    resident programs read at once. ``WAVES`` programs per SM of 16-bit tiles saturate the
    H200's reads (bf16 8 x 16k: 137 us, 94% of the floor; 8 splits instead of 5: 171 us). A
    program of a cache of ``e`` bytes per element reads e/2 of a 16-bit tile's bytes per tile, so
    it takes 2/e as many programs for the same bytes in flight, taken 0.95 x: 2^k keys plus the
    decode's own are 2^k/64 + 1 tiles, which the full 2x rounds one split past a wave (8 x 16k: 9
    splits); 0.95 x measured faster at all 5 sizes of issue 33's defaults round (H200, 8 x 16k
    120.1 -> 93.2 us; the kernel notes in git history (triton_notes.md)). 16-bit and wider caches keep 1. ``fp8_split``: FP8's."""
    e = batch.k_cache.element_size()
    if e >= 2:
        return 1.0
    return float(fp8_split) if fp8_split is not None else FP8_BYTES_MARGIN * 2.0 / e


def decode_programs(cfg: Config, sms: int) -> int:
    """The programs the decode split rule aims at: ``WAVES`` per SM times the cache's
    ``wave_scale`` (exactly ``WAVES * sms`` for 16-bit caches)."""
    return max(1, int(WAVES * cfg.wave_scale * sms))


def tree_words(batch: Batch) -> tuple[torch.Tensor, bool]:
    """``[N, W]`` int64 ancestor bitmasks per query token (zeros for non-tree tokens), on the
    batch's device, and whether the batch has a tree (``host_tree_words`` copied over)."""
    words, has_tree = host_tree_words(batch)
    return torch.from_numpy(words).to(batch.device), has_tree


def host_tree_words(batch: Batch) -> tuple[np.ndarray, bool]:
    """``[max(N, 1), W]`` int64 ancestor bitmasks per query token, on the host (numpy), and
    whether the batch has a tree. Static trees' words are packed once per topology (cached);
    dynamic trees' are rebuilt from the parent arrays in every call (``ancestor_words``).
    Built on the host and uploaded with the plan's other tables in one copy: on a GPU the
    old device build (a gather and ~8 small kernels per pointer-doubling step) cost more host
    time in launches than the whole numpy build (issue 33)."""
    t = batch.trees
    w = max(1, math.ceil(t.tmax / 64))
    out = np.zeros((max(1, batch.num_tokens), w), dtype=np.int64)
    if not t.tmax:
        return out, False
    if t.dynamic:  # rebuilt each plan, straight as words
        table = ancestor_words(t.parents_host, w, t.max_depth).reshape(-1, w)
        row_of_tree = np.arange(len(t.reqs)) * t.tmax
    else:  # static: packed once per topology
        table = _packed_topologies(t.topologies, t.tmax)
        row_of_tree = t.topology_id * t.tmax
    first = np.cumsum(t.sizes) - t.sizes
    node = np.arange(int(t.sizes.sum())) - np.repeat(first, t.sizes)
    out[token_ids(batch, t.reqs)] = table[np.repeat(row_of_tree, t.sizes) + node]
    return out, True


def ancestor_words(parents: np.ndarray, words: int, max_depth: int) -> np.ndarray:
    """``[Bt, T]`` parent arrays -> ``[Bt, T, words]`` int64 ancestor bitmasks, by pointer
    doubling on the words themselves (as ``trees.ancestor_masks`` does on bool rows), in
    numpy. Padding nodes (parent -1) point at the root: their rows are never read."""
    bt, t = parents.shape
    node = np.arange(t)
    own = np.zeros((t, words), dtype=np.uint64)
    own[node, node // 64] = np.left_shift(np.uint64(1), (node % 64).astype(np.uint64))
    acc = np.tile(own, (bt, 1))  # [bt * t, words]: flat rows, so each step is one take
    # each node's parent as a flat row (the root is its own parent)
    up = (np.maximum(parents.astype(np.int64), 0) + (np.arange(bt) * t)[:, None]).reshape(-1)
    for _ in range(max_depth.bit_length()):  # 2^steps > the deepest depth
        acc |= acc[up]
        up = up[up]
    return acc.view(np.int64).reshape(bt, t, words)


@functools.lru_cache(maxsize=64)
def _packed_topologies(topologies: tuple, tmax: int) -> np.ndarray:
    """``[K * tmax, W]`` int64 (read-only): the packed words of static topologies, once per
    (topologies, size), from the ancestor masks every backend shares (``topology_masks``).
    Bit k of word w is node 64 w + k (little-endian bytes: ``packbits``' little bit order)."""
    w = max(1, math.ceil(tmax / 64))
    masks = topology_masks(topologies, tmax, "cpu").numpy()
    bits = np.zeros(masks.shape[:2] + (w * 64,), dtype=bool)
    bits[..., : masks.shape[-1]] = masks
    table = np.packbits(bits, axis=-1, bitorder="little").view("<i8").reshape(-1, w).astype(np.int64)
    table.flags.writeable = False
    return table


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
    return CPU_SMS


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    """A GPU's SM count, asked once (the properties' Python object costs host time every plan)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def ctas_per_sm(cfg: Config, head_dim: int, elsize: int = 2) -> int:
    """Programs of this config that fit on one SM together (H100/H200: 228 KB of shared
    memory, 64K registers), from the shared memory the pipeline needs (Q + ``num_stages``
    K and V tiles) and the registers (``maxnreg``, else the 255 Triton reaches here)."""
    smem = (cfg.block_m + 2 * cfg.num_stages * cfg.block_nf) * head_dim * elsize + 1024
    regs = (cfg.maxnreg or 255) + 1
    return max(1, min(SMEM_PER_SM // smem, REGS_PER_SM // (32 * cfg.num_warps * regs)))


def split_counts(tiles, rows, cfg: Config, head_dim: int, sms: int, hkv: int, per_sm: int = 0) -> np.ndarray:
    """KV splits per row block (``tiles``: its key tiles, ``rows``: its G*q rows).

    Small row blocks (decode, <= 32 rows) are memory-bound: enough programs for ``WAVES``
    waves (times ``cfg.wave_scale``, FP8 caches 2: ``decode_programs``), in chunks of about
    equal tiles, each split at least ``PARTIAL_KEYS_PER_ROW`` keys per row (its float32
    partial rows stay under 1/8 of the K/V bytes it reads, 1/4 for FP8).
    Larger row blocks (trees, prefill) are latency-bound per program (the kernel notes in git history (triton_notes.md),
    rounds 5-6): a program of c key tiles takes ~ c + PROGRAM_TILES (start-up) tile times
    whether or not others share its SM, so the launch takes ~ rounds x (longest program),
    rounds = ceil(all programs' tile times / (slots x longest)), slots = SMs x programs per
    SM; each split adds SPLIT_TILES (partials and their merge). Each candidate (the longest
    row block cut into 1..MAX_SPLITS chunks) is scored so, in tile times; the lowest score
    wins, ties to fewer splits. Fitted to the H100 times of 1..4 splits of tree40 at 1k, 4k
    and 16k; counting work rather than programs keeps causal prefill (short and long row
    blocks mixed) unsplit."""
    t = np.asarray(tiles, dtype=np.int64)
    if cfg.block_m <= 32:
        programs = decode_programs(cfg, sms)
        if len(t) * hkv >= programs:
            return np.ones_like(t)
        chunk = max(MIN_CHUNK_TILES, -(-int(t.sum()) * hkv // programs))
        floor_tiles = -(-PARTIAL_KEYS_PER_ROW * np.asarray(rows, dtype=np.int64) // cfg.block_nf)
        return np.maximum(1, np.minimum(MAX_SPLITS, -(-t // np.maximum(chunk, floor_tiles))))
    slots = sms * (per_sm or ctas_per_sm(cfg, head_dim))
    longest = int(t.max()) if len(t) else 1
    return np.maximum(1, -(-t // large_chunk(t, longest, slots, hkv)))


def large_chunk(t: np.ndarray, longest: int, slots: int, hkv: int) -> int:
    """``split_counts``' pick for larger row blocks: the key tiles per split of the lowest-scoring
    candidate (``t`` int64 tiles per row block, ``longest`` their max; ties to fewer splits)."""
    chunk, col, span, whole, cost = candidates(longest, slots)
    if len(chunk) == 1:
        return int(chunk[0])
    if longest <= 1 << 16:  # few distinct tile counts, each with its count (bincount: 1/3 of unique's time)
        count = np.bincount(t)
        tu = count.nonzero()[0]
        count = count[tu]
    else:
        tu, count = np.unique(t, return_counts=True)
    # work = hkv (all tiles + PROGRAM_TILES x the programs), programs = sum ceil(tiles / chunk); float64
    # integers, exact (< 2^53): a quotient at least 1/divisor away from an integer cannot round onto it
    work = np.ceil(tu / col).dot(count) * float(PROGRAM_TILES * hkv) + float(hkv * tu.dot(count))
    score = np.ceil(work / whole) * span + cost  # rounds (ceil) x the longest program + splits
    return int(chunk[score.argmin()])  # methods, not np.argmin/np.dot: no dispatch layer (~1 us each)


@functools.lru_cache(maxsize=256)
def candidates(longest: int, slots: int) -> tuple:
    """``(chunk, chunk as a column, span, slots x span, split cost)`` of
    the candidate split counts of a row block of ``longest`` tiles on ``slots`` program slots
    (read-only; a function of those two numbers, kept across plans)."""
    n = np.arange(1, MAX_SPLITS + 1)  # every candidate at once, as the loop over n did one by one
    chunk = -(-longest // n)
    last = np.flatnonzero(chunk <= MIN_CHUNK_TILES)  # the loop stopped after the first such chunk
    if len(last):
        n, chunk = n[: last[0] + 1], chunk[: last[0] + 1]
    span = chunk + PROGRAM_TILES
    out = (chunk, chunk[:, None], span, slots * span, (n > 1) * n * SPLIT_TILES)
    for a in out:
        a.flags.writeable = False
    return out


def build_units(batch: Batch, cfg: Config, sms: int, splits: Optional[int] = None,
                positions: Optional[np.ndarray] = None):
    """Returns ``(units [U, UNIT_COLS] int32, merge [R, 2] int32, max_splits, row_blocks)``.

    ``splits``: None for the heuristic, or a fixed number of splits for every row block
    (tests use it to force both paths). Numpy array ops over row blocks, no loop.
    With a sliding window a row block's key range (and its splits) starts at the first tile
    holding a key inside some row's window (``positions``: the tokens' positions,
    shared/features.token_positions); a bidirectional prefill's row blocks read every key of
    their request."""
    bn, bq = cfg.block_nf, cfg.block_q  # splits start on the unmasked loop's tiles
    h = batch.host
    nb = -(-h.query_lens // bq)  # row blocks per request
    req = np.repeat(np.arange(len(nb)), nb)
    q0 = (np.arange(int(nb.sum())) - np.repeat(np.cumsum(nb) - nb, nb)) * bq
    qc = np.minimum(bq, h.query_lens[req] - q0)
    ctx, tree = h.context_lens[req], h.is_tree[req]
    bidir = ~tf.causal_flags(batch)[req]
    kv_end = np.where(bidir, h.kv_lens[req], ctx + q0 + qc)
    qs = h.query_start_loc[req] + q0
    window = tf.window_of(batch)
    if window and positions is None:
        positions = tf.token_positions(batch)
    win_lo, full_lo = tf.window_bounds(positions, qs, window)
    lo = win_lo // bn * bn  # the key range starts on the tile holding the window's first key
    tiles = -(-(kv_end - lo) // bn)
    nsplit = np.maximum(1, np.minimum(splits, tiles)) if splits is not None else split_counts(  # forced, or the heuristic
        tiles, batch.num_q_heads // batch.num_kv_heads * qc, cfg, batch.head_dim, sms, batch.num_kv_heads)
    per = -(-tiles // nsplit)
    nsplit = -(-tiles // per)  # no empty splits: n splits of ceil(tiles / n) tiles may need fewer
    split = nsplit > 1
    rows = np.where(split, np.cumsum(qc * split) - qc * split, -1)  # first partial row
    cnt = qc[split]
    merge = np.zeros((0, 2), np.int32) if not len(cnt) else np.stack(
        [np.repeat(qs[split] - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum())),
         np.repeat(nsplit[split], cnt)], axis=1).astype(np.int32)
    blocks = np.zeros((len(nsplit), UNIT_COLS), dtype=np.int32)  # each row block's columns, gathered below
    for name, values in (("req", req), ("q_start", qs), ("q_count", qc), ("ctx", ctx), ("kv_lo", lo),
                         ("kv_hi", np.minimum(kv_end, lo + per * bn)), ("prow", rows), ("tree", tree),
                         ("full_end", np.where(tree, ctx, np.where(bidir, kv_end, ctx + q0 + 1))), ("q0", q0),
                         ("nsplit", nsplit), ("block", np.arange(len(nsplit))), ("full_lo", full_lo),
                         ("bidir", bidir), ("win_lo", win_lo)):  # once per column, not per unit
        blocks[:, COL[name]] = values
    if not len(cnt):  # no split: one unit per row block, in the blocks' (request) order
        return torch.from_numpy(blocks), torch.from_numpy(merge), 1, len(nsplit)
    # one unit per (row block, split), ordered request, split, row block (row blocks of one
    # request reading the same keys run side by side)
    k = np.repeat(np.arange(len(nsplit)), nsplit)
    sp = np.arange(len(k)) - np.repeat(np.cumsum(nsplit) - nsplit, nsplit)
    order = np.lexsort((k, sp, req[k]))
    k, sp = k[order], sp[order]
    units = blocks[k]
    units[:, COL["split"]] = sp
    units[:, COL["kv_lo"]] = lo[k] + sp * per[k] * bn
    units[:, COL["kv_hi"]] = np.minimum(kv_end[k], lo[k] + (sp + 1) * per[k] * bn)
    return torch.from_numpy(units), torch.from_numpy(merge), int(nsplit.max()), len(nsplit)

