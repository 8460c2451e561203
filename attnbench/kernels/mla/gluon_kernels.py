"""A warp-specialized MLA decode kernel written in Gluon for Hopper (issue 33, MLA round 2; the kernel notes in git history (triton_notes.md),
"the thirteenth session"): the ``gluon`` option of the triton backend's MLA path (mla/gluon.py says which
batches take it; on by default since the thirteenth session).

The absorbed form (docs/semantics.md, "MLA"): every query head reads the one latent row of a key,
``[c_kv (512) | k_rope (64)]``; scores are ``q . row`` over all 576 dims and the values are the row's first 512
(``c_kv``), so one tile of latent rows in shared memory is both K and V. A program is one unit of the MLA plan
(mla/plan.py: 64 rows of one request's (token, head) pairs, token-major, and one split of its keys; MTP chains
are planned as causal chunks: a unit sees keys up to its last token's, and with ``ROW_LIMITS`` each row up to its
own token's):

- the loader, the default partition (4 warps, one thread issuing), brings the unit's 64 rows of q (one TMA box
  of [64, 576]; rows past the unit's are other rows' q or zeros, computed and never stored) and then streams
  the split's ``BLOCK_N``-key latent tiles by TMA into a ring of ``STAGES`` slots (one box a tile, or
  BLOCK_N / PAGE boxes at pages of fewer keys; the block-table entries an iteration ahead);
- the output is 64 x 512 float32: 256 registers a thread for one warpgroup, so its columns are split between
  two compute warpgroups of 256 each. The *score* partition (``_scores``) computes S = Q K^T once per tile
  (576-deep warpgroup MMA), the online softmax (base 2), issues O[:, :256] += P V[:, :256] with P from
  registers and, while that MMA runs, writes P (16-bit) and the rows' rescale factors to shared memory for
  the other partition; the *value* partition (``_values``) rescales O[:, 256:] and adds P V[:, 256:] from P
  in shared memory. P's buffer is single: ``p_ready`` / ``p_free`` hand it over and back once a tile, and
  once more after the last tile with the final row sums. Each compute partition hands a ring slot back with
  one arrival (``empty``: two).

Keys of a split's last tile past its end (``k1``) are read and masked (their weight is 0; the cache there must
hold finite values, as attnbench's caches do). Split units write normalized partial outputs and base-2 LSEs
(of the scaled scores) for mla/kernels.mla_merge_kernel, as the Triton MLA kernel does.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from attnbench.kernels.shared.gluon_pages import tile_pages

#: the MLA plan's unit columns (mla/kernels.UNIT_COLS): request, first row, rows, first key, key end,
#: split (-1: none), first partial row, kind
U_REQ, U_ROW0, U_NROWS, U_K0, U_K1, U_SPLIT, U_PROW = (gl.constexpr(i) for i in range(7))
ROWS = gl.constexpr(64)  # a unit's rows: one warpgroup's MMA rows


@gluon.jit
def _unit(UNITS, UNIT_COLS: gl.constexpr):
    """This program's unit row (a pointer) and its key range [k0, k1)."""
    meta = UNITS + gl.program_id(0) * UNIT_COLS
    return meta, gl.load(meta + U_K0), gl.load(meta + U_K1)


@gluon.jit
def _loader(q_desc, qr_desc, kv_desc, kr_desc, q_smem, qr_smem, kv_smem, kr_smem, q_bar, ready, empty, UNITS, BT,
            QSTART, stride_bt, H, PAGE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
            UNIT_COLS: gl.constexpr):
    """q's 64 rows of the unit, then its key tiles into ring slot j % STAGES (a TMA box per page a tile and
    part: the latent's first D_NOPE columns, then its rope columns)."""
    meta, k0, k1 = _unit(UNITS, UNIT_COLS)
    b = gl.load(meta + U_REQ)
    D_NOPE: gl.constexpr = q_desc.block_type.shape[1]
    q_row = gl.load(QSTART + b) * H + gl.load(meta + U_ROW0)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes + qr_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    tma.async_copy_global_to_shared(qr_desc, [q_row, D_NOPE], q_bar, qr_smem)
    BOX: gl.constexpr = kv_desc.block_type.shape[0]
    NB: gl.constexpr = BLOCK_N // BOX
    bt_row = BT + b.to(gl.int64) * stride_bt
    last = (k1 - 1) // PAGE  # the request's last page holding a key of the unit
    n = gl.cdiv(k1 - k0, BLOCK_N)
    offs = gl.arange(0, NB, layout=gl.BlockedLayout([NB], [32], [4], [0]))
    nxt = tile_pages(bt_row, k0, last, PAGE, BOX, NB)
    for j in range(n):
        s = j % STAGES
        pages = nxt
        nxt = tile_pages(bt_row, k0 + (j + 1) * BLOCK_N, last, PAGE, BOX, NB)  # the next iteration's
        mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)  # mbarriers start with phase 1 complete
        mbarrier.expect(ready.index(s), NB * (kv_desc.block_type.nbytes + kr_desc.block_type.nbytes))
        for bx in gl.static_range(NB):
            page = gl.sum(gl.where(offs == bx, pages, 0), axis=0)  # (in-thread: each thread holds every entry)
            row = page * PAGE + (k0 + j * BLOCK_N + bx * BOX) % PAGE
            tma.async_copy_global_to_shared(kv_desc, [row, 0], ready.index(s), kv_smem.index(s).slice(bx * BOX, BOX))
            tma.async_copy_global_to_shared(kr_desc, [row, D_NOPE], ready.index(s),
                                            kr_smem.index(s).slice(bx * BOX, BOX))


@gluon.jit
def _hand_p(p, alpha, p_smem, a_smem, p_ready, p_free, j):
    """Tile j's P and rescale factors to the value partition, once it is done with tile j - 1's."""
    mbarrier.wait(p_free, (j & 1) ^ 1)
    p_smem.store(p)
    a_smem.store(alpha)
    fence_async_shared()  # P's stores before the value partition's MMA (async proxy) reads them
    gl.thread_barrier()  # every warp's stores before the arrival
    mbarrier.arrive(p_ready, count=1)


@gluon.jit
def _s_issue(j, q_smem, qr_smem, kv_smem, kr_smem, ready, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr):
    """S = Q K^T of ring tile j issued (its slot waited for), not waited for."""
    s = j % STAGES
    mbarrier.wait(ready.index(s), (j // STAGES) & 1)
    zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    qk = warpgroup_mma(q_smem, kv_smem.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
    return warpgroup_mma(qr_smem, kr_smem.index(s).permute((1, 0)), qk, is_async=True)


@gluon.jit
def _score_tile(j, k0, lim, cols, q_smem, qr_smem, kv_smem, kr_smem, p_smem, a_smem, ready, empty, p_ready, p_free,
                acc, m_i, l_i, qk_scale, s_layout: gl.constexpr, o_layout: gl.constexpr, DV: gl.constexpr,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr, ROW_LIMITS: gl.constexpr = False):
    """Ring tile j in the score partition: S = Q K^T, the online softmax (MASKED: keys from ``lim`` on get weight
    0: the unit's key end, or with ROW_LIMITS each row's, a [ROWS] vector), O[:, :DV] += P V[:, :DV] issued,
    P and the rescale factors handed to the value partition while that MMA runs, the slot handed back;
    returns (O, m, l)."""
    s = j % STAGES
    qk = warpgroup_mma_wait(num_outstanding=0, deps=(_s_issue(j, q_smem, qr_smem, kv_smem, kr_smem, ready, s_layout,
                                                              BLOCK_N, STAGES), ))
    if MASKED:
        if ROW_LIMITS:
            qk = gl.where(gl.expand_dims(k0 + j * BLOCK_N + cols, 0) < gl.expand_dims(lim, 1), qk, float("-inf"))
        else:
            qk = gl.where(gl.expand_dims(k0 + j * BLOCK_N + cols < lim, 0), qk, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
    m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
    p = gl.exp2(qk * qk_scale - gl.expand_dims(m_sub, 1)).to(p_smem.dtype)
    alpha = gl.exp2(m_i - m_sub)
    l_i = l_i * alpha + gl.sum(p.to(gl.float32), 1)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    pa = gl.convert_layout(p, gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    acc = warpgroup_mma(pa, kv_smem.index(s).slice(0, DV, dim=1), acc, is_async=True)
    _hand_p(p, alpha, p_smem, a_smem, p_ready, p_free, j)  # P V issued first, P handed over while it runs
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    gl.thread_barrier()  # every warp's MMAs on the slot are done before it is handed back
    mbarrier.arrive(empty.index(s), count=1)
    return acc, m_new, l_i


@gluon.jit
def _store(o, l_i, col0, meta, Out, PO, H, QSTART, stride_o, stride_pos, stride_por, o_layout: gl.constexpr,
           DV: gl.constexpr):
    """A partition's DV columns of the unit's rows, normalized: the output, or a split unit's partial output
    (stored from the MMA's layout: no shared-memory scratch for a 64 x DV float32 conversion)."""
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = o / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout)), 1)
    m = gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
    c = col0 + gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
    ok = gl.expand_dims(m < gl.load(meta + U_NROWS), 1) & gl.expand_dims(c >= 0, 0)
    prow = gl.load(meta + U_PROW)
    if gl.load(meta + U_SPLIT) < 0:
        row = (gl.load(QSTART + gl.load(meta + U_REQ)) * H + gl.load(meta + U_ROW0) + m).to(gl.int64)
        gl.store(Out + gl.expand_dims(row * stride_o, 1) + gl.expand_dims(c, 0), o.to(Out.dtype.element_ty), mask=ok)
    else:
        base = PO + gl.load(meta + U_SPLIT).to(gl.int64) * stride_pos
        row = (prow + m).to(gl.int64)
        gl.store(base + gl.expand_dims(row * stride_por, 1) + gl.expand_dims(c, 0), o.to(PO.dtype.element_ty), mask=ok)


@gluon.jit
def _scores(q_smem, qr_smem, kv_smem, kr_smem, p_smem, a_smem, q_bar, ready, empty, p_ready, p_free, Out, PO, PL,
            UNITS, QSTART, CTX, H, qk_scale, stride_o, stride_pos, stride_por, stride_pls, BLOCK_N: gl.constexpr,
            STAGES: gl.constexpr, DV: gl.constexpr, UNIT_COLS: gl.constexpr, ROW_LIMITS: gl.constexpr):
    """The score partition (one warpgroup): every tile's S and softmax, O's first DV columns; then the final
    row sums handed over (one more P round), its columns and a split unit's LSEs stored. ROW_LIMITS (a unit of
    several tokens: MTP chains at a head count not a multiple of 64): row m sees the keys below its token's end,
    context + its token + 1 (the unit's ``k1`` is its last token's), and the tiles from the first token's end on
    take the mask."""
    meta, k0, k1 = _unit(UNITS, UNIT_COLS)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DV, 16])
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([ROWS, DV], gl.float32, layout=o_layout)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    n = gl.cdiv(k1 - k0, BLOCK_N)
    n_full = (k1 - k0) // BLOCK_N  # tiles wholly below k1: no mask (a decode sees every key of its split)
    lim = k1
    if ROW_LIMITS:
        row0, ctx = gl.load(meta + U_ROW0), gl.load(CTX + gl.load(meta + U_REQ))
        lim = gl.minimum(ctx + (row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))) // H + 1, k1)
        n_full = gl.maximum(gl.minimum(ctx + row0 // H + 1, k1) - k0, 0) // BLOCK_N
    mbarrier.wait(q_bar, 0)
    for j in range(n_full):
        acc, m_i, l_i = _score_tile(j, k0, lim, cols, q_smem, qr_smem, kv_smem, kr_smem, p_smem, a_smem, ready, empty,
                                    p_ready, p_free, acc, m_i, l_i, qk_scale, s_layout, o_layout, DV, BLOCK_N, STAGES,
                                    False, ROW_LIMITS)
    for j in range(n_full, n):
        acc, m_i, l_i = _score_tile(j, k0, lim, cols, q_smem, qr_smem, kv_smem, kr_smem, p_smem, a_smem, ready, empty,
                                    p_ready, p_free, acc, m_i, l_i, qk_scale, s_layout, o_layout, DV, BLOCK_N, STAGES,
                                    True, ROW_LIMITS)
    mbarrier.wait(p_free, (n & 1) ^ 1)
    a_smem.store(l_i)  # the final row sums for the value partition's columns
    gl.thread_barrier()
    mbarrier.arrive(p_ready, count=1)
    _store(acc, l_i, 0, meta, Out, PO, H, QSTART, stride_o, stride_pos, stride_por, o_layout, DV)
    if gl.load(meta + U_SPLIT) >= 0:
        rows = gl.arange(0, ROWS, layout=l_i.type.layout)
        lse = gl.where(l_i > 0.0, m_i + gl.log2(gl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
        gl.store(PL + gl.load(meta + U_SPLIT).to(gl.int64) * stride_pls + gl.load(meta + U_PROW) + rows, lse,
                 mask=rows < gl.load(meta + U_NROWS))


@gluon.jit
def _values(kv_smem, p_smem, a_smem, ready, empty, p_ready, p_free, Out, PO, UNITS, QSTART, H, stride_o, stride_pos,
            stride_por, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DV: gl.constexpr, UNIT_COLS: gl.constexpr):
    """The value partition (one warpgroup): O's last DV columns from the score partition's P and rescale
    factors, then its columns stored with the final row sums."""
    meta, k0, k1 = _unit(UNITS, UNIT_COLS)
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DV, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    acc = gl.zeros([ROWS, DV], gl.float32, layout=o_layout)
    n = gl.cdiv(k1 - k0, BLOCK_N)
    for j in range(n):
        s = j % STAGES
        mbarrier.wait(ready.index(s), (j // STAGES) & 1)
        mbarrier.wait(p_ready, j & 1)
        acc = acc * gl.expand_dims(a_smem.load(row_layout), 1)
        acc = warpgroup_mma(p_smem, kv_smem.index(s).slice(DV, DV, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        gl.thread_barrier()  # every warp's MMAs (and rescale reads) done before P's buffer and the slot go back
        mbarrier.arrive(p_free, count=1)
        mbarrier.arrive(empty.index(s), count=1)
    mbarrier.wait(p_ready, n & 1)
    _store(acc, a_smem.load(row_layout), DV, meta, Out, PO, H, QSTART, stride_o, stride_pos, stride_por, o_layout,
           DV)


@gluon.jit
def mla_gluon_kernel(
    q_desc, qr_desc, kv_desc, kr_desc, Out, PO, PL, BT, UNITS, QSTART, CTX,
    stride_o, stride_pos, stride_por, stride_pls, stride_bt, qk_scale, H,
    PAGE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, UNIT_COLS: gl.constexpr,
    COMPUTE_REGS: gl.constexpr, ROW_LIMITS: gl.constexpr = False,
):
    """Grid: (units,). q's and the latent cache's rows ([N x H, D], [pages x PAGE, D]; D = D_NOPE + rope dims)
    through two descriptors each (TMA blocks are powers of two): the first D_NOPE columns (q_desc: [64, D_NOPE]
    boxes, kv_desc: [min(PAGE, BLOCK_N), D_NOPE]) and the rope columns (qr_desc, kr_desc)."""
    D_NOPE: gl.constexpr = q_desc.block_type.shape[1]
    DV: gl.constexpr = D_NOPE // 2  # each compute partition's output columns
    ty: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(ty, q_desc.block_type.shape, q_desc.layout)
    qr_smem = gl.allocate_shared_memory(ty, qr_desc.block_type.shape, qr_desc.layout)
    kv_smem = gl.allocate_shared_memory(ty, [STAGES, BLOCK_N, D_NOPE], kv_desc.layout)
    kr_smem = gl.allocate_shared_memory(ty, [STAGES, BLOCK_N, kr_desc.block_type.shape[1]], kr_desc.layout)
    p_smem = gl.allocate_shared_memory(ty, [ROWS, BLOCK_N], gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N], ty))
    a_smem = gl.allocate_shared_memory(gl.float32, [ROWS], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival per compute partition
    gl.warp_specialize([
        (_loader, (q_desc, qr_desc, kv_desc, kr_desc, q_smem, qr_smem, kv_smem, kr_smem, q_bar, ready, empty, UNITS,
                   BT, QSTART, stride_bt, H, PAGE, BLOCK_N, STAGES, UNIT_COLS)),
        (_scores, (q_smem, qr_smem, kv_smem, kr_smem, p_smem, a_smem, q_bar, ready, empty, p_ready, p_free, Out, PO,
                   PL, UNITS, QSTART, CTX, H, qk_scale, stride_o, stride_pos, stride_por, stride_pls, BLOCK_N, STAGES,
                   DV, UNIT_COLS, ROW_LIMITS)),
        (_values, (kv_smem, p_smem, a_smem, ready, empty, p_ready, p_free, Out, PO, UNITS, QSTART, H, stride_o,
                   stride_pos, stride_por, BLOCK_N, STAGES, DV, UNIT_COLS)),
    ], [4, 4], [COMPUTE_REGS, COMPUTE_REGS])
