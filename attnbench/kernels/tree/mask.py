"""The Gluon tree kernel's mask of a key tile (tree/gluon_kernels.py), worked out as one 64-bit word a row.

A key tile is 64 keys, so a row's mask of it fits one 64-bit word: ``row_bits`` works that word out once a
row (bit c: key ``start + c`` allowed), and ``keep`` reads each score's bit from the word's 32-bit half its
column lies in (element by element, each of a partition's 64 x 64 scores would take its ancestor word, a
64-bit shift and four compares: ~900 instructions a thread a masked tile on sm_90). The keys a row sees (the reference's): a tree row the context and the nodes of its ancestor
bitmask (``ANC``: bit k of word w for node 64 w + k, the node itself included), any other row the keys up
to its own position, a padding row every key; every row only the keys below the unit's ``kv_hi``.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _low(n):
    """int64 words with bits 0 .. n - 1 set (n clipped to 0 .. 64)."""
    n = gl.minimum(gl.maximum(n, 0), 64).to(gl.int64)
    one = gl.full_like(n, 1)
    return gl.where(n >= 64, gl.full_like(n, -1), (one << gl.minimum(n, 63)) - 1)


@gluon.jit
def _shr(w, n):
    """``w >> n`` as unsigned 64-bit words (n in 0 .. 63)."""
    return (w.to(gl.uint64, bitcast=True) >> n.to(gl.uint64)).to(gl.int64, bitcast=True)


@gluon.jit
def row_bits(start, t, tok, ctx, q0, kv_hi, row_ok, is_tree, ANC, stride_anc):
    """[rows] int64: bit c set when the row may see key ``start + c`` of the 64-key tile from ``start``."""
    lim = _low(kv_hi - start + t * 0)  # the keys below kv_hi
    if is_tree != 0:
        d = start - ctx  # the tile's first key past the context's last (negative: the tile starts in it)
        w0 = gl.maximum(d, 0) // 64  # a 64-key tile spans at most two 64-node words
        wa = gl.load(ANC + tok * stride_anc + w0, mask=row_ok & (w0 < stride_anc), other=0)
        wb = gl.load(ANC + tok * stride_anc + w0 + 1, mask=row_ok & (w0 + 1 < stride_anc), other=0)
        o = gl.maximum(d, 0) % 64 + t * 0  # column 0's bit in word w0
        ahead = gl.where(o == 0, wa, _shr(wa, o) | (wb << (64 - gl.maximum(o, 1)).to(gl.int64)))
        cn = gl.minimum(gl.maximum(-d, 0), 63) + t * 0  # the context's columns (d < 0; d <= -64: all of them)
        behind = (wa << cn.to(gl.int64)) | _low(cn)
        bits = gl.where(d >= 0, ahead, gl.where(-d >= 64, gl.full_like(wa, -1), behind))
    else:
        bits = _low(ctx + q0 + t - start + 1)  # the keys up to the row's own position
    return gl.where(row_ok, bits, gl.full_like(lim, -1)) & lim


@gluon.jit
def keep(bits, cols):
    """[rows, keys]: whether each score's key is allowed (``bits``: ``row_bits``; ``cols``: 0 .. 63)."""
    lo = gl.expand_dims(bits.to(gl.int32), 1)
    hi = gl.expand_dims((bits >> 32).to(gl.int32), 1)
    word = gl.where(gl.expand_dims(cols < 32, 0), lo, hi)
    return ((word >> gl.expand_dims(cols % 32, 0)) & 1) != 0
