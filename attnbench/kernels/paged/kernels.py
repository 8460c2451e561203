"""Triton kernels of the ``triton`` backend: paged + tree attention with split-KV, and the merge.

``paged_attention_kernel``: one program per (unit, KV head); a unit is a block of query tokens
of one request and a range of key tiles (shared/plan.py). The M side of every ``tl.dot`` is
``G`` query heads x ``BLOCK_Q`` tokens (row m = token m // G, head m % G), so K/V are read once
per KV head, through the block table (slot j: page ``block_table[req, j // PAGE]``, offset
``j % PAGE``; any page size, a tile may span pages).

Key tiles below ``full_end`` are visible to every row of the unit and run without a mask, in
steps of ``BLOCK_NF`` keys (>= ``BLOCK_N``, the masked loop's step); the remaining tiles (the
causal diagonal, or a tree's own nodes) apply the mask: prefill/decode ``j <= ctx + i``; tree
``j < ctx`` or bit ``j - ctx`` of the row's ancestor bitmask (int64 words, ``ANC[token, w]``).

Softmax runs in base 2 (scores scaled by ``scale * log2(e)``). A unit whose row block is not
split writes the output directly; a split one writes a float32 partial output and its natural-
log LSE (``-inf`` when the row saw no key in that split); kernels/merge.py's ``merge_kernel`` merges
them in a second launch. The grid is (units, KV heads).
Variants, each a constexpr flag (off: the plain kernel, unchanged): ``FP8`` K/V converted to q's
dtype after the load, the program's K scale folded into ``qk_scale`` and its V scale into the
output (options: ``FP8_F16`` both dots in float16, set by the host for FP8 caches with 16-bit
queries; ``V_WORDS`` (decode configs) V read as int16 words of two FP8 dims and P.V as two half-width dots
joined back, 2: each word converted by one cvt.rn.f16x2, shared/fp8_words.py; the kernel notes in git history (triton_notes.md), issue 33's
FP8 rounds); ``SINK``: split 0
starts from the sink (m = sink, l = 1, no value), so output, LSE and the split merge count it
once; ``SOFTCAP``/``ALIBI`` on the scores; ``WINDOW``: a masked lead-in over the tiles below
every row's window (``full_lo``), slots below ``win_lo`` never read; ``BIDIR``: bidirectional
prefill rows; ``POSITIONS``: query positions (and a tree key's position: its node's) for the
window and ALiBi; ``PAD_D``: a head dim below ``BLOCK_D`` (96 in 128 lanes), the extra lanes
masked on every load and store.

``INTERPRETED``: kernels built for the CPU interpreter (TRITON_INTERPRET=1 at import).
"""
from __future__ import annotations

import triton
import triton.language as tl

try:  # triton >= 3.2 has knobs; fall back to the environment for older versions
    INTERPRETED = bool(triton.knobs.runtime.interpret)
except AttributeError:  # pragma: no cover
    import os

    INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

from attnbench.kernels.shared.plan import UNIT_COLUMNS
from attnbench.kernels.shared.tile_math import softmax_step

# the unit table's column offsets, named by the plan that writes them (one source of truth)
(C_REQ, C_QSTART, C_QCOUNT, C_CTX, C_KVLO, C_KVHI, C_FULL, C_SPLIT, C_PROW, C_TREE, C_Q0, C_NSPLIT, C_BLOCK,
 C_FULLLO, C_BIDIR, C_WINLO) = (
    tl.constexpr(UNIT_COLUMNS.index(name)) for name in (
        "req", "q_start", "q_count", "ctx", "kv_lo", "kv_hi", "full_end", "split", "prow", "tree", "q0",
        "nsplit", "block", "full_lo", "bidir", "win_lo",
    )
)


@triton.jit
def _tile_offsets(bt_row, start, offs_n, limit, stride_kp, stride_ks, stride_vp, stride_vs,
                  PAGE: tl.constexpr, TILE_IN_PAGE: tl.constexpr):
    """Element offsets of the K and V rows of key slots start .. start + BLOCK_N - 1 (slots at
    or past ``limit`` read page 0: their block-table entries may not exist)."""
    slots = start + offs_n
    if TILE_IN_PAGE:  # the tile lies inside one page: one block-table read
        page = tl.load(bt_row + start // PAGE, mask=start < limit, other=0).to(tl.int64)
    else:  # one page id per key slot: any page size, a tile may span pages
        page = tl.load(bt_row + slots // PAGE, mask=slots < limit, other=0).to(tl.int64)
    within = (slots % PAGE).to(tl.int64)
    return page * stride_kp + within * stride_ks, page * stride_vp + within * stride_vs


@triton.jit
def _load_rows(base, offs, offs_d, mask, HEAD_DIM: tl.constexpr, PAD_D: tl.constexpr, ROW_MASK: tl.constexpr):
    """``[rows, BLOCK_D]`` elements at ``base + offs[:, None] + d``; rows where ``mask`` ([rows]
    bool, read only with ROW_MASK) is False and, with ``PAD_D``, the lanes at or past HEAD_DIM
    (a head dim padded to a power of two, e.g. 96 -> 128) read 0."""
    ptrs = base + offs[:, None] + offs_d[None, :]
    if ROW_MASK:
        if PAD_D:
            x = tl.load(ptrs, mask=mask[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=mask[:, None], other=0.0)
    else:
        if PAD_D:
            x = tl.load(ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _load_v(base, offs, offs_d, mask, HEAD_DIM: tl.constexpr, PAD_D: tl.constexpr, ROW_MASK: tl.constexpr,
            V_WORDS: tl.constexpr):
    """V's rows: ``_load_rows``, or with ``V_WORDS`` (``base`` an int16 pointer, ``offs`` in words)
    ``[rows, BLOCK_D / 2]`` int16 words, each two FP8 dims (2w, 2w + 1)."""
    if V_WORDS:
        x = _load_rows(base, offs, tl.arange(0, offs_d.shape[0] // 2), mask, HEAD_DIM // 2, PAD_D, ROW_MASK)
    else:
        x = _load_rows(base, offs, offs_d, mask, HEAD_DIM, PAD_D, ROW_MASK)
    return x


@triton.jit
def _masked_tile(start, q, m_i, l_i, acc, k_base, v_base, bt_row, ANC, QPOS,
                 kv_lo, kv_hi, ctx, q0, qi, tok, row_ok, is_tree, bidir, req_tok0, qpos, slope2,
                 HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, qk_scale, cap, window,
                 stride_kp, stride_ks, stride_vp, stride_vs, stride_anc, offs_n, offs_d, HAS_TREE: tl.constexpr,
                 IEEE: tl.constexpr, PAD_D: tl.constexpr, FP8: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                 WINDOW: tl.constexpr, BIDIR: tl.constexpr, POSITIONS: tl.constexpr, V_WORDS: tl.constexpr):
    """One key tile with the mask: causal (or every key of a bidirectional prefill), tree,
    sliding window, the split's end. ``kv_lo``: with a window, slots below it are not read."""
    slots = start + offs_n
    in_range = slots < kv_hi
    if WINDOW:
        in_range = in_range & (slots >= kv_lo)
    page = tl.load(bt_row + slots // PAGE, mask=in_range, other=0).to(tl.int64)
    within = slots % PAGE
    k = _load_v(k_base, page * stride_kp + within * stride_ks, offs_d, in_range, HEAD_DIM, PAD_D, True, False)
    v = _load_v(v_base, page * stride_vp + within * stride_vs, offs_d, in_range, HEAD_DIM, PAD_D, True, V_WORDS)
    allowed = slots[None, :] <= (ctx + q0 + qi)[:, None]
    if BIDIR:  # (scalar conditions broadcast by hand: the interpreter rejects tensor | scalar-bool)
        allowed = allowed | ((qi * 0 + bidir) != 0)[:, None]
    kpos = slots
    if HAS_TREE:
        # tree keys of this tile: rel = slot - ctx; a BLOCK_N <= 64 tile spans at most two
        # 64-node words of a row's ancestor mask: read those two words per row, not one per key
        rel = slots - ctx
        w0 = tl.maximum(start - ctx, 0) // 64
        w0v = qi * 0 + w0
        rows_t = row_ok & ((qi * 0 + is_tree) != 0)
        wa = tl.load(ANC + tok * stride_anc + w0v, mask=rows_t & (w0v < stride_anc), other=0)
        wb = tl.load(ANC + tok * stride_anc + w0v + 1, mask=rows_t & (w0v + 1 < stride_anc), other=0)
        relc = tl.maximum(rel, 0)
        word = tl.where((relc // 64 == w0)[None, :], wa[:, None], wb[:, None])
        bit = ((word >> (relc % 64).to(tl.int64)[None, :]) & 1) != 0
        tree_ok = (rel < 0)[None, :] | bit
        allowed = tl.where(is_tree != 0, tree_ok, allowed)
        if POSITIONS:  # a tree node's key sits at position ctx + its depth, not at its slot
            keys_t = (rel >= 0) & in_range & ((offs_n * 0 + is_tree) != 0)
            kpos = tl.load(QPOS + req_tok0 + rel, mask=keys_t, other=0)
            kpos = tl.where(keys_t, kpos, slots)
    if WINDOW:
        allowed = allowed & (kpos[None, :] > (qpos - window)[:, None])
    # padding rows see every key in range (finite, never stored)
    allowed = (allowed | (~row_ok)[:, None]) & in_range[None, :]
    bias = None
    if ALIBI:
        bias = slope2[:, None] * (kpos[None, :] - qpos[:, None]).to(tl.float32)
    return softmax_step(q, k, v, m_i, l_i, acc, qk_scale, allowed, bias, cap, True, IEEE, SOFTCAP, ALIBI, FP8,
                        V_WORDS)


@triton.jit
def paged_attention_kernel(
    Q, K, V, Out, PO, PL, BT, UNITS, ANC, QPOS, SINKS, SLOPES, KSC, VSC,
    stride_qt, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_ot, stride_oh,
    stride_pos, stride_por, stride_poh,
    stride_pls, stride_plr,
    stride_bt, stride_anc, stride_scale,
    qk_scale, cap, window,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NF: tl.constexpr,
    UNIT_COLS: tl.constexpr, HAS_TREE: tl.constexpr, IEEE: tl.constexpr, TILE_IN_PAGE: tl.constexpr,
    BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, FP8: tl.constexpr, SINK: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, WINDOW: tl.constexpr, BIDIR: tl.constexpr, POSITIONS: tl.constexpr,
    FP8_F16: tl.constexpr = False, V_WORDS: tl.constexpr = False,
):
    unit = tl.program_id(0)
    kvh = tl.program_id(1)
    meta = UNITS + unit * UNIT_COLS
    req = tl.load(meta + C_REQ)
    q_start = tl.load(meta + C_QSTART)
    q_count = tl.load(meta + C_QCOUNT)
    ctx = tl.load(meta + C_CTX)
    kv_lo = tl.load(meta + C_KVLO)
    kv_hi = tl.load(meta + C_KVHI)
    full_end = tl.load(meta + C_FULL)
    split = tl.load(meta + C_SPLIT)
    prow = tl.load(meta + C_PROW)
    is_tree = tl.load(meta + C_TREE)
    q0 = tl.load(meta + C_Q0)  # index of the block's first token within its request

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    offs_nf = tl.arange(0, BLOCK_NF)
    qi = offs_m // G
    head = kvh * G + offs_m % G
    row_ok = (qi < q_count) & (offs_m < BLOCK_Q * G)
    tok = (q_start + qi).to(tl.int64)
    q = _load_rows(Q, tok * stride_qt + head * stride_qh, offs_d, row_ok, HEAD_DIM, PAD_D, True)
    if FP8_F16:  # both dots in float16: FP8 -> f16 is one cvt per 2 elements (bf16: 2 more each)
        q = q.to(tl.float16)

    if SINK:  # the sink is a key without a value: split 0 starts from it (m = sink, l = 1), so
        # the output, the LSE and the split merge count it exactly once
        sink2 = tl.load(SINKS + head, mask=row_ok, other=0.0) * 1.4426950408889634
        first_split = (qi * 0 + split) == 0
        m_i = tl.where(first_split, sink2, float("-inf"))
        l_i = tl.where(first_split, 1.0, 0.0)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bt_row = BT + req.to(tl.int64) * stride_bt
    k_base = K + kvh * stride_kh
    v_base = V + kvh * stride_vh
    if V_WORDS:  # V read as int16 words of two FP8 dims (16-bit transposed loads), offsets in words
        v_base = v_base.to(tl.pointer_type(tl.int16))
        stride_vp = stride_vp // 2
        stride_vs = stride_vs // 2
    if FP8:  # one K/V scale per program (per tensor, or this program's KV head)
        qk_scale = qk_scale * tl.load(KSC + kvh * stride_scale)
    qpos = qi
    slope2 = None
    req_tok0 = q_start - q0  # packed index of the request's first query token
    if POSITIONS:
        qpos = tl.load(QPOS + tok, mask=row_ok, other=0)
    if ALIBI:
        slope2 = tl.load(SLOPES + head, mask=row_ok, other=0.0) * 1.4426950408889634
    bidir = 0
    if BIDIR:
        bidir = tl.load(meta + C_BIDIR)

    first = kv_lo
    if WINDOW:
        # 0) tiles reaching below some row's window (from full_lo on, keys are in every row's
        # window): masked, from kv_lo (the window's tile); the unmasked loop resumes on a BLOCK_NF one
        full_lo = tl.load(meta + C_FULLLO)
        win_lo = tl.load(meta + C_WINLO)  # the row block's first key (kv_lo: its tile)
        first = tl.minimum(kv_hi, tl.maximum(kv_lo, ((full_lo + BLOCK_NF - 1) // BLOCK_NF) * BLOCK_NF))
        for start in range(kv_lo, first, BLOCK_N):
            m_i, l_i, acc = _masked_tile(
                start, q, m_i, l_i, acc, k_base, v_base, bt_row, ANC, QPOS,
                win_lo, kv_hi, ctx, q0, qi, tok, row_ok, is_tree, bidir, req_tok0, qpos, slope2, HEAD_DIM, PAGE,
                qk_scale, cap, window, stride_kp, stride_ks, stride_vp, stride_vs, stride_anc, offs_n, offs_d,
                HAS_TREE, IEEE, PAD_D, FP8, SOFTCAP, ALIBI, WINDOW, BIDIR, POSITIONS, V_WORDS)

    # 1) tiles every row sees in full, BLOCK_NF keys each: no mask. Tile i+1's block-table read is
    # issued in iteration i (loop-carried offsets), so the pipeliner can prefetch K/V stages
    # ahead; the masked loop below picks up at ``mid`` in BLOCK_N steps.
    mid = tl.maximum(first + ((tl.minimum(kv_hi, full_end) - first) // BLOCK_NF) * BLOCK_NF, first)
    koff_n, voff_n = _tile_offsets(bt_row, first, offs_nf, kv_hi, stride_kp, stride_ks, stride_vp, stride_vs,
                                   PAGE, TILE_IN_PAGE)
    for start in range(first, mid, BLOCK_NF):
        koff = koff_n
        voff = voff_n
        koff_n, voff_n = _tile_offsets(bt_row, start + BLOCK_NF, offs_nf, kv_hi, stride_kp, stride_ks, stride_vp,
                                       stride_vs, PAGE, TILE_IN_PAGE)
        k = _load_v(k_base, koff, offs_d, None, HEAD_DIM, PAD_D, False, False)
        v = _load_v(v_base, voff, offs_d, None, HEAD_DIM, PAD_D, False, V_WORDS)
        bias = None
        if ALIBI:
            bias = slope2[:, None] * (start + offs_nf - qpos[:, None]).to(tl.float32)
        m_i, l_i, acc = softmax_step(q, k, v, m_i, l_i, acc, qk_scale, None, bias, cap, False, IEEE, SOFTCAP, ALIBI,
                                     FP8, V_WORDS)

    # 2) tiles on the causal diagonal / holding tree nodes / past the split's end: masked
    for start in range(mid, kv_hi, BLOCK_N):
        m_i, l_i, acc = _masked_tile(
            start, q, m_i, l_i, acc, k_base, v_base, bt_row, ANC, QPOS,
            kv_lo, kv_hi, ctx, q0, qi, tok, row_ok, is_tree, bidir, req_tok0, qpos, slope2, HEAD_DIM, PAGE,
            qk_scale, cap, window, stride_kp, stride_ks, stride_vp, stride_vs, stride_anc, offs_n, offs_d,
            HAS_TREE, IEEE, PAD_D, FP8, SOFTCAP, ALIBI, WINDOW, BIDIR, POSITIONS, V_WORDS)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    if FP8:
        o = acc * (tl.load(VSC + kvh * stride_scale) / l_safe)[:, None]
    else:
        o = acc / l_safe[:, None]
    if PAD_D:  # the padded lanes are never stored
        row_d = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    else:
        row_d = row_ok[:, None]
    if prow < 0:
        tl.store(Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 o.to(Out.dtype.element_ty), mask=row_d)
    else:
        prow_m = (prow + qi).to(tl.int64)
        tl.store(PO + split * stride_pos + prow_m[:, None] * stride_por + head[:, None] * stride_poh
                 + offs_d[None, :], o.to(PO.dtype.element_ty), mask=row_d)
        lse = tl.where(l_i > 0.0, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        tl.store(PL + split * stride_pls + prow_m * stride_plr + head, lse, mask=row_ok)
