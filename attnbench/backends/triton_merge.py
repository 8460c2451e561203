"""The triton backend's split merge (a second launch after ``paged_attention_kernel`` when a
row block was split and the merge is not fused): one program per (split row, query head),
out = sum_s w_s o_s / sum_s w_s with w_s = exp(lse_s - max). Moved out of triton_kernels.py
(issue 33, FP8 round 2) to keep that module under the 400-line rule; imported there.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def merge_kernel(
    Out, PO, PL, MERGE,
    stride_ot, stride_oh,
    stride_pos, stride_por, stride_poh,
    stride_pls, stride_plr,
    HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
):
    """One program per (split row, query head): out = sum_s w_s o_s / sum_s w_s, w_s = exp(lse_s - max)."""
    r = tl.program_id(0)
    h = tl.program_id(1)
    tok = tl.load(MERGE + 2 * r).to(tl.int64)
    ns = tl.load(MERGE + 2 * r + 1)
    offs_s = tl.arange(0, SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    sm = offs_s < ns
    lanes = sm[:, None]
    if PAD_D:  # lanes past HEAD_DIM (a padded head dim) are neither read nor stored
        lanes = lanes & (offs_d < HEAD_DIM)[None, :]
    lse = tl.load(PL + offs_s * stride_pls + r * stride_plr + h, mask=sm, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse - m)
    o = tl.load(PO + offs_s[:, None] * stride_pos + r * stride_por + h * stride_poh + offs_d[None, :],
                mask=lanes, other=0.0).to(tl.float32)
    num = tl.sum(w[:, None] * o, 0)
    den = tl.sum(w, 0)
    den = tl.where(den > 0.0, den, 1.0)
    if PAD_D:
        tl.store(Out + tok * stride_ot + h * stride_oh + offs_d, (num / den).to(Out.dtype.element_ty),
                 mask=offs_d < HEAD_DIM)
    else:
        tl.store(Out + tok * stride_ot + h * stride_oh + offs_d, (num / den).to(Out.dtype.element_ty))
