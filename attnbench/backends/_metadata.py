"""Per-step metadata every backend's plan derives from the batch, by array and tensor ops.

No function here loops over requests or tree nodes in Python: lengths come from the batch's
host arrays (``batch.host``, numpy, as an engine keeps them), index tensors are built from
them in one go, and tree masks come from the parent arrays (``batch.trees``):

- static trees (known at start-up): :func:`topology_masks` builds the ancestor masks of a
  batch's distinct topologies once, cached by (parent arrays, size, device); a plan only
  gathers them per request (:func:`tree_masks`);
- dynamic trees: :func:`tree_masks` rebuilds them in every plan from the padded parent
  array, by pointer doubling on the batch's device (``trees.ancestor_masks``).
"""
from __future__ import annotations

import numpy as np
import torch

from attnbench.workload.batch import Batch
from attnbench.workload.tokens import token_ids, topology_masks  # noqa: F401  (the backends' metadata)
from attnbench.workload.trees import ancestor_masks


def cu_seqlens(lengths: np.ndarray, device) -> torch.Tensor:
    """``[len + 1]`` int32 cumulative sums on ``device``."""
    t = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=t[1:])
    return torch.from_numpy(t).to(device)


def tree_masks(batch: Batch) -> torch.Tensor:
    """``[Bt, Tmax, Tmax]`` bool on the batch's device: each tree request's ancestor mask
    (padding rows and columns see only themselves). Static trees: a gather from the cached
    per-topology table; dynamic trees: rebuilt from the parent arrays."""
    t = batch.trees
    if t.dynamic:
        return ancestor_masks(t.parents, t.max_depth)
    return topology_masks(t.topologies, t.tmax, str(batch.device))[t.topology_id_t]


def padded_tree_masks(batch: Batch, rows: int, cols: int) -> torch.Tensor:
    """``[B, rows, cols]`` bool on the batch's device: request i's tree mask in its top-left
    corner (zeros for non-tree requests; a row past a tree's end sees only itself, or nothing
    past the largest tree). ``rows``, ``cols`` >= the largest tree."""
    t = batch.trees
    out = torch.zeros(batch.num_requests, rows, cols, dtype=torch.bool, device=batch.device)
    if t.tmax:
        out[t.reqs_t, : t.tmax, : t.tmax] = tree_masks(batch)
    return out


def hidden_entries(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(req, q, k, hidden)``, flat tensors on the batch's device: the only entries of the
    requests' ``[Q, L]`` masks that can be False (docs/semantics.md "Masks") are in each tree's
    ``[T, T]`` block and in each prefill's causal ``[Q, Q]`` triangle; these are the points of
    those blocks (request, query index, logical key slot) and whether the mask hides each.
    Every other entry of a request's block is True. A few padded grids, no per-request loop."""
    h, t = batch.host, batch.trees
    dev = batch.device
    parts = []
    if t.tmax:
        j = torch.arange(t.tmax, device=dev)
        size = torch.from_numpy(t.sizes).to(dev)[:, None, None]
        ctx = batch.context_lens.long()[t.reqs_t][:, None, None]
        hidden = (j[None, :, None] < size) & (j[None, None, :] < size) & ~tree_masks(batch)
        parts.append((t.reqs_t[:, None, None], j[None, :, None], ctx + j[None, None, :], hidden))
    sel = np.flatnonzero(~h.is_tree & (h.query_lens > 1) & h.causal)  # causal prefills: their triangles
    if len(sel):
        qm = int(h.query_lens[sel].max())
        j = torch.arange(qm, device=dev)
        sel_t = torch.from_numpy(sel).to(dev)
        size = batch.query_lens.long()[sel_t][:, None, None]
        ctx = batch.context_lens.long()[sel_t][:, None, None]
        hidden = (j[None, None, :] > j[None, :, None]) & (j[None, None, :] < size)
        parts.append((sel_t[:, None, None], j[None, :, None], ctx + j[None, None, :], hidden))
    if not parts:
        empty = torch.zeros(0, dtype=torch.long, device=dev)
        return empty, empty, empty, empty.bool()
    req, q, k, hidden = (torch.cat([p[c].expand_as(p[3]).reshape(-1) for p in parts]) for c in range(4))
    return req, q, k, hidden


def _clear(base: torch.Tensor, index: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """``base`` (a fresh flat bool tensor) with the ``hidden`` entries at ``index`` cleared, in
    place (on a GPU the selection waits for the device once, as the library's plan does)."""
    base[index[hidden]] = False
    return base


def custom_mask_flat(batch: Batch) -> torch.Tensor:
    """Every request's ``[Q, L]`` mask, flattened row-major and concatenated (FlashInfer's
    ``custom_mask``), bool on the batch's device: all True, then the hidden entries cleared."""
    h = batch.host
    sizes = h.query_lens * h.kv_lens
    total = int(sizes.sum())
    dev = batch.device
    req, q, k, hidden = hidden_entries(batch)
    start = torch.from_numpy(np.cumsum(sizes) - sizes).to(dev)
    flat = start[req] + q * batch.kv_lens.long()[req] + k
    return _clear(torch.ones(total, dtype=torch.bool, device=dev), flat, hidden)


def dense_masks(batch: Batch) -> torch.Tensor:
    """``[B, Qmax, Lmax]`` bool on the batch's device: which logical key slots each query sees
    (the causal / non-causal / tree rule and the window), False past a request's query or kv
    length."""
    h = batch.host
    dev = batch.device
    b, qmax, lmax = batch.num_requests, int(h.query_lens.max()), int(h.kv_lens.max())
    q = torch.arange(qmax, device=dev)[None, :, None]
    k = torch.arange(lmax, device=dev)[None, None, :]
    inside = (q < batch.query_lens.long()[:, None, None]) & (k < batch.kv_lens.long()[:, None, None])
    req, qi, ki, hidden = hidden_entries(batch)
    flat = (req * qmax + qi) * lmax + ki
    m = _clear(inside.reshape(-1), flat, hidden).view(b, qmax, lmax)
    if batch.window is not None:
        qpos, kpos = padded_positions(batch, qmax, lmax)
        m &= kpos[:, None, :] > qpos[:, :, None] - batch.window
    return m


def padded_positions(batch: Batch, qmax: int, lmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(query positions [B, qmax], key positions [B, lmax])`` int64 on the batch's device
    (docs/semantics.md "Positions"): a prefill/decode token at C + i, a tree node at C + its
    depth (the ancestor-mask row's count - 1), a context slot j at j; a key slot C + i holds
    query token i, so it has that token's position. Padding entries hold arbitrary values."""
    dev = batch.device
    ctx = batch.context_lens.long()[:, None]
    depth = torch.arange(qmax, device=dev)[None, :].expand(batch.num_requests, qmax).clone()
    t = batch.trees
    if t.tmax:
        d = tree_masks(batch).sum(-1) - 1  # [Bt, Tmax]
        n = min(t.tmax, qmax)
        depth[t.reqs_t, :n] = d[:, :n]
    qpos = ctx + depth
    j = torch.arange(lmax, device=dev)[None, :]
    own = (j - ctx).clamp(0, qmax - 1)
    kpos = torch.where(j < ctx, j, qpos.gather(1, own))
    return qpos, kpos


def flashinfer_page_layout(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(indptr [B+1], indices [sum pages], last_page_len [B])`` int32: indptr and
    last_page_len on the CPU, indices gathered from the block table on the batch's device.

    Request i uses pages ``block_table[i, :ceil(kv_len / page)]``; its last page holds
    ``kv_len - (pages - 1) * page`` tokens (1..page)."""
    ps = batch.page_size
    kv = batch.host.kv_lens
    pages = -(-kv // ps)
    indptr = np.zeros(len(kv) + 1, dtype=np.int64)
    np.cumsum(pages, out=indptr[1:])
    width = batch.block_table.shape[1]
    flat = np.repeat(np.arange(len(kv)) * width - indptr[:-1], pages) + np.arange(int(indptr[-1]))
    indices = batch.block_table.reshape(-1)[torch.from_numpy(flat).to(batch.device)]
    last = kv - (pages - 1) * ps
    return torch.from_numpy(indptr.astype(np.int32)), indices, torch.from_numpy(last.astype(np.int32))


def slots_of(batch: Batch, reqs: np.ndarray, first: np.ndarray, count: np.ndarray, width: int) -> torch.Tensor:
    """``[len(reqs), width]`` long on the batch's device: the physical cache rows (in
    ``k_cache.view(-1, Hkv, D)``) of logical slots ``first .. first + count - 1`` of each
    request; positions past ``count`` hold 0 (a valid row, masked or dropped by the caller)."""
    dev = batch.device
    ps = batch.page_size
    j = np.arange(width)
    valid = j[None, :] < count[:, None]
    logical = torch.from_numpy(np.where(valid, first[:, None] + j[None, :], 0)).to(dev)
    table = batch.block_table[torch.from_numpy(reqs).to(dev)].long()
    phys = table.gather(1, logical // ps) * ps + logical % ps
    return phys * torch.from_numpy(valid).to(dev)
