"""The ``paged`` route: kernels.py's one-launch Triton kernel, which takes every batch of the paged layout (prefill,
chunked prefill, decode, trees, every attention variant, head dims 32-256, FP8 caches), reading K/V through the block
table, then the split merge. Its FP8 build (issue 33's FP8 rounds, H200 8 x 16k e4m3 decodes): both dots in float16
(``FP8_F16``: 149 against 178 us), and on decode configs (row blocks <= 32 rows) V read as int16 words of two FP8
dims, each converted by one PTX cvt.rn.f16x2 (``V_WORDS`` 2) at ``CVT_MAXNREG`` registers (86.9 against 129.1 us
uncapped and 93.5 for words split by shifts, which the interpreter runs: ``V_WORDS`` 1).
"""
from __future__ import annotations

import torch

from attnbench.kernels.shared import launch as kl
from attnbench.kernels.shared import plan as tp

CVT_MAXNREG = 128  # 116 registers, 4 programs an SM (168 uncapped: 3)


def v_words(cfg: tp.Config, b, fp8: bool, interpreted: bool) -> int:
    """The kernel's V_WORDS: 0 off (16-bit caches, odd head dims, row blocks of > 32 rows: the tree config's wgmma
    took more instructions and a spill), 2 words converted by cvt.rn.f16x2 (float16 dots, compiled), 1 words split
    by shifts (the interpreter runs no PTX)."""
    if not (fp8 and b.head_dim % 2 == 0 and cfg.block_m <= 32):
        return 0
    return 2 if b.q.element_size() == 2 and not interpreted else 1


def launch(p) -> torch.Tensor:
    """``paged_attention_kernel`` over the plan's units x KV heads, then the split merge."""
    from attnbench.kernels.paged import kernels as tk

    b, cfg, f = p.batch, p.cfg, p.feat
    q, k, v, out, po, pl = b.q, b.k_cache, b.v_cache, p.out, p.po, p.pl
    d_pad = tp.next_pow2(b.head_dim)
    dummy = p.units  # the pointer of an input its variant is off for (never read)
    vw = v_words(cfg, b, f.fp8, tk.INTERPRETED)
    regs = cfg.maxnreg if cfg.maxnreg is not None else CVT_MAXNREG if vw == 2 else 0
    tk.paged_attention_kernel[(p.units.shape[0], b.num_kv_heads)](
        q, k, v, out, po, pl, b.block_table, p.units, p.anc,
        *(dummy if t is None else t for t in (f.positions, f.sinks, f.slopes, f.k_scale, f.v_scale)),
        *kl.io_strides(p), p.anc.stride(0),
        1 if f.fp8 and f.k_scale.numel() > 1 else 0,  # per-head scales, or one per tensor
        p.qk_scale, f.cap, f.window,
        G=b.num_q_heads // b.num_kv_heads, HEAD_DIM=b.head_dim, PAGE=b.page_size,
        BLOCK_M=cfg.block_m, BLOCK_Q=cfg.block_q, BLOCK_N=cfg.block_n, BLOCK_NF=cfg.block_nf,
        UNIT_COLS=tp.UNIT_COLS, HAS_TREE=p.has_tree, IEEE=b.dtype == torch.float32,
        TILE_IN_PAGE=b.page_size % cfg.block_nf == 0, BLOCK_D=d_pad, PAD_D=d_pad != b.head_dim,
        **f.constexprs(), FP8_F16=f.fp8 and q.element_size() == 2, V_WORDS=vw,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"maxnreg": regs} if regs and not tk.INTERPRETED else {}),
    )
    return kl.merge(p)
