"""Launch of the Gluon prefill kernel (gluon_prefill_kernels.py; issue 33's prefill round 3,
docs/triton_notes.md): the ``gluon`` option of the triton backend's prefill path, on by default since
round 8 (the default plan shapes its units for the kernel where ``wanted``: config_args).

``fit`` says whether a plan's batch can take it: a Hopper GPU (sm_90: warpgroup MMAs and TMA),
16-bit data, a head dim of 64 or 128, 64 or 128 tokens per unit of one query head (the plan's
``block_q``: warpgroups of 64 rows), key tiles inside one page (pages of a multiple of 64 keys;
128-key tiles where the page allows and no unit starts mid-tile: no split), and caches whose key
rows one 2-d TMA view can address (the NHD and HND layouts attnbench builds, contiguous).
Elsewhere (the CPU interpreter included: Gluon has none) the option falls back to the prefill
kernel with the other options, so a run never refuses a batch for it; the plan's mode (a row's
"ran as") names the kernel that ran, with ``fit``'s reason (triton_prefill.route_note).
"""
from __future__ import annotations

import torch

from . import triton_plan as tp

# the compute warpgroups' registers (setmaxnreg; the loader's 4 warps keep the rest): 200 ran 2-4% faster than 232
# on an H200 (docs/triton_notes.md, prefill round 3)
COMPUTE_REGS = 200
STAGES = 2  # K/V slots in shared memory (128-key tiles: 2 x 64 KB beside Q's 32 KB)
TILE_KEYS = 128  # the key tile where block_n allows it (else 64)
# one program per SM walking the work items (else one program per item). Static round-robin (DYNAMIC off):
# 9% (bare 1k) and 4% (beside 3k) slower than one per item on an H200 (round 4), balancing worse than the
# hardware's block scheduler; drawing items from a counter (DYNAMIC, round 8): 87.4 / 383.2 us against one per
# item's 95.0 / 387.6 (H200), the loader fetching the next item's Q and first tiles while the compute
# partitions finish the current one. PROGRAMS (> 0): that many programs instead of the SM count (tests: many
# items a program, the ring's phases across items)
PERSISTENT = True
# a unit of 128 rows as two compute partitions of 64 (one warpgroup each, handing slots back on their own)
# instead of one partition of 8 warps synchronized at every tile
SPLIT_ROWS = True
# the loader reads a tile's block-table entry before it waits for the tile's slot (not after)
EARLY_PAGE = False
PROGRAMS = 0
# with PERSISTENT: each program's loader draws its next item from an atomic counter (longest first, as the
# items are ordered), telling the compute partitions which one through a word of global memory; the launch's
# last draw sets the counter back to 0 (no reset launch, CUDA-graph safe). 1: the number comes with Q's
# barrier; 2: with an item barrier of its own, once the previous item's Q is handed back, so the compute
# partitions read it and the unit row before the previous item's store (round 9: 86.3 / 382.0 us against 1's
# 88.6 / 383.6, H200); 0: static round-robin
DYNAMIC = 2
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


def kv_view(t: torch.Tensor):
    """(2-d rows view, ROW_PAGE, ROW_HEAD, COL_HEAD) of a [pages, page, kv heads, d] cache, or None."""
    pages, page, heads, d = t.shape
    s = t.stride()
    if s == (page * heads * d, heads * d, d, 1):  # NHD: rows = page x slot, columns = head x d
        return t.view(pages * page, heads * d), page, 0, d
    if s == (heads * page * d, d, page * d, 1):  # HND: rows = (page x head) x slot
        return torch.as_strided(t, (pages * heads * page, d), (d, 1)), heads * page, page, 0
    return None


MIN_QUERY = 64  # the default plan shapes its units for the kernel only when every request brings this many tokens


def hopper(device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def unwanted(batch) -> str:
    """'' when the triton backend's default plan shapes its units for this kernel (``config_args``), else
    why not: it takes a Hopper GPU, 16-bit q and cache, head dim 64 or 128, pages of a multiple of 64
    keys, causal prefills of at least MIN_QUERY tokens each, no tree and no attention variant. A decode
    or a short chunk beside prefills fills a 64-row partition per query head with a few rows, where the
    shipped kernel folds a KV head's G query heads into its rows: gpu/ragged-prefill at page 256 (four
    decodes, chunks of 8 and 17 tokens) ran 127.6 us through this kernel against the shipped 82.9 (H200,
    docs/triton_notes.md, "Prefill rounds 8 and 9")."""
    from . import triton_features as tf

    if not hopper(batch.device):
        return "not a Hopper GPU"
    if batch.dtype not in (torch.float16, torch.bfloat16) or batch.k_cache.dtype != batch.dtype:
        return "not a 16-bit q and cache"
    if batch.head_dim not in (64, 128) or batch.page_size % 64:
        return f"head dim {batch.head_dim}, page {batch.page_size} (it takes 64/128 and pages of a multiple of 64)"
    if batch.trees.tmax or tf.window_of(batch) or getattr(batch, "softcap", None) or any(
            getattr(batch, a, None) is not None for a in ("sinks", "alibi_slopes", "k_scale")):
        return "a tree or an attention variant"
    h = batch.host
    if not h.causal.all():
        return "a bidirectional prefill"
    if len(h.query_lens) == 0:
        return "no request"
    if int(h.query_lens.min()) < MIN_QUERY:
        return f"a request of {int(h.query_lens.min())} query tokens (it takes batches whose every request " \
               f"brings >= {MIN_QUERY}: a decode or short chunk beside prefills ran slower through it)"
    return ""


def wanted(batch) -> bool:
    return not unwanted(batch)


def config_args(batch) -> dict:
    """``choose_config``'s arguments for the kernel: units of 128 tokens (G <= 4) or 64 (64 rows of one
    query head each a compute partition), 64-key tiles in the plan (the kernel takes 128 where it can)."""
    g = batch.num_q_heads // batch.num_kv_heads
    return dict(block_m=(128 if g <= 4 else 64) * g, block_n=64)


def fit(p) -> str:
    """'' when the Gluon kernel can run the plan's batch, else why not."""
    b, cfg = p.batch, p.cfg
    if not hopper(b.q.device):
        return "the Gluon prefill kernel needs a Hopper GPU (sm_90)"
    if b.dtype not in (torch.float16, torch.bfloat16) or b.head_dim not in (64, 128):
        return "the Gluon prefill kernel takes 16-bit data and head dims 64 or 128"
    if cfg.block_q not in (64, 128) or cfg.block_n != 64 or b.page_size % 64:
        return f"the Gluon prefill kernel needs 64/128 tokens a unit and 64-key tiles in one page (block_q " \
               f"{cfg.block_q}, block_n {cfg.block_n}, page {b.page_size})"
    q = b.q
    if q.stride(2) != 1 or q.stride(1) != b.head_dim or any(x.data_ptr() % 16 for x in (q, b.k_cache, b.v_cache)) \
            or q.stride(0) * q.element_size() % 16:
        return "the Gluon prefill kernel needs 16-byte aligned q rows of heads x d"
    if kv_view(b.k_cache) is None or kv_view(b.v_cache) is None:
        return "the Gluon prefill kernel needs contiguous NHD or HND caches"
    return ""


def block_n(p) -> int:
    """The kernel's key tile: 128 where pages hold whole 128-key tiles and every unit starts at key 0
    (no split: the plan's split starts are multiples of its 64-key tiles), else 64."""
    return TILE_KEYS if p.batch.page_size % TILE_KEYS == 0 and p.num_merge == 0 else 64


def run(p, heavy_first: bool) -> None:
    """``prefill_gluon_kernel`` over the plan's units x query heads (split rows: partials for the merge)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from . import gluon_prefill_kernels as gk

    b, cfg = p.batch, p.cfg
    d, bm = b.head_dim, cfg.block_q
    bn = block_n(p)
    ty = gl.bfloat16 if b.dtype == torch.bfloat16 else gl.float16
    q2 = b.q.view(b.q.shape[0], b.q.shape[1] * d)
    parts = 2 if SPLIT_ROWS and bm == 128 else 1
    qd = TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [bm // parts, d],
                          gl.NVMMASharedLayout.get_default_for([bm // parts, d], ty))
    kv_layout = gl.NVMMASharedLayout.get_default_for([bn, d], ty)
    (k2, row_page, row_head, col_head), (v2, *_) = kv_view(b.k_cache), kv_view(b.v_cache)
    kd, vd = (TensorDescriptor(t, list(t.shape), list(t.stride()), [bn, d], kv_layout) for t in (k2, v2))
    out, po, pl = p.out, p.po, p.pl
    n_units = p.units.shape[0]
    items = n_units * b.num_q_heads
    grid = (min(items, PROGRAMS or tp.num_sms(b.q.device)) if PERSISTENT else items,)
    dynamic = DYNAMIC if PERSISTENT else 0
    sched = _sched(b.q.device, grid[0]) if dynamic else p.units  # (the static grid never reads it)
    gk.prefill_gluon_kernel[grid](
        qd, kd, vd, out, po, pl, b.block_table, p.units, sched,
        out.stride(0), out.stride(1), po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
        b.block_table.stride(0), p.qk_scale, row_head, col_head, b.num_q_heads, n_units,
        G=b.num_q_heads // b.num_kv_heads, HEAD_DIM=d, PAGE=b.page_size, ROW_PAGE=row_page, BLOCK_N=bn,
        STAGES=STAGES, UNIT_COLS=tp.UNIT_COLS, HEAVY_FIRST=heavy_first, Q_PARTS=parts, COMPUTE_REGS=COMPUTE_REGS,
        EARLY_PAGE=EARLY_PAGE, DYNAMIC=dynamic,
        num_warps=4,
    )
