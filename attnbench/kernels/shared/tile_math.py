"""The arithmetic of one key tile in the triton backend's kernel (paged/kernels.py): the scores, the online softmax
and the P V product, for 16-bit and FP8 caches (V, and with ``K_WORDS`` K, read as int16 words of two FP8 dims:
shared/fp8_words.py)."""
from __future__ import annotations

import triton
import triton.language as tl

from attnbench.kernels.shared.fp8_words import split_words


@triton.jit
def tanh(x):
    # tanh(x) = 1 - 2 / (exp(2x) + 1): exp2 overflowing to inf gives 1, underflowing to 0 gives -1
    return 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    return tl.dot(a, b, input_precision="ieee" if IEEE else None)


@triton.jit
def scores(q, k, qk_scale, bias, cap, IEEE: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
           KV_A: tl.constexpr = 0, q2=None, k2=None):
    """Base-2 scores of one tile: log2(e) (softcap(q.k scale) + ALiBi). ``qk_scale`` = scale
    log2(e) (times the FP8 K scale), ``cap`` = c log2(e) (c tanh(x / c) scales linearly),
    ``bias`` = slope log2(e) (key position - query position), [BLOCK_M, keys]. ``k2`` (K's words): ``q``, ``k``
    the even dims, ``q2``, ``k2`` the odd ones, two half-width dots into one S."""
    if (KV_A & 1) != 0:  # S^T = K Q^T: K (converted in registers) the A operand, Q^T the B one
        s = tl.trans(dot(k, tl.trans(q), IEEE))
    else:
        s = dot(q, tl.trans(k), IEEE)
    if k2 is not None:
        s = tl.dot(q2, tl.trans(k2), s)
    s = s * qk_scale
    if SOFTCAP:
        s = cap * tanh(s * (1.0 / cap))
    if ALIBI:
        s = s + bias
    return s


@triton.jit
def online_softmax(s, v, m_i, l_i, acc, allowed, MASKED: tl.constexpr, IEEE: tl.constexpr, v2=None,
                   V_WORDS: tl.constexpr = False, KV_A: tl.constexpr = 0):
    if MASKED:
        s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        # a row that has seen no key yet keeps m = -inf: subtract 0 instead (exp2(-inf) = 0)
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_sub = m_new
    p = tl.math.exp2(s - m_sub[:, None])
    alpha = tl.math.exp2(m_i - m_sub)
    l_i = l_i * alpha + tl.sum(p, 1)
    if (KV_A & 2) != 0:  # O^T = V^T P^T: V (converted in registers) the A operand, P^T the B one
        pv = tl.trans(dot(tl.trans(v), tl.trans(p.to(v.dtype)), IEEE))
    else:
        pv = dot(p.to(v.dtype), v, IEEE)
    if V_WORDS:  # v: the even dims, v2: the odd ones; interleaved back (in-thread join)
        pv2 = dot(p.to(v2.dtype), v2, IEEE)
        pv = tl.reshape(tl.join(pv, pv2), [pv.shape[0], 2 * pv.shape[1]])
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def softmax_step(q, k, v, m_i, l_i, acc, qk_scale, allowed, bias, cap, MASKED: tl.constexpr, IEEE: tl.constexpr,
                 SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, FP8: tl.constexpr, V_PAIRS: tl.constexpr,
                 V_WORDS: tl.constexpr = False, KV_A: tl.constexpr = 0, K_WORDS: tl.constexpr = False, q2=None,
                 F8: tl.constexpr = None):
    """One key tile: scores, online softmax, P V. ``V_WORDS``: V as int16 words of two FP8 dims (the low bytes
    the even dims, the high ones the odd), split here; ``K_WORDS``: K too (its FP8 dtype ``F8``), against q's
    even dims (``q``) and odd ones (``q2``): K's and V's tiles then share one load layout."""
    v2 = None
    k2 = None
    if K_WORDS:
        k, k2 = split_words(k, F8, q, V_WORDS == 2)
        v, v2 = split_words(v, F8, q, V_WORDS == 2)
    elif V_WORDS:
        v, v2 = split_words(v, k.dtype, q, V_WORDS == 2)
    if FP8:  # dequantize: the scales are folded into qk_scale (K) and the output (V)
        k = k.to(q.dtype)
        v = v.to(q.dtype)
        if V_PAIRS:  # identity split/join: V converted in its load layout, transposed as 16-bit
            lo, hi = tl.split(tl.reshape(v, [v.shape[0], v.shape[1] // 2, 2]))
            v = tl.reshape(tl.join(lo, hi), [v.shape[0], v.shape[1]])
    s = scores(q, k, qk_scale, bias, cap, IEEE, SOFTCAP, ALIBI, KV_A, q2, k2)
    return online_softmax(s, v, m_i, l_i, acc, allowed, MASKED, IEEE, v2, V_WORDS, KV_A)
