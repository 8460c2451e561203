"""Flex's per-row tables and its ``BlockMask`` built from per-block KV indices, by tensor ops.

An engine with paged attention knows, per request, which KV blocks a query block reads and
which of them are fully visible: the causal limit, the window and the tree region are
intervals per query row. So instead of evaluating the ``mask_mod`` over the whole padded
``[Qmax, Lmax]`` grid (``create_block_mask``: 21-28 ms per step on an H100 for the shipped
cases), the block mask is classified from those intervals and handed to
``BlockMask.from_kv_blocks``; the ``mask_mod`` then decides only inside partial blocks.

Row tables (``[B, Qmax]`` int32/int64 on the batch's device; padding rows see key 0 only):
- ``lo``: the first key slot the row may see (the window's start on positions, else 0);
- ``hi``: the last key slot it sees outside a tree region (``C + i`` causal, ``C - 1`` for a
  tree node, ``L - 1`` non-causal);
- ``tree_base``: a tree row's first tree slot (``2**30`` otherwise);
- ``qpos`` / ``kpos`` (``[B, Lmax]``): positions (docs/semantics.md: a tree node at C + depth).
For a tree row the window bounds the context by ``lo`` and the tree keys by ``kpos`` in the
``mask_mod``; the tree region's blocks are always partial.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnbench.workload.batch import Batch

from ._metadata import padded_tree_masks

FAR = 1 << 30


@dataclass
class RowTables:
    lo: torch.Tensor  # [B, Qmax] int64
    hi: torch.Tensor  # [B, Qmax] int64
    tree_base: torch.Tensor  # [B, Qmax] int64
    tree_anc: torch.Tensor  # [B, Qmax, Tmax] bool
    tmax: int
    qpos: torch.Tensor  # [B, Qmax] int64
    kpos: torch.Tensor  # [B, Lmax] int64
    kv_len: torch.Tensor  # [B] int64
    real: torch.Tensor  # [B, Qmax] bool


def row_tables(batch: Batch, qmax: int, lmax: int) -> RowTables:
    dev = batch.device
    tmax = max(batch.trees.tmax, 1)
    anc = padded_tree_masks(batch, qmax, tmax)  # [B, Qmax, Tmax]: ancestors incl. self
    qi = torch.arange(qmax, device=dev)[None, :]
    ctx = batch.context_lens.long()[:, None]
    kv_len = batch.kv_lens.long()
    real = qi < batch.query_lens.long()[:, None]
    tree = batch.trees.is_tree_t[:, None]
    causal = torch.from_numpy(batch.host.causal).to(dev)[:, None] if hasattr(batch.host, "causal") else True
    depth = anc.sum(-1) - 1  # [B, Qmax]: a tree node's depth (its ancestors, itself included, minus one)
    qpos = torch.where(real, ctx + torch.where(tree, depth, qi), 0)
    hi = torch.where(tree, ctx - 1, torch.where(causal, ctx + qi, kv_len[:, None] - 1))
    hi = torch.where(real, hi, 0)
    tree_base = torch.where(real & tree, ctx, FAR)
    j = torch.arange(lmax, device=dev)[None, :]
    rel = j - ctx
    in_tree = tree & (rel >= 0) & (rel < qmax)
    tree_pos = torch.gather(torch.where(tree, depth, 0), 1, rel.clamp(0, qmax - 1)) + ctx
    kpos = torch.where(in_tree, tree_pos, j)
    lo = torch.zeros_like(hi)
    if batch.window is not None:
        # first slot whose position is > p - W: context slots are their positions; for a tree
        # row that bounds the context, and kpos bounds its tree keys in the mask_mod
        lo = torch.where(real, (qpos - batch.window + 1).clamp(min=0), 0)
    return RowTables(lo, hi, tree_base, anc, tmax, qpos, kpos, kv_len, real)


def make_mask_mod(t: RowTables, window: Any):
    lo, hi, base, anc, tmax, qpos, kpos, kv_len = t.lo, t.hi, t.tree_base, t.tree_anc, t.tmax, t.qpos, t.kpos, t.kv_len

    def mask_mod(b, h, q_idx, kv_idx):
        rel = kv_idx - base[b, q_idx]
        in_tree = (rel >= 0) & anc[b, q_idx, rel.clamp(0, tmax - 1)]
        ok = (kv_idx < kv_len[b]) & (kv_idx >= lo[b, q_idx]) & ((kv_idx <= hi[b, q_idx]) | in_tree)
        if window is not None:
            ok = ok & (kpos[b, kv_idx] > qpos[b, q_idx] - window)
        return ok

    return mask_mod


def _per_block(x: torch.Tensor, block: int, fill: int, reduce: str) -> torch.Tensor:
    """``[B, Qmax]`` -> ``[B, nQB]``: min or max over each query block (rows past Qmax = fill)."""
    b, q = x.shape
    nqb = -(-q // block)
    padded = x.new_full((b, nqb * block), fill)
    padded[:, :q] = x
    v = padded.view(b, nqb, block)
    return v.amin(-1) if reduce == "min" else v.amax(-1)


def kv_block_lists(t: RowTables, lmax: int, q_block: int, kv_block: int) -> tuple[torch.Tensor, ...]:
    """``(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)`` with a head axis of 1,
    int32, from the row intervals: a KV block is *full* for a query block when every row sees
    every key of it (no tree region, wholly inside each row's ``[lo, hi]`` and the kv length),
    *partial* when some row may see some key of it (the mask_mod decides there)."""
    dev = t.lo.device
    nkb = -(-lmax // kv_block)
    k0 = torch.arange(nkb, device=dev)[None, None, :] * kv_block
    k1 = torch.clamp(k0 + kv_block, max=lmax) - 1
    # rows past the end of a request: the padding rows see key 0 only (lo = hi = 0)
    lo_min, lo_max = _per_block(t.lo, q_block, FAR, "min")[..., None], _per_block(t.lo, q_block, -1, "max")[..., None]
    hi_min, hi_max = _per_block(t.hi, q_block, FAR, "min")[..., None], _per_block(t.hi, q_block, -1, "max")[..., None]
    base_min = _per_block(t.tree_base, q_block, FAR, "min")[..., None]
    base_max = _per_block(torch.where(t.tree_base < FAR, t.tree_base + t.tmax - 1, -1), q_block, -1, "max")[..., None]
    kv_len = t.kv_len[:, None, None]
    touches_tree = (base_min <= k1) & (base_max >= k0)
    some = ((lo_min <= k1) & (hi_max >= k0) | touches_tree) & (k0 < kv_len)
    full = (lo_max <= k0) & (hi_min >= k1) & (k1 < kv_len) & ~touches_tree & (k1 - k0 + 1 == kv_block)
    partial = some & ~full
    return (*_compact(partial), *_compact(full))


def _compact(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, nQB, nKB]`` bool -> counts ``[B, 1, nQB]`` and indices ``[B, 1, nQB, nKB]`` (selected first)."""
    counts = sel.sum(-1, dtype=torch.int32)
    order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[:, None], order[:, None]


def block_mask_from_kv_blocks(t: RowTables, qmax: int, lmax: int, mask_mod, block: int = 128) -> Any:
    """Flex's ``BlockMask`` from :func:`kv_block_lists` (forward only: no transposed lists)."""
    from torch.nn.attention.flex_attention import BlockMask

    kv_num, kv_idx, full_num, full_idx = kv_block_lists(t, lmax, block, block)
    kw = dict(BLOCK_SIZE=(block, block), mask_mod=mask_mod, seq_lengths=(qmax, lmax))
    try:
        return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, compute_q_blocks=False, **kw)
    except TypeError:  # a torch without compute_q_blocks
        return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, **kw)
