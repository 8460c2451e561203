"""FlashAttention-4 (the ``flash-attn-4`` package, CuTe DSL: ``flash_attn.cute``) on the paged cache.

Every batch is one ``flash_attn_varlen_func`` call over the cache as it is (K/V ``[pages,
page_size, kv_heads, d]``, ``page_table`` = the block table, int32 ``[B, pages]``; any page size:
a page of one key tile's width loads by TMA, others by cp.async, ``flash_fwd_sm90.py``), with
``cu_seqlens_q`` (the batch's query starts) and ``seqused_k`` (its kv lengths). Routes (the
plan's ``mode``, copied into each result row):

- ``paged causal``: batches of causal requests without branching trees (decodes, prefills,
  chunked prefills, chains: a chain is a causal prefill); ``causal=True`` is bottom-right
  aligned; a window is ``window_size=(W - 1, 0)``. All non-causal prefills without a window:
  ``paged non-causal``.
- ``paged tree mask_mod``: every other batch (trees that branch; causal and non-causal prefills
  together; a window with non-causal prefills): one call with a ``mask_mod`` that reads the
  tables ``plan`` builds (``_fa4_mask.py``): each tree node sees the whole context and its
  ancestors, no dense mask. FlashAttention-4 then evaluates the ``mask_mod`` on every key tile
  of every row (a ``mask_mod`` turns its causal tile skipping off); it takes block-sparse
  tensors that would skip the tiles a row cannot see, not used here.
- Decodes run unsplit on sm_90: 4.0.0b36 refuses split-KV there (``interface.py``,
  ``_flash_attn_fwd``: ``assert not is_split_kv, "SplitKV not supported on SM 9.0"``, for any
  ``num_splits`` but 1, its heuristic's 0 included): ``num_splits=1``, and the mode says so.
- GQA: FlashAttention-4 packs the query heads of a KV head into one tile (``pack_gqa``, its
  default when there is more than one query head per KV head); the mode names it.

Variants: the window (above), sinks as ``learnable_sink`` (a natural-log logit per query head in
the softmax denominator, as docs/semantics.md defines them), soft-cap as ``softcap`` (applied
after the scale, in float32). Not taken, each a skipped row naming the limit: FP8 caches
(4.0.0b36 reads FP8 only on SM100, and only with FP8 queries: ``"FP8 is only supported on
SM100"``, and ``q, k, v`` must share one dtype), ALiBi (no argument for it), the HND cache order
(it reads ``[pages, page_size, kv_heads, d]``), MLA on sm_90 (its ``qv`` path asserts "only
support Blackwell arch with qv"), head dims past 256 (``_validate_head_dims``).

``plan`` makes everything the call reads (the call's arguments, the mask tables); ``run`` only
calls the kernel. First use: FlashAttention-4 compiles a kernel per configuration on its first
call (3-6 s on an H200): the first plan of each configuration in a process makes one untimed
call and reports its seconds (``FIRST_USE_S``, a warning), as FlashInfer's JIT is kept out of
the rows. CUDA graphs: CuTe DSL kernels launch through TVM FFI on torch's current stream, so a
capture records them; whether it did is checked on every graph-timed row by the stale-graph
check (``measure/graph_check.py``: the plan's queries are changed and one replay must follow
them; a row whose replay does not is a mismatch naming it), so no FA4 row can time a graph that
skips the kernel. Where it was validated: docs/backends.md.
"""
from __future__ import annotations

import importlib.metadata as md
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch

from attnbench.backend import Backend, BackendOption
from attnbench.workload.batch import Batch
from attnbench.workload.mla import is_mla

from ._fa4_mask import build_tables, cute_mask_mod
from ._fa4_split import SplitPlan, plan_split, run_split, split_reasons

#: seconds each configuration's first call took in this process (compile + first call)
FIRST_USE_S: dict[str, float] = {}
UNSPLIT = "unsplit: FA4 refuses split-KV on sm_90"


def fa4_version() -> str:
    """``FlashAttention-4 <version>`` of the installed distribution (without importing it)."""
    try:
        return f"FlashAttention-4 {md.version('flash-attn-4')}"
    except md.PackageNotFoundError:
        return "FlashAttention-4"


@dataclass
class FA4Plan:
    mode: str
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    fn: Callable
    kw: dict = field(default_factory=dict)  # every other argument of the call, made in plan
    aux: list = field(default_factory=list)  # the mask tables (kept alive with the plan)
    split: Optional[SplitPlan] = None  # trees=split: the prefix/suffix split's calls


def _fn() -> Callable:
    from flash_attn.cute import flash_attn_varlen_func

    return flash_attn_varlen_func


def _all_chains(batch: Batch) -> bool:
    t = batch.trees
    if not t.tmax:
        return True
    j = np.arange(t.parents_host.shape[1])
    return bool(((t.parents_host == j - 1) | (j >= t.sizes[:, None]) | (j == 0)).all())


def _major(dev: torch.device) -> Optional[int]:
    return torch.cuda.get_device_capability(dev)[0] if dev.type == "cuda" else None


def call_args(batch: Batch, major: Optional[int]) -> tuple[str, str, dict, list]:
    """``(route, mode, kwargs, aux)``: the route, the row's mode, every argument of the
    ``flash_attn_varlen_func`` call besides q, k and v, and the mask tables it reads (none on the
    plain routes), for a GPU of compute capability ``major``. No FlashAttention-4 import: the
    plan's half that a CPU can check."""
    h = batch.host
    causal = bool(h.causal.all())
    plain = _all_chains(batch) and (causal or (not h.causal.any() and batch.window is None))
    kw: dict[str, Any] = dict(
        cu_seqlens_q=batch.query_start_loc, seqused_k=batch.kv_lens,
        max_seqlen_q=int(h.query_lens.max()), max_seqlen_k=int(h.kv_lens.max()),
        page_table=batch.block_table.contiguous(), softmax_scale=batch.scale,
        num_splits=0 if major in (10, 11) else 1, pack_gqa=None,  # 0: its split heuristic (SM100/110)
    )
    if batch.softcap is not None:
        kw["softcap"] = float(batch.softcap)
    if batch.sinks is not None:
        kw["learnable_sink"] = batch.sinks.float().contiguous()
    aux: list = []
    if plain:
        kw["causal"] = causal
        if batch.window is not None:
            kw["window_size"] = (batch.window - 1, 0)
        route = "paged causal" if causal else "paged non-causal"
    else:
        aux = build_tables(batch).aux()
        kw.update(causal=False, mask_mod=None, aux_tensors=aux)  # the mask_mod: set by plan (a CuTe import)
        route = "paged tree mask_mod"
    words = [route, f"page_table (page {batch.page_size})"]
    if batch.num_q_heads > batch.num_kv_heads:
        words.append("GQA packed")
    if major == 9 and (h.query_lens == 1).all():
        words.append(UNSPLIT)
    return route, ", ".join(words), kw, aux


class FlashAttn4Backend(Backend):
    name = "flash-attn4"
    import_modules = ("flash_attn.cute.interface",)  # imports the CuTe DSL (nvidia-cutlass-dsl)
    label = "FlashAttention-4"
    dtypes = (torch.float16, torch.bfloat16)
    head_dim_multiple = 8  # 16 bytes (_validate_head_dims: "divisible by 16 // element size")
    max_head_dim = 256  # sm_90: 8..256 (_validate_head_dims)
    supports_window = True
    supports_sinks = True
    supports_softcap = True
    supports_noncausal = True
    options = {
        "trees": BackendOption(
            "trees", "mask", choices=("mask", "split"),
            help="mask: trees (and mixed causality) through a CuTe mask_mod over plan-built tables; split: the "
                 "tree nodes' context through FA4 with its LSE, their own keys dense in torch, merged (flash-attn 2's "
                 "route), other requests one paged call per causality"),
    }

    def unsupported(self, batch: Batch) -> list[str]:
        v, out = fa4_version(), []
        if batch.spec.kv_dtype is not None:
            out.append(f"{v} reads FP8 only on SM100 and only with FP8 queries (flash_attn/cute/interface.py, "
                       "_flash_attn_fwd: 'FP8 is only supported on SM100', and q, k, v must share one dtype)")
        if self.option("trees") == "split":
            out += split_reasons(batch, v)
        if batch.dtype not in (torch.float16, torch.bfloat16):
            out.append(f"{v}: 'inputs must be float16, bfloat16, fp8 e4m3fn, or fp8 e5m2' (interface.py, "
                       "_flash_attn_fwd)")
        if batch.head_dim > 256 and not is_mla(batch):
            out.append(f"{v}: head dims 8..256 on SM90 (interface.py, _validate_head_dims), got {batch.head_dim}")
        if batch.kv_order != "NHD":
            out.append(f"{v} reads paged K/V as [num_pages, page_size, kv_heads, d] only (interface.py, "
                       "_flash_attn_fwd asserts that shape)")
        major = _major(batch.device)
        if major in (8, 12):
            out.append(f"{v} reads no paged KV cache on SM {major}.x (interface.py, _flash_attn_fwd: 'paged KV not "
                       "supported on SM 8.0' / 'Paged KV not supported on SM 12.0')")
        if batch.head_dim % 16 and not is_mla(batch):
            out.append(f"{v} loads pages that are not one key tile wide by cp.async, which needs head dims that "
                       f"are multiples of 16 (flash_attn/cute/flash_fwd_sm90.py: 'assert self.use_tma_KV or not "
                       f"(self.check_hdim_oob ...)'), got {batch.head_dim}")
        if batch.spec.alibi:
            out.append(f"{v} has no ALiBi argument (flash_attn_varlen_func)")
        if is_mla(batch):
            out.append(f"{v} runs MLA (its qv argument) on SM100/SM110 only (interface.py: "
                       "'only support Blackwell arch with qv')")
        return out

    # -- plan -----------------------------------------------------------------------------
    def plan(self, batch: Batch) -> FA4Plan:
        t0 = time.perf_counter()
        route, mode, kw, aux = call_args(batch, _major(batch.device))
        split = None
        if aux and self.option("trees") == "split":
            split, aux = plan_split(batch, kw), []
            route, mode = "paged split", mode.replace("paged tree mask_mod", "paged split (context via FA4 + dense "
                                                      "tree + LSE merge; one call per causality)")
        elif aux:
            kw["mask_mod"] = cute_mask_mod()
        p = FA4Plan(mode, batch.q, batch.k_cache, batch.v_cache, _fn(), kw, aux, split)
        return self._first_use(p, batch, route, t0)

    def _first_use(self, p: FA4Plan, batch: Batch, route: str, t0: float) -> FA4Plan:
        """The first plan of a configuration (what FlashAttention-4 compiles a kernel for) in
        this process: one untimed call, its seconds reported apart from every row."""
        g = batch.num_q_heads // batch.num_kv_heads
        one_tile = int(batch.host.query_lens.max()) * g <= 128  # its compile key holds whether one query tile does
        key = (f"{route} {batch.dtype} d{batch.head_dim} g{g} page {batch.page_size} one-tile {one_tile} window "
               f"{batch.window is not None} softcap {batch.softcap} sinks {batch.sinks is not None}"
               ).replace("torch.", "")
        if key not in FIRST_USE_S:
            self.run(p)
            torch.cuda.synchronize(batch.device)
            FIRST_USE_S[key] = time.perf_counter() - t0
            warnings.warn(f"flash-attn4 {key}: first use (compile + first call) took "
                          f"{FIRST_USE_S[key]:.1f} s, outside every row's time", stacklevel=2)
        return p

    def run(self, p: FA4Plan) -> torch.Tensor:
        if p.split is not None:
            return run_split(p.split, p.fn, p.q, p.k_cache, p.v_cache)
        out, _ = p.fn(p.q, p.k_cache, p.v_cache, **p.kw)
        return out
