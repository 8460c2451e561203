"""The ``prefill`` route: kernels.py's Triton prefill kernel (issue 33's prefill round, the kernel notes in git history (triton_notes.md)) over
batches with a prefill and without trees or attention variants; the plan (units, splits, merge rows) is the paged
kernel's. The kernel takes loop-invariant int32 in-tile K/V offsets where a tile lies inside a page or starts on
one (``LEAN``: ``lean_fits``), folds the score scale into the exponent's FMA and runs the longest causal row blocks
first (each of the three measured 5-14% faster on 4 x 1k prefills, H200).
"""
from __future__ import annotations

import torch

from attnbench.kernels.shared import launch as kl
from attnbench.kernels.shared import plan as tp
from attnbench.kernels.shared.features import variants


def reasons(batch) -> list[str]:
    """Why the route cannot take ``batch``, in the words a skipped row gives ([] when it can): it takes a prefill
    (a request of more than one query token; decodes alone keep the kernel measured on them), no tree, no attention
    variant (FP8 caches included) and a head dim that needs no padding."""
    out = []
    if int(batch.host.query_lens.max(initial=0)) <= 1:
        out.append("the Triton prefill kernel takes a prefill (decodes alone: the paged kernel)")
    if batch.trees.tmax:
        out.append("the Triton prefill kernel takes no tree")
    fp8 = ["an FP8 cache"] if getattr(batch, "k_scale", None) is not None else []
    out += [f"the Triton prefill kernel takes no attention variant ({v})" for v in (fp8 + variants(batch))[:1]]
    if tp.next_pow2(batch.head_dim) != batch.head_dim:
        out.append(f"the Triton prefill kernel takes a power-of-two head dim (not {batch.head_dim})")
    return out


def lean_fits(page: int, block_nf: int) -> bool:
    """``LEAN``'s loop-invariant offsets need a tile inside one page or starting on one."""
    return page % block_nf == 0 or block_nf % page == 0


def launch(p) -> torch.Tensor:
    """The prefill kernel over the plan's units, then the split merge (shared.launch.merge)."""
    from attnbench.kernels.paged import kernels as tk
    from attnbench.kernels.prefill import kernels as pk

    b, cfg = p.batch, p.cfg
    pk.prefill_attention_kernel[(p.units.shape[0], b.num_kv_heads)](
        b.q, b.k_cache, b.v_cache, p.out, p.po, p.pl, b.block_table, p.units,
        *kl.io_strides(p),
        p.qk_scale,
        G=b.num_q_heads // b.num_kv_heads, HEAD_DIM=b.head_dim, PAGE=b.page_size,
        BLOCK_M=cfg.block_m, BLOCK_Q=cfg.block_q, BLOCK_N=cfg.block_n, BLOCK_NF=cfg.block_nf,
        UNIT_COLS=tp.UNIT_COLS, IEEE=b.dtype == torch.float32, TILE_IN_PAGE=b.page_size % cfg.block_nf == 0,
        LEAN=lean_fits(b.page_size, cfg.block_nf),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg and not tk.INTERPRETED else {}),
    )
    return kl.merge(p)
