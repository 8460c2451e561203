"""The Gluon tree kernel's epilogue (tree/gluon_kernels.py): a compute partition's rows written out, normalized,
or as a split unit's partial output and natural-log LSE for merge.py's kernel.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


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
