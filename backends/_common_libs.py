"""Helpers shared by the library backends (flash-attn, xformers, FlashInfer). Torch only.

- ``env_flag``: the opt-in switches (``ATTNBENCH_*`` environment variables).
- ``flashinfer_page_layout``: our block table -> FlashInfer's indptr / indices / last_page_len.
- The tree split of SEMANTICS.md ("Splitting a tree into prefix + suffix"), for libraries
  without arbitrary masks: ``build_tree_split`` (plan step: index tensors and the tree mask),
  ``dense_tree_part`` (run step: the tree nodes attend to the tree's own K/V in torch, with a
  natural-log LSE) and ``merge_tree_split`` (LSE merge with the library's prefix part).
  The prefix part (every tree node sees slots ``0..C-1``) is the library's job.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from attnbench.workload.batch import Batch
from attnbench.workload.reference import merge_attention_states
from attnbench.workload.trees import ancestor_mask


def env_flag(name: str) -> bool:
    """True when the environment variable ``name`` is set to 1/true/yes/on."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def tree_requests(batch: Batch) -> list[int]:
    return [i for i, r in enumerate(batch.requests) if r.tree_parents is not None]


def token_ids(batch: Batch, reqs: Sequence[int]) -> list[int]:
    """Packed query-token ids of the requests ``reqs`` (in that order)."""
    starts = batch.query_start
    out: list[int] = []
    for i in reqs:
        out.extend(range(starts[i], starts[i + 1]))
    return out


def cu_seqlens(lengths: Sequence[int], device) -> torch.Tensor:
    """``[len + 1]`` int32 cumulative sums on ``device``."""
    t = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    if lengths:
        t[1:] = torch.cumsum(torch.tensor(list(lengths), dtype=torch.int32), 0)
    return t.to(device)


def flashinfer_page_layout(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(indptr [B+1], indices [sum pages], last_page_len [B])`` int32 on the CPU.

    Request i uses pages ``block_table[i, :ceil(kv_len / page)]``; its last page holds
    ``kv_len - (pages - 1) * page`` tokens (1..page)."""
    ps = batch.page_size
    table = batch.block_table.cpu()
    counts, rows, last = [], [], []
    for i, r in enumerate(batch.requests):
        n = -(-r.kv_len // ps)
        counts.append(n)
        rows.append(table[i, :n])
        last.append(r.kv_len - (n - 1) * ps)
    indptr = torch.zeros(len(counts) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(counts, dtype=torch.int32), 0)
    indices = torch.cat(rows).to(torch.int32) if rows else torch.zeros(0, dtype=torch.int32)
    return indptr, indices, torch.tensor(last, dtype=torch.int32)


def custom_mask_flat(batch: Batch) -> torch.Tensor:
    """Every request's ``[Q, L]`` mask, flattened row-major and concatenated (FlashInfer's custom_mask)."""
    return torch.cat([batch.mask(i).reshape(-1) for i in range(batch.num_requests)])


@dataclass
class TreeSplit:
    """Plan-step metadata of the prefix + dense-tree split, for the tree requests ``reqs``.

    Tensors live on the batch's device. ``Bt`` tree requests, ``Nt`` tree tokens, ``Tmax``
    the largest tree. Padded positions of the dense part point at valid rows (0) and are
    masked to see only themselves, so they never produce NaN; they are dropped by ``real``.
    """

    reqs: list[int]
    tok: torch.Tensor  # [Nt] long: packed token ids of the tree tokens
    all_tokens: bool  # the tree tokens are the whole batch, in order
    contexts: list[int]
    cu_q: torch.Tensor  # [Bt+1] int32
    cu_k_prefix: torch.Tensor  # [Bt+1] int32 (cumulative contexts)
    max_q: int
    max_k_prefix: int
    block_table: torch.Tensor  # [Bt, max_pages] int32
    no_prefix: Optional[torch.Tensor]  # [Nt] bool: rows of requests with context 0 (None if none)
    q_index: torch.Tensor  # [Bt*Tmax] long into q
    kv_slot: torch.Tensor  # [Bt*Tmax] long into k_cache.view(-1, Hkv, D)
    mask: torch.Tensor  # [Bt, Tmax, Tmax] bool: tree part of the mask
    bias: torch.Tensor  # [Bt*Hkv, G*Tmax, Tmax] float32: 0 / -inf from ``mask``, per (request, kv head)
    real: torch.Tensor  # [Nt] long into the padded [Bt*Tmax]
    tmax: int


def build_tree_split(batch: Batch, reqs: Optional[Sequence[int]] = None) -> TreeSplit:
    """All index tensors and masks of the split, built on the host and moved once."""
    reqs = list(tree_requests(batch) if reqs is None else reqs)
    dev = batch.device
    ps = batch.page_size
    starts = batch.query_start
    table = batch.block_table.cpu().long()
    sizes = [batch.requests[i].query for i in reqs]
    tmax = max(sizes)
    bt = len(reqs)
    q_index = torch.zeros(bt, tmax, dtype=torch.long)
    kv_slot = torch.zeros(bt, tmax, dtype=torch.long)
    mask = torch.eye(tmax, dtype=torch.bool).repeat(bt, 1, 1)
    real = []
    for b, i in enumerate(reqs):
        r = batch.requests[i]
        t = r.query
        q_index[b, :t] = torch.arange(starts[i], starts[i] + t)
        slots = torch.arange(r.context, r.kv_len)
        kv_slot[b, :t] = table[i, slots // ps] * ps + slots % ps
        mask[b, :t, :t] = ancestor_mask(r.tree_parents)
        real.extend(range(b * tmax, b * tmax + t))
    tok = token_ids(batch, reqs)
    contexts = [batch.requests[i].context for i in reqs]
    g = batch.num_q_heads // batch.num_kv_heads
    bias = torch.zeros(bt, tmax, tmax).masked_fill(~mask, float("-inf"))
    bias = bias[:, None, None].expand(bt, batch.num_kv_heads, g, tmax, tmax).reshape(-1, g * tmax, tmax)
    no_prefix = None
    if any(c == 0 for c in contexts):
        no_prefix = torch.cat([torch.full((s,), c == 0) for s, c in zip(sizes, contexts)]).to(dev)
    return TreeSplit(
        reqs=reqs,
        tok=torch.tensor(tok, dtype=torch.long, device=dev),
        all_tokens=tok == list(range(batch.num_tokens)),
        contexts=contexts,
        cu_q=cu_seqlens(sizes, dev),
        cu_k_prefix=cu_seqlens(contexts, dev),
        max_q=tmax,
        max_k_prefix=max(contexts),
        block_table=batch.block_table[torch.tensor(reqs, device=dev)].contiguous(),
        no_prefix=no_prefix,
        q_index=q_index.reshape(-1).to(dev),
        kv_slot=kv_slot.reshape(-1).to(dev),
        mask=mask.to(dev),
        bias=bias.contiguous().to(dev),
        real=torch.tensor(real, dtype=torch.long, device=dev),
        tmax=tmax,
    )


def dense_tree_part(
    ts: TreeSplit, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree nodes attending to the tree's own K/V (slots C..L-1) under the ancestor mask.

    Returns ``(o [Nt, Hq, D] float32, lse [Nt, Hq] float32, natural log)`` in the order of
    ``ts.tok``. Float32 batched matmuls over ``Bt * Hkv`` groups of ``G * Tmax`` query rows,
    the mask added as the precomputed ``ts.bias``: trees are small (tens of nodes), so this is
    a handful of kernels."""
    hq, d = q.shape[1], q.shape[2]
    hkv = k_cache.shape[2]
    g = hq // hkv
    bt, t = len(ts.reqs), ts.tmax
    qh = q[ts.q_index].view(bt, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(bt * hkv, g * t, d).float()
    kh = k_cache.reshape(-1, hkv, d)[ts.kv_slot].view(bt, t, hkv, d).permute(0, 2, 3, 1).reshape(bt * hkv, d, t).float()
    vh = v_cache.reshape(-1, hkv, d)[ts.kv_slot].view(bt, t, hkv, d).permute(0, 2, 1, 3).reshape(bt * hkv, t, d).float()
    s = torch.baddbmm(ts.bias, qh, kh, alpha=scale)  # [bt*hkv, g*t, t]
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    o = torch.bmm(torch.exp(s - lse), vh)  # [bt*hkv, g*t, d]
    o = o.view(bt, hkv, g, t, d).permute(0, 3, 1, 2, 4).reshape(bt * t, hq, d)
    lse = lse.view(bt, hkv, g, t).permute(0, 3, 1, 2).reshape(bt * t, hq)
    return o[ts.real], lse[ts.real]


def merge_tree_split(
    ts: TreeSplit, o_prefix: torch.Tensor, lse_prefix: torch.Tensor, o_tree: torch.Tensor, lse_tree: torch.Tensor
) -> torch.Tensor:
    """Merge the prefix part (``[Nt, Hq, D]``, natural-log ``[Nt, Hq]``) with the dense tree part.

    Rows of requests with context 0 saw no prefix key: their prefix LSE is forced to -inf
    (flash-attn reports +inf for empty rows). Returns ``[Nt, Hq, D]`` in ``o_prefix.dtype``."""
    lse_prefix = lse_prefix.float()
    if ts.no_prefix is not None:
        lse_prefix = lse_prefix.masked_fill(ts.no_prefix[:, None], float("-inf"))
    o, _ = merge_attention_states(o_prefix.float(), lse_prefix, o_tree, lse_tree)
    return o.to(o_prefix.dtype)
