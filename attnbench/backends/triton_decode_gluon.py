"""Launch of the Gluon decode kernel (gluon_decode_kernels.py; issue 33's decode round 1, docs/triton_notes.md):
the ``decode="gluon"`` option of the triton backend.

``unwanted`` says why the option does not take a batch ('' when it does): a Hopper GPU, batches of decodes alone
(one query token a request, no tree), 16-bit q over an FP8 cache (``FP8_ONLY``; a 16-bit cache of q's dtype
otherwise too), head dim 64 or 128, at most 16 query heads a KV head, pages of a multiple of 64 keys or of 16 or 32
keys (``MIN_PAGE``), and no ALiBi (sliding windows, sinks and soft-capping run in the kernel). ``config_args`` then
asks the shipped config for the kernel's tiles (``block_nf``, ``tile_keys``: 64 keys, 128 for head dim 64; the
splits start on them); the plan (units, splits, partials, the merge) is the shipped kernel's.
``fit`` checks the plan; elsewhere (the CPU interpreter included: Gluon has none) the shipped kernel runs, and the
plan's mode names the kernel that ran (``route_note``).
"""
from __future__ import annotations

import torch

from . import triton_plan as tp
from .gluon_route import note, refusal
from .triton_prefill_gluon import hopper, kv_view
from .triton_tree_gluon import FP8_TYPES, cache_ok, page_ok, tma_problem

BLOCK_N = 64  # keys a tile (the splits start on them), but for the head dims in TILES
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
# pages under COPY_BELOW keys of a head dim in COPY_DIMS come by cp.async (gluon_pages.copy_tile: 16-byte pieces of
# whole key rows, each row's page looked up by its threads, one CTA barrier a tile) instead of one TMA box a page, each
# of which the compiler puts behind a CTA barrier of its own (18 a tile at page 16; offline sm_90, FP8 d 128: the
# loop's 604 instructions a tile 480). H200, 8 x 16k e4m3 (sixteenth session): head dim 64, page 16 55.8 us against
# the boxes' 67.2; head dim 128 slower, 88.2 / 85.6 against 81.3 / 75.1 at pages 16 / 32 (3 or 4 slots 1.3-1.7x)
COPY_BELOW = 64
COPY_DIMS = (64,)
# pages under this many keys stay on the shipped kernel: at page 8 (8 TMA boxes a tile for K and 8 for V, the compiler
# putting a CTA barrier before each) 8 x 16k FP8 decodes ran 110 us against its 87.7 (H200, fifteenth session)
MIN_PAGE = 16
# 16-bit caches stay on the shipped kernel (94% of their floor, H200 8 x 16k); the Gluon kernel's 16-bit path ran
# about 1.1-1.3x its time there (fifteenth session, call 2's geo-means over the bf16 and FP8 cases, variant
# triton-gd-all)
FP8_ONLY = True
RAN = "gluon decode kernel"  # route_note when the kernel runs the plan


def unwanted(batch) -> str:
    """'' when the option takes this batch (``config_args`` shapes its plan), else why not."""
    if not hopper(batch.device):
        return "not a Hopper GPU"
    h = batch.host
    if batch.trees.tmax or int(h.query_lens.max(initial=0)) != 1:
        return "not decodes alone"
    fp8 = batch.k_cache.dtype in FP8_TYPES
    if batch.dtype not in (torch.float16, torch.bfloat16) or not cache_ok(batch) or (FP8_ONLY and not fp8):
        return "not a 16-bit q over an FP8 cache" if FP8_ONLY else "not a 16-bit q with a 16-bit or FP8 cache"
    g = batch.num_q_heads // batch.num_kv_heads
    if batch.head_dim not in (64, 128) or not page_ok(batch.page_size) or batch.page_size < MIN_PAGE or g > MAX_G:
        return f"head dim {batch.head_dim}, page {batch.page_size}, G {g} (it takes 64/128, pages of a multiple of " \
               f"64 keys or of 16 or 32, G <= {MAX_G})"
    if getattr(batch, "alibi_slopes", None) is not None:
        return "ALiBi (the Gluon decode kernel takes windows, sinks and soft-capping)"
    return ""


def wanted(batch) -> bool:
    return not unwanted(batch)


def tile_keys(batch) -> int:
    """Keys a tile for this batch's head dim (``TILES``, else ``BLOCK_N``)."""
    return TILES.get(batch.head_dim, BLOCK_N)


def config_args(batch) -> dict:
    """``choose_config``'s arguments: the kernel's tiles (``tile_keys``), where the splits start."""
    return dict(block_nf=tile_keys(batch))


def fit(p) -> str:
    """'' when the Gluon decode kernel can run the plan's batch, else why not."""
    b, cfg = p.batch, p.cfg
    why = refusal(b, "decode", unwanted, hopper)
    if why:
        return why
    if any(p.feat.constexprs()[k] for k in ("ALIBI", "BIDIR")):
        return "the Gluon decode kernel takes no ALiBi or bidirectional rows"
    if cfg.block_nf != tile_keys(b) or cfg.block_m > MAX_G:
        return f"the Gluon decode kernel needs {tile_keys(b)}-key tiles and <= {MAX_G} rows (block_nf " \
               f"{cfg.block_nf}, block_m {cfg.block_m})"
    return tma_problem(b, "decode")


def route_note(p) -> str:
    """The kernel a decode batch runs with the option: 'gluon decode kernel', or the shipped one and why ('' for a
    batch the option never considers: one with a tree or more than one query token a request)."""
    h = p.batch.host
    if p.has_tree or int(h.query_lens.max(initial=0)) != 1:
        return ""
    return note(p, fit, unwanted, hopper, RAN, "shipped kernel, not Gluon's decode kernel")


def _regs() -> dict:
    """The launch's register cap (none for None)."""
    return {"maxnreg": MAXNREG} if MAXNREG else {}


def copy_layout(b):
    """``COPY_BELOW`` / ``COPY_DIMS``: the cp.async layout (16-byte pieces of key rows over 4 warps) for this batch's
    pages and head dim, else None (TMA boxes)."""
    from triton.experimental.gluon import language as gl

    (k2, *_), (v2, *_) = kv_view(b.k_cache), kv_view(b.v_cache)
    if b.page_size >= COPY_BELOW or b.head_dim not in COPY_DIMS or k2.stride() != v2.stride():  # (one row stride)
        return None
    vec = 16 // b.k_cache.element_size()
    tpr = b.head_dim // vec  # threads a row
    return gl.BlockedLayout([1, vec], [32 // tpr, tpr], [4, 1], [1, 0])


def run(p) -> None:
    """``decode_gluon_kernel`` over the plan's units x KV heads (split units: partials for triton_launch.merge)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from . import gluon_decode_kernels as gk

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
        STAGES=STAGES, UNIT_COLS=tp.UNIT_COLS, FP8=fp8, E5M2=b.k_cache.dtype == torch.float8_e5m2,
        WORD_LAYOUT=words, WINDOW=f.window > 0, SINK=f.sinks is not None, SOFTCAP=f.cap > 0, COPY=copy_layout(b),
        num_warps=4, **_regs(),
    )
