"""A warp-specialized tree kernel written in Gluon for Hopper (issue 33, tree round 1;
the kernel notes in git history (triton_notes.md)): the ``gluon`` option of the triton backend's tree path
(tree/gluon.py says which batches take it).

The prefill kernel's design (prefill/gluon_kernels.py) applied to a speculative-decoding batch,
where a request brings a few dozen query tokens (a draft tree) over a long context:

- one program per work item (a unit of the plan: one request's query tokens and one split of its
  keys; times the KV heads), all G query heads of the KV head in its rows (row m: token m // G,
  head m % G, as the shipped kernel), so K and V are read once per KV head and split;
- the loader, the default partition (4 warps, one thread issuing), streams the item's 64-key
  tiles by TMA into a ring of ``STAGES`` slots. A tile lies in one page (pages of 64 keys or
  more) or spans 64 / PAGE pages, one box each (pages of 8-32 keys), each box's block-table
  entry read before the slot wait (a box past the request's last key reads its last page: its
  keys are masked); the block-table entries of a tile come in one load an iteration ahead (``shared/gluon_pages.py``);
- FP8 caches (tree round 2): the TMA writes each tile into one of ``STAGES8`` FP8 staging slots, and the
  loader's 128 threads widen it into the ring slot as float16 (exact for e4m3 and e5m2), fence it for the
  MMAs and arrive on ``ready``; the compute partitions convert q to float16 (|q| below 65504, as the
  one-launch kernel's ``fp8_f16``) and fold the KV head's K scale
  into ``qk_scale`` and its V scale into the output;
- ``WGS`` compute partitions of one warpgroup (64 rows each: a 40-node tree with G 4 is 160 rows,
  3 partitions) load their rows of Q themselves (gathered over tokens and heads, then stored to
  shared memory for the MMA), wait on a slot's ``ready`` barrier, run S = Q K^T and O += P V as
  warpgroup MMAs with the online softmax, and hand the slot back (one arrival each) so they
  run apart. A partition without rows (a decode's unit) only hands the slots back. ``PIPE_S`` (on for
  16-bit caches, off for FP8 ones: tree/gluon.py): the next tile's S issued right behind this tile's P V,
  one wait for both (``_tile_piped``).

Tiles ending past ``full_end`` (a tree's own nodes, a chunk's causal diagonal) take the mask:
a tree row sees the context and the nodes of its ancestor bitmask (``ANC``: bit k of word w for
node 64 w + k), any other row the keys up to its own position; every row only keys below the
unit's ``kv_hi`` (tree/mask.py: one 64-bit word a row and tile). Keys read past ``kv_hi`` must hold finite
values (attnbench's caches do). Split units write partial outputs (the plan's dtype) and natural-log LSEs for
merge.py's kernel (shared/gluon_epilogue.py).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

from attnbench.kernels.shared.gluon_pages import issue_tile, tile_pages
from attnbench.kernels.shared.gluon_steps import softmax_p, softmax_pv
from attnbench.kernels.tree.mask import keep, row_bits
from attnbench.kernels.shared.gluon_epilogue import store
from attnbench.kernels.shared.plan import UNIT_COLUMNS

(U_REQ, U_QSTART, U_QCOUNT, U_CTX, U_KVLO, U_KVHI, U_FULL, U_SPLIT, U_PROW, U_TREE, U_Q0) = (
    gl.constexpr(UNIT_COLUMNS.index(name)) for name in (
        "req", "q_start", "q_count", "ctx", "kv_lo", "kv_hi", "full_end", "split", "prow", "tree", "q0"))


@gluon.jit
def _widen(src, dst, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """An FP8 tile in shared memory to 16 bits in another, 16 bytes a thread in chunks of rows."""
    TC: gl.constexpr = HEAD_DIM // 16  # threads across a row
    CHUNK: gl.constexpr = 4 * (32 // TC)
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [32 // TC, TC], [4, 1], [1, 0])
    for c in gl.static_range(BLOCK_N // CHUNK):
        dst.slice(c * CHUNK, CHUNK).store(src.slice(c * CHUNK, CHUNK).load(layout).to(dst.dtype))


@gluon.jit
def _loader(k_desc, v_desc, k_smem, v_smem, ready, empty, k8, v8, landed, UNITS, BT, stride_bt, n_kv, row_head,
            col_head, PAGE: gl.constexpr, ROW_PAGE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
            UNIT_COLS: gl.constexpr, FP8: gl.constexpr, STAGES8: gl.constexpr):
    """The item's key tiles into ring slot j % STAGES. FP8: TMA into staging slot j % STAGES8 (``landed``),
    then this partition's 128 threads widen it into the ring slot (float16) and arrive on ``ready``."""
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    w = gl.program_id(0)
    meta = UNITS + (w // n_kv) * UNIT_COLS
    kvh = w % n_kv
    kv_lo = gl.load(meta + U_KVLO)
    kv_hi = gl.load(meta + U_KVHI)
    last = (kv_hi - 1) // PAGE  # the request's last page holding a key of the unit
    bt_row = BT + gl.load(meta + U_REQ).to(gl.int64) * stride_bt
    n = gl.cdiv(kv_hi - kv_lo, BLOCK_N)
    BOX: gl.constexpr = k_desc.block_type.shape[0]
    NB: gl.constexpr = BLOCK_N // BOX
    AHEAD: gl.constexpr = STAGES8 * FP8  # the tile iteration j issues: j + AHEAD
    if FP8:
        for j in range(gl.minimum(n, STAGES8)):
            start = kv_lo + j * BLOCK_N
            issue_tile(k_desc, v_desc, k8.index(j), v8.index(j), landed.index(j), start,
                   tile_pages(bt_row, start, last, PAGE, BOX, NB), kvh, row_head, col_head, PAGE, ROW_PAGE, BLOCK_N)
    nxt = tile_pages(bt_row, kv_lo + AHEAD * BLOCK_N, last, PAGE, BOX, NB)
    for j in range(n):
        s = j % STAGES
        pages = nxt
        nxt = tile_pages(bt_row, kv_lo + (j + AHEAD + 1) * BLOCK_N, last, PAGE, BOX, NB)  # the next iteration's
        mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)  # mbarriers start with phase 1 complete
        if FP8:
            f = j % STAGES8
            mbarrier.wait(landed.index(f), (j // STAGES8) & 1)
            _widen(k8.index(f), k_smem.index(s), BLOCK_N, HEAD_DIM)
            _widen(v8.index(f), v_smem.index(s), BLOCK_N, HEAD_DIM)
            fence_async_shared()  # the stores before the MMAs' (async proxy) reads, the reads before TMA's writes
            gl.thread_barrier()
            mbarrier.arrive(ready.index(s), count=1)
            if j + AHEAD < n:
                issue_tile(k_desc, v_desc, k8.index(f), v8.index(f), landed.index(f), kv_lo + (j + AHEAD) * BLOCK_N,
                       pages, kvh, row_head, col_head, PAGE, ROW_PAGE, BLOCK_N)
        else:
            issue_tile(k_desc, v_desc, k_smem.index(s), v_smem.index(s), ready.index(s), kv_lo + j * BLOCK_N, pages,
                   kvh, row_head, col_head, PAGE, ROW_PAGE, BLOCK_N)


@gluon.jit
def _tile(j, q_smem, k_smem, v_smem, ready, empty, acc, m_i, l_i, qk_scale, s_layout: gl.constexpr,
          o_layout: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr, ok):
    """Ring tile j: S = Q K^T, the online softmax (base 2; MASKED: the [rows, keys] mask ``ok``, ``_mask``), O += P V,
    the slot handed back."""
    s = j % STAGES
    mbarrier.wait(ready.index(s), (j // STAGES) & 1)
    s_zero = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
    qk = warpgroup_mma(q_smem, k_smem.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
    if MASKED:
        qk = gl.where(ok, qk, float("-inf"))
    return softmax_pv(qk, m_i, l_i, acc, qk_scale, v_smem.index(s), empty.index(s), o_layout)


@gluon.jit
def _tile_piped(j, n_tiles, qk, q_smem, k_smem, v_smem, ready, empty, acc, m_i, l_i, qk_scale, s_layout: gl.constexpr,
                o_layout: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr, ok):
    """``PIPE_S``: ring tile j, its S (``qk``) issued by the tile before: the mask and softmax, O += P V, and
    S of tile j + 1 issued behind the P V (the two MMAs back to back), one wait for both before slot j is handed
    back (a partition holds two slots at once: STAGES >= 2); returns (O, m, l, the next S)."""
    s = j % STAGES
    nxt = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
    if MASKED:
        qk = gl.where(ok, qk, float("-inf"))
    pa, acc, m_i, l_i = softmax_p(qk, m_i, l_i, acc, qk_scale, v_smem.dtype, o_layout)
    pv = warpgroup_mma(pa, v_smem.index(s), acc, is_async=True)
    if j + 1 < n_tiles:
        s1 = (j + 1) % STAGES
        mbarrier.wait(ready.index(s1), ((j + 1) // STAGES) & 1)
        qk1 = warpgroup_mma(q_smem, k_smem.index(s1).permute((1, 0)), nxt, use_acc=False, is_async=True)
        acc, nxt = warpgroup_mma_wait(num_outstanding=0, deps=(pv, qk1))
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv, ))
    gl.thread_barrier()  # every warp's MMAs on slot j are done before it is handed back
    mbarrier.arrive(empty.index(s), count=1)
    return acc, m_i, l_i, nxt


@gluon.jit
def _mask(j, kv_lo, BLOCK_N: gl.constexpr, cols, t, tok, ctx, q0, kv_hi, row_ok, is_tree, ANC, stride_anc):
    """Masked tile j's [rows, keys] mask, from its rows' 64-bit words (tree/mask.py)."""
    return keep(row_bits(kv_lo + j * BLOCK_N, t, tok, ctx, q0, kv_hi, row_ok, is_tree, ANC, stride_anc), cols)


@gluon.jit
def _key_tiles(q_smem, k_smem, v_smem, ready, empty, qk_scale, s_layout: gl.constexpr, o_layout: gl.constexpr,
               BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PIPE_S: gl.constexpr, full_end, kv_lo, n_tiles, cols, t,
               tok, ctx, q0, kv_hi, row_ok, is_tree, ANC, stride_anc):
    """The partition's key tiles: those every row sees in full (the context), then the masked ones (the tree's
    nodes, the split's end); returns (O unnormalized, m, l). PIPE_S: ``_tile_piped``."""
    ROWS: gl.constexpr = 64
    HEAD_DIM: gl.constexpr = v_smem.shape[2]
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)
    n_full = gl.minimum(gl.maximum(full_end - kv_lo, 0) // BLOCK_N, n_tiles)
    if PIPE_S:
        qk = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
        if n_tiles > 0:
            mbarrier.wait(ready.index(0), 0)
            qk = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), qk, use_acc=False, is_async=True)
            qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
        for j in range(n_full):
            acc, m_i, l_i, qk = _tile_piped(j, n_tiles, qk, q_smem, k_smem, v_smem, ready, empty, acc, m_i, l_i,
                                            qk_scale, s_layout, o_layout, BLOCK_N, STAGES, False, 0)
        for j in range(n_full, n_tiles):
            ok = _mask(j, kv_lo, BLOCK_N, cols, t, tok, ctx, q0, kv_hi, row_ok, is_tree, ANC, stride_anc)
            acc, m_i, l_i, qk = _tile_piped(j, n_tiles, qk, q_smem, k_smem, v_smem, ready, empty, acc, m_i, l_i,
                                            qk_scale, s_layout, o_layout, BLOCK_N, STAGES, True, ok)
    else:
        for j in range(n_full):
            acc, m_i, l_i = _tile(j, q_smem, k_smem, v_smem, ready, empty, acc, m_i, l_i, qk_scale, s_layout, o_layout,
                                  BLOCK_N, STAGES, False, 0)
        for j in range(n_full, n_tiles):
            ok = _mask(j, kv_lo, BLOCK_N, cols, t, tok, ctx, q0, kv_hi, row_ok, is_tree, ANC, stride_anc)
            acc, m_i, l_i = _tile(j, q_smem, k_smem, v_smem, ready, empty, acc, m_i, l_i, qk_scale, s_layout, o_layout,
                                  BLOCK_N, STAGES, True, ok)
    return acc, m_i, l_i


@gluon.jit
def _load_q(q_smem, Q, q_start, q_count, kvh, part, stride_qt, stride_qh, G: gl.constexpr, ROWS: gl.constexpr,
            HEAD_DIM: gl.constexpr):
    """The partition's rows of Q, gathered over tokens and heads, into its shared-memory tile."""
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    m_ld = part * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, ld_layout))
    d_ld = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ld_layout))
    tok_ld = (q_start + m_ld // G).to(gl.int64)
    q_ptr = Q + gl.expand_dims(tok_ld * stride_qt + (kvh * G + m_ld % G) * stride_qh, 1) + gl.expand_dims(d_ld, 0)
    q_ok = gl.expand_dims(m_ld // G < q_count, 1) & gl.expand_dims(d_ld < HEAD_DIM, 0)
    q_smem.store(gl.load(q_ptr, mask=q_ok, other=0.0).to(q_smem.dtype))  # FP8 caches: bf16 q -> float16
    fence_async_shared()
    gl.thread_barrier()  # every warp's rows stored before the MMAs read them


@gluon.jit
def _columns(meta):
    """A unit's context, full_end, q0 and tree flag (triton_plan.UNIT_COLUMNS)."""
    return gl.load(meta + U_CTX), gl.load(meta + U_FULL), gl.load(meta + U_Q0), gl.load(meta + U_TREE)


@gluon.jit
def _compute(part, q_smem, k_smem, v_smem, ready, empty, Q, Out, PO, PL, UNITS, ANC, KSC, VSC, n_kv, qk_scale,
             stride_qt, stride_qh, stride_ot, stride_oh, stride_pos, stride_por, stride_poh, stride_pls, stride_plr,
             stride_anc, stride_sc, G: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
             STAGES: gl.constexpr, UNIT_COLS: gl.constexpr, FP8: gl.constexpr, PIPE_S: gl.constexpr):
    """Compute partition ``part`` (one warpgroup): rows part x 64 .. of the item. FP8: the KV head's K scale
    folded into ``qk_scale``, its V scale into the output (the slots hold the FP8 values widened)."""
    ROWS: gl.constexpr = 64
    w = gl.program_id(0)
    meta = UNITS + (w // n_kv) * UNIT_COLS
    kvh = w % n_kv
    q_start = gl.load(meta + U_QSTART)
    q_count = gl.load(meta + U_QCOUNT)
    kv_lo = gl.load(meta + U_KVLO)
    kv_hi = gl.load(meta + U_KVHI)
    # the unit's other columns in the same round trip (the epilogue's too)
    ctx, full_end, q0, is_tree = _columns(meta)
    prow, split = gl.load(meta + U_PROW), gl.load(meta + U_SPLIT)
    n_tiles = gl.cdiv(kv_hi - kv_lo, BLOCK_N)
    if part * ROWS < q_count * G:
        _load_q(q_smem, Q, q_start, q_count, kvh, part, stride_qt, stride_qh, G, ROWS, HEAD_DIM)
        if FP8:
            qk_scale = qk_scale * gl.load(KSC + kvh * stride_sc)

        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        m_s = part * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
        t = m_s // G
        row_ok = t < q_count
        tok = (q_start + t).to(gl.int64)
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        acc, m_i, l_i = _key_tiles(q_smem, k_smem, v_smem, ready, empty, qk_scale, s_layout, o_layout, BLOCK_N, STAGES,
                                   PIPE_S, full_end, kv_lo, n_tiles, cols, t, tok, ctx, q0, kv_hi, row_ok, is_tree, ANC,
                                   stride_anc)
        if FP8:
            acc = acc * gl.load(VSC + kvh * stride_sc)
        store(acc, m_i, l_i, Out, PO, PL, prow, split, q_start, part, q_count, kvh, stride_ot, stride_oh, stride_pos,
              stride_por, stride_poh, stride_pls, stride_plr, G, ROWS, HEAD_DIM)
    else:  # no rows here (a decode's unit): the slots handed back as they come
        for j in range(n_tiles):
            s = j % STAGES
            mbarrier.wait(ready.index(s), (j // STAGES) & 1)
            mbarrier.arrive(empty.index(s), count=1)


@gluon.jit
def tree_gluon_kernel(
    k_desc, v_desc, Q, Out, PO, PL, BT, UNITS, ANC, KSC, VSC,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_pos, stride_por, stride_poh, stride_pls, stride_plr,
    stride_bt, stride_anc, stride_sc, qk_scale, ROW_HEAD, COL_HEAD, n_kv,
    G: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE: gl.constexpr, ROW_PAGE: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, UNIT_COLS: gl.constexpr, WGS: gl.constexpr, COMPUTE_REGS: gl.constexpr,
    SLOT_TY: gl.constexpr, SLOT_LAYOUT: gl.constexpr, FP8: gl.constexpr, STAGES8: gl.constexpr, PIPE_S: gl.constexpr,
):
    """Grid: (units x KV heads,), unit-major. WGS compute partitions of 64 rows (1-3). The slots (and Q's
    tiles) hold SLOT_TY in SLOT_LAYOUT: the cache's 16-bit dtype, or float16 for FP8 caches, whose tiles
    the TMA writes into STAGES8 staging slots of their own (the loader widens them)."""
    q_smem = gl.allocate_shared_memory(SLOT_TY, [WGS, 64, HEAD_DIM], SLOT_LAYOUT)
    k_smem = gl.allocate_shared_memory(SLOT_TY, [STAGES, BLOCK_N, HEAD_DIM], SLOT_LAYOUT)
    v_smem = gl.allocate_shared_memory(SLOT_TY, [STAGES, BLOCK_N, HEAD_DIM], SLOT_LAYOUT)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=WGS)  # one arrival per compute partition
    if FP8:
        k8 = gl.allocate_shared_memory(k_desc.dtype, [STAGES8, BLOCK_N, HEAD_DIM], k_desc.layout)
        v8 = gl.allocate_shared_memory(v_desc.dtype, [STAGES8, BLOCK_N, HEAD_DIM], v_desc.layout)
        landed = gl.allocate_shared_memory(gl.int64, [STAGES8, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES8):
            mbarrier.init(landed.index(i), count=1)
    else:  # not read
        k8 = k_smem
        v8 = v_smem
        landed = ready
    gl.warp_specialize([
        (_loader, (k_desc, v_desc, k_smem, v_smem, ready, empty, k8, v8, landed, UNITS, BT, stride_bt, n_kv, ROW_HEAD,
                   COL_HEAD, PAGE, ROW_PAGE, BLOCK_N, STAGES, UNIT_COLS, FP8, STAGES8)),
        (_compute, (0, q_smem.index(0), k_smem, v_smem, ready, empty, Q, Out, PO, PL, UNITS, ANC, KSC, VSC, n_kv,
                    qk_scale, stride_qt, stride_qh, stride_ot, stride_oh, stride_pos, stride_por, stride_poh,
                    stride_pls, stride_plr, stride_anc, stride_sc, G, BLOCK_N, HEAD_DIM, STAGES, UNIT_COLS, FP8,
                    PIPE_S)),
        (_compute, (1, q_smem.index(1 % WGS), k_smem, v_smem, ready, empty, Q, Out, PO, PL, UNITS, ANC, KSC, VSC, n_kv,
                    qk_scale, stride_qt, stride_qh, stride_ot, stride_oh, stride_pos, stride_por, stride_poh,
                    stride_pls, stride_plr, stride_anc, stride_sc, G, BLOCK_N, HEAD_DIM, STAGES, UNIT_COLS, FP8,
                    PIPE_S)),
        (_compute, (2, q_smem.index(2 % WGS), k_smem, v_smem, ready, empty, Q, Out, PO, PL, UNITS, ANC, KSC, VSC, n_kv,
                    qk_scale, stride_qt, stride_qh, stride_ot, stride_oh, stride_pos, stride_por, stride_poh,
                    stride_pls, stride_plr, stride_anc, stride_sc, G, BLOCK_N, HEAD_DIM, STAGES, UNIT_COLS, FP8,
                    PIPE_S)),
    ][:WGS + 1], [4] * WGS, [COMPUTE_REGS] * WGS)
