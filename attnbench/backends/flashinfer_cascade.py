"""FlashInfer's cascade route: batches whose requests share prefix pages (docs/semantics.md,
"Shared prefixes") read each group's shared pages once for all of the group's query tokens.

Two levels over the one paged cache:
- level 0, one segment per prefix group: all of the group's query tokens (a contiguous run of
  the packed queries) attend, without a mask, to the group's shared pages (every query sees the
  whole shared prefix, which lies before all of them);
- level 1, one segment per request: its query tokens attend to its own pages (slots
  ``S * page_size .. kv_len - 1``) under its mask. FlashInfer's causal mask is bottom-right
  aligned, so a suffix of the keys keeps the causal rule of the whole row; a tree request's
  custom mask is its ``[Q, L]`` mask without the first ``S * page_size`` columns.
The two partial results are merged by their LSEs (FlashInfer's ``merge_state_in_place``).

Routes (the mode of the ``flashinfer`` backend):
- ``cascade``: batches without trees: ``flashinfer.MultiLevelCascadeAttentionWrapper`` with
  the two levels (its last level causal). It builds its own prefill wrappers with FlashInfer's
  default kernel choice ("auto": fa3 on Hopper, JIT-compiled on first use).
- ``cascade-custom-mask``: batches with trees: the same two levels as two
  ``BatchPrefillWithPagedKVCacheWrapper`` (fa2; the level-1 one with ``custom_mask``) and the
  same merge, because the multi-level wrapper's plan takes no custom mask.

It applies when every request of the batch belongs to a prefix group with at least one shared
page and each group's requests are consecutive (``cascade_layout`` returns None otherwise; the
backend then takes its usual route). The backend's option ``cascade=off`` (default from
``ATTNBENCH_FLASHINFER_CASCADE``) turns it off, to measure the same batch without it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from attnbench.workload.batch import Batch

CASCADE_ENV = "ATTNBENCH_FLASHINFER_CASCADE"


@dataclass
class Level:
    """One level's FlashInfer page layout, int32 on the CPU: ``qo_indptr [S+1]`` over the
    packed queries, ``kv_indptr [S+1]``, ``kv_indices [pages]``, ``last_page_len [S]``."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor


@dataclass
class CascadeLayout:
    shared: Level  # one segment per prefix group
    unique: Level  # one segment per request
    unique_start: list[int]  # first slot of each request's level-1 keys (S * page_size)


def _indptr(counts: list[int]) -> torch.Tensor:
    t = torch.zeros(len(counts) + 1, dtype=torch.int32)
    t[1:] = torch.cumsum(torch.tensor(counts, dtype=torch.int32), 0)
    return t


def _level(q_counts: list[int], pages: list[torch.Tensor], last: list[int]) -> Level:
    indices = torch.cat(pages).to(torch.int32) if pages else torch.zeros(0, dtype=torch.int32)
    return Level(_indptr(q_counts), _indptr([len(p) for p in pages]), indices, torch.tensor(last, dtype=torch.int32))


def cascade_layout(batch: Batch) -> Optional[CascadeLayout]:
    """The two levels of ``batch``, or None when the cascade does not apply to it."""
    spec = batch.spec
    groups = spec.prefix_groups()
    if not groups or sum(len(m) for m in groups.values()) != batch.num_requests:
        return None
    if any(m != list(range(m[0], m[-1] + 1)) for m in groups.values()):
        return None
    ps = spec.page_size
    table = batch.block_table.cpu()
    reqs = batch.requests
    seg_q, seg_pages = [], []
    for members in sorted(groups.values(), key=lambda m: m[0]):
        seg_q.append(sum(reqs[i].query for i in members))
        seg_pages.append(table[members[0], : spec.shared_pages(reqs[members[0]])])
    own_pages, own_last, start = [], [], []
    for i, r in enumerate(reqs):
        s, n = spec.shared_pages(r), spec.pages_of(r)
        own_pages.append(table[i, s:n])
        own_last.append(r.kv_len - (n - 1) * ps)
        start.append(s * ps)
    shared = _level(seg_q, seg_pages, [ps] * len(seg_pages))
    unique = _level([r.query for r in reqs], own_pages, own_last)
    return CascadeLayout(shared, unique, start)


def unique_mask_flat(batch: Batch, layout: CascadeLayout) -> torch.Tensor:
    """Level 1's custom mask: each request's mask without its shared columns, row-major, concatenated."""
    return torch.cat([batch.mask(i)[:, s:].reshape(-1) for i, s in enumerate(layout.unique_start)])


class TwoLevelCustomMask:
    """The cascade for batches with trees: level 0 unmasked, level 1 with the custom mask, merged."""

    def __init__(self, shared_wrapper: Any, unique_wrapper: Any, merge: Any):
        self.shared, self.unique, self.merge = shared_wrapper, unique_wrapper, merge

    def run(self, q: torch.Tensor, kv: tuple) -> torch.Tensor:
        out, lse = self.unique.run(q, kv, return_lse=True)
        o0, s0 = self.shared.run(q, kv, return_lse=True)
        self.merge(out, lse, o0, s0)
        return out


def _plan_args(level: Level, batch: Batch) -> tuple:
    dev = batch.device
    return (level.qo_indptr.to(dev), level.kv_indptr.to(dev), level.kv_indices.to(dev), level.last_page_len.to(dev),
            batch.num_q_heads, batch.num_kv_heads, batch.head_dim, batch.page_size)


def _made(cache: dict, key: tuple, make: Any) -> Any:
    """A wrapper made once per backend instance and reused by every plan (as an engine does)."""
    if key not in cache:
        cache[key] = make()
    return cache[key]


def plan_cascade(batch: Batch, workspace: torch.Tensor, wrappers: dict) -> Optional[tuple[str, Any]]:
    """``(mode, wrapper with .run(q, (k_cache, v_cache)))``, or None when the cascade does not
    apply. ``wrappers``: the backend's cache of FlashInfer wrappers, filled on first use."""
    layout = cascade_layout(batch)
    if layout is None:
        return None
    import flashinfer

    dev = str(batch.device)
    common = dict(sm_scale=batch.scale, q_data_type=batch.dtype, kv_data_type=batch.dtype)
    if all(r.tree_parents is None for r in batch.requests):
        w = _made(wrappers, ("multi", dev), lambda: flashinfer.MultiLevelCascadeAttentionWrapper(2, workspace, kv_layout="NHD"))
        top, bottom = _plan_args(layout.shared, batch), _plan_args(layout.unique, batch)
        per_level = [[top[k], bottom[k]] for k in range(4)]  # qo_indptr, kv_indptr, kv_indices, last_page_len
        w.plan(*per_level, *top[4:], causal=True, **common)  # causal applies to the last level only
        return "cascade", w
    prefill = lambda: flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="NHD", backend="fa2")  # noqa: E731
    shared = _made(wrappers, ("shared", dev), prefill)
    shared.plan(*_plan_args(layout.shared, batch), causal=False, **common)
    unique = _made(wrappers, ("unique", dev), prefill)
    unique.plan(*_plan_args(layout.unique, batch), custom_mask=unique_mask_flat(batch, layout).to(batch.device), **common)
    return "cascade-custom-mask", TwoLevelCustomMask(shared, unique, flashinfer.merge_state_in_place)
