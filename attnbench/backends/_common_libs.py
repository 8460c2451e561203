"""Helpers shared by the library backends (flash-attn, xformers, FlashInfer). Torch only.

- ``env_flag``: the opt-in switches (``ATTNBENCH_*`` environment variables).
- The tree split of docs/semantics.md ("Prefix/suffix merge"), for libraries without
  arbitrary masks: ``build_tree_split`` (plan step: index tensors and the tree mask, by
  array and tensor ops from the batch's tree inputs), ``dense_tree_part`` (run step: the
  tree nodes attend to the tree's own K/V in torch, with a natural-log LSE) and
  ``merge_tree_split`` (LSE merge with the library's prefix part). The prefix part (every
  tree node sees slots ``0..C-1``) is the library's job.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from attnbench.workload.batch import Batch
from attnbench.workload.reference import merge_attention_states

from ._metadata import cu_seqlens, slots_of, token_ids, tree_masks


def env_flag(name: str) -> bool:
    """True when the environment variable ``name`` is set to 1/true/yes/on."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


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


def build_tree_split(batch: Batch) -> TreeSplit:
    """All index tensors and masks of the split of the batch's tree requests, on its device.
    The tree masks come from ``tree_masks`` (cached per topology for static trees)."""
    t = batch.trees
    dev = batch.device
    reqs, sizes, tmax = t.reqs, t.sizes, t.tmax
    h = batch.host
    ctx = h.context_lens[reqs]
    bt = len(reqs)
    j = np.arange(tmax)
    valid = j[None, :] < sizes[:, None]  # [Bt, Tmax]
    q_index = np.where(valid, h.query_start_loc[reqs][:, None] + j[None, :], 0)
    mask = tree_masks(batch)
    g = batch.num_q_heads // batch.num_kv_heads
    bias = torch.zeros(bt, tmax, tmax, device=dev).masked_fill(~mask, float("-inf"))
    bias = bias[:, None, None].expand(bt, batch.num_kv_heads, g, tmax, tmax).reshape(-1, g * tmax, tmax)
    no_prefix = None
    if (ctx == 0).any():
        no_prefix = torch.from_numpy(np.repeat(ctx == 0, sizes)).to(dev)
    return TreeSplit(
        reqs=reqs.tolist(),
        tok=torch.from_numpy(token_ids(batch, reqs)).to(dev),
        all_tokens=bt == batch.num_requests,
        cu_q=cu_seqlens(sizes, dev),
        cu_k_prefix=cu_seqlens(ctx, dev),
        max_q=tmax,
        max_k_prefix=int(ctx.max()),
        block_table=batch.block_table[t.reqs_t].contiguous(),
        no_prefix=no_prefix,
        q_index=torch.from_numpy(q_index.reshape(-1)).to(dev),
        kv_slot=slots_of(batch, reqs, ctx, sizes, tmax).reshape(-1),
        mask=mask,
        bias=bias,
        real=torch.from_numpy(np.flatnonzero(valid)).to(dev),
        tmax=tmax,
    )


def dense_tree_part(
    ts: TreeSplit, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float,
    softcap: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree nodes attending to the tree's own K/V (slots C..L-1) under the ancestor mask.

    Returns ``(o [Nt, Hq, D] float32, lse [Nt, Hq] float32, natural log)`` in the order of
    ``ts.tok``. Float32 batched matmuls over ``Bt * Hkv`` groups of ``G * Tmax`` query rows,
    the mask added as the precomputed ``ts.bias``: trees are small (tens of nodes), so this is
    a handful of kernels. ``softcap``: scores -> c * tanh(scores / c) before the mask."""
    hq, d = q.shape[1], q.shape[2]
    hkv = k_cache.shape[2]
    g = hq // hkv
    bt, t = len(ts.reqs), ts.tmax
    qh = q[ts.q_index].view(bt, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(bt * hkv, g * t, d).float()
    kh = k_cache.reshape(-1, hkv, d)[ts.kv_slot].view(bt, t, hkv, d).permute(0, 2, 3, 1).reshape(bt * hkv, d, t).float()
    vh = v_cache.reshape(-1, hkv, d)[ts.kv_slot].view(bt, t, hkv, d).permute(0, 2, 1, 3).reshape(bt * hkv, t, d).float()
    if softcap is None:
        s = torch.baddbmm(ts.bias, qh, kh, alpha=scale)  # [bt*hkv, g*t, t]
    else:
        s = softcap * torch.tanh(torch.bmm(qh, kh) * (scale / softcap)) + ts.bias
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
