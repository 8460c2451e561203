"""Causal and non-causal groups of one batch, for libraries that take one causality per call.

flash-attn's ``causal`` flag (``flash_attn_varlen_func``) and xformers' paged bias type
(``PagedBlockDiagonalCausalWithOffsetPaddedKeysMask`` or ``PagedBlockDiagonalPaddedKeysMask``)
hold for every request of a call. A batch that mixes causal prefills with non-causal
(bidirectional) ones runs as two calls, one per group, as an engine serving that batch would
launch them (issue 32). The split is plan work; the run step only gathers a group's queries,
calls the library and writes the group's output into the batch's packed output:

- ``split_requests`` (host only, for ``unsupported`` and ``plan``): which requests go to which
  call. Decodes (one query token) see every key under either flag: they join the causal
  group. Only prefills can be non-causal (``BatchSpec`` refuses the flag elsewhere); chains in
  flash-attn's varlen call are causal rows.
- ``causal_groups`` (plan): each group's lengths, cumulative lengths, block-table rows and
  where its rows sit in the packed output: one run of rows (``rows``, a slice: the queries are
  a view) or packed token ids (``tok``: the queries are gathered).
- ``take`` / ``put`` (run): the group's queries; its output written into the packed output.
  Neither library's call takes an output tensor (flash-attn 2.8.3's ``flash_attn_varlen_func``
  passes ``out=None`` to its kernel; xformers 0.0.35's ``memory_efficient_attention_forward``
  has no ``out``), so a split batch pays one copy of each group's output (``put``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from attnbench.workload.batch import Batch

from ._metadata import cu_seqlens, token_ids

#: appended to a route's name (the row's ``mode``) when its batch runs as two calls
TWO_CALLS = "two calls: causal + non-causal"


@dataclass
class Group:
    """One library call's requests; ``Bg`` requests, ``Ng`` query tokens, tensors on the
    batch's device (host arrays int64)."""

    causal: bool  # the call's causality flag
    reqs: np.ndarray  # [Bg] request indices, in batch order
    query_lens: np.ndarray  # [Bg]
    kv_lens: np.ndarray  # [Bg]
    rows: Optional[slice]  # the group's rows of the packed q / output when they are one run
    tok: Optional[torch.Tensor]  # [Ng] int64 packed token ids when they are not (else None)
    whole: bool  # every query token of the batch, in order: the call's output is the batch's
    cu_q: torch.Tensor  # [Bg + 1] int32
    cu_k: torch.Tensor  # [Bg + 1] int32
    max_q: int
    max_k: int
    block_table: torch.Tensor  # [Bg, max_pages] int32 (the batch's own when ``whole``)


def noncausal(batch: Batch, reqs: np.ndarray) -> np.ndarray:
    """``[len(reqs)]`` bool: the requests a causal flag would compute wrongly (non-causal
    prefills of more than one query token)."""
    h = batch.host
    return ~h.causal[reqs] & (h.query_lens[reqs] > 1)


def split_requests(batch: Batch, reqs: Optional[np.ndarray] = None) -> list[tuple[bool, np.ndarray]]:
    """``[(causal, request indices)]``: one entry when the requests ``reqs`` (default: all)
    take one causality, else the causal group then the non-causal group. Host arrays only."""
    reqs = np.arange(batch.num_requests) if reqs is None else np.asarray(reqs, dtype=np.int64)
    nc = noncausal(batch, reqs)
    causal_prefill = ~nc & (batch.host.query_lens[reqs] > 1)
    if not (nc.any() and causal_prefill.any()):
        return [(not nc.any(), reqs)]
    return [(True, reqs[~nc]), (False, reqs[nc])]


def causal_groups(batch: Batch, reqs: Optional[np.ndarray] = None) -> list[Group]:
    """The calls of ``split_requests(batch, reqs)`` with their launch metadata (plan step)."""
    return [_group(batch, causal, r) for causal, r in split_requests(batch, reqs)]


def _group(batch: Batch, causal: bool, reqs: np.ndarray) -> Group:
    h, dev = batch.host, batch.device
    q, kv = h.query_lens[reqs], h.kv_lens[reqs]
    every = len(reqs) == batch.num_requests  # reqs are in batch order: all of them is the batch
    one_run = len(reqs) > 0 and int(reqs[-1] - reqs[0]) == len(reqs) - 1
    rows = slice(int(h.query_start_loc[reqs[0]]), int(h.query_start_loc[reqs[-1] + 1])) if one_run else None
    return Group(
        causal=causal,
        reqs=reqs,
        query_lens=q,
        kv_lens=kv,
        rows=rows,
        tok=None if one_run else torch.from_numpy(token_ids(batch, reqs)).to(dev),
        whole=every,
        cu_q=cu_seqlens(q, dev),
        cu_k=cu_seqlens(kv, dev),
        max_q=int(q.max()),
        max_k=int(kv.max()),
        block_table=batch.block_table if every else batch.block_table[torch.from_numpy(reqs).to(dev)].contiguous(),
    )


def take(x: torch.Tensor, g: Group) -> torch.Tensor:
    """The group's rows of the packed ``x`` (``[N, ...]``): a view when they are one run."""
    if g.whole:
        return x
    return x[g.rows] if g.rows is not None else x[g.tok]


def put(out: Optional[torch.Tensor], g: Group, o: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Write the group's output ``o`` into the packed output ``out`` (made like ``like`` when
    None; ``o`` itself when the group is the whole batch) and return it. The one copy of a
    split batch: the libraries' calls take no output tensor (module docstring)."""
    if g.whole:
        return o
    if out is None:
        out = torch.empty_like(like)
    if g.rows is not None:
        out[g.rows] = o
    else:
        out[g.tok] = o
    return out
