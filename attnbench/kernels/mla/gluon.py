"""The ``gluon-mla`` route: gluon_kernels.py's Hopper kernel over MLA batches of decodes and MTP chains (issue 33's
MLA round 2, the default since the thirteenth session). H200, 8 x 16k decodes: 128 heads 83.3 us against the
Triton MLA kernel's 186.7, 16 heads 53.6 against 79.8.

It takes (``reasons``) a Hopper GPU, batches of decodes and MTP chains (static chains of drafts, planned as the
causal chunks they equal: ``chains``) with a 16-bit q and latent cache of the same dtype, DeepSeek-V3's latent row
(kv_lora_rank 512, rope_dim 64) and pages of a multiple of 64 keys or of 8, 16 or 32 keys; any head count (a unit
is 64 rows of (token, head) pairs, token-major). ``config_args`` plans units of 64 rows and 64-key tiles, split for
one program an SM (``WAVES``), with 16-bit split partials (``HALF_PARTIALS``); ``fit`` checks the plan.
"""
from __future__ import annotations

import numpy as np
import torch

from attnbench.kernels.shared.gluon import BLOCK_N, hopper, page_ok

STAGES = 2  # ring slots of BLOCK_N keys: 2 x 72 KB beside q's 72 KB and P's 8 KB (224.6 KB offline, sm_90)
COMPUTE_REGS = 232  # the two compute warpgroups' registers (setmaxnreg; the loader's 4 warps keep 40)
WAVES = 1  # splits for at most this many programs an SM (one fits: 224.6 KB of shared memory)
HALF_PARTIALS = True  # split partial outputs in the batch's dtype (8 MB instead of 16 at 8 x 16k, 128 heads)
RANK, ROPE = 512, 64  # the latent row the kernel is built and tested for (DeepSeek-V2/V3/R1, Kimi K2)
ROWS = 64  # a unit's rows: one warpgroup's MMA rows


def reasons(batch) -> list[str]:
    """Why the route cannot take ``batch``, in the words a skipped row gives ([] when it can)."""
    if not hopper(batch.device):
        return ["the Gluon MLA kernel needs a Hopper GPU (sm_90)"]
    out = []
    if batch.dtype not in (torch.float16, torch.bfloat16) or batch.k_cache.dtype != batch.dtype \
            or getattr(batch, "k_scale", None) is not None:
        out.append("the Gluon MLA kernel takes a 16-bit q and latent cache of one dtype (FP8 caches: route mla)")
    spec = batch.spec
    if (spec.kv_lora_rank, spec.rope_dim) != (RANK, ROPE):
        out.append(f"the Gluon MLA kernel takes kv_lora_rank {RANK} and rope_dim {ROPE} (kv_lora_rank "
                   f"{spec.kv_lora_rank}, rope_dim {spec.rope_dim})")
    if not page_ok(batch.page_size):
        out.append(f"the Gluon MLA kernel takes pages of a multiple of {BLOCK_N} keys or of 8, 16 or 32 (page "
                   f"{batch.page_size})")
    h = batch.host
    several = (h.query_lens != 1) | h.is_tree  # requests other than plain decodes: MTP chains only
    if len(h.query_lens) == 0 or not chains(batch)[several].all():
        out.append("the Gluon MLA kernel takes decodes and MTP chains (trees, prefills: route mla)")
    if not (_rows_ok(batch.q) and _rows_ok(batch.k_cache)):
        out.append("the Gluon MLA kernel needs contiguous, 16-byte aligned q and latent cache")
    return out


def chains(batch) -> np.ndarray:
    """Per request: a static tree whose nodes form one chain (an MTP draft: node i's parent is i - 1), which sees
    what a causal chunk of its tokens would. The option plans them as such (``mla/plan.MlaShape``'s
    ``causal_chains``): a unit's key end is its last token's; where a unit holds one token's heads (a multiple
    of ``ROWS`` heads) the kernel masks nothing but that end, else each row its own token's (``ROW_LIMITS``)."""
    return np.array([r.tree_parents is not None and not r.tree_dynamic
                     and tuple(r.tree_parents) == tuple(range(-1, len(r.tree_parents) - 1))
                     for r in batch.spec.requests], dtype=bool)


def config_args() -> dict:
    """``mla/plan.choose_config``'s arguments: 64-row units (a warpgroup's MMA rows), BLOCK_N-key tiles (the
    splits start on them), one value program a unit, splits in ``WAVES``, ``HALF_PARTIALS``."""
    return dict(block_m=ROWS, block_n=BLOCK_N, value_chunks=1, tail_stages=0, waves=WAVES,
                half_partials=HALF_PARTIALS, max_block_m=ROWS)


def _rows_ok(t: torch.Tensor) -> bool:
    """Whether ``t``'s rows ([..., D]) are one 2-d row-major view (TMA's) with 16-byte aligned rows."""
    return t.is_contiguous() and t.data_ptr() % 16 == 0 and t.shape[-1] * t.element_size() % 16 == 0


def fit(p) -> str:
    """'' when the kernel can run the plan (its units and tiles), else why not."""
    cfg = p.cfg
    if (cfg.block_m, cfg.block_n, cfg.value_chunks) != (ROWS, BLOCK_N, 1):
        return f"the Gluon MLA kernel needs {ROWS}-row units, {BLOCK_N}-key tiles and one value program a unit " \
               f"(block_m {cfg.block_m}, block_n {cfg.block_n}, value_chunks {cfg.value_chunks})"
    return ""


def launch(p) -> None:
    """``mla_gluon_kernel`` over the plan's units (split units: partials for mla.plan's merge)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from attnbench.kernels.mla import gluon_kernels as gk

    b = p.batch
    d, rank = b.head_dim, b.spec.kv_lora_rank
    ty = gl.bfloat16 if b.dtype == torch.bfloat16 else gl.float16
    box = min(b.page_size, BLOCK_N)
    q2 = b.q.reshape(-1, d)
    kv2 = b.k_cache.reshape(-1, d)

    def desc(t, rows, cols):
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], ty)
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [rows, cols], layout)

    out = p.out.view(-1, rank)
    po, pl = p.po, p.pl
    gk.mla_gluon_kernel[(p.units.shape[0],)](
        desc(q2, ROWS, rank), desc(q2, ROWS, d - rank), desc(kv2, box, rank), desc(kv2, box, d - rank),
        out, po, pl, b.block_table, p.units, p.qstart, p.ctx,
        out.stride(0), po.stride(0), po.stride(1), pl.stride(0), b.block_table.stride(0), p.qk_scale,
        b.num_q_heads, PAGE=b.page_size, BLOCK_N=BLOCK_N, STAGES=STAGES, UNIT_COLS=p.units.shape[1],
        COMPUTE_REGS=COMPUTE_REGS,
        ROW_LIMITS=bool(b.num_q_heads % ROWS and b.host.query_lens.max() > 1),  # units of several tokens
        num_warps=4,
    )
