"""The triton plan's per-step fast path (issue 33: <= 200 us of host time a step).

``shared/plan.build_units`` and ``host_tree_words`` say what the tables hold; this module
builds the same values with far fewer numpy calls, in three parts:

- a *shape* (``Shape``), cached per backend instance, holds what depends only on the step's
  query side and options: the row-block decomposition (request, first token, token count,
  tree and bidirectional flags), the unit table's constant columns, each key-side column's
  offset from the request's context length (``kv_end = ctx + end_off``, ``full_end = ctx +
  fe_off``), the split heuristic's inputs that do not change (the partial-row floor, the SM
  slots), a static tree's per-token words, the positions' offsets. Keyed by the query lengths, the tree and
  causal flags, the static topologies and the batch's dims: an engine's decode or verify
  steps keep it while the contexts grow.
- every step recomputes what depends on the key lengths (the context lengths, hence the key
  ranges, tiles, splits, units, window bounds and positions) and a dynamic tree's words (its
  parents change every step): nothing keyed on the context lengths or on a dynamic tree's
  parents is reused, so a timed plan costs what an engine's step would. One exception, which
  a serving engine's steps hit too: the units and merge rows of a split *pattern* (splits per
  row block, ``Layout``) are kept per shape, and the pattern changes only when a row block's
  key tiles cross a split boundary (scripts/dev/triton_plan_time.py's ``serving us`` column
  times steps whose contexts grow, so the pattern changes as it would).
- the tables are written straight into one host buffer and sent in one copy
  (``shared/stage.Staging``; dynamic tree words: ``shared/stage.Words``).

Layout of the buffer (int32 elements, each table 16-byte aligned): tree words ``[N, W]``
int64, the fused merge's counters ``[row blocks, Hkv]`` (zeros), positions ``[N]`` (with a
window or ALiBi), merge rows ``[R, 2]`` (at least one row), units ``[U, UNIT_COLS]``. The
first two have the shape's sizes: a cached image of them (static words, zeros) is copied
in with one call; the last two, merge rows and the units' constant columns, are one more cached
image per split pattern (``tail``), copied with one call too.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from attnbench.kernels.shared import features as tf
from attnbench.kernels.shared import plan as tp
from attnbench.kernels.shared.stage import Staging, Words

__all__ = ["Shape", "Layout", "Staging", "Words", "shape_key", "tree_key", "make_shape", "fill", "al"]
C = tp.COL
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
    end_pad: np.ndarray  # [nblk] end_off + block_nf - 1 (tiles = (ctx + end_pad - lo) // block_nf)
    rows: np.ndarray  # [nblk] G * qc
    base: np.ndarray  # [nblk, UNIT_COLS] int32: the unsplit units' constant columns (key-side ones 0)
    tail: np.ndarray  # int32: the buffer's end without a split: a zero merge row, padding, ``base`` (``tail``)
    one_req: bool  # one row block per request, in request order: ctx needs no gather
    image: np.ndarray  # int32: the words and zeroed counters (the buffer's constant prefix)
    sem_at: int  # where the counters start (the words start at 0)
    pos_at: int  # where the positions start
    n: int  # query tokens
    words: "Words"
    window: int = 0  # the batch's window (0: none)
    bidir: bool = False  # some prefill is bidirectional (``Features.bidir``)
    floor: Optional[np.ndarray] = None  # [nblk] decode-sized blocks: the split heuristic's partial-row floor
    floor_max: int = 0  # its largest value
    slots: int = 0  # larger blocks: programs one SM holds at once (``ctas_per_sm``; the GPU holds SMs x this)
    waves: bool = False  # larger blocks: the split rule counts waves of programs (``wave_chunk``), not work
    tok_req: Optional[np.ndarray] = None  # [N] request of each token (positions)
    tok_off: Optional[np.ndarray] = None  # [N] position - ctx (static trees or none)
    wlo: Optional[np.ndarray] = None  # [2, nblk] window: min / max of tok_off over the block - window + 1
    layouts: dict = field(default_factory=dict)  # nsplit bytes -> Layout


def shape_key(batch, positions: bool, long: bool, window: Optional[int] = None) -> tuple:
    """What a shape (and the config) depends on: dims, dtype, the cache's dtype (FP8: the split
    rule), window, positions, long keys, the query lengths, tree and causal flags, and a static
    tree's topologies (a dynamic tree's parents are not in it: its words are rebuilt every step);
    also the page size and the sink, soft-cap and ALiBi inputs, which decide whether the default
    plan shapes a prefill's units for the Gluon kernel (prefill/gluon.declines)."""
    h, q = batch.host, batch.q
    variants = (getattr(batch, "softcap", None), getattr(batch, "sinks", None) is not None,
                getattr(batch, "alibi_slopes", None) is not None)
    return (q.shape, q.dtype, batch.k_cache.dtype, batch.num_kv_heads, tf.window_of(batch) if window is None else window,
            positions, long, h.query_lens.tobytes(), h.is_tree.tobytes(), h.causal.tobytes(), tree_key(batch.trees),
            batch.page_size, variants)


def tree_key(t) -> tuple:
    """A step's trees as a shape: static topologies and who uses which; a dynamic tree's
    size only (its parents change every step and are never part of a key)."""
    return (t.dynamic, t.tmax) if t.dynamic else (t.tmax, t.topologies, t.topology_id.tobytes())


def make_shape(batch, cfg: tp.Config, positions: bool) -> Shape:
    """The query side of a step, once per shape (the reference constructions' own code)."""
    h, t = batch.host, batch.trees
    bq, bn = cfg.block_q, cfg.block_nf
    nb = -(-h.query_lens // bq)
    req = np.repeat(np.arange(len(nb)), nb)
    q0 = (np.arange(int(nb.sum())) - np.repeat(np.cumsum(nb) - nb, nb)) * bq
    qc = np.minimum(bq, h.query_lens[req] - q0)
    tree, bidir = h.is_tree[req], ~h.causal[req]
    qs = h.query_start_loc[req] + q0
    nblk = len(req)
    end_off = np.where(bidir, h.query_lens[req], q0 + qc)
    fe_off = np.where(tree, 0, np.where(bidir, h.query_lens[req], q0 + 1))
    base = np.zeros((nblk, tp.UNIT_COLS), dtype=np.int32)
    for name, v in (("req", req), ("q_start", qs), ("q_count", qc), ("prow", -1), ("tree", tree), ("q0", q0),
                    ("nsplit", 1), ("block", np.arange(nblk)), ("bidir", bidir)):
        base[:, C[name]] = v
    n, hkv = batch.num_tokens, batch.num_kv_heads
    words = Words(batch)
    sem_at = al(words.size)
    pos_at = sem_at + al(nblk * hkv)
    image = np.zeros(pos_at, np.int32)
    image[: words.size] = words.image
    g = batch.num_q_heads // hkv
    sh = Shape(nblk, req, qc, qs, end_off, fe_off, end_off + (bn - 1), g * qc, base, tail(np.zeros((0, 2)), base),
               bool((nb == 1).all()), image, sem_at, pos_at, n, words)
    sh.window, sh.bidir = tf.window_of(batch), not h.causal.all()
    if cfg.block_m <= 32:
        sh.floor = -(-tp.PARTIAL_KEYS_PER_ROW * sh.rows // bn)
        sh.floor_max = int(sh.floor.max(initial=0))
    else:
        sh.slots = tp.ctas_per_sm(cfg, batch.head_dim)
    if positions:
        sh.tok_req = np.repeat(np.arange(len(nb)), h.query_lens)
        if not t.dynamic:
            sh.tok_off = tf.token_positions(batch) - h.context_lens[sh.tok_req]
            window = tf.window_of(batch)
            sh.wlo = np.stack([np.minimum.reduceat(sh.tok_off, qs), np.maximum.reduceat(sh.tok_off, qs)]) - window + 1
    return sh


def _blocks_step(sh: Shape, batch, cfg: tp.Config, sms: int, splits: Optional[int]):
    """The key side of every row block for this step's context lengths: ``(ctx, tiles, lo,
    win_lo, full_lo, nsplit, exact)`` (``build_units``' arithmetic; lo and the window bounds 0
    without a window; nsplit None when no row block splits; ``exact``: nsplit is ceil(tiles /
    chunk) per block, so the plan's "no empty splits" pass would give it back unchanged and some
    block splits)."""
    bn = cfg.block_nf
    ctx = batch.host.context_lens
    if not sh.one_req:
        ctx = ctx[sh.req]
    window = sh.window
    if not window:
        win_lo = full_lo = lo = 0
        tiles = (ctx + sh.end_pad) // bn
    else:
        if sh.wlo is None:  # dynamic trees with a window: positions rebuilt in full
            win_lo, full_lo = tf.window_bounds(tf.token_positions(batch), sh.qs, window)
        else:
            bounds = np.add(ctx, sh.wlo)  # both bounds in one add and one clamp
            np.maximum(bounds, 0, out=bounds)
            win_lo, full_lo = bounds
        lo = win_lo - win_lo % bn
        tiles = (ctx + sh.end_pad - lo) // bn
    if splits is not None:
        return ctx, tiles, lo, win_lo, full_lo, np.maximum(1, np.minimum(splits, tiles)), False
    hkv = batch.num_kv_heads
    if sh.floor is None:  # split_counts' rule for larger blocks, its chosen chunk
        count = np.bincount(tiles)  # row blocks per tile count: the last is the longest's
        longest = len(count) - 1
        if sh.waves:  # a kernel of one program an SM at a time (the Gluon tree kernel)
            chunk = wave_chunk(count, sms * sh.slots, hkv)
        else:
            chunk = large_chunk(tiles, count, sms * sh.slots, hkv)  # the GPU's slots: SMs x programs per SM
    elif sh.nblk * hkv >= (programs := tp.decode_programs(cfg, sms)):  # split_counts' first rule: no split
        return ctx, tiles, lo, win_lo, full_lo, None, False
    else:  # split_counts' decode rule, its floor kept per shape (ufunc reduces: no Python wrapper)
        chunk = max(tp.MIN_CHUNK_TILES, -(-int(np.add.reduce(tiles)) * hkv // programs))
        if sh.floor_max > chunk:  # some block's floor is the larger: per block, capped as the rule is
            c = np.maximum(sh.floor, chunk)
            return ctx, tiles, lo, win_lo, full_lo, np.minimum((tiles + (c - 1)) // c, tp.MAX_SPLITS), False
        longest = int(np.maximum.reduce(tiles))
        if -(-longest // chunk) > tp.MAX_SPLITS:
            return ctx, tiles, lo, win_lo, full_lo, np.minimum((tiles + (chunk - 1)) // chunk, tp.MAX_SPLITS), False
    if chunk >= longest:  # every block one split (tiles >= 1: a block has a key)
        return ctx, tiles, lo, win_lo, full_lo, None, False
    return ctx, tiles, lo, win_lo, full_lo, (tiles + (chunk - 1)) // chunk, True


def wave_chunk(count: np.ndarray, slots: int, hkv: int) -> int:
    """``large_chunk`` for a kernel whose programs fill the SMs in waves (one program an SM at a time:
    the Gluon tree kernel; ``count``: ``np.bincount`` of the row blocks' tiles): each candidate scores
    ceil(programs / slots) waves x its longest program (+ start-up) + the split cost; counting work instead
    let 144 programs of 13 tiles through for gpu/ragged-trees, a second wave for 12 of them on 132 SMs
    (72.7 us against 66.4 for the one-launch kernel, H200, issue 33's tree round 1)."""
    longest = len(count) - 1
    chunk, _, span, _, cost = tp.candidates(longest, slots)
    if len(chunk) == 1:
        return int(chunk[0])
    programs = _wave_table(longest, slots).dot(count) * float(hkv)
    score = np.ceil(programs / slots) * span + cost
    return int(chunk[score.argmin()])


@functools.lru_cache(maxsize=16)
def _wave_table(longest: int, slots: int) -> np.ndarray:
    """``[candidates, longest + 1]`` float64 (read-only): the programs of a row block of u key tiles under
    each candidate chunk c, ceil(u / c) (``wave_chunk``'s, as ``_work_table`` is ``large_chunk``'s)."""
    chunk = tp.candidates(longest, slots)[0]
    table = (-(-np.arange(longest + 1) // chunk[:, None])).astype(np.float64)
    table.flags.writeable = False
    return table


DENSE_CELLS = 40_000  # candidates x (longest + 1) up to which ``large_chunk`` takes one product (64 x 514: 32k keys in 64-key tiles)


def large_chunk(t: np.ndarray, count: np.ndarray, slots: int, hkv: int) -> int:
    """``tp.large_chunk``'s pick in fewer numpy calls (``count``: ``np.bincount(t)``, so the
    longest block has ``len(count) - 1`` tiles): every candidate's work is one product of a table
    kept per (longest, slots, hkv) (``_work_table``) with ``count``, instead of the distinct
    counts' ceil(u / chunk) built in every call (~7 -> ~4 us). The work values are the same
    float64 integers (exact: < 2^53), so the scores and the pick are the same."""
    longest = len(count) - 1
    chunk, _, span, whole, cost = tp.candidates(longest, slots)
    if len(chunk) == 1:
        return int(chunk[0])
    if len(chunk) * (longest + 1) > DENSE_CELLS:  # a table too large to pay: the distinct counts
        return tp.large_chunk(t, longest, slots, hkv)
    score = _work_table(longest, slots, hkv).dot(count)
    score /= whole
    np.ceil(score, out=score)  # rounds
    score *= span
    score += cost
    return int(chunk[score.argmin()])


@functools.lru_cache(maxsize=16)
def _work_table(longest: int, slots: int, hkv: int) -> np.ndarray:
    """``[candidates, longest + 1]`` float64 (read-only): the work ``tp.large_chunk`` counts for one
    row block of u key tiles under each candidate chunk c: hkv (u + PROGRAM_TILES ceil(u / c))."""
    chunk = tp.candidates(longest, slots)[0]
    u = np.arange(longest + 1)
    table = (hkv * (u + tp.PROGRAM_TILES * -(-u // chunk[:, None]))).astype(np.float64)
    table.flags.writeable = False
    return table


@dataclass
class Layout:
    """The units of one split pattern (``nsplit`` per row block) of a shape: which row block
    and split each unit is (ordered request, split, row block), its constant columns, and the
    merge rows (all of them depend on the pattern only, not on the context lengths)."""

    k: np.ndarray  # [U] row block of each unit
    sp: np.ndarray  # [U] its split
    r: int  # merge rows
    tail: np.ndarray  # int32: the buffer's end: the [R, 2] merge rows, padding, the [U, UNIT_COLS] units
    # with their key-side columns left 0 (``tail``)
    smax: int
    end_k: np.ndarray  # [U] end_off of each unit's row block (kv_end = ctx + end_k)
    fe_k: np.ndarray  # [U] its fe_off (full_end = ctx + fe_k)


def make_layout(sh: Shape, nsplit: np.ndarray) -> Layout:
    split = nsplit > 1
    cnt = sh.qc[split]
    blocks = sh.base.copy()
    blocks[:, C["nsplit"]] = nsplit
    blocks[:, C["prow"]] = np.where(split, np.cumsum(sh.qc * split) - sh.qc * split, -1)
    merge = np.stack([np.repeat(sh.qs[split] - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum())),
                      np.repeat(nsplit[split], cnt)], axis=1).astype(np.int32)
    k = np.repeat(np.arange(sh.nblk), nsplit)
    sp = np.arange(len(k)) - np.repeat(np.cumsum(nsplit) - nsplit, nsplit)
    if not sh.one_req:
        order = np.lexsort((k, sp, sh.req[k]))
        k, sp = k[order], sp[order]
    units = blocks[k]
    units[:, C["split"]] = sp
    return Layout(k, sp, len(merge), tail(merge, units), int(nsplit.max()), sh.end_off[k], sh.fe_off[k])


def tail(merge: np.ndarray, units: np.ndarray) -> np.ndarray:
    """The end of a step's buffer as one int32 image, written by one copy: the merge rows (one
    zero row when there are none), padded to 16 bytes, then the units' constant columns."""
    at = al(2 * max(len(merge), 1))
    out = np.zeros(at + units.size, np.int32)
    out[: merge.size] = merge.reshape(-1)
    out[at:] = units.reshape(-1)
    return out


def fill(sh: Shape, batch, cfg: tp.Config, sms: int, splits: Optional[int], staging: Staging,
         positions: bool):
    """One step's tables in one host buffer: ``(buffer, merge_at, units_at, R, max splits)``."""
    ctx, tiles, lo, win_lo, full_lo, nsplit, exact = _blocks_step(sh, batch, cfg, sms, splits)
    lay = per = None
    if nsplit is not None:
        per = (tiles + (nsplit - 1)) // nsplit
        if not exact:
            nsplit = (tiles + (per - 1)) // per  # no empty splits
        if exact or int(nsplit.sum()) > sh.nblk:
            key = nsplit.tobytes()
            lay = sh.layouts.get(key)
            if lay is None:
                if len(sh.layouts) >= SHAPES:
                    sh.layouts.clear()
                lay = sh.layouts[key] = make_layout(sh, nsplit)
    r = lay.r if lay else 0
    nu = len(lay.k) if lay else sh.nblk
    merge_at = sh.pos_at + (al(sh.n) if positions else 0)
    units_at = merge_at + al(2 * max(r, 1))
    end = lay.tail if lay else sh.tail
    buf = staging.host(merge_at + len(end), batch.device)
    buf[: sh.pos_at] = sh.image
    buf[merge_at:] = end  # merge rows and units' constant columns, one copy
    if sh.words.dynamic:
        sh.words.write(buf, batch)
    if positions:
        pos = buf[sh.pos_at: sh.pos_at + sh.n]
        if sh.tok_off is None:
            pos[:] = tf.token_positions(batch)
        else:
            np.add(batch.host.context_lens[sh.tok_req], sh.tok_off, out=pos, casting="unsafe")
    units = buf[units_at:].reshape(nu, tp.UNIT_COLS)
    if lay is None:  # one unit per row block (column writes: numpy's fastest here, broadcasts over rows are not)
        units[:, C["ctx"]], units[:, C["kv_hi"]], units[:, C["full_end"]] = ctx, ctx + sh.end_off, ctx + sh.fe_off
        window_cols(units, lo, full_lo, win_lo)
        return buf, merge_at, units_at, 0, 1
    k = lay.k
    ck = ctx[k]
    units[:, C["ctx"]], units[:, C["full_end"]] = ck, ck + lay.fe_k
    step = (per * cfg.block_nf)[k]
    start = lay.sp * step
    if window_cols(units, lo, full_lo, win_lo, k):
        start += lo[k]
    units[:, C["kv_lo"]] = start
    units[:, C["kv_hi"]] = np.minimum(ck + lay.end_k, start + step)
    return buf, merge_at, units_at, r, lay.smax


def window_cols(units: np.ndarray, lo, full_lo, win_lo, k: Optional[np.ndarray] = None) -> bool:
    """With a window (``lo`` an array): its columns into ``units`` (per row block, or per unit
    of row block ``k``); whether there was one."""
    if not isinstance(lo, np.ndarray):
        return False
    if k is None:
        units[:, C["kv_lo"]], units[:, C["full_lo"]], units[:, C["win_lo"]] = lo, full_lo, win_lo
    else:
        units[:, C["full_lo"]], units[:, C["win_lo"]] = full_lo[k], win_lo[k]
    return True
