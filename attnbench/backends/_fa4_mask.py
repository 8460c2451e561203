"""FlashAttention-4's mask for trees (and for batches that mix causal and non-causal prefills,
or hold a window on tree nodes): the tables its ``mask_mod`` reads, built in ``plan``.

FlashAttention-4 4.0.0b36 calls a ``mask_mod`` as ``mask_mod(batch_idx, head_idx, q_idx, kv_idx,
seqlen_info, aux_tensors)`` (``flash_attn/cute/mask.py``, ``call_mask_mod``) on every element of
every key tile (a ``mask_mod`` turns its causal and window masks off:
``interface.py``, ``_resolve_causal_local_window``). With ``cu_seqlens_q`` and a ``page_table``,
``batch_idx`` is the request, ``q_idx`` the query's index inside it and ``kv_idx`` the key's
logical slot in it. It may call the ``mask_mod`` for rows past a request's queries (the rest of
its last query tile; with GQA packing ``q_idx`` is the packed row over the group size) and, in
the last key tile, for slots up to one tile past its keys: the tables below are padded so that
every such read stays inside them (their results are masked or dropped by the kernel).

Per row (``[B, Qpad]`` int32 each, ``rows[0..3]``):
- ``lo``: the first visible slot (the window's start on positions; 0 without a window);
- ``hi``: the last visible slot outside a tree (``C + i`` causal, ``L - 1`` non-causal,
  ``C - 1`` for a tree node; -1 for a padding row);
- ``base``: a tree row's first tree slot (``C``), 0 for the others;
- ``off``: where the row's entries start in ``seen``: ``seen[off + kv - base]`` is 1 when tree
  slot ``kv`` is the node itself or one of its ancestors (and, with a window, within it).
``seen`` is one flat int32 table: ``Lmax`` zeros (so that ``off + kv - base`` stays >= 0 for the
context slots of a tree row), each tree request's ``[T, T]`` ancestor mask (the window folded in
on depths), then ``Lmax`` + ``KEY_PAD`` zeros that every non-tree row reads (its tree term is
always 0). A key is visible when ``lo <= kv <= hi`` or (``kv >= base`` and its ``seen`` entry is
1): docs/semantics.md "Visibility". :func:`visible` is that predicate in torch (for tests on a
CPU); :func:`cute_mask_mod` the same arithmetic in the CuTe DSL (``_fa4_cute.py``),
which FlashAttention-4 compiles.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnbench.workload.batch import Batch, node_depths

ROW_PAD = 384  # rows past a request's queries the kernel may evaluate (one query tile of up to 2 x 192 rows)
KEY_PAD = 256  # slots past a request's keys in its last key tile (a key tile is at most 192 wide)


@dataclass
class MaskTables:
    """The ``mask_mod``'s aux tensors: ``rows`` ``[4, B, Qpad]`` int32 (lo, hi, base, off) and
    ``seen`` (flat int32), on the batch's device; ``host``: the rows as numpy arrays."""

    rows: torch.Tensor
    seen: torch.Tensor
    host: dict

    def aux(self) -> list[torch.Tensor]:
        """The tensors in the order the ``mask_mod`` reads them."""
        return [self.rows[0], self.rows[1], self.rows[2], self.rows[3], self.seen]


def _row_depths(batch: Batch, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``([B, width] depth of each tree row (0 elsewhere), [Bt, T] depths of the tree nodes)``."""
    t = batch.trees
    out = np.zeros((batch.num_requests, width), dtype=np.int64)
    if not t.tmax:
        return out, np.zeros((0, 1), dtype=np.int64)
    d = node_depths(t.parents_host)[:, : t.tmax]
    out[t.reqs, : t.tmax] = d
    return out, d


def build_tables(batch: Batch) -> MaskTables:
    """The tables for ``batch`` (docstring above), by array ops on the host lengths, one copy of
    the rows to the device; the tree entries from the batch's ancestor masks (cached per
    topology for static trees) by a few tensor ops on the device."""
    from ._metadata import tree_masks

    h, t = batch.host, batch.trees
    qpad = -(-(int(h.query_lens.max()) + ROW_PAD) // 8) * 8  # a multiple of 8: each row table 32-byte aligned
    lmax = int(h.kv_lens.max())
    q, c, kv = h.query_lens[:, None], h.context_lens[:, None], h.kv_lens[:, None]
    tree, causal = h.is_tree[:, None], h.causal[:, None]
    qi = np.arange(qpad)[None, :]
    real = qi < q
    depth, node_depth = _row_depths(batch, qpad)
    qpos = c + np.where(tree, depth, qi)
    hi = np.where(real, np.where(tree, c - 1, np.where(causal, c + qi, kv - 1)), -1)
    lo = np.zeros_like(hi) if batch.window is None else np.where(real, np.maximum(qpos - batch.window + 1, 0), 0)
    base = np.where(real & tree, c, 0)
    tmax = t.tmax
    slot = np.zeros(batch.num_requests, dtype=np.int64)  # each tree request's index among the trees
    slot[t.reqs] = np.arange(len(t.reqs))
    zero = lmax + len(t.reqs) * tmax * tmax  # where the zeros every non-tree row reads start
    off = np.where(real & tree, lmax + (slot[:, None] * tmax + qi) * tmax, zero)
    rows = np.stack([lo, hi, base, off]).astype(np.int32)
    seen = torch.zeros(zero + lmax + KEY_PAD, dtype=torch.int32, device=batch.device)
    if tmax:
        vis = tree_masks(batch)  # [Bt, T, T]: node i sees j (itself and its ancestors)
        if batch.window is not None:
            dep = torch.from_numpy(node_depth).to(batch.device)
            vis = vis & (dep[:, None, :] > dep[:, :, None] - batch.window)
        seen[lmax:zero] = vis.reshape(-1).to(torch.int32)
    host = {"lo": rows[0], "hi": rows[1], "base": rows[2], "off": rows[3]}
    return MaskTables(torch.from_numpy(rows).to(batch.device), seen, host)


def visible(tables: MaskTables, b: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """The ``mask_mod``'s predicate in torch, on index tensors (broadcast together): the same
    reads and arithmetic as :func:`cute_mask_mod`."""
    rows = tables.rows.long()
    lo, hi, base, off = (rows[k][b, q] for k in range(4))
    seen = tables.seen.long()[off + kv - base]
    return ((kv >= lo) & (kv <= hi)) | ((kv >= base) & (seen > 0))


def cute_mask_mod():
    """The ``mask_mod`` FlashAttention-4 compiles: :func:`visible` in the CuTe DSL, on the aux
    tensors of :meth:`MaskTables.aux` (``_fa4_cute.py``, imported here: it needs the CuTe DSL)."""
    from ._fa4_cute import attnbench_tree_mask

    return attnbench_tree_mask
