"""The ``gluon-prefill`` route: gluon_kernels.py's hand-specialized Hopper kernel over batches of prefills
(issue 33's prefill round 3, the default since round 8; the kernel notes in git history (triton_notes.md), "Prefill rounds").

It takes (``reasons``) a Hopper GPU (sm_90: warpgroup MMAs and TMA), 16-bit q and cache of one dtype, a head dim of
64 or 128, pages of a multiple of 64 keys, causal prefills without a tree or an attention variant, and caches whose
key rows one 2-d TMA view can address (the NHD and HND layouts attnbench builds, contiguous). ``auto`` takes it when
every request brings >= ``MIN_QUERY`` tokens (``declines``). ``config_args`` plans units of 64 or 128 tokens of one
query head (the plan's ``block_q``: warpgroups of 64 rows); ``fit`` checks the plan; the kernel takes 128-key tiles
where pages hold them and no unit starts mid-tile (``block_n``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.kernels.shared import launch as kl
from attnbench.kernels.shared import plan as tp
from attnbench.kernels.shared.features import variants
from attnbench.kernels.shared.gluon import hopper, kv_view

MIN_QUERY = 64  # auto takes the route only when every request brings this many tokens


@dataclass(frozen=True)
class Tuning:
    """The kernel's build choices (H200, the kernel notes in git history (triton_notes.md), prefill rounds 3-9)."""

    compute_regs: int = 200  # the compute warpgroups' registers (setmaxnreg): 200 ran 2-4% faster than 232
    stages: int = 2  # K/V slots in shared memory (128-key tiles: 2 x 64 KB beside Q's 32 KB)
    tile_keys: int = 128  # the key tile where pages and splits allow it (else 64)
    # programs of the persistent launch: 0 one an SM, each loader drawing its next item from an atomic counter
    # (longest first; round 9: 86.3 / 382.0 us against one program per item's 95.0 / 387.6, H200); > 0 that many
    # (tests: many items a program, the ring's phases across items)
    programs: int = 0


TUNING = Tuning()


_SCHED: dict = {}  # device -> int32 [1 + programs]: the counter, then one word a program


def _sched(device, programs: int) -> torch.Tensor:
    """The dynamic scheduler's words on ``device`` (zeroed once; each launch leaves the counter at 0)."""
    t = _SCHED.get(device)
    if t is None or t.numel() < 1 + programs:
        if torch.cuda.is_current_stream_capturing():  # a graph's memory must not outlive the graph
            raise RuntimeError("the Gluon prefill kernel's scheduler words are made on its first run: run it "
                               "once before capturing a CUDA graph")
        t = _SCHED[device] = torch.zeros(1 + max(programs, 1024), dtype=torch.int32, device=device)
    return t


def reasons(batch) -> list[str]:
    """Why the route cannot take ``batch``, in the words a skipped row gives ([] when it can)."""
    if not hopper(batch.device):
        return ["the Gluon prefill kernel needs a Hopper GPU (sm_90)"]
    out = []
    if batch.dtype not in (torch.float16, torch.bfloat16) or batch.k_cache.dtype != batch.dtype:
        out.append("the Gluon prefill kernel takes 16-bit q and cache of one dtype")
    if batch.head_dim not in (64, 128) or batch.page_size % 64:
        out.append(f"the Gluon prefill kernel takes head dim 64/128 and pages of a multiple of 64 (head dim "
                   f"{batch.head_dim}, page {batch.page_size})")
    if batch.trees.tmax or len(batch.host.query_lens) == 0:
        out.append("the Gluon prefill kernel takes no tree")
    out += [f"the Gluon prefill kernel takes no attention variant ({v})" for v in variants(batch)[:1]]
    q = batch.q
    if q.stride(2) != 1 or q.stride(1) != batch.head_dim or any(x.data_ptr() % 16 for x in (q, batch.k_cache,
                                                                                           batch.v_cache)) \
            or q.stride(0) * q.element_size() % 16:
        out.append("the Gluon prefill kernel needs 16-byte aligned q rows of heads x d")
    if kv_view(batch.k_cache) is None or kv_view(batch.v_cache) is None:
        out.append("the Gluon prefill kernel needs contiguous NHD or HND caches")
    return out


def declines(batch) -> list[str]:
    """Why ``auto`` leaves a batch the route can take to the Triton prefill kernel. A decode or a short chunk
    beside prefills fills a 64-row partition per query head with a few rows, where the Triton kernels fold a KV
    head's G query heads into their rows: gpu/ragged-prefill at page 256 (four decodes, chunks of 8 and 17 tokens)
    ran 127.6 us through this kernel against 82.9 (H200, the kernel notes in git history (triton_notes.md), "Prefill rounds 8 and 9")."""
    lens = batch.host.query_lens
    shortest = int(lens.min()) if len(lens) else 0
    if shortest < MIN_QUERY:
        return [f"a request of {shortest} query tokens (auto takes batches whose every request brings >= {MIN_QUERY})"]
    return []


def config_args(batch) -> dict:
    """``choose_config``'s arguments for the kernel: units of 128 tokens (G <= 4) or 64 (64 rows of one
    query head each a compute partition), 64-key tiles in the plan (the kernel takes 128 where it can)."""
    g = batch.num_q_heads // batch.num_kv_heads
    return dict(block_m=(128 if g <= 4 else 64) * g, block_n=64)


def fit(p) -> str:
    """'' when the kernel can run the plan (its units and tiles), else why not."""
    cfg = p.cfg
    if cfg.block_q not in (64, 128) or cfg.block_n != 64:
        return f"the Gluon prefill kernel needs 64/128 tokens a unit and 64-key tiles (block_q {cfg.block_q}, " \
               f"block_n {cfg.block_n})"
    return ""


def block_n(p, tuning: Tuning = TUNING) -> int:
    """The kernel's key tile: 128 where pages hold whole 128-key tiles and every unit starts at key 0
    (no split: the plan's split starts are multiples of its 64-key tiles), else 64."""
    return tuning.tile_keys if p.batch.page_size % tuning.tile_keys == 0 and p.num_merge == 0 else 64


def launch(p, tuning: Tuning = TUNING) -> torch.Tensor:
    """``prefill_gluon_kernel`` over the plan's units x query heads longest first, then the
    split merge (shared.launch.merge)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from attnbench.kernels.prefill import gluon_kernels as gk

    b, cfg = p.batch, p.cfg
    d, bm = b.head_dim, cfg.block_q
    bn = block_n(p, tuning)
    ty = gl.bfloat16 if b.dtype == torch.bfloat16 else gl.float16
    q2 = b.q.view(b.q.shape[0], b.q.shape[1] * d)
    parts = 2 if bm == 128 else 1  # two compute partitions of 64 rows (one of 8 warps: slower, round 5)
    qd = TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [bm // parts, d],
                          gl.NVMMASharedLayout.get_default_for([bm // parts, d], ty))
    kv_layout = gl.NVMMASharedLayout.get_default_for([bn, d], ty)
    (k2, row_page, row_head, col_head), (v2, *_) = kv_view(b.k_cache), kv_view(b.v_cache)
    kd, vd = (TensorDescriptor(t, list(t.shape), list(t.stride()), [bn, d], kv_layout) for t in (k2, v2))
    out, po, pl = p.out, p.po, p.pl
    n_units = p.units.shape[0]
    items = n_units * b.num_q_heads
    grid = (min(items, tuning.programs or tp.num_sms(b.q.device)),)  # persistent: items drawn from a counter
    sched = _sched(b.q.device, grid[0])
    gk.prefill_gluon_kernel[grid](
        qd, kd, vd, out, po, pl, b.block_table, p.units, sched,
        out.stride(0), out.stride(1), po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
        b.block_table.stride(0), p.qk_scale, row_head, col_head, b.num_q_heads, n_units,
        G=b.num_q_heads // b.num_kv_heads, HEAD_DIM=d, PAGE=b.page_size, ROW_PAGE=row_page, BLOCK_N=bn,
        STAGES=tuning.stages, UNIT_COLS=tp.UNIT_COLS, Q_PARTS=parts, COMPUTE_REGS=tuning.compute_regs,
        num_warps=4,
    )
    return kl.merge(p)
