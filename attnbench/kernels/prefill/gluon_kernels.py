"""A warp-specialized prefill kernel written in Gluon for Hopper (issue 33, prefill round 3;
the kernel notes in git history (triton_notes.md)): the ``gluon`` option of the triton backend's prefill path (on by default since
round 8, for the batches prefill/gluon.wanted takes on a Hopper GPU).

Round 2 asked triton 3.6's automatic pass to specialize the prefill loop and it crashed (an
out-of-range shared-memory address in compiler-generated code, compute-sanitizer). Here the
partitions and their barriers are written out by hand:

- the loader, the default partition (4 warps, one thread issuing): per work item Q's tile, then
  each K/V tile by TMA into a ring of ``STAGES`` shared-memory slots; it waits for a slot's
  ``empty`` barrier before refilling it, and the TMA transaction count completes the slot's
  ``ready`` barrier (Q has its own ready/empty pair);
- the compute partitions, Q_PARTS workers (at 128 rows: two of one warpgroup each, each with its
  own Q box and rows, or one of two warpgroups; ``setmaxnreg`` COMPUTE_REGS), each wait on ``ready``,
  run S = Q K^T and O += P V as warpgroup MMAs (P from registers) with the online softmax between
  them, hand the slot back on ``empty`` (one arrival each) once their MMAs on it are done, and store
  their rows of the item.

Work items are (unit of the shipped plan: BLOCK_M tokens, query head), the longest causal units
first (the plan's units read in reverse). The grid is persistent: a program's loader draws its items
from an atomic counter and tells the compute partitions each item's number through a word of global
memory and an item barrier of its own, so they read the next item before storing the current one.
The loader fetches the next item's Q and first tiles while the compute warps finish the current one;
the ring's slots and phases run on across items.
The keys of a tile lie in one page (``PAGE % BLOCK_N == 0``), so a tile is one TMA box of the cache
viewed as 2-d rows: row = page * ROW_PAGE + kv_head * ROW_HEAD + slot, column kv_head * COL_HEAD
(NHD: [pages x page, kv heads x d]; HND: [pages x kv heads x page, d]). Keys of the last tile
past ``kv_hi`` are read and masked (their weight is 0; the cache there must hold finite values,
as attnbench's caches do). Causal rows, the split's key range, partial outputs and LSEs follow
the shipped kernel (shared/plan.py's unit table).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from attnbench.kernels.shared.gluon_steps import softmax_pv

from attnbench.kernels.shared.plan import UNIT_COLUMNS

(U_REQ, U_QSTART, U_QCOUNT, U_CTX, U_KVLO, U_KVHI, U_SPLIT, U_PROW, U_Q0) = (
    gl.constexpr(UNIT_COLUMNS.index(name)) for name in (
        "req", "q_start", "q_count", "ctx", "kv_lo", "kv_hi", "split", "prow", "q0"))


@gluon.jit
def _item(UNITS, w, n_heads, n_units, UNIT_COLS: gl.constexpr):
    """Work item ``w``: (its unit row's pointer, its query head). Units are ordered request, split, row
    block; read in reverse, the longest causal units go first."""
    unit = w // n_heads
    unit = n_units - 1 - unit
    return UNITS + unit * UNIT_COLS, w % n_heads


@gluon.jit
def _draw(SCHED):
    """The next item of the launch: a draw from its counter."""
    return gl.atomic_add(SCHED, 1)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, item_ready, ready, empty, UNITS, BT,
            stride_bt,
            n_heads, n_units, row_head, col_head, G: gl.constexpr, HEAD_DIM: gl.constexpr, ROW_PAGE: gl.constexpr,
            PAGE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, UNIT_COLS: gl.constexpr,
            Q_PARTS: gl.constexpr, SCHED):
    """The loader partition: per item its Q tile (once the previous item's is consumed), then K and V of
    each tile into ring slot c % STAGES (c counts tiles across items). Items are drawn from the counter
    SCHED[0] and, once the previous item's Q is handed back, told to the compute partitions through
    SCHED[1 + pid] (-1: the end) and the item barrier."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    total = n_heads * n_units
    c = 0
    it = 0
    w = _draw(SCHED)
    while w < total:
        meta, head = _item(UNITS, w, n_heads, n_units, UNIT_COLS)
        kvh = head // G
        kv_lo = gl.load(meta + U_KVLO)
        n_tiles = gl.cdiv(gl.load(meta + U_KVHI) - kv_lo, BLOCK_N)
        bt_row = BT + gl.load(meta + U_REQ).to(gl.int64) * stride_bt
        mbarrier.wait(q_empty, (it & 1) ^ 1)  # mbarriers start with phase 1 complete
        # the compute partitions have read the previous item's number (they handed its Q back)
        gl.store(SCHED + 1 + pid, w)
        gl.thread_barrier()  # the storing thread's write ordered before the arriving thread's release
        mbarrier.arrive(item_ready, count=1)
        mbarrier.expect(q_ready, Q_PARTS * q_desc.block_type.nbytes)
        q_start = gl.load(meta + U_QSTART)
        for h in gl.static_range(Q_PARTS):  # one box per compute partition's rows
            tma.async_copy_global_to_shared(q_desc, [q_start + h * q_desc.block_type.shape[0], head * HEAD_DIM],
                                            q_ready, q_smem.index(h))
        for j in range(n_tiles):
            s = c % STAGES
            start = kv_lo + j * BLOCK_N
            mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)
            page = gl.load(bt_row + start // PAGE)
            row = page * ROW_PAGE + kvh * row_head + start % PAGE
            mbarrier.expect(ready.index(s), 2 * k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [row, kvh * col_head], ready.index(s), k_smem.index(s))
            tma.async_copy_global_to_shared(v_desc, [row, kvh * col_head], ready.index(s), v_smem.index(s))
            c += 1
        it += 1
        w = _draw(SCHED)
    # the last draw of the launch (every program has drawn its end) sets the counter back to 0
    if w == total + nprog - 1:
        gl.atomic_xchg(SCHED, 0)
    mbarrier.wait(q_empty, (it & 1) ^ 1)
    gl.store(SCHED + 1 + pid, -1)  # the compute partitions' end
    gl.thread_barrier()
    mbarrier.arrive(item_ready, count=1)


@gluon.jit
def _key_loop(q_smem, k_smem, v_smem, ready, empty, c, q_count, ctx, q0, kv_lo, kv_hi, n_tiles, qk_scale,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
              num_warps: gl.constexpr):
    """One item's key tiles (ring tiles c, c + 1, ...): the MMAs and the online softmax (base 2);
    returns (O unnormalized, m, l)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    # a row sees keys below lim: causal and the split's end (padding rows: every key in range)
    lim = gl.where(rows < q_count, gl.minimum(ctx + q0 + rows + 1, kv_hi), kv_hi)
    unmasked_end = gl.minimum(ctx + q0 + 1, kv_hi)  # tiles ending at or before it need no mask
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    for j in range(n_tiles):
        s = (c + j) % STAGES
        mbarrier.wait(ready.index(s), ((c + j) // STAGES) & 1)
        qk = warpgroup_mma(q_smem, k_smem.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
        start = kv_lo + j * BLOCK_N
        if start + BLOCK_N > unmasked_end:
            keep = gl.expand_dims(cols, 0) < gl.expand_dims(lim - start, 1)
            qk = gl.where(keep, qk, float("-inf"))
        acc, m_i, l_i = softmax_pv(qk, m_i, l_i, acc, qk_scale, v_smem.index(s), empty.index(s), o_layout)
    return acc, m_i, l_i


@gluon.jit
def _meta(UNITS, w, total, r0, n_heads, n_units, UNIT_COLS: gl.constexpr):
    """Item w's (query head, this partition's rows, kv_lo, kv_hi, ctx, q0, first token, split, partial row);
    w is clamped into range (past the end: values never used)."""
    meta, head = _item(UNITS, gl.minimum(gl.maximum(w, 0), total - 1), n_heads, n_units, UNIT_COLS)
    prow = gl.load(meta + U_PROW)
    # rows <= 0: none (the tiles still consumed); split rows: this partition's, else the -1 sentinel
    return (head, gl.load(meta + U_QCOUNT) - r0, gl.load(meta + U_KVLO), gl.load(meta + U_KVHI),
            gl.load(meta + U_CTX), gl.load(meta + U_Q0) + r0, gl.load(meta + U_QSTART) + r0,
            gl.load(meta + U_SPLIT), prow + r0 * (prow >= 0).to(gl.int32))


@gluon.jit
def _compute(part, q_smem, k_smem, v_smem, q_ready, q_empty, item_ready, ready, empty, Out, PO, PL, UNITS, n_heads,
             n_units, qk_scale, stride_ot, stride_oh, stride_pos, stride_por, stride_poh, stride_pls, stride_plr,
             ROWS: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
             WARPS: gl.constexpr, UNIT_COLS: gl.constexpr, SCHED):
    """A compute partition (WARPS warps): rows part x ROWS .. of each item: its key loop, its share of the
    Q slot handed back, then its rows' store. Two partitions (Q_PARTS 2) hand each slot back with one
    arrival each and so run apart: one's softmax beside the other's MMAs. The next item's number (the
    loader's draw, told by the item barrier; -1: the end) and unit row are read before this item's store
    (their latency under it)."""
    pid = gl.program_id(0)
    total = n_heads * n_units
    r0 = part * ROWS
    c = 0
    it = 0
    mbarrier.wait(item_ready, 0)
    w = gl.load(SCHED + 1 + pid, volatile=True)
    head, q_count, kv_lo, kv_hi, ctx, q0, q_start, split, prow = _meta(UNITS, w, total, r0, n_heads, n_units,
                                                                      UNIT_COLS)
    while (w >= 0) & (w < total):
        n_tiles = gl.cdiv(kv_hi - kv_lo, BLOCK_N)
        mbarrier.wait(q_ready, it & 1)
        o, m_i, l_i = _key_loop(q_smem.index(part), k_smem, v_smem, ready, empty, c, q_count, ctx, q0, kv_lo, kv_hi,
                                n_tiles, qk_scale, ROWS, BLOCK_N, HEAD_DIM, STAGES, WARPS)
        gl.thread_barrier()  # (an item without tiles) every warp is past Q before it is handed back
        mbarrier.arrive(q_empty, count=1)
        c += n_tiles
        it += 1
        mbarrier.wait(item_ready, it & 1)
        w = gl.load(SCHED + 1 + pid, volatile=True)
        nxt = _meta(UNITS, w, total, r0, n_heads, n_units, UNIT_COLS)
        _store(o, m_i, l_i, Out, PO, PL, q_start, q_count, head, split, prow, stride_ot, stride_oh, stride_pos,
               stride_por, stride_poh, stride_pls, stride_plr, ROWS, HEAD_DIM, WARPS)
        head, q_count, kv_lo, kv_hi, ctx, q0, q_start, split, prow = nxt


@gluon.jit
def _store(o, m_i, l_i, Out, PO, PL, q_start, q_count, head, split, prow, stride_ot, stride_oh, stride_pos,
           stride_por, stride_poh, stride_pls, stride_plr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
           num_warps: gl.constexpr):
    """The normalized output rows, or a split row block's partial output and natural-log LSE."""
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = o / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(1, o.type.layout)), 1)
    o = gl.convert_layout(o, out_layout)
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, out_layout))
    ok = gl.expand_dims(offs_m < q_count, 1) & gl.expand_dims(offs_d < HEAD_DIM, 0)
    if prow < 0:
        tok = (q_start + offs_m).to(gl.int64)
        ptr = Out + gl.expand_dims(tok * stride_ot + head * stride_oh, 1) + gl.expand_dims(offs_d, 0)
        gl.store(ptr, o.to(Out.dtype.element_ty), mask=ok)
    else:
        prow_m = (prow + offs_m).to(gl.int64)
        po_ptr = PO + split * stride_pos + gl.expand_dims(prow_m * stride_por + head * stride_poh, 1) \
            + gl.expand_dims(offs_d, 0)
        gl.store(po_ptr, o.to(PO.dtype.element_ty), mask=ok)
        rows = gl.arange(0, BLOCK_M, layout=l_i.type.layout)
        lse = gl.where(l_i > 0.0, (m_i + gl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        gl.store(PL + split * stride_pls + (prow + rows).to(gl.int64) * stride_plr + head, lse, mask=rows < q_count)


@gluon.jit
def prefill_gluon_kernel(
    q_desc, k_desc, v_desc, Out, PO, PL, BT, UNITS, SCHED,
    stride_ot, stride_oh, stride_pos, stride_por, stride_poh, stride_pls, stride_plr, stride_bt,
    qk_scale, ROW_HEAD, COL_HEAD, n_heads, n_units,
    G: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE: gl.constexpr, ROW_PAGE: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, UNIT_COLS: gl.constexpr, Q_PARTS: gl.constexpr, COMPUTE_REGS: gl.constexpr,
):
    """Grid: (programs,), persistent: the loaders draw the ``n_heads * n_units`` work items (unit, query
    head) from the counter SCHED[0] (left at 0 for the next launch).
    A unit's BLOCK_M rows are Q_PARTS compute partitions of q_desc's rows (a multiple of 64: 16 per warp)."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    WARPS: gl.constexpr = ROWS // 16
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [Q_PARTS] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    item_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_empty, count=Q_PARTS)  # one arrival per compute partition
    mbarrier.init(item_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=Q_PARTS)
    # the loader is the default partition (num_warps 4, one thread issuing), the math Q_PARTS workers of
    # WARPS warps with their own register budget (setmaxnreg COMPUTE_REGS)
    gl.warp_specialize([
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, item_ready, ready, empty, UNITS,
                   BT, stride_bt, n_heads, n_units, ROW_HEAD, COL_HEAD, G, HEAD_DIM, ROW_PAGE, PAGE, BLOCK_N, STAGES,
                   UNIT_COLS, Q_PARTS, SCHED)),
        (_compute, (0, q_smem, k_smem, v_smem, q_ready, q_empty, item_ready, ready, empty, Out, PO, PL, UNITS,
                    n_heads, n_units, qk_scale, stride_ot, stride_oh, stride_pos, stride_por, stride_poh, stride_pls,
                    stride_plr, ROWS, BLOCK_N, HEAD_DIM, STAGES, WARPS, UNIT_COLS, SCHED)),
        (_compute, (Q_PARTS - 1, q_smem, k_smem, v_smem, q_ready, q_empty, item_ready, ready, empty, Out, PO, PL,
                    UNITS, n_heads, n_units, qk_scale, stride_ot, stride_oh, stride_pos, stride_por, stride_poh,
                    stride_pls, stride_plr, ROWS, BLOCK_N, HEAD_DIM, STAGES, WARPS, UNIT_COLS, SCHED)),
    ][:Q_PARTS + 1], [WARPS] * Q_PARTS, [COMPUTE_REGS] * Q_PARTS)
