"""Launch of the Gluon MLA kernel (gluon_mla_kernels.py; issue 33's MLA round 2, docs/triton_notes.md, "the
thirteenth session"): the ``gluon`` option of the triton backend's MLA path (``TritonBackend(mla_gluon=True)``,
``triton_mla.plan(..., gluon=True)``), on by default since the thirteenth session (H200, 8 x 16k decodes: 128 heads
83.3 us against the Triton MLA kernel's 186.7, 16 heads 53.6 against 79.8; 51 GPU tests passed).

``unwanted`` says why the option's plan does not shape a batch for the kernel ('' when it does): it takes a
Hopper GPU, batches of decodes and MTP chains (static chains of drafts, planned as the causal chunks they
equal: ``chains``) with a 16-bit q and latent cache of the same dtype, DeepSeek-V3's latent row (kv_lora_rank
512, rope_dim 64) and pages of a multiple of 64 keys or of 8, 16 or 32 keys; any head count (a unit is 64 rows
of (token, head) pairs, token-major). Branching or dynamic trees, prefills, FP8 caches and other latent widths
keep the Triton MLA kernel (triton_mla_kernels.py).
``config_args`` then plans units of 64 rows and 64-key tiles, split for one program an SM (``WAVES``), with
16-bit split partials (``HALF_PARTIALS``); ``fit`` checks the plan (the CPU interpreter included: Gluon has
none, so there the option falls back to the Triton MLA kernel), and the plan's mode (a row's "ran as") names
the kernel that ran (``route_note``).
"""
from __future__ import annotations

import numpy as np
import torch

from .gluon_route import note, refusal
from .triton_prefill_gluon import hopper

BLOCK_N = 64  # keys a ring slot (64 x 576 bf16: 72 KB)
STAGES = 2  # ring slots: 2 x 72 KB beside q's 72 KB and P's 8 KB (224.6 KB offline, sm_90, triton 3.6)
COMPUTE_REGS = 232  # the two compute warpgroups' registers (setmaxnreg; the loader's 4 warps keep 40)
WAVES = 1  # splits for at most this many programs an SM (one fits: 224.6 KB of shared memory)
# the score warpgroup's P V issued before P's hand-over to the value warpgroup (which then runs beside the MMA)
# instead of after it: 8 x 16k decodes, H200, 128 heads 83.3 us against 87.3 after it, 16 heads 53.6 against 53.7
# (thirteenth session; triton-mla-gluon: after it)
EARLY_PV = True
# the next tile's S issued before this tile's softmax (the MMA under it), waited for with this tile's P V: the score
# warpgroup holds two ring slots, so it wants more than 2 (variants triton-mla-gluon-n32s4-ps*: 4 slots of 32 keys;
# offline no spill there, 8 bytes at 64-key tiles); off: on an H200 (thirteenth session) 32-key tiles with it ran 97.6-98.8
# us against 83.3 for the default's 64-key tiles without it (8 x 16k, 128 heads)
PIPE_S = False
HALF_PARTIALS = True  # split partial outputs in the batch's dtype (8 MB instead of 16 at 8 x 16k, 128 heads)
RANK, ROPE = 512, 64  # the latent row the kernel is built and tested for (DeepSeek-V2/V3/R1, Kimi K2)
RAN = "gluon MLA kernel"  # route_note when the kernel runs the plan
ROWS = 64  # a unit's rows: one warpgroup's MMA rows


def _page_ok(page: int) -> bool:
    return page % BLOCK_N == 0 or (BLOCK_N % page == 0 and page >= 8)


def unwanted(batch) -> str:
    """'' when the option's plan shapes this batch for the kernel (``config_args``), else why not."""
    if not hopper(batch.device):
        return "not a Hopper GPU"
    if batch.dtype not in (torch.float16, torch.bfloat16) or batch.k_cache.dtype != batch.dtype \
            or getattr(batch, "k_scale", None) is not None:
        return "not a 16-bit q and latent cache of one dtype (FP8 caches: the Triton MLA kernel)"
    spec = batch.spec
    if (spec.kv_lora_rank, spec.rope_dim) != (RANK, ROPE):
        return f"kv_lora_rank {spec.kv_lora_rank}, rope_dim {spec.rope_dim} (it takes {RANK} and {ROPE})"
    if not _page_ok(batch.page_size):
        return f"page {batch.page_size} (it takes pages of a multiple of {BLOCK_N} keys or of 8, 16 or 32)"
    h = batch.host
    several = (h.query_lens != 1) | h.is_tree  # requests other than plain decodes: MTP chains only
    if len(h.query_lens) == 0 or not chains(batch)[several].all():
        return "not a batch of decodes and MTP chains (trees, prefills: the Triton MLA kernel)"
    return ""


def chains(batch) -> np.ndarray:
    """Per request: a static tree whose nodes form one chain (an MTP draft: node i's parent is i - 1), which sees
    what a causal chunk of its tokens would. The option plans them as such (``triton_mla.MlaShape``'s
    ``causal_chains``): a unit's key end is its last token's; where a unit holds one token's heads (a multiple
    of ``ROWS`` heads) the kernel masks nothing but that end, else each row its own token's (``ROW_LIMITS``)."""
    return np.array([r.tree_parents is not None and not r.tree_dynamic
                     and tuple(r.tree_parents) == tuple(range(-1, len(r.tree_parents) - 1))
                     for r in batch.spec.requests], dtype=bool)


def wanted(batch) -> bool:
    return not unwanted(batch)


def config_args() -> dict:
    """``triton_mla.choose_config``'s arguments: 64-row units (a warpgroup's MMA rows), BLOCK_N-key tiles (the
    splits start on them), one value program a unit, splits in ``WAVES``, ``HALF_PARTIALS``."""
    return dict(block_m=ROWS, block_n=BLOCK_N, value_chunks=1, tail_stages=0, waves=WAVES,
                half_partials=HALF_PARTIALS, max_block_m=ROWS)


def _rows_ok(t: torch.Tensor) -> bool:
    """Whether ``t``'s rows ([..., D]) are one 2-d row-major view (TMA's) with 16-byte aligned rows."""
    return t.is_contiguous() and t.data_ptr() % 16 == 0 and t.shape[-1] * t.element_size() % 16 == 0


def fit(p) -> str:
    """'' when the Gluon MLA kernel can run the plan's batch, else why not."""
    b, cfg = p.batch, p.cfg
    why = refusal(b, "MLA", unwanted, hopper)
    if why:
        return why
    if (cfg.block_m, cfg.block_n, cfg.value_chunks) != (ROWS, BLOCK_N, 1):
        return f"the Gluon MLA kernel needs {ROWS}-row units, {BLOCK_N}-key tiles and one value program a unit " \
               f"(block_m {cfg.block_m}, block_n {cfg.block_n}, value_chunks {cfg.value_chunks})"
    if not (_rows_ok(b.q) and _rows_ok(b.k_cache)):
        return "the Gluon MLA kernel needs contiguous, 16-byte aligned q and latent cache"
    return ""


def route_note(p) -> str:
    """The kernel an MLA batch runs with the option: 'gluon MLA kernel', or the Triton one and why ('' off
    Hopper: never a candidate there)."""
    return note(p, fit, unwanted, hopper, RAN, "Triton MLA kernel, not Gluon's MLA kernel")


def run(p) -> None:
    """``mla_gluon_kernel`` over the plan's units (split units: partials for triton_mla's merge launch)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from . import gluon_mla_kernels as gk

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
        COMPUTE_REGS=COMPUTE_REGS, EARLY_PV=EARLY_PV, PIPE_S=PIPE_S,
        ROW_LIMITS=bool(b.num_q_heads % ROWS and b.host.query_lens.max() > 1),  # units of several tokens
        num_warps=4,
    )
