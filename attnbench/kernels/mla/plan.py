"""The MLA path of the ``triton`` backend: plan (host side, numpy) and launch of
mla/kernels.py. The ``triton`` backend (backends/triton.py) hands an MLA batch here.

Why inside ``triton`` and not a backend of its own: which kernel runs follows from the batch
(``attention: mla``), as each library backend picks its MLA wrapper; one ``triton`` row per
case reads alike in MHA and MLA runs, and no MLA-only backend adds skipped rows to every
MHA scenario.

Plan: a request's rows are its (token, head) pairs; they are cut into units of ``block_m``
rows. A unit's keys end at the request's kv_len (trees, bidirectional prefills) or at its last
token's causal limit (prefill, decode). When the batch has fewer units than the GPU has room for, each unit's key
range is split into chunks of a multiple of ``block_n`` keys (at least ``MIN_SPLIT_KEYS``),
as many as fill about ``PROGRAMS_PER_SM`` programs per SM; split rows are merged by LSE in
a second small kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from attnbench.workload.batch import Batch

from attnbench.kernels.mla import gluon as mg
from attnbench.kernels.shared import step as ts
from attnbench.kernels.shared.plan import host_tree_words

PROGRAMS_PER_SM = 2
MIN_SPLIT_KEYS = 256
CPU_SMS = 4
LOG2E = math.log2(math.e)


@dataclass(frozen=True)
class MlaConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    value_chunks: int = 1  # programs per unit, each its share of the value dims (kernel's NCH)
    tail_stages: int = 0  # stages of the masked tail loop (0: num_stages)
    waves: int = 0  # splits fill floor(waves * SMs) programs (0: ceil(PROGRAMS_PER_SM * SMs))
    half_partials: bool = False  # split partial outputs in the batch dtype, not float32


@dataclass
class MlaPlan:
    batch: Batch
    cfg: MlaConfig
    units: torch.Tensor  # [U, UNIT_COLS] int32
    merge: torch.Tensor  # [R, 2] int32: (output row, splits)
    num_merge: int
    ctx: torch.Tensor  # [B] int32 context lengths
    qstart: torch.Tensor  # [B] int32 first query token of each request
    anc: torch.Tensor  # [N, W] int64 ancestor-or-self bitmasks of tree tokens
    has_tree: bool
    out: torch.Tensor  # [N, H, kv_lora_rank] batch dtype
    po: torch.Tensor  # [S, R, kv_lora_rank] float32 partial outputs (R = 0: [1, 1, rank], shared, never touched)
    pl: torch.Tensor  # [S, R] float32 partial LSEs (base 2, scaled scores; R = 0 as po)
    splits_p2: int
    qk_scale: float
    mode: str = ""
    route: object = None  # the route that runs it (kernels/routes.py; set by the caller)


def mla_problems(batch: Batch) -> list[str]:
    """What the MLA kernels cannot take (tl.dot and tl.arange want powers of two >= 16)."""
    rank, rope = batch.spec.kv_lora_rank, batch.spec.rope_dim
    bad = [f"{n} {v}" for n, v in (("kv_lora_rank", rank), ("rope_dim", rope)) if v < 16 or v & (v - 1)]
    out = []
    if bad:
        out.append(f"triton's MLA kernel needs kv_lora_rank and rope_dim powers of two >= 16, got {', '.join(bad)}")
    if batch.spec.kv_dtype is not None:
        out.append(f"triton's MLA kernel reads a latent cache in the model dtype, not {batch.spec.kv_dtype}")
    return out


def unit_kind(h, req: np.ndarray) -> np.ndarray:
    """The unit table's column 7 for row blocks of requests ``req``: 1 tree, 2 bidirectional
    prefill (``causal: false``: every key of its request), 0 causal (prefill, decode)."""
    return np.where(h.is_tree[req], 1, np.where(h.causal[req], 0, 2)).astype(np.int64)


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def choose_config(batch: Batch, block_m: Optional[int] = None, block_n: Optional[int] = None,
                  num_warps: Optional[int] = None, num_stages: Optional[int] = None,
                  value_chunks: int = 1, tail_stages: int = 0, waves: int = 0,
                  half_partials: bool = False, max_block_m: int = 64) -> MlaConfig:
    """``block_m``: all rows of the longest request up to 64 (16 at least, tl.dot's minimum);
    ``block_n`` 32 keys of 576 dims (36 KB a stage in 16-bit); 4 warps up to 32 rows, else 8.
    ``value_chunks`` 2 (off by default, issue 33's MLA round 1): two programs per unit, each
    the whole scores and half the value dims (half the accumulator, so 128-row units fit:
    ``max_block_m`` 128, one 128-head token a unit, 64 rows a warpgroup of 8 warps);
    ``tail_stages`` 1: the masked tail unpipelined (its shared buffers freed for 128-row trees);
    ``waves``: splits sized to at most ``waves`` programs per SM, rounded down (the shipped
    rule rounds up: 272 programs for 132 one-program SMs); ``half_partials``: 16-bit partials."""
    if value_chunks not in (1, 2):
        raise ValueError(f"value_chunks must be 1 or 2, got {value_chunks}")
    rows = int(batch.host.query_lens.max()) * batch.num_q_heads
    bm = block_m or min(max_block_m, max(16, _next_pow2(rows)))
    bn = block_n or (32 if batch.head_dim > 256 else 64)
    return MlaConfig(bm, bn, num_warps or (4 if bm <= 32 else 8), num_stages or 2, value_chunks,
                     tail_stages, waves, half_partials)


WIDE = dict(max_block_m=128, value_chunks=2, tail_stages=1)  # 128-row units, value halves, t1 tail


def default_config(batch: Batch) -> dict:
    """The ``triton`` backend's MLA overrides of ``choose_config`` for this batch (issue 33's MLA
    round 1, H200, 8 x 16k): batches of decodes and trees whose one token fills more than a
    64-row unit (over 64 heads: 128) take 128-row units with two value programs and an
    unpipelined tail (``WIDE``), splits for at most 1 program per SM on decodes (322.5 -> 186.1
    us) and 2 with a tree (MTP chain-2: 934 -> 549 us); the same options made 16-head batches
    slower (79.5 -> 105-150 us), so up to 64 heads, and batches with a prefill (not measured;
    value halves compute the scores twice), keep ``choose_config``'s own (``{}``)."""
    h = batch.host
    if batch.num_q_heads <= 64 or not (h.is_tree | (h.query_lens == 1)).all():
        return {}
    return dict(WIDE, waves=2 if h.is_tree.any() else 1)


def split_want(cfg: MlaConfig, sms: int, blocks: int) -> int:
    """Splits wanted per row block: ``PROGRAMS_PER_SM`` programs per SM rounded up, or with
    ``cfg.waves`` at most that many per SM (each block's ``value_chunks`` programs counted)."""
    progs = max(1, blocks * cfg.value_chunks)
    if cfg.waves:
        return max(1, cfg.waves * sms // progs)
    return max(1, math.ceil(PROGRAMS_PER_SM * sms / progs))


def build_units(batch: Batch, cfg: MlaConfig, sms: int, splits: Optional[int] = None):
    """-> ``(units [U, 8] int32, merge [R, 2] int32, max splits)`` as numpy arrays."""
    h = batch.host
    heads, bm, bn = batch.num_q_heads, cfg.block_m, cfg.block_n
    rows = h.query_lens * heads
    nblk = -(-rows // bm)
    req = np.repeat(np.arange(len(rows)), nblk)
    k = np.arange(len(req)) - np.repeat(np.cumsum(nblk) - nblk, nblk)
    row0 = k * bm
    nrows = np.minimum(bm, rows[req] - row0)
    last_tok = (row0 + nrows - 1) // heads
    tree = h.is_tree[req]
    whole = tree | ~h.causal[req]  # trees and bidirectional prefills: keys up to kv_len
    kend = np.where(whole, h.kv_lens[req], h.context_lens[req] + last_tok + 1)
    if splits is None:
        want = split_want(cfg, sms, len(req))
        s = np.clip(np.full(len(req), want), 1, np.maximum(1, kend // MIN_SPLIT_KEYS))
    else:
        s = np.clip(np.full(len(req), splits), 1, np.maximum(1, -(-kend // bn)))
    per_split = -(-kend // s)
    chunk = -(-per_split // bn) * bn  # keys per split, a multiple of block_n
    s = -(-kend // chunk)
    unit_blk = np.repeat(np.arange(len(req)), s)
    idx = np.arange(len(unit_blk)) - np.repeat(np.cumsum(s) - s, s)
    split_rows = np.where(s > 1, nrows, 0)
    prow0 = np.cumsum(split_rows) - split_rows
    ub = unit_blk
    units = np.stack([
        req[ub], row0[ub], nrows[ub], idx * chunk[ub], np.minimum(kend[ub], (idx + 1) * chunk[ub]),
        np.where(s[ub] > 1, idx, -1), prow0[ub], unit_kind(h, req)[ub],
    ], axis=1).astype(np.int32)
    blk = np.nonzero(s > 1)[0]
    first = h.query_start_loc[req[blk]] * heads + row0[blk]
    count = nrows[blk]
    out_rows = np.repeat(first - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
    merge = np.stack([out_rows, np.repeat(s[blk], count)], axis=1).astype(np.int32).reshape(-1, 2)
    return units, merge, int(s.max(initial=1))


def tree_words(batch: Batch) -> tuple[np.ndarray, bool]:
    """``[N, W]`` int64 ancestor-or-self bitmasks (bit j of a tree token: node j is itself or
    an ancestor), on the host; zeros for other tokens. The MHA plan's (shared/plan.py): static
    topologies packed once, dynamic trees rebuilt in every plan."""
    return host_tree_words(batch)


def plan(batch: Batch, sms: int, interpreted: bool, splits: Optional[int] = None, *,
         shapes: Optional[dict] = None, staging: Optional[ts.Staging] = None, gluon: bool = False,
         **config) -> MlaPlan:
    """The step's tables, as ``build_units`` and ``host_tree_words`` define them, built by the
    cached per-shape parts (``shapes``: the caller's cache; ``MlaShape``) and written into one
    host buffer sent to the device in one copy (``staging``, shared/step.py): units, merge
    rows, context lengths, query starts, tree words. The config: ``default_config``'s overrides
    (a function of the shape, so taken once per shape) under ``config``'s; ``gluon``: units
    shaped for the Gluon MLA kernel instead (mla/gluon.py's ``config_args``, MTP chains as causal chunks)."""
    dev, h = batch.device, batch.host
    shapes = {} if shapes is None else shapes
    key = ("mla", sms, batch.q.shape, batch.dtype, splits, gluon, tuple(sorted(config.items())) if config else (),
           h.query_lens.tobytes(), h.is_tree.tobytes(), h.causal.tobytes(), ts.tree_key(batch.trees))
    sh = shapes.get(key)
    if sh is None:
        if len(shapes) >= ts.SHAPES:
            shapes.clear()
        kw = mg.config_args() if gluon else {**default_config(batch), **config}
        sh = shapes[key] = MlaShape(batch, choose_config(batch, **kw), sms, splits, causal_chains=gluon)
    staging = staging or ts.Staging()
    buf, lay = sh.fill(batch, staging)
    d_buf = staging.send(buf, dev)
    nb, cfg, rank, r, s = len(h.query_lens), sh.cfg, batch.spec.kv_lora_rank, lay.r, lay.smax
    pdt = batch.dtype if cfg.half_partials else torch.float32  # split partials (16-bit: option half_partials)
    p = MlaPlan(
        batch=batch, cfg=cfg, units=d_buf.as_strided((lay.nu, mk_cols), (mk_cols, 1), lay.at),
        merge=d_buf.as_strided((max(r, 1), 2), (2, 1), sh.fixed), num_merge=r,
        ctx=d_buf.as_strided((nb,), (1,), sh.ctx_at), qstart=d_buf.as_strided((nb,), (1,), sh.qstart_at),
        anc=d_buf.view(torch.int64).as_strided((sh.words.nw, sh.words.w), (sh.words.w, 1), 0),
        has_tree=sh.words.tree,
        out=torch.empty(batch.out_shape, dtype=batch.dtype, device=dev),
        po=(torch.empty(s, r, rank, dtype=pdt, device=dev) if r else staging.unread(dev, pdt, rank)),
        pl=torch.empty(s, r, dtype=torch.float32, device=dev) if r else staging.unread(dev, torch.float32),
        splits_p2=_next_pow2(max(2, s)),
        qk_scale=batch.scale * LOG2E,
        mode=("interpreted (TRITON_INTERPRET=1), " if interpreted else "") + lay.mode,
    )
    return p


mk_cols = 8  # the MLA unit table's columns (mla/kernels.UNIT_COLS)


class MlaShape:
    """What an MLA step's tables take from its query side (``build_units``' row blocks and
    split want, the query starts, a static tree's words), once per shape; ``fill`` adds the
    context lengths' part (key ends, splits, units) every step, the units and merge rows of
    each split pattern kept (``layouts``)."""

    def __init__(self, batch: Batch, cfg: MlaConfig, sms: int, splits: Optional[int], causal_chains: bool = False):
        h = batch.host
        self.cfg, self.splits, heads, bm = cfg, splits, batch.num_q_heads, cfg.block_m
        rows = h.query_lens * heads
        nblk = -(-rows // bm)
        self.req = req = np.repeat(np.arange(len(rows)), nblk)
        k = np.arange(len(req)) - np.repeat(np.cumsum(nblk) - nblk, nblk)
        self.row0 = k * bm
        self.nrows = np.minimum(bm, rows[req] - self.row0)
        self.kind = unit_kind(h, req)
        if causal_chains:  # chain trees as the causal chunks they equal (mla/gluon.chains)
            self.kind = np.where(mg.chains(batch)[req], 0, self.kind)
        self.off = np.where(self.kind > 0, h.query_lens[req], (self.row0 + self.nrows - 1) // heads + 1)  # kend - ctx
        self.want = split_want(cfg, sms, len(req))
        self.words = ts.Words(batch)
        nb = len(rows)
        self.qstart_at = ts.al(self.words.size)
        self.ctx_at = self.qstart_at + ts.al(nb)
        self.image = np.zeros(self.ctx_at, np.int32)
        self.image[: self.words.size] = self.words.image
        self.image[self.qstart_at: self.qstart_at + nb] = h.query_start_loc[:-1]
        self.fixed = self.ctx_at + ts.al(nb)
        self.layouts: dict = {}
        self.first = h.query_start_loc[req] * heads + self.row0

    def fill(self, batch: Batch, staging: ts.Staging):
        """This step's tables in one host buffer: ``(buffer, its MlaLayout)``."""
        h, bn = batch.host, self.cfg.block_n
        kend = h.context_lens[self.req] + self.off
        if self.splits is None:
            s = np.minimum(np.maximum(kend // MIN_SPLIT_KEYS, 1), self.want)
        else:
            s = np.minimum(np.maximum((kend + (bn - 1)) // bn, 1), max(1, self.splits))
        chunk = ((kend + (s - 1)) // s + (bn - 1)) // bn * bn  # keys per split, a multiple of block_n
        s = (kend + (chunk - 1)) // chunk
        key = s.tobytes()
        lay = self.layouts.get(key)
        if lay is None:
            if len(self.layouts) >= ts.SHAPES:
                self.layouts.clear()
            lay = self.layouts[key] = self._layout(s)
        buf = staging.host(lay.at + lay.units.size, batch.device)
        buf[: self.ctx_at] = self.image
        if self.words.dynamic:
            self.words.write(buf, batch)
        buf[self.ctx_at: self.ctx_at + len(h.context_lens)] = h.context_lens
        buf[self.fixed: lay.at] = lay.merge
        units = buf[lay.at:].reshape(-1, mk_cols)
        units[:] = lay.units
        c = chunk[lay.k]
        lo = lay.idx * c
        units[:, 3] = lo
        units[:, 4] = np.minimum(kend[lay.k], lo + c)
        return buf, lay

    def _layout(self, s: np.ndarray) -> "MlaLayout":
        """One split pattern's units and merge rows (``build_units``' own expressions)."""
        k = np.repeat(np.arange(len(self.req)), s)
        idx = np.arange(len(k)) - np.repeat(np.cumsum(s) - s, s)
        split_rows = np.where(s > 1, self.nrows, 0)
        prow0 = np.cumsum(split_rows) - split_rows
        units = np.zeros((len(k), mk_cols), np.int32)
        for col, v in ((0, self.req[k]), (1, self.row0[k]), (2, self.nrows[k]), (5, np.where(s[k] > 1, idx, -1)),
                       (6, prow0[k]), (7, self.kind[k])):
            units[:, col] = v
        blk = np.nonzero(s > 1)[0]
        count = self.nrows[blk]
        out_rows = np.repeat(self.first[blk] - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
        merge = np.stack([out_rows, np.repeat(s[blk], count)], axis=1).astype(np.int32).reshape(-1)
        r = len(merge) // 2
        at = self.fixed + ts.al(2 * max(r, 1))
        mode = f"MLA kernel, {len(k)} units" + (f" x {self.cfg.value_chunks} value programs, block_m {self.cfg.block_m}"
                                                  if self.cfg.value_chunks > 1 else "")
        flat = np.zeros(at - self.fixed, np.int32)  # the merge rows (at least one: zeros), padded to ``at``
        flat[: len(merge)] = merge
        return MlaLayout(k, idx, units, flat, r, int(s.max(initial=1)), at, len(k), mode)


@dataclass
class MlaLayout:
    """One split pattern of a shape: which row block and split each unit is, the units' constant
    columns, the merge rows as written into the buffer, and what the plan reads off them."""

    k: np.ndarray
    idx: np.ndarray
    units: np.ndarray  # [U, mk_cols] int32, the key columns (3, 4) left 0
    merge: np.ndarray  # int32, flat, zero-padded up to the units' start
    r: int  # merge rows
    smax: int
    at: int  # where the units start in the buffer
    nu: int
    mode: str


def launch(p: MlaPlan) -> torch.Tensor:
    """The ``mla`` route: kernels.py's Triton MLA kernel over the plan's units, then the split merge."""
    from attnbench.kernels.mla import kernels as mk

    _launch(p, mk)
    return merge(p)


def launch_gluon(p: MlaPlan) -> torch.Tensor:
    """The ``gluon-mla`` route: gluon.py's kernel over the plan's units, then the split merge."""
    mg.launch(p)
    return merge(p)


def merge(p: MlaPlan) -> torch.Tensor:
    """``mla_merge_kernel`` over the plan's split rows into ``p.out`` (none: nothing to launch)."""
    from attnbench.kernels.mla import kernels as mk

    b = p.batch
    out = p.out.view(-1, b.v_head_dim)
    if p.num_merge:
        mk.mla_merge_kernel[(p.num_merge,)](
            p.po, p.pl, out, p.merge,
            p.po.stride(0), p.po.stride(1), p.pl.stride(0), out.stride(0),
            D_NOPE=b.spec.kv_lora_rank, SPLITS=p.splits_p2, num_warps=4,
        )
    return p.out


def _launch(p: MlaPlan, mk) -> None:
    """mla/kernels.mla_attention_kernel over the plan's units (x value programs)."""
    b, cfg = p.batch, p.cfg
    q = b.q.reshape(b.num_tokens * b.num_q_heads, b.head_dim)
    kv = b.k_cache
    out = p.out.view(-1, b.v_head_dim)
    mk.mla_attention_kernel[(p.units.shape[0] * cfg.value_chunks,)](
        q, kv, out, p.po, p.pl, b.block_table, p.units, p.ctx, p.qstart, p.anc,
        q.stride(0), kv.stride(0), kv.stride(1), out.stride(0), b.block_table.stride(0),
        p.po.stride(0), p.po.stride(1), p.pl.stride(0), p.anc.stride(0),
        p.qk_scale,
        H=b.num_q_heads, D_NOPE=b.spec.kv_lora_rank, D_ROPE=b.spec.rope_dim, PAGE=b.page_size,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HAS_TREE=p.has_tree, UNIT_COLS=mk.UNIT_COLS,
        IEEE=b.dtype == torch.float32, BIDIR=not b.host.causal.all(), NCH=cfg.value_chunks,
        TAIL_STAGES=cfg.tail_stages or None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
