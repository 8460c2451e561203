"""flash-attn 2 on the paged cache, through the entry points vLLM's FlashAttentionBackend uses.

Routes (the plan's ``mode``, copied into each result row):
- ``paged-kvcache``: decode-only batches (every request has one query token) through
  ``flash_attn_with_kvcache(q [B,1,H,D], k_cache, v_cache, cache_seqlens, block_table, causal)``.
- ``paged-varlen``: prefill / chunked prefill / mixed batches through
  ``flash_attn_varlen_func(..., causal=True, block_table=...)`` (causal is bottom-right aligned).
- ``chain-as-causal``: trees that are all chains are exactly a causal prefill: same call.
- A batch that mixes causal and non-causal prefills runs the varlen call twice, once per
  causality (flash-attn's ``causal`` is per call; ``_causal_groups.py``), each group's output
  copied into the packed output (the varlen call takes no output tensor); the mode then ends
  in ``(two calls: causal + non-causal)``. Decodes join the causal call, chains too.
- ``prefix+dense-tree+merge``: other trees. flash-attn has no arbitrary masks, so a tree
  request is split (docs/semantics.md, "Prefix/suffix merge"): its nodes attend to the prefix (slots ``0..C-1``) through
  ``flash_attn_varlen_func`` (paged, non-causal, with its natural-log LSE), to the tree's own
  K/V (slots ``C..L-1``, gathered) by a small dense masked attention in torch, and the two are
  merged by LSE. Non-tree requests of the same batch take the paged-varlen route.

Plan builds every index, length and mask tensor by array and tensor ops (no loop over
requests; static trees' masks come from a per-topology cache); run only launches kernels (the
tree route's K/V gather of ``T`` rows per tree request is part of run, as it reads the cache;
so are a split batch's query gather and output copy per causality group).

Capabilities (declared on the class): CUDA, float16/bfloat16, ``page_size % 256 == 0``
(flash-attn 2's paged kernels: "Paged KV cache block size must be divisible by 256"), head_dim
a multiple of 8 up to 256. Option ``hdim128_only=on`` (``-b flash-attn:hdim128_only=on``;
default from ``ATTNBENCH_FA2_HDIM128_ONLY``) declares a minimal build with head dim 128 only:
other head dims are then skipped with that reason instead of computing garbage. Where it was validated: docs/backends.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from attnbench.backend import Backend, BackendOption
from attnbench.workload.batch import Batch

from ._causal_groups import TWO_CALLS, Group, causal_groups, put, take
from ._common_libs import TreeSplit, build_tree_split, dense_tree_part, merge_tree_split

HDIM128_ENV = "ATTNBENCH_FA2_HDIM128_ONLY"


@dataclass
class FlashAttnPlan:
    mode: str  # the route
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    scale: float
    fns: Any
    # paged-kvcache
    cache_seqlens: Optional[torch.Tensor] = None
    block_table: Optional[torch.Tensor] = None
    # paged-varlen / chain-as-causal / the non-tree part of a tree batch: one varlen call per
    # causality (``_causal_groups.py``), with its own variant arguments (the window's right edge)
    varlen: list[Group] = field(default_factory=list)
    varlen_kw: list[dict] = field(default_factory=list)
    # tree split, and its prefix part as one non-causal varlen call
    tree: Optional[TreeSplit] = None
    prefix: Optional[Group] = None
    # variants, passed to every flash-attn call (window_size, softcap, alibi_slopes)
    lib_kw: dict = field(default_factory=dict)
    softcap: Optional[float] = None


def _fns():
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

    return flash_attn_varlen_func, flash_attn_with_kvcache


class FlashAttnBackend(Backend):
    name = "flash-attn"
    import_modules = ("flash_attn.flash_attn_interface",)  # loads the CUDA extension
    label = "flash-attn 2"
    dtypes = (torch.float16, torch.bfloat16)
    page_size_multiple = 256
    head_dim_multiple = 8
    max_head_dim = 256
    options = {
        "hdim128_only": BackendOption(
            "hdim128_only", False, type=bool, env=HDIM128_ENV,
            help="the installed build has head dim 128 only (a minimal build): skip other head dims"),
    }

    supports_window = True
    supports_softcap = True
    supports_alibi = True
    supports_noncausal = True

    def unsupported(self, batch: Batch) -> list[str]:
        out = []
        if self.option("hdim128_only") == "on" and batch.head_dim != 128:
            out.append(f"this flash-attn build has head_dim 128 only (hdim128_only=on), got {batch.head_dim}")
        h, t = batch.host, batch.trees
        branching = bool(t.tmax) and not _all_chains(t.parents_host, t.sizes)
        if branching and batch.window is not None:
            out.append("flash-attn 2: a window on tree nodes needs their positions (C + depth); its window reads row order")
        if batch.spec.alibi and (branching or not h.causal.all()):
            out.append("flash-attn 2: its ALiBi bias is -slope * |i - j| on row order: exact only for causal rows without trees")
        return out

    def _variant_kw(self, batch: Batch, causal: bool = True) -> dict:
        """window_size / softcap / alibi_slopes for a paged or varlen call of causality
        ``causal`` (docs/semantics.md: keys j > p - W are visible; flash-attn's (left, right)
        = (W - 1, 0) causal, (W - 1, -1) not)."""
        kw: dict = {}
        if batch.window is not None:
            kw["window_size"] = (batch.window - 1, 0 if causal else -1)
        if batch.softcap is not None:
            kw["softcap"] = float(batch.softcap)
        if batch.alibi_slopes is not None:
            kw["alibi_slopes"] = batch.alibi_slopes.float().contiguous()
        return kw

    # -- plan -----------------------------------------------------------------------------
    def plan(self, batch: Batch) -> FlashAttnPlan:
        common = dict(q=batch.q, k_cache=batch.k_cache, v_cache=batch.v_cache, scale=batch.scale, fns=_fns(),
                      lib_kw=self._variant_kw(batch), softcap=batch.softcap)
        h, t = batch.host, batch.trees
        if not t.tmax and (h.query_lens == 1).all():
            return FlashAttnPlan(
                mode="paged-kvcache",
                cache_seqlens=batch.kv_lens,
                block_table=batch.block_table,
                **common,
            )
        everyone = np.arange(batch.num_requests)
        if not t.tmax or _all_chains(t.parents_host, t.sizes):
            mode, ts, reqs = ("chain-as-causal" if t.tmax else "paged-varlen"), None, everyone
        else:
            mode, ts, reqs = "prefix+dense-tree+merge", build_tree_split(batch), everyone[~h.is_tree]
        groups = causal_groups(batch, reqs) if len(reqs) else []
        if len(groups) > 1:
            mode = f"{mode} ({TWO_CALLS})"
        kws = [self._variant_kw(batch, g.causal) for g in groups]
        prefix = None if ts is None else _prefix_call(ts)
        return FlashAttnPlan(mode=mode, tree=ts, prefix=prefix, varlen=groups, varlen_kw=kws, **common)

    # -- run ------------------------------------------------------------------------------
    def _run_varlen(self, p: FlashAttnPlan, v: Group, q: torch.Tensor, kw: dict, return_lse: bool = False):
        varlen_fn = p.fns[0]
        res = varlen_fn(
            q,
            p.k_cache,
            p.v_cache,
            v.cu_q,
            v.cu_k,
            v.max_q,
            v.max_k,
            softmax_scale=p.scale,
            causal=v.causal,
            return_attn_probs=return_lse,
            block_table=v.block_table,
            **kw,
        )
        return res

    def run(self, p: FlashAttnPlan) -> torch.Tensor:
        if p.mode == "paged-kvcache":
            kvcache_fn = p.fns[1]
            b, hq, d = p.q.shape
            o = kvcache_fn(
                p.q.view(b, 1, hq, d),
                p.k_cache,
                p.v_cache,
                cache_seqlens=p.cache_seqlens,
                block_table=p.block_table,
                softmax_scale=p.scale,
                causal=True,
                **p.lib_kw,
            )
            return o.view(b, hq, d)
        out = None if p.tree is None else self._run_tree(p)
        for g, kw in zip(p.varlen, p.varlen_kw):  # one call per causality (a copy each when split)
            out = put(out, g, self._run_varlen(p, g, take(p.q, g), kw), p.q)
        return out

    def _run_tree(self, p: FlashAttnPlan) -> torch.Tensor:
        """The tree requests' rows (prefix + dense tree + merge): the whole output when the
        batch is all trees, else a fresh packed output with the tree rows written."""
        ts = p.tree
        q_tree = p.q if ts.all_tokens else p.q[ts.tok]
        cap = {"softcap": p.softcap} if p.softcap is not None else {}  # no window/ALiBi on trees (unsupported)
        o_pre, lse_pre, _ = self._run_varlen(p, p.prefix, q_tree, cap, return_lse=True)
        lse_pre = _lse_tokens_first(lse_pre, q_tree.shape[0])
        o_t, lse_t = dense_tree_part(ts, p.q, p.k_cache, p.v_cache, p.scale, p.softcap)
        o_tree = merge_tree_split(ts, o_pre, lse_pre, o_t, lse_t)
        if ts.all_tokens:
            return o_tree
        out = torch.empty_like(p.q)
        out[ts.tok] = o_tree
        return out


def _prefix_call(ts: TreeSplit) -> Group:
    """The tree split's prefix part as one non-causal varlen call (slots 0..C-1 of each tree
    request; ``tok``/``rows`` unused: the caller passes the tree rows)."""
    no = np.zeros(0, dtype=np.int64)
    return Group(causal=False, reqs=np.asarray(ts.reqs), query_lens=no, kv_lens=no, rows=None, tok=None,
                 whole=False, cu_q=ts.cu_q, cu_k=ts.cu_k_prefix, max_q=ts.max_q,
                 max_k=max(1, ts.max_k_prefix), block_table=ts.block_table)


def _lse_tokens_first(lse: torch.Tensor, n: int) -> torch.Tensor:
    """flash-attn's varlen LSE is ``[H, total_q]``; return ``[total_q, H]``."""
    if lse.dim() == 2 and lse.shape[1] == n:
        return lse.transpose(0, 1)
    raise RuntimeError(f"unexpected flash-attn LSE shape {tuple(lse.shape)} for {n} query tokens")


def _all_chains(parents: np.ndarray, sizes: np.ndarray) -> bool:
    """Every tree (``[Bt, Tmax]`` padded parent arrays) is a chain: node j's parent is j - 1."""
    j = np.arange(parents.shape[1])
    return bool(((parents == j - 1) | (j >= sizes[:, None]) | (j == 0)).all())
