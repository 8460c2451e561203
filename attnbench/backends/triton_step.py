"""The triton plan's per-step fast path (issue 33: <= 200 us of host time a step).

``triton_plan.build_units`` and ``host_tree_words`` say what the tables hold; this module
builds the same values with far fewer numpy calls, in three parts:

- a *shape* (``Shape``), cached per backend instance, holds what depends only on the step's
  query side and options: the row-block decomposition (request, first token, token count,
  tree and bidirectional flags), the unit table's constant columns, each column's offset from
  the request's context length (``kv_end = ctx + end_off``, ``full_end = ctx + fe_off``), the
  split heuristic's partial-row floor, a static tree's per-token words, the positions'
  offsets. Keyed by the query lengths, the tree and causal flags, the static topologies and
  the batch's dims: an engine's decode or verify steps keep it while the contexts grow.
- every step recomputes what depends on the key lengths (the context lengths, hence the key
  ranges, tiles, splits, units, merge rows, window bounds and positions) and a dynamic tree's
  words (its parents change every step): nothing keyed on the context lengths or on a
  dynamic tree's parents is reused, so a timed plan costs what an engine's step would.
- the tables are written straight into one host buffer (``Staging``): on a GPU, with
  ATTNBENCH_TRITON_PINNED_STAGING=1 (until a device run has timed it; else a buffer of the
  plan's own and one plain copy), one of a ring of pinned buffers, copied with one
  ``non_blocking`` copy into a fresh device buffer
  (each plan owns its tables: the runner runs its first plan after timing later ones); a
  slot is rewritten only after the event recorded behind its last copy has completed. On the
  CPU each plan gets a fresh numpy buffer (no copy).

Layout of the buffer (int32 elements, each table 16-byte aligned): tree words ``[N, W]``
int64, the fused merge's counters ``[row blocks, Hkv]`` (zeros), positions ``[N]`` (with a
window or ALiBi), merge rows ``[R, 2]`` (at least one row), units ``[U, UNIT_COLS]``. The
first three have the shape's sizes: a cached image of them (static words, zeros) is copied
in with one call.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from . import triton_features as tf
from . import triton_plan as tp
from ._metadata import token_ids

C = tp.COL
RING = 4  # pinned buffers in flight on a GPU (a slot is reused 4 plans later, after its event)
SHAPES = 16  # shapes kept per backend instance


def al(n: int) -> int:
    """``n`` int32 elements rounded up to 16 bytes (every table starts aligned)."""
    return -(-n // 4) * 4


@dataclass
class Shape:
    nblk: int
    req: np.ndarray  # [nblk] request of each row block
    qc: np.ndarray  # [nblk] query tokens
    qs: np.ndarray  # [nblk] first packed token
    end_off: np.ndarray  # [nblk] kv_end - ctx
    fe_off: np.ndarray  # [nblk] full_end - ctx
    rows: np.ndarray  # [nblk] G * qc
    blocks: np.ndarray  # [nblk, UNIT_COLS] int32: the constant columns (unsplit values)
    sorted_units: bool  # every request has one row block: units need no sort
    image: np.ndarray  # int32: the words and zeroed counters (the buffer's constant prefix)
    sem_at: int  # where the counters start (the words start at 0)
    pos_at: int  # where the positions start
    n: int  # query tokens
    words: "Words"
    tok_req: Optional[np.ndarray] = None  # [N] request of each token (positions)
    tok_off: Optional[np.ndarray] = None  # [N] position - ctx (static trees or none)
    omin: Optional[np.ndarray] = None  # [nblk] min / max of tok_off over the block (window)
    omax: Optional[np.ndarray] = None
    layouts: dict = field(default_factory=dict)  # nsplit bytes -> Layout


def shape_key(batch, positions: bool, long: bool) -> tuple:
    """What a shape (and the config) depends on: dims, dtype, window, positions, long keys,
    the query lengths, tree and causal flags, and a static tree's topologies (a dynamic tree's
    parents are not in it: its words are rebuilt every step)."""
    h = batch.host
    return (batch.q.shape, batch.dtype, batch.num_kv_heads, tf.window_of(batch), positions, long,
            h.query_lens.tobytes(), h.is_tree.tobytes(), h.causal.tobytes(), tree_key(batch.trees))


def tree_key(t) -> tuple:
    """A step's trees as a shape: static topologies and who uses which; a dynamic tree's
    size only (its parents change every step and are never part of a key)."""
    return (t.dynamic, t.tmax) if t.dynamic else (t.tmax, t.topologies, t.topology_id.tobytes())


def make_shape(batch, cfg: tp.Config, positions: bool) -> Shape:
    """The query side of a step, once per shape (the reference constructions' own code)."""
    h, t = batch.host, batch.trees
    bq = cfg.block_q
    nb = -(-h.query_lens // bq)
    req = np.repeat(np.arange(len(nb)), nb)
    q0 = (np.arange(int(nb.sum())) - np.repeat(np.cumsum(nb) - nb, nb)) * bq
    qc = np.minimum(bq, h.query_lens[req] - q0)
    tree, bidir = h.is_tree[req], ~h.causal[req]
    qs = h.query_start_loc[req] + q0
    nblk = len(req)
    blocks = np.zeros((nblk, tp.UNIT_COLS), dtype=np.int32)
    for name, v in (("req", req), ("q_start", qs), ("q_count", qc), ("prow", -1), ("tree", tree), ("q0", q0),
                    ("nsplit", 1), ("block", np.arange(nblk)), ("bidir", bidir)):
        blocks[:, C[name]] = v
    n, hkv = batch.num_tokens, batch.num_kv_heads
    words = Words(batch)
    sem_at = al(words.size)
    pos_at = sem_at + al(nblk * hkv)
    image = np.zeros(pos_at, np.int32)
    image[: words.size] = words.image
    g = batch.num_q_heads // hkv
    sh = Shape(nblk, req, qc, qs, np.where(bidir, h.query_lens[req], q0 + qc),
               np.where(tree, 0, np.where(bidir, h.query_lens[req], q0 + 1)), g * qc, blocks,
               bool((nb <= 1).all()), image, sem_at, pos_at, n, words)
    if positions:
        sh.tok_req = np.repeat(np.arange(len(nb)), h.query_lens)
        if not t.dynamic:
            sh.tok_off = tf.token_positions(batch) - h.context_lens[sh.tok_req]
            sh.omin = np.minimum.reduceat(sh.tok_off, qs)
            sh.omax = np.maximum.reduceat(sh.tok_off, qs)
    return sh


class Words:
    """A step's tree words ``[max(N, 1), W]`` int64 (``tp.host_tree_words``): a static tree's
    packed once per shape (``image``, int32 elements), a dynamic tree's rebuilt every step by
    ``tp.ancestor_words``' pointer doubling into the buffer (``write``), the constant parts
    (each node's own bit, the tokens' rows) kept."""

    def __init__(self, batch):
        t = batch.trees
        self.w = w = max(1, -(-t.tmax // 64))
        self.dynamic = t.dynamic
        words = np.zeros((max(1, batch.num_tokens), w), np.int64) if t.dynamic or not t.tmax \
            else tp.host_tree_words(batch)[0]
        self.nw, self.size = words.shape[0], words.size * 2
        self.image = words.reshape(-1).view(np.int32)
        if t.dynamic:
            first = np.cumsum(t.sizes) - t.sizes
            node = np.arange(int(t.sizes.sum())) - np.repeat(first, t.sizes)
            self.tok, self.row = token_ids(batch, t.reqs), np.repeat(np.arange(len(t.reqs)) * t.tmax, t.sizes) + node
            bits = np.arange(t.tmax)
            own = np.zeros((t.tmax, w), dtype=np.uint64)
            own[bits, bits // 64] = np.left_shift(np.uint64(1), (bits % 64).astype(np.uint64))
            self.acc0 = np.tile(own, (len(t.reqs), 1)).reshape(-1) if w == 1 else np.tile(own, (len(t.reqs), 1))
            self.offs = (np.arange(len(t.reqs)) * t.tmax)[:, None]  # flat rows: 1-D gathers for one word

    def write(self, buf: np.ndarray, batch) -> None:
        """A dynamic step's words into ``buf`` (which holds the zero image)."""
        t = batch.trees
        acc = self.acc0.copy()
        up = (np.maximum(t.parents_host, 0) + self.offs).reshape(-1)
        for _ in range(t.max_depth.bit_length()):
            acc |= acc[up]
            up = up[up]
        words = buf[: self.size].view(np.int64)
        (words if self.w == 1 else words.reshape(self.nw, self.w))[self.tok] = acc.view(np.int64)[self.row]


class Staging:
    """The host buffers a plan writes its tables into, and their one copy to the device."""

    def __init__(self):
        self.ring: list = [None] * RING  # (pinned int32 tensor, its numpy view, event)
        self.i = 0
        # the pinned ring has not run on a GPU yet (written on a CPU-only machine): until a device
        # run has checked and timed it (scripts/gpu/gpu_triton_plan.sh), CUDA plans take one plain
        # copy from a buffer of their own, as before, unless ATTNBENCH_TRITON_PINNED_STAGING=1
        self.pinned = os.environ.get("ATTNBENCH_TRITON_PINNED_STAGING", "") == "1"

    def host(self, size: int, device: torch.device) -> np.ndarray:
        if device.type != "cuda" or not self.pinned:
            return np.empty(size, np.int32)  # each plan owns its tables
        self.i = (self.i + 1) % RING
        slot = self.ring[self.i]
        if slot is not None and slot[2] is not None:
            slot[2].synchronize()  # its last copy has left the buffer (at once, but for a long queue)
        if slot is None or slot[1].size < size:
            pinned = torch.empty(max(size, 1 << 14), dtype=torch.int32, pin_memory=True)
            slot = self.ring[self.i] = [pinned, pinned.numpy(), None]
        return slot[1][:size]

    def send(self, buf: np.ndarray, device: torch.device) -> torch.Tensor:
        if device.type != "cuda" or not self.pinned:  # the CPU: the buffer itself (else one plain copy)
            return torch.from_numpy(buf) if device.type == "cpu" else torch.from_numpy(buf).to(device)
        slot = self.ring[self.i]
        dev = torch.empty(buf.size, dtype=torch.int32, device=device)
        dev.copy_(slot[0][: buf.size], non_blocking=True)
        if slot[2] is None:
            slot[2] = torch.cuda.Event()
        slot[2].record(torch.cuda.current_stream(device))  # the stream the copy went on
        return dev


def _blocks_step(sh: Shape, batch, cfg: tp.Config, sms: int, splits: Optional[int]):
    """The key side of every row block for this step's context lengths: ``(ctx, kv_end, lo,
    win_lo, full_lo, per, nsplit)`` (``build_units``' arithmetic; lo and the window bounds 0
    without a window)."""
    bn = cfg.block_nf
    ctx = batch.host.context_lens[sh.req]
    kv_end = ctx + sh.end_off
    window = tf.window_of(batch)
    if window and sh.omin is None:  # dynamic trees with a window: positions rebuilt in full
        win_lo, full_lo = tf.window_bounds(tf.token_positions(batch), sh.qs, window)
    elif window:
        win_lo, full_lo = np.maximum(0, ctx + (sh.omin - window + 1)), np.maximum(0, ctx + (sh.omax - window + 1))
    else:
        win_lo = full_lo = lo = 0
    if window:
        lo = win_lo // bn * bn
    tiles = (kv_end - lo + (bn - 1)) // bn
    if splits is not None:
        nsplit = np.maximum(1, np.minimum(splits, tiles))
    else:
        nsplit = tp.split_counts(tiles, sh.rows, cfg, batch.head_dim, sms, batch.num_kv_heads)
    per = -(-tiles // nsplit)
    return ctx, kv_end, lo, win_lo, full_lo, per, (tiles + per - 1) // per  # no empty splits


@dataclass
class Layout:
    """The units of one split pattern (``nsplit`` per row block) of a shape: which row block
    and split each unit is (ordered request, split, row block), its constant columns, and the
    merge rows (all of them depend on the pattern only, not on the context lengths)."""

    k: np.ndarray  # [U] row block of each unit
    sp: np.ndarray  # [U] its split
    units: np.ndarray  # [U, UNIT_COLS] int32, the key-side columns left 0
    merge: np.ndarray  # [R, 2] int32
    smax: int


def make_layout(sh: Shape, nsplit: np.ndarray) -> Layout:
    split = nsplit > 1
    cnt = sh.qc[split]
    blocks = sh.blocks.copy()
    blocks[:, C["nsplit"]] = nsplit
    blocks[:, C["prow"]] = np.where(split, np.cumsum(sh.qc * split) - sh.qc * split, -1)
    merge = np.stack([np.repeat(sh.qs[split] - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum())),
                      np.repeat(nsplit[split], cnt)], axis=1).astype(np.int32)
    k = np.repeat(np.arange(sh.nblk), nsplit)
    sp = np.arange(len(k)) - np.repeat(np.cumsum(nsplit) - nsplit, nsplit)
    if not sh.sorted_units:
        order = np.lexsort((k, sp, sh.req[k]))
        k, sp = k[order], sp[order]
    units = blocks[k]
    units[:, C["split"]] = sp
    return Layout(k, sp, units, merge, int(nsplit.max()))


def fill(sh: Shape, batch, cfg: tp.Config, sms: int, splits: Optional[int], staging: Staging,
         positions: bool):
    """One step's tables in one host buffer: ``(buffer, merge_at, units_at, R, max splits)``."""
    ctx, kv_end, lo, win_lo, full_lo, per, nsplit = _blocks_step(sh, batch, cfg, sms, splits)
    nu = int(nsplit.sum())
    lay = None
    if nu > sh.nblk:
        key = nsplit.tobytes()
        lay = sh.layouts.get(key)
        if lay is None:
            if len(sh.layouts) >= SHAPES:
                sh.layouts.clear()
            lay = sh.layouts[key] = make_layout(sh, nsplit)
    r = len(lay.merge) if lay else 0
    merge_at = sh.pos_at + (al(sh.n) if positions else 0)
    units_at = merge_at + al(2 * max(r, 1))
    buf = staging.host(units_at + nu * tp.UNIT_COLS, batch.device)
    buf[: sh.pos_at] = sh.image
    if sh.words.dynamic:
        sh.words.write(buf, batch)
    if positions:
        pos = buf[sh.pos_at: sh.pos_at + sh.n]
        if sh.tok_off is None:
            pos[:] = tf.token_positions(batch)
        else:
            np.add(batch.host.context_lens[sh.tok_req], sh.tok_off, out=pos, casting="unsafe")
    units = buf[units_at:].reshape(nu, tp.UNIT_COLS)
    fe = ctx + sh.fe_off
    if lay is None:  # one unit per row block: its columns as they are
        buf[merge_at: merge_at + 2] = 0
        units[:] = sh.blocks
        units[:, C["ctx"]], units[:, C["kv_hi"]], units[:, C["full_end"]] = ctx, kv_end, fe
        if isinstance(lo, np.ndarray):  # a window
            units[:, C["kv_lo"]], units[:, C["full_lo"]], units[:, C["win_lo"]] = lo, full_lo, win_lo
        return buf, merge_at, units_at, 0, 1
    buf[merge_at: merge_at + 2 * r] = lay.merge.reshape(-1)
    k = lay.k
    units[:] = lay.units
    step = (per * cfg.block_nf)[k]
    start = lay.sp * step
    if isinstance(lo, np.ndarray):
        start += lo[k]
        units[:, C["full_lo"]], units[:, C["win_lo"]] = full_lo[k], win_lo[k]
    units[:, C["kv_lo"]] = start
    units[:, C["kv_hi"]] = np.minimum(kv_end[k], start + step)
    units[:, C["ctx"]], units[:, C["full_end"]] = ctx[k], fe[k]
    return buf, merge_at, units_at, r, lay.smax
