"""The ``gluon-tree`` route: gluon_kernels.py's warp-specialized Hopper kernel over a batch with trees (issue 33's
tree round 1; FP8 e4m3 / e5m2 caches since round 2). H200, 8 x 40-node trees at 4k / 16k, page 16: 61.5 / 199.6 us
against the paged kernel's 106.0 / 350.0 (FP8: 69.8 / 210.2 against 132.0 / 449.5).

It takes (``reasons``) a Hopper GPU, 16-bit q and a 16-bit or FP8 cache, head dim 64 or 128, pages of a multiple
of 64 keys or of 8-32 keys (one TMA box a page inside a 64-key tile), a tree in the batch and no attention variant,
and at most 192 rows a request (query tokens x G: three compute warpgroups of 64). ``config_args`` makes one row
block of every request (``block_m`` = G x the longest request, rounded up to a power of two) and 64-key tiles, so
the plan's units are (request, split) and a work item of the kernel is one unit and KV head; such plans keep their
split partials in 16 bits (``HALF_PARTIALS``) and count their splits in waves of one program an SM
(step.wave_chunk). ``fit`` checks the plan; ``launch`` runs it (and the split merge).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.kernels.shared import launch as kl
from attnbench.kernels.shared import plan as tp
from attnbench.kernels.shared.features import variants
from attnbench.kernels.shared.gluon import BLOCK_N, FP8_TYPES, cache_ok, hopper, kv_view, page_ok, tma_problem

MAX_ROWS = 192  # three compute warpgroups
# split partials in the batch's 16-bit dtype where the plan is shaped for this kernel: 62.8 / 197.6 us against
# 71.2 / 206.6 (the merge launch 3.3 us instead of 9.5), the error against the reference 2.8e-3 instead of 2.2e-3
# (H200, tree round 1)
HALF_PARTIALS = True
FP8_SMEM = 196 * 1024  # the compiler adds ~24 KB of scratch (sm_90 builds, triton 3.6): 227 KB is the limit


@dataclass(frozen=True)
class Tuning:
    """The kernel's build choices (each measured on an H200, the kernel notes in git history (triton_notes.md))."""

    compute_regs: int = 160  # the compute warpgroups' registers (setmaxnreg): 152 ran as fast (tree round 1)
    compute_regs_fp8: int = 152  # FP8: the loader's warps keep 56 registers for the widening (32 at 160)
    stages: int = 4  # 64-key K/V slots in shared memory (4 x 32 KB beside Q's 3 x 16 KB); 3 ran as fast
    # FP8 caches (tree round 2): the TMA fills FP8 staging slots, the loader's warpgroup widens each into one of
    # ``stages_fp8`` float16 ring slots (q converted to float16 too, the scales folded into qk_scale and the
    # output); the staging slots take what FP8_SMEM leaves beside Q and the ring (their number changed nothing
    # measured: 3, 5 or 7)
    stages_fp8: int = 3
    # the next tile's S = Q K^T issued right behind this tile's P V, one wait for both (a partition holds two ring
    # slots): 1 on, 0 off. 8 x 40-node trees, page 16 / 256 (H200): 16k 188.0 / 186.2 us on against 201.4 / 198.8
    # off; 4k alike (issuing it before the softmax instead, FA3's overlap, ran no faster: 201.3 / 197.2, and
    # spilled). FP8 caches run it off (72.9 us on against 70.0 off at 4k)
    pipe_s: int = 1


TUNING = Tuning()


def staging_slots(wgs: int, d: int, tuning: Tuning = TUNING) -> int:
    """The FP8 staging slots of a launch with ``wgs`` compute warpgroups and head dim ``d``."""
    tile = 2 * BLOCK_N * d  # an FP8 K and V tile
    return max(2, (FP8_SMEM - wgs * 64 * d * 2 - tuning.stages_fp8 * 2 * tile) // tile)


def reasons(batch) -> list[str]:
    """Why the route cannot take ``batch``, in the words a skipped row gives ([] when it can)."""
    if not hopper(batch.device):
        return ["the Gluon tree kernel needs a Hopper GPU (sm_90)"]
    out = []
    if batch.dtype not in (torch.float16, torch.bfloat16) or not cache_ok(batch):
        out.append("the Gluon tree kernel takes a 16-bit q with a 16-bit or FP8 (e4m3 / e5m2) cache")
    if batch.head_dim not in (64, 128) or not page_ok(batch.page_size):
        out.append(f"the Gluon tree kernel takes head dim 64/128 and pages of a multiple of 64 keys or of 8, 16 or "
                   f"32 (head dim {batch.head_dim}, page {batch.page_size})")
    if not batch.trees.tmax:
        out.append("no tree in the batch (the Gluon tree kernel is no decode kernel: one program an SM of 4 useful "
                   "rows in 64)")
    out += [f"the Gluon tree kernel takes no attention variant ({v})" for v in variants(batch)[:1]]
    rows = int(batch.host.query_lens.max(initial=0)) * (batch.num_q_heads // batch.num_kv_heads)
    if rows > MAX_ROWS:
        out.append(f"{rows} rows a request (query tokens x G; the Gluon tree kernel takes <= {MAX_ROWS}: three "
                   f"warpgroups of 64)")
    return out or [why for why in (tma_problem(batch, "tree"),) if why]


def config_args(batch) -> dict:
    """``choose_config``'s arguments: one row block a request, 64-key tiles (splits start on them)."""
    g = batch.num_q_heads // batch.num_kv_heads
    return dict(block_m=max(16, tp.next_pow2(g * int(batch.host.query_lens.max()))), block_n=BLOCK_N)


def warpgroups(p) -> int:
    """Compute warpgroups: the rows of the plan's largest unit, in 64s."""
    b = p.batch
    g = b.num_q_heads // b.num_kv_heads
    return -(-g * min(p.cfg.block_q, int(b.host.query_lens.max())) // 64)


def fit(p) -> str:
    """'' when the kernel can run the plan (its tiles), else why not."""
    cfg, wgs = p.cfg, warpgroups(p)
    if cfg.block_n != BLOCK_N or cfg.block_nf != BLOCK_N or wgs > 3:
        return f"the Gluon tree kernel needs 64-key tiles and <= {MAX_ROWS} rows a unit (block_n {cfg.block_n}, " \
               f"{wgs} warpgroups)"
    return ""


def launch(p, tuning: Tuning = TUNING) -> torch.Tensor:
    """``tree_gluon_kernel`` over the plan's units x KV heads, then the split merge (shared.launch.merge)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from attnbench.kernels.tree import gluon_kernels as gk

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
        kd, vd, b.q, out, po, pl, b.block_table, p.units, p.anc, ksc, vsc,
        b.q.stride(0), b.q.stride(1), out.stride(0), out.stride(1), po.stride(0), po.stride(1), po.stride(2),
        pl.stride(0), pl.stride(1), b.block_table.stride(0), p.anc.stride(0),
        1 if fp8 and f.k_scale.numel() > 1 else 0, p.qk_scale, row_head, col_head, b.num_kv_heads,
        G=b.num_q_heads // b.num_kv_heads, HEAD_DIM=d, PAGE=b.page_size, ROW_PAGE=row_page, BLOCK_N=BLOCK_N,
        STAGES=tuning.stages_fp8 if fp8 else tuning.stages, UNIT_COLS=tp.UNIT_COLS, WGS=wgs,
        COMPUTE_REGS=tuning.compute_regs_fp8 if fp8 else tuning.compute_regs, SLOT_TY=ty,
        SLOT_LAYOUT=gl.NVMMASharedLayout.get_default_for([BLOCK_N, d], ty), FP8=fp8,
        STAGES8=staging_slots(wgs, d, tuning) if fp8 else 1, PIPE_S=0 if fp8 else tuning.pipe_s, num_warps=4,
    )
    return kl.merge(p)
