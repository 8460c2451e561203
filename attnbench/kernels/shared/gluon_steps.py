"""The online-softmax step shared by the Gluon kernels (prefill/gluon_kernels.py, tree/gluon_kernels.py).

After a tile's S = Q K^T (and its mask): the running max and sum (base 2), P = exp2(S - max) in the
V slot's 16-bit dtype, O rescaled and O += P V as a warpgroup MMA, then the slot handed back to the
loader (one arrival a partition, after every warp's MMAs on it are done).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait


@gluon.jit
def softmax_p(qk, m_i, l_i, acc, qk_scale, p_ty: gl.constexpr, o_layout: gl.constexpr):
    """A tile's softmax (``qk``: the raw scores, masked keys -inf): returns (P as the P V MMA's A operand in
    ``p_ty``, O rescaled, m, l)."""
    m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
    m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
    p = gl.exp2(qk * qk_scale - gl.expand_dims(m_sub, 1))
    alpha = gl.exp2(m_i - m_sub)
    l_i = l_i * alpha + gl.sum(p, 1)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    pa = gl.convert_layout(p.to(p_ty), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    return pa, acc, m_new, l_i


@gluon.jit
def softmax_pv(qk, m_i, l_i, acc, qk_scale, v_tile, empty_bar, o_layout: gl.constexpr):
    """One tile's softmax and P V, then the slot handed back; returns (O, m, l)."""
    pa, acc, m_new, l_i = softmax_p(qk, m_i, l_i, acc, qk_scale, v_tile.dtype, o_layout)
    acc = warpgroup_mma(pa, v_tile, acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    gl.thread_barrier()  # every warp's MMAs on the slot are done before it is handed back
    mbarrier.arrive(empty_bar, count=1)
    return acc, m_new, l_i
