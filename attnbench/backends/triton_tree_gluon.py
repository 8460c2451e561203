"""Launch of the Gluon tree kernel (gluon_tree_kernels.py; issue 33's tree round 1, docs/triton_notes.md):
the ``tree="gluon"`` option of the triton backend, on by default since the round.

``unwanted`` says why the option's plan does not shape a batch for the kernel ('' when it does): it
takes a Hopper GPU, 16-bit q and a 16-bit or FP8 cache (tree round 2), head dim 64 or 128, pages of a
multiple of 64 keys or of 8-32 keys (one TMA box a page inside a 64-key tile), a tree in the batch and no
attention variant, and at most 192 rows a request (query tokens x G: three compute warpgroups of 64).
``config_args`` then makes one row
block of every request (``block_m`` = G x the longest request, rounded up to a power of two) and 64-key
tiles, so the plan's units are (request, split) and a work item of the kernel is one unit and KV head;
such plans keep their split partials in 16 bits (``HALF_PARTIALS``) and count their splits in waves of one
program an SM (triton_step.wave_chunk).
``fit`` checks the plan; elsewhere (the CPU interpreter included: Gluon has none) the option falls back to
the shipped kernel, and the plan's mode (a row's "ran as") names the kernel that ran (``route_note``).
"""
from __future__ import annotations

import torch

from . import triton_plan as tp
from .gluon_route import note
from .triton_prefill_gluon import kv_view, hopper

COMPUTE_REGS = 160  # the compute warpgroups' registers (setmaxnreg): 152 ran as fast (H200, tree round 1)
STAGES = 4  # 64-key K/V slots in shared memory (4 x 32 KB beside Q's 3 x 16 KB); 3 ran as fast (H200, tree round 1)
BLOCK_N = 64
MAX_ROWS = 192  # three compute warpgroups
# the last split of a (row block, KV head) merges its rows in the kernel (no merge launch): 8 x 40-node trees at
# 4k / 16k, page 16, 66.0 / 201.0 us against 71.2 / 206.6 with the merge launch (H200, tree round 1)
FUSED_MERGE = False
# split partials in the batch's 16-bit dtype where the plan is shaped for this kernel (TritonBackend's
# half_partials for these batches): 62.8 / 197.6 us against 71.2 / 206.6 (the merge launch 3.3 us instead of
# 9.5), the error against the reference 2.8e-3 instead of 2.2e-3 (H200, tree round 1)
HALF_PARTIALS = True
# FP8 caches (issue 33, tree round 2): the TMA fills STAGES8 FP8 staging slots, the loader's warpgroup widens
# each into a float16 ring slot (q converted to float16 too, the scales folded into qk_scale and the output);
# shared memory: Q (16 KB a warpgroup) + STAGES_FP8 x 32 KB + the staging slots, 16 KB each (head dim 128)
STAGES_FP8 = 3
# FP8 staging slots: 0 = as many as FP8_SMEM holds beside Q and the ring. Their number changed nothing measured
# (H200, tree round 2: FP8 decodes alone 185.9 / 186.9 / 186.9 us with 5 / 7 / 3 of them, FP8 trees at 4k 73.5-74.5
# us with 3 or 5), against this constant's first reason (reads in flight); the block-table loads on the TMA's path
# were the limit (gluon_tree_kernels._pages: 186 -> 171 us, trees 74.7 -> 69.8 us)
STAGES8 = 0
FP8_SMEM = 196 * 1024  # the compiler adds ~24 KB of scratch (sm_90 builds, triton 3.6): 227 KB is the limit
COMPUTE_REGS_FP8 = 152  # the loader's warps keep 56 registers for the widening (32 at 160)
FP8_TYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# the next tile's S = Q K^T issued early, one wait for it and this tile's P V (a partition holds two ring slots):
# 0 off; 1 right behind this tile's P V (the two MMAs back to back); 2 before this tile's softmax (FA3's overlap:
# the S MMA under the softmax; 256 spill bytes at 160 registers, in the masked tiles). 8 x 40-node trees, page
# 16 / 256 (H200, eleventh session, variants triton-tr-ps / -ps2): 16k 188.0 / 186.2 us with 1 against 201.4 /
# 198.8 off and 201.3 / 197.2 with 2; 4k 62.0 / 61.6 against 61.7 / 62.0 (alike)
PIPE_S = 1
# the same on FP8 caches, slower there (fp8-tree40: 4k 72.9 us with 1 and 136.1 with 2 against 70.0 off; 16k
# 223.7 / 489.5 against 209.4). Why is not measured: a fourth ring slot, which leaves one staging slot, ran slower
# still with PIPE_S 1 or 0 (twelfth session: 79.4 / 78.4 us at 4k, 241.8 / 242.4 at 16k)
PIPE_S_FP8 = 0
# batches of decodes alone (no tree) the option takes too: "" none (default), "fp8" on FP8 caches, "all" (variants
# triton-dec-f8 / triton-dec-gl, tree round 2). Off: 8 x 16k decodes, page 16, ran 170.8 us on FP8 and 149.4 on bf16
# there, against the one-launch kernel's 93.6 / 135.5 (H200): one program an SM of 4 useful rows in 64 is no decode
# kernel
DECODES = ""
# a masked tile's mask from one 64-bit word a row (gluon_tree_mask.row_bits; False: element by element, the kernel's
# before), and the first masked tile's words worked out before the full tiles (MASK_AHEAD)
MASK_WORDS = True
# 8 x 40-node trees, page 16 / 256 (H200, fourteenth session, two rounds beside faadb7e's kernel): words without the
# look-ahead 60.4 / 58.3 us at 4k and 188.5 / 181 at 16k, with it 63.2 / 62.9 and 211 / 193 (holding the first masked
# tile's words through the full tiles costs more than their loads' latency saves), the element-wise mask 63.3 / 62.7
# and 188 / 186, faadb7e's kernel 61.4 / 61.8 and 186.5 / 185
MASK_AHEAD = False
# a compute partition loads every column of its unit it will read (the epilogue's split row and split included) in
# one round trip at its start (False: the tile loop's after q_count's, the epilogue's at its end). Measured (variant
# triton-tr-em0, same runs as MASK_AHEAD's): 4k 59.6 / 58.0 us against 60.2-60.3 / 58.4-58.6 late; 16k alike
EARLY_META = True
# the split merge launched as a programmatic dependent of the kernel (CUDA's PDL: its launch overlaps the kernel's
# end; triton_launch.merge), the kernel letting it start at once. Off: 8 x 40-node trees, page 16 / 256 (H200, fourteenth
# session, variant triton-tr-nopdl, two rounds) ran 59.6 / 58.0 us at 4k with it against 60.1 / 57.5 without, and
# 188-189 / 181-182 against 187-188 / 180-181 at 16k: no measured gain
PDL_MERGE = False
# a [programs, 4, 2 x gluon_clocks.SLOTS] int64 tensor: the next launches write their partitions' timestamps into it
# (scripts/gpu/tree_timeline.py); None (default) builds the kernel without them
CLOCKS = None


def staging_slots(wgs: int, d: int) -> int:
    """The FP8 staging slots of a launch with ``wgs`` compute warpgroups and head dim ``d`` (STAGES8)."""
    tile = 2 * BLOCK_N * d  # an FP8 K and V tile
    return STAGES8 or max(2, (FP8_SMEM - wgs * 64 * d * 2 - STAGES_FP8 * 2 * tile) // tile)


def decodes_taken(batch) -> bool:
    """Whether the option takes this batch as one of decodes alone (``DECODES``)."""
    if not DECODES or int(batch.host.query_lens.max(initial=0)) > 1:
        return False
    return DECODES == "all" or batch.k_cache.dtype in FP8_TYPES


def page_ok(page: int) -> bool:
    return page % BLOCK_N == 0 or (BLOCK_N % page == 0 and page >= 8)


def unwanted(batch) -> str:
    """'' when the option's plan shapes this batch for the kernel (``config_args``), else why not."""
    from . import triton_features as tf

    if not hopper(batch.device):
        return "not a Hopper GPU"
    if batch.dtype not in (torch.float16, torch.bfloat16) or not cache_ok(batch):
        return "not a 16-bit q with a 16-bit or FP8 (e4m3 / e5m2) cache"
    if batch.head_dim not in (64, 128) or not page_ok(batch.page_size):
        return f"head dim {batch.head_dim}, page {batch.page_size} (it takes 64/128 and pages of a multiple of " \
               f"64 keys or of 8, 16 or 32)"
    if not batch.trees.tmax and not decodes_taken(batch):
        return "no tree"
    if tf.window_of(batch) or getattr(batch, "softcap", None) or any(
            getattr(batch, a, None) is not None for a in ("sinks", "alibi_slopes")):
        return "an attention variant"
    h = batch.host
    if not h.causal.all():
        return "a bidirectional prefill"
    rows = int(h.query_lens.max()) * (batch.num_q_heads // batch.num_kv_heads)
    if rows > MAX_ROWS:
        return f"{rows} rows a request (query tokens x G; it takes <= {MAX_ROWS}: three warpgroups of 64)"
    return ""


def cache_ok(batch) -> bool:
    """A 16-bit cache of q's dtype, or an FP8 one (its scales in ``k_scale`` / ``v_scale``)."""
    kd = batch.k_cache.dtype
    if kd in FP8_TYPES:
        return getattr(batch, "k_scale", None) is not None and batch.v_cache.dtype == kd
    return kd == batch.dtype and getattr(batch, "k_scale", None) is None


def wanted(batch) -> bool:
    return not unwanted(batch)


def config_args(batch) -> dict:
    """``choose_config``'s arguments: one row block a request, 64-key tiles (splits start on them)."""
    g = batch.num_q_heads // batch.num_kv_heads
    return dict(block_m=max(16, tp.next_pow2(g * int(batch.host.query_lens.max()))), block_n=BLOCK_N)


def warpgroups(p) -> int:
    """Compute warpgroups: the rows of the plan's largest unit, in 64s."""
    b = p.batch
    g = b.num_q_heads // b.num_kv_heads
    return -(-g * min(p.cfg.block_q, int(b.host.query_lens.max())) // 64)


def kv_ok(t: torch.Tensor) -> bool:
    """Whether ``kv_view`` takes the cache (NHD or HND, contiguous), from its strides alone."""
    pages, page, heads, d = t.shape
    return t.stride() in ((page * heads * d, heads * d, d, 1), (heads * page * d, d, page * d, 1))


def fit(p) -> str:
    """'' when the Gluon tree kernel can run the plan's batch, else why not."""
    b, cfg = p.batch, p.cfg
    if not hopper(b.q.device):
        return "the Gluon tree kernel needs a Hopper GPU (sm_90)"
    if b.dtype not in (torch.float16, torch.bfloat16) or not cache_ok(b) or b.head_dim not in (64, 128):
        return "the Gluon tree kernel takes 16-bit queries, 16-bit or FP8 caches and head dims 64 or 128"
    if any(v for k, v in p.feat.constexprs().items() if k != "FP8"):
        return "the Gluon tree kernel takes no attention variant"
    wgs = warpgroups(p)
    if cfg.block_n != BLOCK_N or cfg.block_nf != BLOCK_N or not page_ok(b.page_size) or wgs > 3:
        return f"the Gluon tree kernel needs 64-key tiles, pages of a multiple of 64 keys or of 8-32 and <= " \
               f"{MAX_ROWS} rows a unit (block_n {cfg.block_n}, page {b.page_size}, {wgs} warpgroups)"
    return tma_problem(b, "tree")


def tma_problem(b, kernel: str) -> str:
    """'' when the Gluon ``kernel``'s TMA views (triton_prefill_gluon.kv_view) can read the batch's q and caches,
    else why not."""
    if b.q.stride(2) != 1 or b.k_cache.data_ptr() % 16 or b.v_cache.data_ptr() % 16:
        return f"the Gluon {kernel} kernel needs q's last dimension contiguous and 16-byte aligned caches"
    if not (kv_ok(b.k_cache) and kv_ok(b.v_cache)):
        return f"the Gluon {kernel} kernel needs contiguous NHD or HND caches"
    return ""


RAN = "gluon tree kernel"  # route_note when the kernel runs the plan


def route_note(p) -> str:
    """The kernel a tree batch runs with the option: 'gluon tree kernel', or the shipped one and why."""
    if not p.has_tree and not decodes_taken(p.batch):
        return ""
    return note(p, fit, unwanted, hopper, RAN, "shipped kernel, not Gluon's tree kernel")


def run(p) -> bool:
    """``tree_gluon_kernel`` over the plan's units x KV heads (split units: partials for the merge); whether
    the kernel merged them itself (FUSED_MERGE), else triton_launch.merge must."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from . import gluon_tree_kernels as gk

    b, f = p.batch, p.feat
    d = b.head_dim
    fp8 = b.k_cache.dtype in FP8_TYPES
    ty = gl.float16 if fp8 or b.dtype == torch.float16 else gl.bfloat16  # the slots' (FP8: widened to float16)
    cache_ty = {torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5}.get(b.k_cache.dtype, ty)
    box = min(b.page_size, BLOCK_N)
    # the TMA's destinations (a box writes BOX of their rows): the ring's slots, or FP8's staging slots
    layout = gl.NVMMASharedLayout.get_default_for([BLOCK_N, d], cache_ty)
    (k2, row_page, row_head, col_head), (v2, *_) = kv_view(b.k_cache), kv_view(b.v_cache)
    kd, vd = (TensorDescriptor(t, list(t.shape), list(t.stride()), [box, d], layout) for t in (k2, v2))
    out, po, pl = p.out, p.po, p.pl
    ksc, vsc = (f.k_scale, f.v_scale) if fp8 else (p.units, p.units)  # (not read without FP8)
    wgs = warpgroups(p)
    gk.tree_gluon_kernel[(p.units.shape[0] * b.num_kv_heads,)](
        kd, vd, b.q, out, po, pl, b.block_table, p.units, p.anc, p.sem, ksc, vsc, p.units if CLOCKS is None else CLOCKS,
        b.q.stride(0), b.q.stride(1), out.stride(0), out.stride(1), po.stride(0), po.stride(1), po.stride(2),
        pl.stride(0), pl.stride(1), b.block_table.stride(0), p.anc.stride(0), p.sem.stride(0),
        1 if fp8 and f.k_scale.numel() > 1 else 0, p.qk_scale, row_head, col_head, b.num_kv_heads,
        G=b.num_q_heads // b.num_kv_heads, HEAD_DIM=d, PAGE=b.page_size, ROW_PAGE=row_page, BLOCK_N=BLOCK_N,
        STAGES=STAGES_FP8 if fp8 else STAGES, UNIT_COLS=tp.UNIT_COLS, WGS=wgs,
        COMPUTE_REGS=COMPUTE_REGS_FP8 if fp8 else COMPUTE_REGS, FUSED_MERGE=FUSED_MERGE, SLOT_TY=ty,
        SLOT_LAYOUT=gl.NVMMASharedLayout.get_default_for([BLOCK_N, d], ty), FP8=fp8,
        STAGES8=staging_slots(wgs, d) if fp8 else 1, PIPE_S=PIPE_S_FP8 if fp8 else PIPE_S, CLOCKS=CLOCKS is not None,
        PDL=PDL_MERGE, MASK_WORDS=MASK_WORDS, MASK_AHEAD=MASK_AHEAD,
        EARLY_META=EARLY_META, num_warps=4,
    )
    return FUSED_MERGE
