"""flash-attn 2 on the paged cache, through the entry points vLLM's FlashAttentionBackend uses.

Routes (the plan's ``mode``, copied into each result row):
- ``paged-kvcache``: decode-only batches (every request has one query token) through
  ``flash_attn_with_kvcache(q [B,1,H,D], k_cache, v_cache, cache_seqlens, block_table, causal)``.
- ``paged-varlen``: prefill / chunked prefill / mixed batches through
  ``flash_attn_varlen_func(..., causal=True, block_table=...)`` (causal is bottom-right aligned).
- ``chain-as-causal``: trees that are all chains are exactly a causal prefill: same call.
- ``prefix+dense-tree+merge``: other trees. flash-attn has no arbitrary masks, so a tree
  request is split (docs/semantics.md, "Prefix/suffix merge"): its nodes attend to the prefix (slots ``0..C-1``) through
  ``flash_attn_varlen_func`` (paged, non-causal, with its natural-log LSE), to the tree's own
  K/V (slots ``C..L-1``, gathered) by a small dense masked attention in torch, and the two are
  merged by LSE. Non-tree requests of the same batch take the paged-varlen route.

Plan builds every index, length and mask tensor by array and tensor ops (no loop over
requests; static trees' masks come from a per-topology cache); run only launches kernels (the
tree route's K/V gather of ``T`` rows per tree request is part of run, as it reads the cache).

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

from ._common_libs import TreeSplit, build_tree_split, dense_tree_part, merge_tree_split
from ._metadata import cu_seqlens, token_ids

HDIM128_ENV = "ATTNBENCH_FA2_HDIM128_ONLY"


@dataclass
class _Varlen:
    """One ``flash_attn_varlen_func`` call over a subset of requests."""

    tok: Optional[torch.Tensor]  # packed token ids of these requests (None: the whole batch)
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    block_table: torch.Tensor
    causal: bool


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
    # paged-varlen / chain-as-causal / the non-tree part of a tree batch
    varlen: Optional[_Varlen] = None
    # tree split
    tree: Optional[TreeSplit] = None
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
        # chains run in the same varlen call as the prefills (chain-as-causal): they count as causal rows
        multi = (h.query_lens > 1) & (~h.is_tree if branching else True)
        if len(set(h.causal[multi].tolist())) > 1:
            out.append("flash-attn 2: causal and non-causal prefills in one batch need two calls (not wired)")
        return out

    def _variant_kw(self, batch: Batch) -> dict:
        """window_size / softcap / alibi_slopes for the paged and varlen calls (docs/semantics.md:
        keys j > p - W are visible; flash-attn's (left, right) = (W - 1, 0) causal, (W - 1, -1) not)."""
        kw: dict = {}
        if batch.window is not None:
            causal = bool(batch.host.causal[(batch.host.query_lens > 1)].all()) if (batch.host.query_lens > 1).any() else True
            kw["window_size"] = (batch.window - 1, 0 if causal else -1)
        if batch.softcap is not None:
            kw["softcap"] = float(batch.softcap)
        if batch.alibi_slopes is not None:
            kw["alibi_slopes"] = batch.alibi_slopes.float().contiguous()
        return kw

    # -- plan -----------------------------------------------------------------------------
    def _varlen(self, batch: Batch, reqs: np.ndarray, whole: bool) -> _Varlen:
        dev = batch.device
        h = batch.host
        q, kv = h.query_lens[reqs], h.kv_lens[reqs]
        return _Varlen(
            tok=None if whole else torch.from_numpy(token_ids(batch, reqs)).to(dev),
            cu_q=cu_seqlens(q, dev),
            cu_k=cu_seqlens(kv, dev),
            max_q=int(q.max()),
            max_k=int(kv.max()),
            block_table=batch.block_table if whole else batch.block_table[torch.from_numpy(reqs).to(dev)].contiguous(),
            causal=bool(h.causal[reqs][q > 1].all()) if (q > 1).any() else True,
        )

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
            mode = "chain-as-causal" if t.tmax else "paged-varlen"
            return FlashAttnPlan(mode=mode, varlen=self._varlen(batch, everyone, True), **common)
        ts = build_tree_split(batch)
        others = everyone[~h.is_tree]
        rest = self._varlen(batch, others, False) if len(others) else None
        return FlashAttnPlan(mode="prefix+dense-tree+merge", tree=ts, varlen=rest, **common)

    # -- run ------------------------------------------------------------------------------
    def _run_varlen(self, p: FlashAttnPlan, v: _Varlen, q: torch.Tensor, return_lse: bool = False, kw=None):
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
            **(p.lib_kw if kw is None else kw),
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
        if p.mode in ("paged-varlen", "chain-as-causal"):
            return self._run_varlen(p, p.varlen, p.q)
        ts = p.tree
        q_tree = p.q if ts.all_tokens else p.q[ts.tok]
        prefix = _Varlen(None, ts.cu_q, ts.cu_k_prefix, ts.max_q, max(1, ts.max_k_prefix), ts.block_table, False)
        cap = {"softcap": p.softcap} if p.softcap is not None else {}  # no window/ALiBi on trees (unsupported)
        o_pre, lse_pre, _ = self._run_varlen(p, prefix, q_tree, return_lse=True, kw=cap)
        lse_pre = _lse_tokens_first(lse_pre, q_tree.shape[0])
        o_t, lse_t = dense_tree_part(ts, p.q, p.k_cache, p.v_cache, p.scale, p.softcap)
        o_tree = merge_tree_split(ts, o_pre, lse_pre, o_t, lse_t)
        if ts.all_tokens:
            return o_tree
        out = torch.empty_like(p.q)
        out[ts.tok] = o_tree
        rest = p.varlen
        out[rest.tok] = self._run_varlen(p, rest, p.q[rest.tok])
        return out


def _lse_tokens_first(lse: torch.Tensor, n: int) -> torch.Tensor:
    """flash-attn's varlen LSE is ``[H, total_q]``; return ``[total_q, H]``."""
    if lse.dim() == 2 and lse.shape[1] == n:
        return lse.transpose(0, 1)
    raise RuntimeError(f"unexpected flash-attn LSE shape {tuple(lse.shape)} for {n} query tokens")


def _all_chains(parents: np.ndarray, sizes: np.ndarray) -> bool:
    """Every tree (``[Bt, Tmax]`` padded parent arrays) is a chain: node j's parent is j - 1."""
    j = np.arange(parents.shape[1])
    return bool(((parents == j - 1) | (j >= sizes[:, None]) | (j == 0)).all())
