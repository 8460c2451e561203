"""Launch of the triton backend's prefill kernel (triton_prefill_kernels.py; issue 33's prefill
round, docs/triton_notes.md), an option of ``TritonBackend`` (``prefill=``), on by default
with "lean,fold,heavy,gluon" (``prefill=None``: off, the one-launch kernel for every batch).

``TritonBackend(prefill="lean,fold,heavy")`` runs batches the prefill kernel covers (a prefill,
no tree, no attention variant, a power-of-two head dim: ``applies``) through it with those
options (``prefill=""``: the kernel with none, the shipped algorithm); every other batch,
decode-only batches and a tree beside a prefill included, runs the one-launch kernel unchanged.
The plan (units, splits, the merge rows) is the shipped one: split row blocks are merged by
``triton_kernels.merge_kernel``.

``ws`` (issue 33's prefill round 2: triton's automatic warp specialization) was rejected on the GPU
and removed: docs/triton_notes.md, "Prefill round 2". ``gluon`` (round 3, on by default since round 8): the
batches ``triton_prefill_gluon.fit`` takes run gluon_prefill_kernels.py's hand-specialized Hopper
kernel instead; the others run this kernel with the remaining options.
"""
from __future__ import annotations

import torch

from . import triton_launch
from . import triton_plan as tp

OPTIONS = ("lean", "fold", "heavy", "gluon")
_KERNELS = "attnbench.backends.triton_prefill_kernels"


def options(spec: str) -> frozenset:
    """``"lean,fold"`` -> the set of prefill-kernel options (unknown names rejected)."""
    names = frozenset(s.strip() for s in spec.split(",") if s.strip())
    unknown = sorted(names - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown prefill option(s) {unknown}: choose from {OPTIONS}")
    return names


def applies(p) -> bool:
    """Whether the prefill kernel covers the plan's batch: a prefill (a request of more than one
    query token: decode-only batches keep the kernel measured on them), no tree, no attention
    variant (FP8, window, sink, soft-cap, ALiBi, bidirectional rows, positions) and a head dim
    that needs no padding."""
    b = p.batch
    return (int(b.host.query_lens.max(initial=0)) > 1 and not p.has_tree and not any(p.feat.constexprs().values())
            and tp.next_pow2(b.head_dim) == b.head_dim)


def route_note(p) -> str:
    """With the ``gluon`` option, the kernel the plan's batch runs: '' (not the prefill path's),
    'gluon prefill kernel', or the prefill kernel with triton_prefill_gluon.fit's reason."""
    if not applies(p):
        return ""
    from . import triton_prefill_gluon as gluon
    from .gluon_route import note

    return note(p, gluon.fit, gluon.unwanted, gluon.hopper, "gluon prefill kernel", "prefill kernel, not Gluon's")


def lean_fits(page: int, block_nf: int) -> bool:
    """``LEAN``'s loop-invariant offsets need a tile inside one page or starting on one."""
    return page % block_nf == 0 or block_nf % page == 0


def run(p, opts: frozenset) -> torch.Tensor:
    """The prefill kernel over the plan's units (and the merge of split rows, if any)."""
    import importlib

    from . import triton_kernels as tk

    if "gluon" in opts:
        from . import triton_prefill_gluon as gluon

        if not gluon.fit(p):
            gluon.run(p, "heavy" in opts)
            return triton_launch.merge(p)
    pk = importlib.import_module(_KERNELS)
    b, cfg = p.batch, p.cfg
    pk.prefill_attention_kernel[(p.units.shape[0], b.num_kv_heads)](
        b.q, b.k_cache, b.v_cache, p.out, p.po, p.pl, b.block_table, p.units,
        *triton_launch.io_strides(p),
        p.qk_scale,
        G=b.num_q_heads // b.num_kv_heads, HEAD_DIM=b.head_dim, PAGE=b.page_size,
        BLOCK_M=cfg.block_m, BLOCK_Q=cfg.block_q, BLOCK_N=cfg.block_n, BLOCK_NF=cfg.block_nf,
        UNIT_COLS=tp.UNIT_COLS, IEEE=b.dtype == torch.float32, TILE_IN_PAGE=b.page_size % cfg.block_nf == 0,
        LEAN="lean" in opts and lean_fits(b.page_size, cfg.block_nf), FOLD="fold" in opts,
        HEAVY_FIRST="heavy" in opts,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg and not tk.INTERPRETED else {}),
    )
    return triton_launch.merge(p)
