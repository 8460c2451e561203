"""Which keys a query sees, and where tokens sit (docs/semantics.md "Masks", "Positions",
"Sliding window", "ALiBi"): per request, on the CPU, as the reference and the counting read them.

Positions: context slot j is at position j; a prefill's (or decode's) i-th new token at C + i;
a tree node at C + its depth (its slot stays C + i). A query at position p sees a key at
position j only if the causal/tree rule lets it and, with a window W, j > p - W.
"""
from __future__ import annotations

from typing import Optional

import torch

from attnbench.workload.spec import Request
from attnbench.workload.trees import ancestor_mask, depths


def query_positions(r: Request) -> torch.Tensor:
    """``[Q]`` int64: the absolute position of each query token of ``r``."""
    if r.tree_parents is not None:
        return r.context + torch.tensor(depths(r.tree_parents), dtype=torch.long)
    return r.context + torch.arange(r.query, dtype=torch.long)


def key_positions(r: Request) -> torch.Tensor:
    """``[L]`` int64: the position of the token in each logical slot of ``r`` (context slots
    are their own positions; the new tokens' slots hold the query tokens, so outside a tree slot j
    is at position j, also when a non-causal request has more queries than keys, context < 0)."""
    if r.tree_parents is None:
        return torch.arange(r.kv_len, dtype=torch.long)
    return torch.cat([torch.arange(r.context, dtype=torch.long), query_positions(r)])


def request_mask(r: Request, window: Optional[int] = None) -> torch.Tensor:
    """``[Q, L]`` bool: causal bottom-right for prefill/decode, every key of the request for a
    non-causal prefill, prefix + ancestors for trees; AND the window on positions."""
    q_idx = torch.arange(r.query).unsqueeze(1)
    k_idx = torch.arange(r.kv_len).unsqueeze(0)
    if r.tree_parents is not None:
        m = torch.zeros(r.query, r.kv_len, dtype=torch.bool)
        m[:, : r.context] = True
        m[:, r.context :] = ancestor_mask(r.tree_parents)
    elif r.causal:
        m = k_idx <= r.context + q_idx
    else:
        m = torch.ones(r.query, r.kv_len, dtype=torch.bool)
    if window is not None:
        m &= key_positions(r)[None, :] > query_positions(r)[:, None] - window
    return m


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """``[H]`` float32: ALiBi's head slopes. For H a power of two, head h (0-based) gets
    ``2 ** (-8 * (h + 1) / H)``; otherwise the slopes of the power of two below H, followed by
    every other slope of twice that power (the ALiBi paper's construction)."""

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    low = 1 << (num_heads.bit_length() - 1)
    slopes = geometric(low)
    if low != num_heads:
        slopes += geometric(2 * low)[0::2][: num_heads - low]
    return torch.tensor(slopes, dtype=torch.float32)


def visible_pairs(r: Request, window: Optional[int] = None) -> int:
    """How many (query, key) pairs of ``r`` the mask allows (closed form; tested against
    ``request_mask``). With a window every query sees at most W keys (causal/tree)."""
    c, q, w = r.context, r.query, window
    if r.tree_parents is not None:
        ds = depths(r.tree_parents)
        if w is None:
            return q * c + sum(d + 1 for d in ds)
        return sum(min(c, max(0, w - d - 1)) + min(d + 1, w) for d in ds)
    if not r.causal:
        if w is None:
            return q * r.kv_len
        n0 = min(max(w - c, 0), q)  # queries i < W - C see the whole request
        cut = (q - n0) * (c - w + 1) + (q - 1 + n0) * (q - n0) // 2  # sum of C + i - W + 1 over the rest
        return q * r.kv_len - cut
    if w is None:
        return q * c + q * (q + 1) // 2
    n1 = min(max(w - c, 0), q)  # queries whose C + i + 1 keys all fit in the window
    return n1 * c + n1 * (n1 + 1) // 2 + (q - n1) * w


def first_needed_slot(r: Request, window: Optional[int] = None) -> int:
    """The lowest logical slot any query of ``r`` sees: 0 without a window; with a window W,
    the first query (or the tree's root, at position C) sees keys from position C - W + 1 on,
    so the slots below ``max(0, C - W + 1)`` are never read. Every slot from it to kv_len - 1
    is seen by some query (each new token sees itself)."""
    if window is None:
        return 0
    return max(0, r.context - window + 1)
