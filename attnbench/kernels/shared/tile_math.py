"""The arithmetic of one key tile in the paged route's kernel (paged/kernels.py): the scores, the online softmax
and the P V product, for 16-bit and FP8 caches (V read as int16 words of two FP8 dims on decode configs:
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
def scores(q, k, qk_scale, bias, cap, IEEE: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """Base-2 scores of one tile: log2(e) (softcap(q.k scale) + ALiBi). ``qk_scale`` = scale
    log2(e) (times the FP8 K scale), ``cap`` = c log2(e) (c tanh(x / c) scales linearly),
    ``bias`` = slope log2(e) (key position - query position), [BLOCK_M, keys]."""
    s = dot(q, tl.trans(k), IEEE)
    s = s * qk_scale
    if SOFTCAP:
        s = cap * tanh(s * (1.0 / cap))
    if ALIBI:
        s = s + bias
    return s


@triton.jit
def online_softmax(s, v, m_i, l_i, acc, allowed, MASKED: tl.constexpr, IEEE: tl.constexpr, v2=None,
                   V_WORDS: tl.constexpr = False):
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
    pv = dot(p.to(v.dtype), v, IEEE)
    if V_WORDS:  # v: the even dims, v2: the odd ones; interleaved back (in-thread join)
        pv2 = dot(p.to(v2.dtype), v2, IEEE)
        pv = tl.reshape(tl.join(pv, pv2), [pv.shape[0], 2 * pv.shape[1]])
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def softmax_step(q, k, v, m_i, l_i, acc, qk_scale, allowed, bias, cap, MASKED: tl.constexpr, IEEE: tl.constexpr,
                 SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, FP8: tl.constexpr, V_WORDS: tl.constexpr = False):
    """One key tile: scores, online softmax, P V. ``V_WORDS``: V as int16 words of two FP8 dims (the low bytes
    the even dims, the high ones the odd), split here."""
    v2 = None
    if V_WORDS:
        v, v2 = split_words(v, k.dtype, q, V_WORDS == 2)
    if FP8:  # dequantize: the scales are folded into qk_scale (K) and the output (V)
        k = k.to(q.dtype)
        v = v.to(q.dtype)
    s = scores(q, k, qk_scale, bias, cap, IEEE, SOFTCAP, ALIBI)
    return online_softmax(s, v, m_i, l_i, acc, allowed, MASKED, IEEE, v2, V_WORDS)
