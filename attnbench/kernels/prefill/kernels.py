"""The prefill kernel of the ``triton`` backend (issue 33, prefill round 1; the kernel notes in git history (triton_notes.md)).

``prefill_attention_kernel`` is ``paged/kernels.paged_attention_kernel`` reduced to what a
causal prefill, chunked prefill or decode batch needs (no tree, no FP8, window, sink,
soft-cap, ALiBi, bidirectional rows or padded head dim: ``prefill/launch.applies`` sends
other batches to the shipped kernel), and differs from it in:

- ``LEAN`` (a constexpr; off: the shipped kernel's addressing): the unmasked loop's K/V
  addresses from loop-invariant int32 offsets within a tile (row ``j`` at
  ``(j % PAGE) * stride + d``) plus one int64 page base per tile (a tile inside one page) or
  per row (a tile spanning pages), instead of int64 row offsets rebuilt per tile; the next
  tile's block-table entries still read one iteration ahead. Offline (sm_90, triton 3.6) the
  shipped loop spends ~1 in 4 of its instructions on address math.
- the row maximum taken on the raw scores and the score scale folded into the exponent's one
  FMA (``exp2(qk * scale - m)``): no separate multiply per score.
- programs run in reverse unit order, so each request's longest causal row blocks start
  first and the shortest ones fill the tail of the launch.

Units, masks, split partials and the merge are the shipped kernel's (shared/plan.py); the
unit table's columns are read by the plan's names.
"""
from __future__ import annotations

import triton
import triton.language as tl

from attnbench.kernels.shared.plan import UNIT_COLUMNS

(P_REQ, P_QSTART, P_QCOUNT, P_CTX, P_KVLO, P_KVHI, P_FULL, P_SPLIT, P_PROW, P_Q0) = (
    tl.constexpr(UNIT_COLUMNS.index(name)) for name in (
        "req", "q_start", "q_count", "ctx", "kv_lo", "kv_hi", "full_end", "split", "prow", "q0"))


@triton.jit
def _step(q, k, v, m_i, l_i, acc, qk_scale, allowed, MASKED: tl.constexpr, IEEE: tl.constexpr):
    """One key tile of the online softmax in base 2 (``qk_scale`` = scale log2(e)), the scale folded
    into the exponent's FMA."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    if MASKED:
        s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # max of the raw scores (the scale is positive), scaled once
    if MASKED:  # a row that has seen no key yet keeps m = -inf: subtract 0 (exp2(-inf) = 0)
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_sub = m_new
    p = tl.math.exp2(s * qk_scale - m_sub[:, None])
    alpha = tl.math.exp2(m_i - m_sub)
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _pages(bt_row, start, offs, limit, PAGE: tl.constexpr, ONE_PAGE: tl.constexpr):
    """The block-table entries of a tile: one (scalar) when it lies in one page, else one per
    key slot (``limit``: slots at or past it read page 0, their entries may not exist)."""
    if ONE_PAGE:
        page = tl.load(bt_row + start // PAGE, mask=start < limit, other=0)
    else:
        slots = start + offs
        page = tl.load(bt_row + slots // PAGE, mask=slots < limit, other=0)
    return page


@triton.jit
def _offsets(bt_row, start, offs, limit, stride_kp, stride_ks, stride_vp, stride_vs, PAGE: tl.constexpr,
             ONE_PAGE: tl.constexpr):
    """int64 element offsets of a tile's K and V rows (the shipped kernel's ``_tile_offsets``)."""
    page = _pages(bt_row, start, offs, limit, PAGE, ONE_PAGE).to(tl.int64)
    within = ((start + offs) % PAGE).to(tl.int64)
    return page * stride_kp + within * stride_ks, page * stride_vp + within * stride_vs


@triton.jit
def _unit(UNITS, UNIT_COLS: tl.constexpr):
    """This program's unit row (grid axis 0): req, q_start, q_count, ctx, kv_lo, kv_hi, full_end,
    split, prow, q0. Units are ordered request, split, row block; read reversed, the long rows go
    first."""
    unit = tl.num_programs(0) - 1 - tl.program_id(0)
    meta = UNITS + unit * UNIT_COLS
    return (tl.load(meta + P_REQ), tl.load(meta + P_QSTART), tl.load(meta + P_QCOUNT), tl.load(meta + P_CTX),
            tl.load(meta + P_KVLO), tl.load(meta + P_KVHI), tl.load(meta + P_FULL), tl.load(meta + P_SPLIT),
            tl.load(meta + P_PROW), tl.load(meta + P_Q0))


@triton.jit
def prefill_attention_kernel(
    Q, K, V, Out, PO, PL, BT, UNITS,
    stride_qt, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_ot, stride_oh,
    stride_pos, stride_por, stride_poh,
    stride_pls, stride_plr,
    stride_bt,
    qk_scale,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NF: tl.constexpr,
    UNIT_COLS: tl.constexpr, IEEE: tl.constexpr, TILE_IN_PAGE: tl.constexpr,
    LEAN: tl.constexpr,
):
    kvh = tl.program_id(1)
    req, q_start, q_count, ctx, kv_lo, kv_hi, full_end, split, prow, q0 = _unit(UNITS, UNIT_COLS)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    offs_nf = tl.arange(0, BLOCK_NF)
    qi = offs_m // G
    head = kvh * G + offs_m % G
    row_ok = (qi < q_count) & (offs_m < BLOCK_Q * G)
    tok = (q_start + qi).to(tl.int64)
    q = tl.load(Q + (tok * stride_qt + head * stride_qh)[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    bt_row = BT + req.to(tl.int64) * stride_bt
    k_base = K + kvh * stride_kh
    v_base = V + kvh * stride_vh

    # 1) key tiles every row sees: no mask, BLOCK_NF keys each; tile i+1's block-table entries
    # are read in iteration i (loop-carried), so the pipeliner can prefetch K/V stages ahead
    mid = tl.maximum(kv_lo + ((tl.minimum(kv_hi, full_end) - kv_lo) // BLOCK_NF) * BLOCK_NF, kv_lo)
    if LEAN:
        # kv_lo is a multiple of BLOCK_NF: with PAGE | BLOCK_NF a tile starts on a page, with
        # BLOCK_NF | PAGE it lies in one, so a row's offset within its page is loop-invariant
        if TILE_IN_PAGE:
            k_in = offs_nf[:, None] * stride_ks + offs_d[None, :]
            v_in = offs_nf[:, None] * stride_vs + offs_d[None, :]
        else:
            k_in = (offs_nf % PAGE)[:, None] * stride_ks + offs_d[None, :]
            v_in = (offs_nf % PAGE)[:, None] * stride_vs + offs_d[None, :]
        page_n = _pages(bt_row, kv_lo, offs_nf, kv_hi, PAGE, TILE_IN_PAGE)
        for start in range(kv_lo, mid, BLOCK_NF):
            page = page_n.to(tl.int64)
            page_n = _pages(bt_row, start + BLOCK_NF, offs_nf, kv_hi, PAGE, TILE_IN_PAGE)
            if TILE_IN_PAGE:
                k = tl.load(k_base + (page * stride_kp + (start % PAGE) * stride_ks) + k_in)
                v = tl.load(v_base + (page * stride_vp + (start % PAGE) * stride_vs) + v_in)
            else:
                k = tl.load(k_base + (page * stride_kp)[:, None] + k_in)
                v = tl.load(v_base + (page * stride_vp)[:, None] + v_in)
            m_i, l_i, acc = _step(q, k, v, m_i, l_i, acc, qk_scale, None, False, IEEE)
    else:  # the shipped kernel's addressing: int64 row offsets, computed a tile ahead
        koff_n, voff_n = _offsets(bt_row, kv_lo, offs_nf, kv_hi, stride_kp, stride_ks, stride_vp, stride_vs,
                                  PAGE, TILE_IN_PAGE)
        for start in range(kv_lo, mid, BLOCK_NF):
            koff = koff_n
            voff = voff_n
            koff_n, voff_n = _offsets(bt_row, start + BLOCK_NF, offs_nf, kv_hi, stride_kp, stride_ks, stride_vp,
                                      stride_vs, PAGE, TILE_IN_PAGE)
            k = tl.load(k_base + koff[:, None] + offs_d[None, :])
            v = tl.load(v_base + voff[:, None] + offs_d[None, :])
            m_i, l_i, acc = _step(q, k, v, m_i, l_i, acc, qk_scale, None, False, IEEE)

    # 2) the causal diagonal and the split's end: masked, BLOCK_N keys each
    for start in range(mid, kv_hi, BLOCK_N):
        slots = start + offs_n
        in_range = slots < kv_hi
        page = tl.load(bt_row + slots // PAGE, mask=in_range, other=0).to(tl.int64)
        within = (slots % PAGE).to(tl.int64)
        koff = page * stride_kp + within * stride_ks
        voff = page * stride_vp + within * stride_vs
        k = tl.load(k_base + koff[:, None] + offs_d[None, :], mask=in_range[:, None], other=0.0)
        v = tl.load(v_base + voff[:, None] + offs_d[None, :], mask=in_range[:, None], other=0.0)
        allowed = slots[None, :] <= (ctx + q0 + qi)[:, None]
        # padding rows see every key in range (finite, never stored)
        allowed = (allowed | (~row_ok)[:, None]) & in_range[None, :]
        m_i, l_i, acc = _step(q, k, v, m_i, l_i, acc, qk_scale, allowed, True, IEEE)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if prow < 0:
        tl.store(Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 o.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:  # a split row block: partial output and natural-log LSE (triton_kernels.merge_kernel merges)
        prow_m = (prow + qi).to(tl.int64)
        tl.store(PO + split * stride_pos + prow_m[:, None] * stride_por + head[:, None] * stride_poh
                 + offs_d[None, :], o.to(PO.dtype.element_ty), mask=row_ok[:, None])
        lse = tl.where(l_i > 0.0, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        tl.store(PL + split * stride_pls + prow_m * stride_plr + head, lse, mask=row_ok)
