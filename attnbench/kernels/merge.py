"""The triton backend's split merge (a second launch after the attention kernel when a row block was
split): one program per (split row, block of ``BLOCK_H`` query heads), out = sum_s w_s o_s / sum_s w_s with
w_s = exp(lse_s - max).

One head a program made 10240 programs of 256 elements for 8 x 40-node trees with 32 heads; a block of
heads a program (``BLOCK_H``, shared/launch.merge_heads) makes one wave of them, but the launch took the
same 9.5-11 us (H200, ``--profile``): its cost there was reading float32 partials, 3.3 us in 16 bits
(the kernel notes in git history (triton_notes.md), "tree round 1").
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def merge_kernel(
    Out, PO, PL, MERGE,
    stride_ot, stride_oh,
    stride_pos, stride_por, stride_poh,
    stride_pls, stride_plr, num_heads,
    HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """One program per (split row, BLOCK_H query heads): out = sum_s w_s o_s / sum_s w_s, w_s = exp(lse_s - max)."""
    r = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    tok = tl.load(MERGE + 2 * r).to(tl.int64)
    ns = tl.load(MERGE + 2 * r + 1)
    offs_s = tl.arange(0, SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    sh = (offs_s < ns)[:, None] & (h < num_heads)[None, :]  # [splits, heads]
    lanes = sh[:, :, None]
    if PAD_D:  # lanes past HEAD_DIM (a padded head dim) are neither read nor stored
        lanes = lanes & (offs_d < HEAD_DIM)[None, None, :]
    lse = tl.load(PL + offs_s[:, None] * stride_pls + r * stride_plr + h[None, :], mask=sh, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse - m[None, :])  # [splits, heads]
    o = tl.load(PO + offs_s[:, None, None] * stride_pos + r * stride_por + h[None, :, None] * stride_poh
                + offs_d[None, None, :], mask=lanes, other=0.0).to(tl.float32)
    num = tl.sum(w[:, :, None] * o, 0)  # [heads, d]
    den = tl.sum(w, 0)
    den = tl.where(den > 0.0, den, 1.0)
    out = Out + tok * stride_ot + h[:, None] * stride_oh + offs_d[None, :]
    ok = (h < num_heads)[:, None]
    if PAD_D:
        ok = ok & (offs_d < HEAD_DIM)[None, :]
    tl.store(out, (num / den[:, None]).to(Out.dtype.element_ty), mask=ok)
