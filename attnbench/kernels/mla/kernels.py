"""Triton kernels of the MLA path (absorbed form, docs/semantics.md "MLA"): every request kind
of a batch in one launch, read straight from the paged latent cache.

A program owns one *unit*: ``BLOCK_M`` consecutive rows of one request, where the rows of a
request are its (query token, head) pairs in token-major order (row r = token r // H, head
r % H), which is also their order in the flattened ``q [N * H, D]``. All of a unit's rows
read the one latent head, so each latent tile of ``BLOCK_N`` keys is read once for
``BLOCK_M`` rows (16 heads of a TP-8 shard: all heads of up to BLOCK_M / 16 tokens at once;
128 heads: BLOCK_M of one token's heads). A tile's latent rows are loaded as ``c_kv``
(``D_NOPE`` dims) and ``k_rope`` (``D_ROPE``); scores are ``q_nope . c_kv + q_rope . k_rope``
and the values are the same ``c_kv`` tile, so the cache is read once for K and V.

Long key ranges are split (split-K): a unit then covers ``[k0, k1)`` of its rows' keys and
writes a normalized partial output and its base-2 LSE; ``mla_merge_kernel`` combines a row's
splits. Keys before the request's context end are visible to every row; the tail is masked
causally (prefill, decode) or by per-token ancestor bitmasks (trees), decided per tile only
when the tile reaches the tail; a bidirectional prefill (``causal: false``, column 7 = 2, kernels
built with ``BIDIR``) sees every key of its request.

``NCH`` 2 (off by default: ``mla/plan.choose_config``'s ``value_chunks``) gives a unit two
adjacent programs, each computing the whole scores and accumulating half the value dims (half
the accumulator: 128-row units fit 8 warps); ``TAIL_STAGES`` 1 keeps the masked tail loop out
of the software pipeline (its shared buffers).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

#: columns of the unit table: request, first row, rows, first key, key end, split (-1: none),
#: first partial row, kind (0 causal, 1 tree, 2 bidirectional prefill)
UNIT_COLS = 8


@triton.jit
def mla_attention_kernel(
    Q, KV, OUT, PO, PL, BT, UNITS, CTX, QSTART, ANC,
    stride_q, stride_kv_page, stride_kv_tok, stride_o, stride_bt,
    stride_po_s, stride_po_r, stride_pl_s, stride_anc,
    qk_scale,
    H: tl.constexpr, D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_TREE: tl.constexpr, UNIT_COLS: tl.constexpr,
    IEEE: tl.constexpr, BIDIR: tl.constexpr = False, NCH: tl.constexpr = 1, TAIL_STAGES: tl.constexpr = None,
):
    # NCH value chunks (1 or 2): program pid takes unit pid // NCH and value dims
    # [dv0, dv0 + DV) of it; the NCH programs of a unit are adjacent (they read the same tiles)
    DV: tl.constexpr = D_NOPE // NCH
    pid = tl.program_id(0)
    ub = UNITS + (pid // NCH) * UNIT_COLS
    dv0 = (pid % NCH) * DV
    dvo = D_NOPE - DV - dv0  # NCH == 2: the other half (its score part only)
    b = tl.load(ub)
    row0 = tl.load(ub + 1)
    nrows = tl.load(ub + 2)
    k0 = tl.load(ub + 3)
    k1 = tl.load(ub + 4)
    split = tl.load(ub + 5)
    prow0 = tl.load(ub + 6)
    is_tree = tl.load(ub + 7)  # the unit's kind: 0 causal, 1 tree, 2 bidirectional
    ctx = tl.load(CTX + b)
    qs = tl.load(QSTART + b)

    offs_m = tl.arange(0, BLOCK_M)
    rmask = offs_m < nrows
    rows = row0 + offs_m
    grow = (qs * H + rows).to(tl.int64)  # row of the flattened q / out
    tok = rows // H  # query token within the request
    offs_c = tl.arange(0, DV)
    offs_r = tl.arange(0, D_ROPE)
    q_n = tl.load(Q + grow[:, None] * stride_q + dv0 + offs_c[None, :], mask=rmask[:, None], other=0.0)
    if NCH == 2:
        q_o = tl.load(Q + grow[:, None] * stride_q + dvo + offs_c[None, :], mask=rmask[:, None], other=0.0)
    else:
        q_o = q_n  # unused
    q_r = tl.load(Q + grow[:, None] * stride_q + D_NOPE + offs_r[None, :], mask=rmask[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV], tl.float32)
    bt_row = BT + b.to(tl.int64) * stride_bt
    # Tiles wholly inside the context are visible to every row: no mask, no bounds (k0 and the
    # split chunks are multiples of BLOCK_N). The rest (the new tokens) is masked per tile.
    mid = k0 + (tl.maximum(tl.minimum(k1, ctx) - k0, 0) // BLOCK_N) * BLOCK_N
    for start in range(k0, mid, BLOCK_N):
        m_i, l_i, acc = _tile(q_n, q_o, q_r, m_i, l_i, acc, KV, bt_row, ANC, start, k1, ctx, qs, tok, rmask, is_tree,
                              stride_kv_page, stride_kv_tok, stride_anc, qk_scale, dv0, dvo,
                              D_NOPE, D_ROPE, PAGE, BLOCK_N, False, HAS_TREE, IEEE, BIDIR, NCH)
    # TAIL_STAGES (None: the launch's num_stages): 1 keeps the masked tail's tiles out of the
    # software pipeline (its own shared buffers; a decode's or tree's tail is one or two tiles)
    for start in tl.range(mid, k1, BLOCK_N, num_stages=TAIL_STAGES):
        m_i, l_i, acc = _tile(q_n, q_o, q_r, m_i, l_i, acc, KV, bt_row, ANC, start, k1, ctx, qs, tok, rmask, is_tree,
                              stride_kv_page, stride_kv_tok, stride_anc, qk_scale, dv0, dvo,
                              D_NOPE, D_ROPE, PAGE, BLOCK_N, True, HAS_TREE, IEEE, BIDIR, NCH)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if split < 0:
        tl.store(OUT + grow[:, None] * stride_o + dv0 + offs_c[None, :], o.to(OUT.dtype.element_ty),
                 mask=rmask[:, None])
    else:
        prow = (prow0 + offs_m).to(tl.int64)
        tl.store(PO + split * stride_po_s + prow[:, None] * stride_po_r + dv0 + offs_c[None, :],
                 o.to(PO.dtype.element_ty), mask=rmask[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        # the value programs' LSEs are equal: the first stores it (scalar broadcast by hand, as BIDIR's)
        tl.store(PL + split * stride_pl_s + prow, lse, mask=rmask & ((offs_m * 0 + dv0) == 0))


@triton.jit
def mla_merge_kernel(
    PO, PL, OUT, MERGE,
    stride_po_s, stride_po_r, stride_pl_s, stride_o,
    D_NOPE: tl.constexpr, SPLITS: tl.constexpr,
):
    """One program per split row: ``MERGE[r] = (output row, splits)``; the partials are
    weighted by ``2 ** (lse - max lse)`` (base-2 LSEs of the scaled scores)."""
    r = tl.program_id(0)
    orow = tl.load(MERGE + r * 2).to(tl.int64)
    ns = tl.load(MERGE + r * 2 + 1)
    offs_s = tl.arange(0, SPLITS)
    smask = offs_s < ns
    lse = tl.load(PL + offs_s * stride_pl_s + r, mask=smask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    denom = tl.sum(tl.where(smask, tl.exp2(lse - m), 0.0), 0)
    offs_c = tl.arange(0, D_NOPE)
    acc = tl.zeros([D_NOPE], tl.float32)
    for s in range(0, ns):  # one split's row at a time: D_NOPE values in registers, not SPLITS x D_NOPE
        w = tl.exp2(tl.load(PL + s * stride_pl_s + r) - m)
        acc += w * tl.load(PO + s * stride_po_s + r.to(tl.int64) * stride_po_r + offs_c).to(tl.float32)
    tl.store(OUT + orow * stride_o + offs_c, (acc / denom).to(OUT.dtype.element_ty))


@triton.jit
def _tile(q_n, q_o, q_r, m_i, l_i, acc, KV, bt_row, ANC, start, k1, ctx, qs, tok, rmask, is_tree,
          stride_kv_page, stride_kv_tok, stride_anc, qk_scale, dv0, dvo,
          D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
          MASKED: tl.constexpr, HAS_TREE: tl.constexpr, IEEE: tl.constexpr, BIDIR: tl.constexpr,
          NCH: tl.constexpr = 1):
    """One tile of BLOCK_N keys from ``start``: scores over the latent row, online softmax,
    values = the tile's c_kv (NCH == 2: the scores take both halves of c_kv, the values only
    the program's half ``dv0``). MASKED: bounds (k1) and the causal / tree rule apply."""
    DV: tl.constexpr = D_NOPE // NCH
    offs_n = tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, DV)
    offs_r = tl.arange(0, D_ROPE)
    keys = start + offs_n
    if MASKED:
        kmask = keys < k1
        page = tl.load(bt_row + keys // PAGE, mask=kmask, other=0)
    else:
        page = tl.load(bt_row + keys // PAGE)
    base = page.to(tl.int64) * stride_kv_page + (keys % PAGE).to(tl.int64) * stride_kv_tok
    if MASKED:
        c_kv = tl.load(KV + base[:, None] + dv0 + offs_c[None, :], mask=kmask[:, None], other=0.0)
        k_pe = tl.load(KV + base[:, None] + D_NOPE + offs_r[None, :], mask=kmask[:, None], other=0.0)
    else:
        c_kv = tl.load(KV + base[:, None] + dv0 + offs_c[None, :])
        k_pe = tl.load(KV + base[:, None] + D_NOPE + offs_r[None, :])
    if IEEE:  # float32: full-precision products (the default on a GPU is TF32, 10-bit mantissas:
        # rel. err 1.1e-3 against float32's 1e-4 tolerance on mla-tiny, H100)
        s = tl.dot(q_n, tl.trans(c_kv), input_precision="ieee")
        s += tl.dot(q_r, tl.trans(k_pe), input_precision="ieee")
    else:
        s = tl.dot(q_n, tl.trans(c_kv))
        s += tl.dot(q_r, tl.trans(k_pe))
    if NCH == 2:  # the other half's score part
        if MASKED:
            c_o = tl.load(KV + base[:, None] + dvo + offs_c[None, :], mask=kmask[:, None], other=0.0)
        else:
            c_o = tl.load(KV + base[:, None] + dvo + offs_c[None, :])
        if IEEE:
            s += tl.dot(q_o, tl.trans(c_o), input_precision="ieee")
        else:
            s += tl.dot(q_o, tl.trans(c_o))
    s = s * qk_scale
    if MASKED:
        before = keys[None, :] <= ctx + tok[:, None]
        if BIDIR:  # a bidirectional prefill's rows see every key (the scalar broadcast by hand:
            # the interpreter rejects tensor | scalar-bool)
            before = before | ((tok * 0 + is_tree) == 2)[:, None]
        vis = rmask[:, None] & kmask[None, :] & before
        if HAS_TREE:
            rel = keys[None, :] - ctx
            relc = tl.maximum(rel, 0)
            word = tl.load(ANC + (qs + tok)[:, None].to(tl.int64) * stride_anc + relc // 64,
                           mask=rmask[:, None] & kmask[None, :] & (rel >= 0), other=0)
            anc_ok = (rel < 0) | (((word >> (relc % 64).to(tl.int64)) & 1) != 0)
            tree_vis = rmask[:, None] & kmask[None, :] & anc_ok
            vis = tl.where(is_tree == 1, tree_vis, vis)
        s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        pv = tl.dot(p.to(c_kv.dtype), c_kv, input_precision="ieee")
    else:
        pv = tl.dot(p.to(c_kv.dtype), c_kv)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc
