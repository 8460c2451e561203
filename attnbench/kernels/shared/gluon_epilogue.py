"""The Gluon tree kernel's epilogue (tree/gluon_kernels.py): a compute partition's rows written out, normalized,
or as a split unit's partial output and natural-log LSE for merge.py's kernel; with ``FUSED_MERGE``, the
last split of a (row block, KV head) merging them in the same launch (``merge_rows``).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from attnbench.kernels.shared.plan import UNIT_COLUMNS

U_QSTART, U_PROW, U_NSPLIT, U_BLOCK = (
    gl.constexpr(UNIT_COLUMNS.index(name)) for name in ("q_start", "prow", "nsplit", "block"))


@gluon.jit
def store(o, m_i, l_i, Out, PO, PL, prow, split, q_start, part, q_count, kvh, stride_ot, stride_oh, stride_pos,
          stride_por, stride_poh, stride_pls, stride_plr, G: gl.constexpr, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
    """The normalized output rows, or a split unit's partial output and natural-log LSE (the unit's ``prow``,
    ``split`` and ``q_start`` loaded with its other columns at the partition's start: no load on the way out)."""
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = o / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(1, o.type.layout)), 1)
    o = gl.convert_layout(o, out_layout)
    m_o = part * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, out_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, out_layout))
    t = m_o // G
    head = kvh * G + m_o % G
    ok = gl.expand_dims(t < q_count, 1) & gl.expand_dims(offs_d < HEAD_DIM, 0)
    if prow < 0:
        tok = (q_start + t).to(gl.int64)
        ptr = Out + gl.expand_dims(tok * stride_ot + head * stride_oh, 1) + gl.expand_dims(offs_d, 0)
        gl.store(ptr, o.to(Out.dtype.element_ty), mask=ok)
    else:
        prow_m = (prow + t).to(gl.int64)
        po_ptr = PO + split * stride_pos + gl.expand_dims(prow_m * stride_por + head * stride_poh, 1) \
            + gl.expand_dims(offs_d, 0)
        gl.store(po_ptr, o.to(PO.dtype.element_ty), mask=ok)
        m_l = part * ROWS + gl.arange(0, ROWS, layout=l_i.type.layout)
        lse = gl.where(l_i > 0.0, (m_i + gl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        gl.store(PL + split * stride_pls + (prow + m_l // G).to(gl.int64) * stride_plr + kvh * G + m_l % G, lse,
                 mask=m_l // G < q_count)


@gluon.jit
def merge_rows(meta, part, q_count, kvh, Out, PO, PL, SEM, stride_sem, stride_ot, stride_oh, stride_pos, stride_por,
                stride_poh, stride_pls, stride_plr, G: gl.constexpr, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
    """The fused merge of a split unit's rows: each partition counts its arrivals in its own byte of the
    (row block, KV head) word, and the last split's partition to store its partials merges them (read
    past L1) into the output, then takes its count back out (the word returns to 0 for the next launch)."""
    nsplit = gl.load(meta + U_NSPLIT)
    sem = SEM + gl.load(meta + U_BLOCK) * stride_sem + kvh
    gl.thread_barrier()  # every warp's partials stored before the release
    old = gl.atomic_add(sem, 1 << (8 * part), sem="acq_rel")
    if ((old >> (8 * part)) & 255) == nsplit - 1:
        gl.thread_barrier()
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        m_o = part * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
        t = m_o // G
        head = kvh * G + m_o % G
        row_ok = t < q_count
        prow_m = (gl.load(meta + U_PROW) + t).to(gl.int64)
        ok = gl.expand_dims(row_ok, 1) & gl.expand_dims(offs_d < HEAD_DIM, 0)
        m_all = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, layout))
        w_sum = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, layout))
        o_sum = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=layout)
        for sp in range(nsplit):
            lse = gl.load(PL + sp * stride_pls + prow_m * stride_plr + head, mask=row_ok, other=float("-inf"),
                          cache_modifier=".cg")
            o_s = gl.load(PO + sp * stride_pos + gl.expand_dims(prow_m * stride_por + head * stride_poh, 1)
                          + gl.expand_dims(offs_d, 0), mask=ok, other=0.0, cache_modifier=".cg").to(gl.float32)
            m_new = gl.maximum(m_all, lse)
            m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
            scale_old = gl.exp(m_all - m_sub)
            w = gl.exp(lse - m_sub)
            w_sum = w_sum * scale_old + w
            o_sum = o_sum * gl.expand_dims(scale_old, 1) + gl.expand_dims(w, 1) * o_s
            m_all = m_new
        w_sum = gl.where(w_sum > 0.0, w_sum, 1.0)
        tok = (gl.load(meta + U_QSTART) + t).to(gl.int64)
        gl.store(Out + gl.expand_dims(tok * stride_ot + head * stride_oh, 1) + gl.expand_dims(offs_d, 0),
                 (o_sum / gl.expand_dims(w_sum, 1)).to(Out.dtype.element_ty), mask=ok)
        gl.atomic_add(sem, -(nsplit << (8 * part)))
