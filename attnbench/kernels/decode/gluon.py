"""The ``gluon-decode`` route: gluon_kernels.py's Hopper kernel over batches of decodes alone (issue 33's decode
round 1). H200, 8 x 16k FP8 e4m3 decodes: 82.4 against the paged kernel's 87.0 us at page 16, 73.7 against 79.5 at
page 64.

It takes (``reasons``) a Hopper GPU, decodes alone (one query token a request, no tree), a 16-bit q over a 16-bit
cache of its dtype or an FP8 one, head dim 64 or 128, at most 16 query heads a KV head, pages of a multiple of 64
keys or of 8, 16 or 32 keys, and no ALiBi or bidirectional rows (sliding windows, sinks and soft-capping run in the
kernel); ``auto`` takes it for FP8 caches at pages of >= 16 keys only (``declines``). ``config_args`` asks the
paged plan for the kernel's tiles (``block_nf``: ``tile_keys``, the splits start on them); the plan (units,
splits, partials, the merge) is the paged kernel's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.kernels.shared import launch as kl
from attnbench.kernels.shared import plan as tp
from attnbench.kernels.shared.gluon import BLOCK_N, FP8_TYPES, cache_ok, hopper, kv_view, page_ok, tma_problem

# BLOCK_N keys a tile (the splits start on them), but for the head dims in TILES
# head dim -> keys a tile: each tile pays the same barriers, waits and softmax reductions whatever its bytes, so head
# dim 64 takes 128-key tiles (offline sm_90, FP8 e4m3: 552 / 546 / 476 instructions for 128 keys at pages 16 / 64 /
# 256 against 648 / 616 / 616 as two 64-key tiles, 105-126 registers). H200, 8 x 16k e4m3 d 64, sixteenth session:
# 54.3 / 49.0 / 46.6 us against 64-key tiles' 54.8 / 52.3 / 52.6
TILES: dict = {64: 128}
MAX_G = 16  # the MMA's rows
# 64-key K and V slots (16 KB a slot on FP8, head dim 128). 8 x 16k FP8 e4m3 decodes, page 16 / 64 (H200, fifteenth
# session, two rounds): 82.3 / 73.7 us with 2, 84.4 / 76.0 with 3, against the shipped kernel's 86.5 / 79.5; 4 (3
# programs an SM) about 1.3-1.4x the shipped kernel's time
STAGES = 2
# registers a thread: 4 programs of 4 warps an SM (offline sm_90: 126, no spill, FP8 page 16). Uncapped (152: 3 an SM)
# about 1.3-1.4x the shipped kernel's time; 96 or 80 (5 or 6 an SM, 208-280 spill bytes, the split rule aiming at as
# many) 2-3x
MAXNREG = 128
# pages under COPY_BELOW keys of a head dim in COPY_DIMS come by cp.async (shared/gluon_pages.copy_tile: 16-byte pieces of
# whole key rows, each row's page looked up by its threads, one CTA barrier a tile) instead of one TMA box a page, each
# of which the compiler puts behind a CTA barrier of its own (18 a tile at page 16; offline sm_90, FP8 d 128: the
# loop's 604 instructions a tile 480). H200, 8 x 16k e4m3 (sixteenth session): head dim 64, page 16 55.8 us against
# the boxes' 67.2; head dim 128 slower, 88.2 / 85.6 against 81.3 / 75.1 at pages 16 / 32 (3 or 4 slots 1.3-1.7x)
COPY_BELOW = 64
COPY_DIMS = (64,)
# pages under this many keys stay on the shipped kernel: at page 8 (8 TMA boxes a tile for K and 8 for V, the compiler
# putting a CTA barrier before each) 8 x 16k FP8 decodes ran 110 us against its 87.7 (H200, fifteenth session)
MIN_PAGE = 16
# auto: 16-bit caches stay on the paged kernel (94% of their floor, H200 8 x 16k); the Gluon kernel's 16-bit path ran
# about 1.1-1.3x its time there (fifteenth session, call 2's geo-means over the bf16 and FP8 cases, variant
# triton-gd-all)


@dataclass(frozen=True)
class Tuning:
    """The kernel's build choices (their measurements: the comments above each default's constant)."""

    stages: int = STAGES
    maxnreg: int = MAXNREG
    copy_below: int = COPY_BELOW
    copy_dims: tuple = COPY_DIMS


TUNING = Tuning()


def reasons(batch) -> list[str]:
    """Why the route cannot take ``batch``, in the words a skipped row gives ([] when it can)."""
    if not hopper(batch.device):
        return ["the Gluon decode kernel needs a Hopper GPU (sm_90)"]
    out = []
    if batch.trees.tmax or int(batch.host.query_lens.max(initial=0)) != 1:
        out.append("the Gluon decode kernel takes decodes alone (one query token a request, no tree)")
    if batch.dtype not in (torch.float16, torch.bfloat16) or not cache_ok(batch):
        out.append("the Gluon decode kernel takes a 16-bit q with a 16-bit or FP8 (e4m3 / e5m2) cache")
    g = batch.num_q_heads // batch.num_kv_heads
    if batch.head_dim not in (64, 128) or not page_ok(batch.page_size) or g > MAX_G:
        out.append(f"the Gluon decode kernel takes head dim 64/128, pages of a multiple of 64 keys or of 8, 16 or 32 "
                   f"and G <= {MAX_G} (head dim {batch.head_dim}, page {batch.page_size}, G {g})")
    if getattr(batch, "alibi_slopes", None) is not None or not batch.host.causal.all():
        out.append("the Gluon decode kernel takes no ALiBi or bidirectional rows (windows, sinks and soft-capping "
                   "it takes)")
    return out or [why for why in (tma_problem(batch, "decode"),) if why]


def declines(batch) -> list[str]:
    """Why ``auto`` leaves a batch the route can take to the paged kernel (measured slower here)."""
    if batch.k_cache.dtype not in FP8_TYPES:
        return ["a 16-bit cache (the paged kernel reads it at 94% of its floor; this kernel ran 1.1-1.3x its time)"]
    if batch.page_size < MIN_PAGE:
        return [f"page {batch.page_size} (< {MIN_PAGE} keys: one TMA box and barrier a page made it slower)"]
    return []


def tile_keys(batch) -> int:
    """Keys a tile for this batch's head dim (``TILES``, else ``BLOCK_N``)."""
    return TILES.get(batch.head_dim, BLOCK_N)


def config_args(batch) -> dict:
    """``choose_config``'s arguments: the kernel's tiles (``tile_keys``), where the splits start."""
    return dict(block_nf=tile_keys(batch))


def fit(p) -> str:
    """'' when the kernel can run the plan (its tiles), else why not."""
    cfg, b = p.cfg, p.batch
    if cfg.block_nf != tile_keys(b) or cfg.block_m > MAX_G:
        return f"the Gluon decode kernel needs {tile_keys(b)}-key tiles and <= {MAX_G} rows (block_nf " \
               f"{cfg.block_nf}, block_m {cfg.block_m})"
    return ""


def copy_layout(b, tuning: Tuning = TUNING):
    """``copy_below`` / ``copy_dims``: the cp.async layout (16-byte pieces of key rows over 4 warps) for this batch's
    pages and head dim, else None (TMA boxes)."""
    from triton.experimental.gluon import language as gl

    (k2, *_), (v2, *_) = kv_view(b.k_cache), kv_view(b.v_cache)
    if b.page_size >= tuning.copy_below or b.head_dim not in tuning.copy_dims or k2.stride() != v2.stride():  # (one row stride)
        return None
    vec = 16 // b.k_cache.element_size()
    tpr = b.head_dim // vec  # threads a row
    return gl.BlockedLayout([1, vec], [32 // tpr, tpr], [4, 1], [1, 0])


def launch(p, tuning: Tuning = TUNING) -> torch.Tensor:
    """``decode_gluon_kernel`` over the plan's units x KV heads then the split merge (shared.launch.merge)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from attnbench.kernels.decode import gluon_kernels as gk

    b, f = p.batch, p.feat
    d = b.head_dim
    fp8 = b.k_cache.dtype in FP8_TYPES
    cache_ty = {torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5, torch.float16: gl.float16,
                torch.bfloat16: gl.bfloat16}[b.k_cache.dtype]
    bn = tile_keys(b)
    layout = gl.NVMMASharedLayout.get_default_for([bn, d], cache_ty)
    words = gl.NVMMASharedLayout.get_default_for([bn, d // 2], gl.int16)  # FP8: the same rows' bytes
    (k2, row_page, row_head, col_head), (v2, *_) = kv_view(b.k_cache), kv_view(b.v_cache)
    box = [min(b.page_size, bn), d]
    kd, vd = (TensorDescriptor(t, list(t.shape), list(t.stride()), box, layout) for t in (k2, v2))
    out, po, pl = p.out, p.po, p.pl
    ksc, vsc = (f.k_scale, f.v_scale) if fp8 else (p.units, p.units)  # (not read without FP8)
    sinks = f.sinks if f.sinks is not None else p.units  # (not read without sinks)
    gk.decode_gluon_kernel[(p.units.shape[0] * b.num_kv_heads,)](
        kd, vd, k2, v2, b.q, out, po, pl, b.block_table, p.units, ksc, vsc, sinks,
        b.q.stride(0), b.q.stride(1), out.stride(0), out.stride(1), po.stride(0), po.stride(1), po.stride(2),
        pl.stride(0), pl.stride(1), b.block_table.stride(0), 1 if fp8 and f.k_scale.numel() > 1 else 0, k2.stride(0),
        p.qk_scale, f.cap, row_head, col_head, b.num_kv_heads,
        G=b.num_q_heads // b.num_kv_heads, HEAD_DIM=d, PAGE=b.page_size, ROW_PAGE=row_page, BLOCK_N=bn,
        STAGES=tuning.stages, UNIT_COLS=tp.UNIT_COLS, FP8=fp8, E5M2=b.k_cache.dtype == torch.float8_e5m2,
        WORD_LAYOUT=words, WINDOW=f.window > 0, SINK=f.sinks is not None, SOFTCAP=f.cap > 0, COPY=copy_layout(b, tuning),
        num_warps=4, **({"maxnreg": tuning.maxnreg} if tuning.maxnreg else {}),
    )
    return kl.merge(p)
