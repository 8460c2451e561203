"""A paged decode kernel written in Gluon for Hopper (issue 33, decode round 1; the kernel notes in git history (triton_notes.md)): the
``decode="gluon"`` option of the triton backend (decode/gluon.py says which batches take it).

The shipped Triton kernel reads FP8 decodes at 73% of their byte floor at pages of 16 keys and 80% at 64 or more
(H200): at page 16 each key of a tile looks its page up in the block table and builds its own 64-bit address,
for K's layout and again for V's (thirteenth session, SASS and TTGIR), and Triton's layouts give no way to read
a page's entry once for its keys. Here the keys come by TMA, one box a page (shared/gluon_pages.py), so a tile's block-table
reads are NB entries in one load, a tile ahead, and no key has an address of its own.

One program per work item (a unit of the plan: one request's decode token and one split of its keys; times the
KV heads), 4 warps, no warp specialization (a decode's tile is little compute: the latency is hidden by several
programs an SM, as the shipped kernel's is):

- a ring of ``STAGES`` slots of ``BLOCK_N``-key K and V tiles (64, or the launch's ``TILES`` for the head dim) in
  the cache's dtype, filled by TMA, each with its barrier;
  tile j + STAGES is issued into tile j's slot once every warp has read it (its pages loaded a tile before); with
  ``COPY`` (a layout: the launch's choice for small pages of some head dims) by cp.async instead, one group a tile
  (shared/gluon_pages.copy_tile), its threads' pieces made visible by a CTA barrier;
- the G query heads of the KV head are the rows of an Ampere-style MMA (``mma_v2``: 16 rows, G of them used), q
  in registers; K and V read from shared memory straight into the MMA's operand layouts and, from an FP8 cache,
  converted there to float16 (the KV head's K scale folded into ``qk_scale``, its V scale into the output);
- the online softmax in base 2; every key at or past the unit's ``kv_hi`` masked (the last tile's; a box past the
  request's last page reads that page again: its keys must hold finite values, as attnbench's caches do);
- ``WINDOW``: keys below the unit's ``win_lo`` masked too (the plan starts the unit on the tile holding it);
  ``SINK``: split 0's softmax starts from the head's sink; ``SOFTCAP``: c tanh(s / c) on the scores;
- a split unit writes its partial output and natural-log LSE for merge.py's kernel (shared/gluon_epilogue.store).

A loader warp issuing the boxes (``gl.warp_specialize``) ran 1.2-1.45x this kernel's time (sixteenth session,
the kernel notes in git history (triton_notes.md)) and was removed.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from attnbench.kernels.shared.gluon_pages import copy_tile, issue_tile, row_pages, tile_pages
from attnbench.kernels.shared.gluon_epilogue import store
from attnbench.kernels.shared.fp8_words import CVT_E4M3, CVT_E5M2
from attnbench.kernels.shared.plan import UNIT_COLUMNS

(U_REQ, U_QSTART, U_KVLO, U_KVHI, U_SPLIT, U_PROW, U_WINLO) = (
    gl.constexpr(UNIT_COLUMNS.index(name)) for name in ("req", "q_start", "kv_lo", "kv_hi", "split", "prow", "win_lo"))
ROWS = gl.constexpr(16)  # the MMA's rows: the G query heads of a KV head (G <= 16)


@gluon.jit
def _load_q(Q, q_start, kvh, stride_qt, stride_qh, dot_ty: gl.constexpr, q_layout: gl.constexpr, G: gl.constexpr,
            DIMS: gl.constexpr, STEP: gl.constexpr, FIRST: gl.constexpr):
    """The token's G heads of KV head ``kvh`` as the MMA's A operand (rows past G zero) in ``dot_ty``: dims FIRST,
    FIRST + STEP, ... (DIMS of them: all, or the even or odd ones of the FP8 words)."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8 // STEP], [4, 8], [4, 1], [1, 0])
    m = gl.arange(0, ROWS, layout=gl.SliceLayout(1, ld))
    d = gl.arange(0, DIMS, layout=gl.SliceLayout(0, ld))
    ptr = Q + q_start.to(gl.int64) * stride_qt + gl.expand_dims((kvh * G + m) * stride_qh, 1) \
        + gl.expand_dims(d * STEP + FIRST, 0)
    ok = gl.expand_dims(m < G, 1) & gl.expand_dims(d < DIMS, 0)
    return gl.convert_layout(gl.load(ptr, mask=ok, other=0.0).to(dot_ty), q_layout)


@gluon.jit
def _split_words(w, E5M2: gl.constexpr):
    """int16 words of two FP8 values (an even dim in the low byte, the next odd one in the high) as two float16
    tensors (low, high): one PTX cvt a word (triton_fp8_words' CVT)."""
    if E5M2:
        lo, hi = gl.inline_asm_elementwise(CVT_E5M2, "=h,=h,h", [w], dtype=(gl.float16, gl.float16), is_pure=True,
                                           pack=1)
    else:
        lo, hi = gl.inline_asm_elementwise(CVT_E4M3, "=h,=h,h", [w], dtype=(gl.float16, gl.float16), is_pure=True,
                                           pack=1)
    return lo, hi


@gluon.jit
def _softcap(qk, qk_scale, cap):
    """cap tanh(qk qk_scale / cap), tanh(x) = 1 - 2 / (exp(2x) + 1) (triton_tile_math.tanh's form)."""
    return cap * (1.0 - 2.0 / (gl.exp2(qk * (qk_scale / cap) * 2.8853900817779268) + 1.0))


@gluon.jit
def _softmax(qk, m_i, l_i, qk_scale, start, win_lo, kv_hi, cap, BLOCK_N: gl.constexpr, WINDOW: gl.constexpr,
             SOFTCAP: gl.constexpr):
    """A tile's online softmax (base 2), keys at or past ``kv_hi`` (and with WINDOW below ``win_lo``) masked, the
    scores soft-capped with SOFTCAP: (P, the rescale alpha, m, l)."""
    cols = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, qk.type.layout))
    if SOFTCAP:
        qk = _softcap(qk, qk_scale, cap)
        qk_scale = 1.0
    ok = cols < kv_hi
    if WINDOW:
        ok = ok & (cols >= win_lo)
    qk = gl.where(gl.expand_dims(ok, 0), qk, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
    m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)  # (a row that has seen no key yet)
    p = gl.exp2(qk * qk_scale - gl.expand_dims(m_sub, 1))
    alpha = gl.exp2(m_i - m_sub)
    return p, gl.expand_dims(alpha, 1), m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _tile16(j, qa, k_smem, v_smem, ready, acc, m_i, l_i, qk_scale, start, win_lo, kv_hi, cap, mma: gl.constexpr,
            BLOCK_N: gl.constexpr, STAGES: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr,
            COPY: gl.constexpr):
    """Ring tile j of a 16-bit cache: S = Q K^T, the softmax, O += P V (every warp has read the slot when this
    returns: the caller's barrier hands it back)."""
    s = j % STAGES
    _wait(ready, j, STAGES, COPY)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    kt = k_smem.index(s).permute((1, 0)).load(b_op)
    v = v_smem.index(s).load(b_op)
    qk = mma_v2(qa, kt, gl.zeros([ROWS, BLOCK_N], gl.float32, layout=mma))
    p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, qk_scale, start, win_lo, kv_hi, cap, BLOCK_N, WINDOW, SOFTCAP)
    pa = gl.convert_layout(p.to(v.dtype), gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2))
    return mma_v2(pa, v, acc * alpha), m_i, l_i


@gluon.jit
def _tile8(j, q_lo, q_hi, k_smem, v_smem, ready, acc_lo, acc_hi, m_i, l_i, qk_scale, start, win_lo, kv_hi, cap,
           mma: gl.constexpr, word_layout: gl.constexpr, E5M2: gl.constexpr, BLOCK_N: gl.constexpr,
           STAGES: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, COPY: gl.constexpr):
    """Ring tile j of an FP8 cache, read as int16 words of two dims (ldmatrix, as 16-bit tiles are) and split by
    one cvt a word: S = Q_even K_even^T + Q_odd K_odd^T, the softmax, O_even += P V_even and O_odd += P V_odd."""
    s = j % STAGES
    _wait(ready, j, STAGES, COPY)
    HW: gl.constexpr = k_smem.shape[2] // 2
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    kw = k_smem.index(s)._reinterpret(gl.int16, [BLOCK_N, HW], word_layout).permute((1, 0)).load(b_op)
    vw = v_smem.index(s)._reinterpret(gl.int16, [BLOCK_N, HW], word_layout).load(b_op)
    k_lo, k_hi = _split_words(kw, E5M2)
    qk = mma_v2(q_lo, k_lo, gl.zeros([ROWS, BLOCK_N], gl.float32, layout=mma))
    qk = mma_v2(q_hi, k_hi, qk)
    p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, qk_scale, start, win_lo, kv_hi, cap, BLOCK_N, WINDOW, SOFTCAP)
    pa = gl.convert_layout(p.to(gl.float16), gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2))
    v_lo, v_hi = _split_words(vw, E5M2)
    return mma_v2(pa, v_lo, acc_lo * alpha), mma_v2(pa, v_hi, acc_hi * alpha), m_i, l_i


@gluon.jit
def _wait(ready, j, STAGES: gl.constexpr, COPY: gl.constexpr):
    """Until ring tile j is in its slot, for every warp: its barrier, or with COPY its cp.async group (the tiles
    after it may be in flight) and a CTA barrier (each thread waits for its own copies only)."""
    if COPY is not None:
        async_copy.wait_group(STAGES - 1)
        gl.thread_barrier()
    else:
        mbarrier.wait(ready.index(j % STAGES), (j // STAGES) & 1)


@gluon.jit
def _init(bars, STAGES: gl.constexpr):
    """STAGES barriers of one arrival each."""
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)


@gluon.jit
def _ring(k_desc, v_desc, K2, V2, stride_row, k_smem, v_smem, ready, bt_row, kv_lo, n, last, kvh, ROW_HEAD, COL_HEAD,
          PAGE: gl.constexpr, ROW_PAGE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, COPY: gl.constexpr):
    """The ring's barriers, and its first STAGES tiles issued (with COPY, each tile a cp.async group)."""
    BOX: gl.constexpr = k_desc.block_type.shape[0]
    _init(ready, STAGES)
    for j in gl.static_range(STAGES):
        start = kv_lo + j * BLOCK_N
        if COPY is not None:
            if j < n:
                copy_tile(K2, V2, k_smem.index(j), v_smem.index(j), start, row_pages(bt_row, start, last, PAGE,
                          BLOCK_N, COPY), kvh, stride_row, ROW_HEAD, COL_HEAD, PAGE, ROW_PAGE, COPY)
            async_copy.commit_group()  # (empty past the unit's tiles: every tile is one group)
        elif j < n:
            issue_tile(k_desc, v_desc, k_smem.index(j), v_smem.index(j), ready.index(j), start,
                       tile_pages(bt_row, start, last, PAGE, BOX, BLOCK_N // BOX), kvh, ROW_HEAD, COL_HEAD, PAGE,
                       ROW_PAGE, BLOCK_N)


@gluon.jit
def _refill(j, n, k_desc, v_desc, K2, V2, stride_row, k_smem, v_smem, ready, start, pages, kvh, ROW_HEAD, COL_HEAD,
            PAGE: gl.constexpr, ROW_PAGE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
            COPY: gl.constexpr):
    """Tile j + STAGES into tile j's slot, once every warp has read it (the reads ordered before the TMA's writes;
    with COPY by cp.async, one group a tile, empty past the unit's tiles)."""
    if COPY is not None:
        gl.thread_barrier()
        if j + STAGES < n:
            copy_tile(K2, V2, k_smem.index(j % STAGES), v_smem.index(j % STAGES), start + STAGES * BLOCK_N, pages, kvh,
                      stride_row, ROW_HEAD, COL_HEAD, PAGE, ROW_PAGE, COPY)
        async_copy.commit_group()
    elif j + STAGES < n:
        fence_async_shared()
        gl.thread_barrier()
        s = j % STAGES
        issue_tile(k_desc, v_desc, k_smem.index(s), v_smem.index(s), ready.index(s), start + STAGES * BLOCK_N, pages,
                   kvh, ROW_HEAD, COL_HEAD, PAGE, ROW_PAGE, BLOCK_N)


@gluon.jit
def _pages(bt_row, start, last, PAGE: gl.constexpr, BOX: gl.constexpr, BLOCK_N: gl.constexpr, COPY: gl.constexpr):
    """The block-table entries the tile from ``start`` is issued with: a box's each, or with COPY a key row's each."""
    if COPY is not None:
        pages = row_pages(bt_row, start, last, PAGE, BLOCK_N, COPY)
    else:
        pages = tile_pages(bt_row, start, last, PAGE, BOX, BLOCK_N // BOX)
    return pages


MMA = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8]))


@gluon.jit
def _fp8_keys(k_desc, v_desc, K2, V2, stride_row, k_smem, v_smem, ready, Q, KSC, VSC, q_start, kvh, kv_lo, win_lo,
              kv_hi, n, last, bt_row, m_i, l_i, cap, stride_qt, stride_qh, stride_sc, qk_scale, ROW_HEAD, COL_HEAD,
              G: gl.constexpr, PAGE: gl.constexpr, ROW_PAGE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              E5M2: gl.constexpr, WORD_LAYOUT: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr,
              COPY: gl.constexpr):
    """The unit's key tiles from an FP8 cache (``_tile8``, the ring refilled behind them): (O with the V scale, m,
    l); q's even and odd dims as float16, the K scale folded into ``qk_scale``."""
    HW: gl.constexpr = k_smem.shape[2] // 2
    BOX: gl.constexpr = k_desc.block_type.shape[0]
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    q_lo = _load_q(Q, q_start, kvh, stride_qt, stride_qh, gl.float16, a_op, G, HW, 2, 0)
    q_hi = _load_q(Q, q_start, kvh, stride_qt, stride_qh, gl.float16, a_op, G, HW, 2, 1)
    qk_scale = qk_scale * gl.load(KSC + kvh * stride_sc)
    acc_lo = gl.zeros([ROWS, HW], gl.float32, layout=MMA)
    acc_hi = gl.zeros([ROWS, HW], gl.float32, layout=MMA)
    nxt = _pages(bt_row, kv_lo + STAGES * BLOCK_N, last, PAGE, BOX, BLOCK_N, COPY)
    for j in range(n):
        start = kv_lo + j * BLOCK_N
        pages = nxt
        nxt = _pages(bt_row, start + (STAGES + 1) * BLOCK_N, last, PAGE, BOX, BLOCK_N, COPY)  # the next's
        acc_lo, acc_hi, m_i, l_i = _tile8(j, q_lo, q_hi, k_smem, v_smem, ready, acc_lo, acc_hi, m_i, l_i, qk_scale,
                                          start, win_lo, kv_hi, cap, MMA, WORD_LAYOUT, E5M2, BLOCK_N, STAGES, WINDOW,
                                          SOFTCAP, COPY)
        _refill(j, n, k_desc, v_desc, K2, V2, stride_row, k_smem, v_smem, ready, start, pages, kvh, ROW_HEAD, COL_HEAD,
                PAGE, ROW_PAGE, BLOCK_N, STAGES, COPY)
    acc = gl.reshape(gl.join(acc_lo, acc_hi), [ROWS, 2 * HW])  # the dims back in order: even, odd, ...
    return acc * gl.load(VSC + kvh * stride_sc), m_i, l_i


@gluon.jit
def _half_keys(k_desc, v_desc, K2, V2, stride_row, k_smem, v_smem, ready, Q, q_start, kvh, kv_lo, win_lo, kv_hi, n,
               last, bt_row, m_i, l_i, cap, stride_qt, stride_qh, qk_scale, ROW_HEAD, COL_HEAD, G: gl.constexpr,
               PAGE: gl.constexpr, ROW_PAGE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
               WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, COPY: gl.constexpr):
    """The unit's key tiles from a 16-bit cache (``_tile16``, the ring refilled behind them): (O, m, l)."""
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    BOX: gl.constexpr = k_desc.block_type.shape[0]
    qa = _load_q(Q, q_start, kvh, stride_qt, stride_qh, k_desc.dtype,
                 gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2), G, HEAD_DIM, 1, 0)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=MMA)
    nxt = _pages(bt_row, kv_lo + STAGES * BLOCK_N, last, PAGE, BOX, BLOCK_N, COPY)
    for j in range(n):
        start = kv_lo + j * BLOCK_N
        pages = nxt
        nxt = _pages(bt_row, start + (STAGES + 1) * BLOCK_N, last, PAGE, BOX, BLOCK_N, COPY)  # the next's
        acc, m_i, l_i = _tile16(j, qa, k_smem, v_smem, ready, acc, m_i, l_i, qk_scale, start, win_lo, kv_hi, cap,
                                MMA, BLOCK_N, STAGES, WINDOW, SOFTCAP, COPY)
        _refill(j, n, k_desc, v_desc, K2, V2, stride_row, k_smem, v_smem, ready, start, pages, kvh, ROW_HEAD, COL_HEAD,
                PAGE, ROW_PAGE, BLOCK_N, STAGES, COPY)
    return acc, m_i, l_i


@gluon.jit
def _start(SINKS, kvh, split, G: gl.constexpr, SINK: gl.constexpr):
    """The online softmax's first (m, l): with SINK, split 0 starts from the head's sink (a key without a value:
    m = sink log2(e), l = 1), so the output, the LSE and the split merge count it once; else (-inf, 0)."""
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, MMA))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, MMA))
    l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, MMA))
    if SINK:
        first = (rows < G) & (split == 0)
        m_i = gl.where(first, gl.load(SINKS + kvh * G + rows, mask=rows < G, other=0.0) * 1.4426950408889634, m_i)
        l_i = gl.where(first, 1.0, l_i)
    return m_i, l_i


@gluon.jit
def decode_gluon_kernel(
    k_desc, v_desc, K2, V2, Q, Out, PO, PL, BT, UNITS, KSC, VSC, SINKS,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_pos, stride_por, stride_poh, stride_pls, stride_plr,
    stride_bt, stride_sc, stride_row, qk_scale, cap, ROW_HEAD, COL_HEAD, n_kv,
    G: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE: gl.constexpr, ROW_PAGE: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, UNIT_COLS: gl.constexpr, FP8: gl.constexpr, E5M2: gl.constexpr,
    WORD_LAYOUT: gl.constexpr, WINDOW: gl.constexpr, SINK: gl.constexpr, SOFTCAP: gl.constexpr,
    COPY: gl.constexpr = None,
):
    """Grid: (units x KV heads,), unit-major. The ring holds the cache's dtype in the descriptors' layout; FP8
    tiles are read through WORD_LAYOUT (the same bytes as [BLOCK_N, HEAD_DIM / 2] int16 words) and their MMAs run
    in float16, 16-bit tiles' in their own dtype. Variants: ``WINDOW`` keys below the unit's ``win_lo`` masked (the
    plan starts the unit on the tile holding it), ``SINK`` (``_start``), ``SOFTCAP`` (``cap`` = c log2(e))."""
    w = gl.program_id(0)
    meta = UNITS + (w // n_kv) * UNIT_COLS
    kvh = w % n_kv
    q_start = gl.load(meta + U_QSTART)
    kv_lo = gl.load(meta + U_KVLO)
    kv_hi = gl.load(meta + U_KVHI)
    win_lo = gl.load(meta + U_WINLO) if WINDOW else 0
    bt_row = BT + gl.load(meta + U_REQ).to(gl.int64) * stride_bt
    prow, split = gl.load(meta + U_PROW), gl.load(meta + U_SPLIT)
    last = (kv_hi - 1) // PAGE  # the request's last page holding a key of the unit
    n = gl.cdiv(kv_hi - kv_lo, BLOCK_N)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    _ring(k_desc, v_desc, K2, V2, stride_row, k_smem, v_smem, ready, bt_row, kv_lo, n, last, kvh, ROW_HEAD, COL_HEAD,
          PAGE, ROW_PAGE, BLOCK_N, STAGES, COPY)
    m_i, l_i = _start(SINKS, kvh, split, G, SINK)
    if FP8:
        acc, m_i, l_i = _fp8_keys(k_desc, v_desc, K2, V2, stride_row, k_smem, v_smem, ready, Q, KSC, VSC, q_start, kvh,
                                  kv_lo, win_lo, kv_hi, n, last, bt_row, m_i, l_i, cap, stride_qt, stride_qh, stride_sc,
                                  qk_scale, ROW_HEAD, COL_HEAD, G, PAGE, ROW_PAGE, BLOCK_N, STAGES, E5M2, WORD_LAYOUT,
                                  WINDOW, SOFTCAP, COPY)
    else:
        acc, m_i, l_i = _half_keys(k_desc, v_desc, K2, V2, stride_row, k_smem, v_smem, ready, Q, q_start, kvh, kv_lo,
                                   win_lo, kv_hi, n, last, bt_row, m_i, l_i, cap, stride_qt, stride_qh, qk_scale,
                                   ROW_HEAD, COL_HEAD, G, PAGE, ROW_PAGE, BLOCK_N, STAGES, WINDOW, SOFTCAP, COPY)
    store(acc, m_i, l_i, Out, PO, PL, prow, split, q_start, 0, 1, kvh, stride_ot, stride_oh, stride_pos,
          stride_por, stride_poh, stride_pls, stride_plr, G, ROWS, HEAD_DIM)
