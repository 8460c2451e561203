"""FlashAttention-4's trees by the prefix/suffix split (``-b flash-attn4:trees=split``), the route
flash-attn 2 takes (docs/semantics.md "Prefix/suffix merge"): the tree nodes attend to their
request's context (slots ``0..C-1``) through one paged, non-causal FlashAttention-4 call with its
LSE (natural log; with sinks the sink is in it), to the tree's own K/V by a small dense masked
attention in torch (``_common_libs.dense_tree_part``), and the two merge by LSE. The other
requests run as paged calls of one causality each (``_causal_groups.py``), their outputs
written into the packed output. Beside the ``mask_mod`` route (the default), this one needs no
CuTe ``mask_mod`` and shows what the tree mask costs. Windows are not taken with branching trees
(the prefix call's window reads row order, a node sits at C + depth) nor on non-causal prefills.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from attnbench.workload.batch import Batch

from ._causal_groups import Group, causal_groups, put, take
from ._common_libs import TreeSplit, build_tree_split, dense_tree_part, merge_tree_split

#: the call's arguments that describe the requests (replaced per call)
PER_CALL = ("cu_seqlens_q", "seqused_k", "max_seqlen_q", "max_seqlen_k", "page_table", "causal", "window_size")


@dataclass
class SplitPlan:
    tree: Optional[TreeSplit]  # None: no tree request (a batch of mixed causality)
    prefix_kw: dict  # the tree rows' prefix call
    calls: list  # [(Group, kwargs)]: the other requests, one call per causality
    scale: float
    softcap: Optional[float]


def split_reasons(batch: Batch, label: str) -> list[str]:
    out = []
    t = batch.trees
    j = np.arange(t.parents_host.shape[1])
    chains = bool(((t.parents_host == j - 1) | (j >= t.sizes[:, None]) | (j == 0)).all()) if t.tmax else True
    if batch.window is not None and not chains:  # chains run as causal prefills (the plain route)
        out.append(f"{label} trees=split: a window on tree nodes needs their positions (C + depth); the prefix "
                   "call's window reads row order (the default trees=mask takes it)")
    if batch.window is not None and not bool(batch.host.causal.all()):
        out.append(f"{label} trees=split: no window on non-causal prefills (the default trees=mask takes it)")
    return out


def _i32(x: np.ndarray, dev) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x, dtype=np.int32)).to(dev)


def plan_split(batch: Batch, base_kw: dict) -> SplitPlan:
    """Every index, length and mask tensor of the split, by array and tensor ops."""
    h, dev = batch.host, batch.device
    common = {k: v for k, v in base_kw.items() if k not in PER_CALL}
    ts, prefix_kw = None, {}
    if batch.trees.tmax:
        ts = build_tree_split(batch)
        if batch.sinks is not None:  # a row without context: FA4 gives o = 0 and lse = the sink, which must stay
            ts = dataclasses.replace(ts, no_prefix=None)
        ctx = h.context_lens[np.asarray(ts.reqs)]
        prefix_kw = dict(common, cu_seqlens_q=ts.cu_q, seqused_k=_i32(ctx, dev), max_seqlen_q=ts.max_q,
                         max_seqlen_k=max(1, ts.max_k_prefix), page_table=ts.block_table, causal=False,
                         return_lse=True)
    calls = []
    others = np.flatnonzero(~h.is_tree)
    for g in causal_groups(batch, others) if len(others) else []:
        kw = dict(common, cu_seqlens_q=g.cu_q, seqused_k=_i32(g.kv_lens, dev), max_seqlen_q=g.max_q,
                  max_seqlen_k=g.max_k, page_table=g.block_table, causal=g.causal)
        if batch.window is not None:  # causal groups only (split_reasons)
            kw["window_size"] = (batch.window - 1, 0)
        calls.append((g, kw))
    return SplitPlan(ts, prefix_kw, calls, batch.scale, batch.softcap)


def run_split(p: SplitPlan, fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    ts, out = p.tree, None
    if ts is not None:
        q_tree = q if ts.all_tokens else q[ts.tok]
        o_pre, lse_pre = fn(q_tree, k, v, **p.prefix_kw)  # lse [Hq, Nt]
        o_t, lse_t = dense_tree_part(ts, q, k, v, p.scale, p.softcap)
        o_tree = merge_tree_split(ts, o_pre, lse_pre.transpose(0, 1), o_t, lse_t)
        if ts.all_tokens:
            return o_tree
        out = torch.empty_like(q)
        out[ts.tok] = o_tree
    g: Group
    for g, kw in p.calls:
        out = put(out, g, fn(take(q, g), k, v, **kw)[0], q)
    return out
