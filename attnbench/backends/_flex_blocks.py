"""Flex's per-row tables and its ``BlockMask`` built from per-block KV indices.

An engine with paged attention knows, per request, which KV blocks a query block reads and
which of them are fully visible: the causal limit, the window and the tree region are
intervals per query row. So instead of evaluating the ``mask_mod`` over the whole padded
``[Qmax, Lmax]`` grid (``create_block_mask``: 21-28 ms per step on an H100 for the shipped
cases), the block mask is classified from those intervals and handed to
``BlockMask.from_kv_blocks``; the ``mask_mod`` then decides only inside partial blocks. The
intervals and the block lists are computed by array ops on the host copies of the lengths (as
an engine builds its step metadata) and reach the device in a few copies: a first version with
the same math as ~60 small device ops took 1.2-2.6 ms per plan on an H100.

Row tables (``[B, Qmax]`` int32 on the batch's device; padding rows see key 0 only):
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
from typing import Any, Optional

import numpy as np
import torch

from attnbench.workload.batch import Batch

from ._metadata import padded_tree_masks

FAR = 1 << 30
ALIGN = 32  # int32 elements: 128 bytes between the block-list tensors in their one device buffer


@dataclass
class RowTables:
    """Device tensors for the mask_mod; ``host``: the same intervals as numpy arrays, from which
    the block lists are classified on the CPU (an engine's host-side metadata step)."""

    lo: torch.Tensor  # [B, Qmax] int32
    hi: torch.Tensor  # [B, Qmax] int32
    tree_base: torch.Tensor  # [B, Qmax] int32
    tree_anc: torch.Tensor  # [B, Qmax, Tmax] bool
    tmax: int
    qpos: torch.Tensor  # [B, Qmax] int32
    kpos: Optional[torch.Tensor]  # [B, Lmax] int32 (only with a window or ALiBi)
    kv_len: torch.Tensor  # [B] int32
    real: torch.Tensor  # [B, Qmax] bool
    host: dict  # "lo", "hi", "tree_base", "kv_len": numpy int64; "real": numpy bool


def _depths(batch: Batch, qmax: int) -> np.ndarray:
    """``[B, Qmax]`` int64: each tree node's depth (0 elsewhere), from the padded parent arrays
    by repeated gathers (max_depth + 1 rounds of array ops, no loop over requests)."""
    t = batch.trees
    out = np.zeros((batch.num_requests, qmax), dtype=np.int64)
    if not t.tmax:
        return out
    par = t.parents_host.astype(np.int64)
    d = np.zeros_like(par)
    for _ in range(t.max_depth + 1):
        d = np.where(par >= 0, np.take_along_axis(d, np.maximum(par, 0), 1) + 1, 0)
    out[t.reqs, : par.shape[1]] = d[:, :qmax]
    return out


def row_tables(batch: Batch, qmax: int, lmax: int, need_kpos: Optional[bool] = None) -> RowTables:
    h, dev = batch.host, batch.device
    q, c, kv = h.query_lens[:, None], h.context_lens[:, None], h.kv_lens[:, None]
    tree, causal = h.is_tree[:, None], h.causal[:, None]
    qi = np.arange(qmax)[None, :]
    real = qi < q
    depth = _depths(batch, qmax)
    qpos = np.where(real, c + np.where(tree, depth, qi), 0)
    hi = np.where(real, np.where(tree, c - 1, np.where(causal, c + qi, kv - 1)), 0)
    base = np.where(real & tree, c, FAR)
    lo = np.zeros_like(hi)
    if batch.window is not None:
        # the first slot whose position is > p - W: context slots are their positions; for a tree
        # row that bounds the context, and kpos bounds its tree keys in the mask_mod
        lo = np.where(real, np.maximum(qpos - batch.window + 1, 0), 0)
    # int32, as the mask_mod's indices are: Flex's FLASH backend lowers the mask_mod to the CuTe
    # DSL, which refused an int64 table index stored into its int32 index tensor (torch 2.11, H200)
    rows = torch.from_numpy(np.stack([lo, hi, base, qpos]).astype(np.int32)).to(dev)  # one copy to the device
    kpos = None
    if need_kpos if need_kpos is not None else (batch.window is not None or batch.alibi_slopes is not None):
        j = np.arange(lmax)[None, :]
        rel = j - c
        in_tree = tree & (rel >= 0) & (rel < q)
        kpos = np.where(in_tree, c + np.take_along_axis(depth, np.clip(rel, 0, qmax - 1), 1), j)
        kpos = torch.from_numpy(kpos.astype(np.int32)).to(dev)
    tmax = max(batch.trees.tmax, 1)
    anc = padded_tree_masks(batch, qmax, tmax)  # [B, Qmax, Tmax]: ancestors incl. self
    return RowTables(rows[0], rows[1], rows[2], anc, tmax, rows[3], kpos, batch.kv_lens.int(),
                     torch.from_numpy(real).to(dev), {"lo": lo, "hi": hi, "tree_base": base, "kv_len": h.kv_lens,
                                                      "real": real})


def make_mask_mod(t: RowTables, window: Any):
    lo, hi, base, anc, tmax, qpos, kpos, kv_len = t.lo, t.hi, t.tree_base, t.tree_anc, t.tmax, t.qpos, t.kpos, t.kv_len
    if window is not None and kpos is None:
        raise ValueError("row_tables built without key positions, but the batch has a window")

    trees = bool((t.host["tree_base"] != FAR).any())

    # torch.where rather than clamp: Flex's FLASH backend renders the mask_mod in the CuTe DSL,
    # whose lowering has no maximum/minimum (torch 2.11 on the H200: "UNSUPPORTED CUTEDSL
    # OPERATION: 'maximum'"); a batch without a tree leaves the ancestor lookup out
    def mask_mod(b, h, q_idx, kv_idx):
        ok = (kv_idx < kv_len[b]) & (kv_idx >= lo[b, q_idx])
        if not trees:
            return window_ok(ok & (kv_idx <= hi[b, q_idx]), b, q_idx, kv_idx)
        rel = kv_idx - base[b, q_idx]
        col = torch.where(rel < 0, 0, torch.where(rel > tmax - 1, tmax - 1, rel))
        in_tree = (rel >= 0) & anc[b, q_idx, col]
        return window_ok(ok & ((kv_idx <= hi[b, q_idx]) | in_tree), b, q_idx, kv_idx)

    def window_ok(ok, b, q_idx, kv_idx):
        if window is not None:
            ok = ok & (kpos[b, kv_idx] > qpos[b, q_idx] - window)
        return ok

    return mask_mod


def _per_block(x: np.ndarray, block: int, fill: int, reduce: str) -> np.ndarray:
    """``[B, Qmax]`` -> ``[B, nQB]``: min or max over each query block (rows past Qmax = fill)."""
    b, q = x.shape
    nqb = -(-q // block)
    padded = np.full((b, nqb * block), fill, dtype=np.int64)
    padded[:, :q] = x
    v = padded.reshape(b, nqb, block)
    return v.min(-1) if reduce == "min" else v.max(-1)


def kv_block_lists(t: RowTables, lmax: int, q_block: int, kv_block: int) -> tuple[torch.Tensor, ...]:
    """``(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)`` with a head axis of 1,
    int32 on the device, classified on the host from the row intervals: a KV block is *full* for
    a query block when every row sees every key of it (no tree region, wholly inside each row's
    ``[lo, hi]`` and the kv length), *partial* when some row may see some key of it (the
    mask_mod decides there); padding rows are left out (their output is dropped, and a
    fully padded query block reads nothing). One copy to the device; every tensor has row-major strides, its
    size-1 head axis included (``_flex_audit.stride_problems``)."""
    lo, hi, base = t.host["lo"], t.host["hi"], t.host["tree_base"]
    nkb = -(-lmax // kv_block)
    k0 = np.arange(nkb)[None, None, :] * kv_block
    k1 = np.minimum(k0 + kv_block, lmax) - 1
    # Only real rows count: a padding row (key 0 for the mask_mod) is dropped from the output, so
    # it need not shape the lists. Counting its key 0 made a windowed decode's query block read
    # every block from 0 to its position, and its hi = 0 kept every block of a query block with
    # padding rows partial. A query block of padding rows only reads nothing (output 0).
    real = t.host["real"]
    lo_min = _per_block(np.where(real, lo, FAR), q_block, FAR, "min")[..., None]
    lo_max = _per_block(np.where(real, lo, -1), q_block, -1, "max")[..., None]
    hi_min = _per_block(np.where(real, hi, FAR), q_block, FAR, "min")[..., None]
    hi_max = _per_block(np.where(real, hi, -1), q_block, -1, "max")[..., None]
    base_min = _per_block(base, q_block, FAR, "min")[..., None]
    base_max = _per_block(np.where(base < FAR, base + t.tmax - 1, -1), q_block, -1, "max")[..., None]
    kv_len = t.host["kv_len"][:, None, None]
    touches_tree = (base_min <= k1) & (base_max >= k0)
    some = (((lo_min <= k1) & (hi_max >= k0)) | touches_tree) & (k0 < kv_len)
    has_real = _per_block(real.astype(np.int64), q_block, 0, "max")[..., None] > 0
    full = has_real & (lo_max <= k0) & (hi_min >= k1) & (k1 < kv_len) & ~touches_tree & (k1 - k0 + 1 == kv_block)
    partial = some & ~full
    b, nqb = partial.shape[:2]
    parts = [partial.sum(-1), np.argsort(~partial, axis=-1, kind="stable"),
             full.sum(-1), np.argsort(~full, axis=-1, kind="stable")]
    shapes = [(b, 1, nqb), (b, 1, nqb, nkb), (b, 1, nqb), (b, 1, nqb, nkb)]
    # One host buffer, one copy to the device, then row-major views: the Triton kernel finds a
    # batch row's lists at (z * H + h) * stride(head axis) and so needs the head axis's stride
    # to be the row-major one even though that axis has size 1 (numpy's x[:, None] gives it
    # stride 0, which PyTorch still calls contiguous: every row then read row 0's lists, issue
    # 32). Each part starts 128 bytes apart so that none is misaligned for the kernel.
    sizes = [int(np.prod(s)) for s in shapes]
    starts = np.concatenate([[0], np.cumsum([-(-n // ALIGN) * ALIGN for n in sizes])])
    host = np.zeros(int(starts[-1]), dtype=np.int32)
    for part, s0, n in zip(parts, starts, sizes):
        host[s0:s0 + n] = part.reshape(-1)
    dev = torch.from_numpy(host).to(t.lo.device)
    kv_num, kv_idx, full_num, full_idx = (dev[s0:s0 + n].view(s) for s0, n, s in zip(starts, sizes, shapes))
    return kv_num, kv_idx, full_num, full_idx


def block_mask_from_kv_blocks(t: RowTables, qmax: int, lmax: int, mask_mod, block: int = 128) -> Any:
    """Flex's ``BlockMask`` from :func:`kv_block_lists` (forward only: no transposed lists)."""
    from torch.nn.attention.flex_attention import BlockMask

    from ._flex_audit import stride_problems

    kv_num, kv_idx, full_num, full_idx = kv_block_lists(t, lmax, block, block)
    kw = dict(BLOCK_SIZE=(block, block), mask_mod=mask_mod, seq_lengths=(qmax, lmax))
    try:
        bm = BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, compute_q_blocks=False, **kw)
    except TypeError:  # a torch without compute_q_blocks
        bm = BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, **kw)
    bad = stride_problems(bm)
    if bad:  # the fused kernel would read the wrong batch rows' lists
        raise RuntimeError("flex block mask with strides the kernel does not expect: " + "; ".join(bad))
    return bm
