"""Layout conversions shared by the backends that cannot read a paged cache (SDPA, Flex).

Their plan step gathers each request's K/V out of the pages into a dense layout; that copy
is part of what the plan time measures, and their kernel time then reads contiguous K/V.
"""
from __future__ import annotations

import torch

from attnbench.workload.batch import Batch


def gather_padded_kv(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``k, v`` as ``[B, Hkv, Lmax, D]``; rows past each kv_len are left as gathered garbage."""
    b = batch.num_requests
    lmax = batch.max_kv_len
    ps = batch.page_size
    npages = -(-lmax // ps)
    pages = batch.block_table[:, :npages].long()  # [B, npages]
    k = batch.k_cache[pages].reshape(b, npages * ps, batch.num_kv_heads, batch.head_dim)[:, :lmax]
    v = batch.v_cache[pages].reshape(b, npages * ps, batch.num_kv_heads, batch.head_dim)[:, :lmax]
    return k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()


def padded_mask(batch: Batch) -> torch.Tensor:
    """``[B, 1, Qmax, Lmax]`` bool on the batch's device. Padding rows see key 0 (never all-False)."""
    b, qmax, lmax = batch.num_requests, batch.max_query_len, batch.max_kv_len
    m = torch.zeros(b, 1, qmax, lmax, dtype=torch.bool)
    for i, r in enumerate(batch.requests):
        m[i, 0, : r.query, : r.kv_len] = batch.mask(i)
        m[i, 0, r.query :, 0] = True
    return m.to(batch.device)


def token_index(batch: Batch) -> torch.Tensor:
    """Flat index into ``[B * Qmax]`` of every real query token, in packed order."""
    qmax = batch.max_query_len
    idx = [i * qmax + torch.arange(r.query) for i, r in enumerate(batch.requests)]
    return torch.cat(idx).to(batch.device)


def padded_queries(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed queries as ``[B, Hq, Qmax, D]`` (zeros in the padding) and their
    :func:`token_index`, which :func:`unpad_output` takes back."""
    b, qmax, hq, d = batch.num_requests, batch.max_query_len, batch.num_q_heads, batch.head_dim
    index = token_index(batch)
    q = batch.q.new_zeros(b * qmax, hq, d)
    q[index] = batch.q
    return q.reshape(b, qmax, hq, d).transpose(1, 2), index


def unpad_output(o: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """``[B, Hq, Qmax, D]`` -> the packed ``[N, Hq, D]`` (``index`` None: nothing was padded)."""
    b, hq, qmax, d = o.shape
    o = o.transpose(1, 2).reshape(b * qmax, hq, d)
    return o if index is None else o[index]
