"""PyTorch scaled_dot_product_attention on K/V gathered out of the pages in ``plan``.

One SDPA call for the whole batch, padded to ``[B, H, Qmax/Lmax, D]``. Uniform batches need no
mask (equal-length decode) or a plain causal one (equal-length prefill without context),
which lets PyTorch pick its flash kernel; any other batch (mixed lengths, chunked prefill,
trees) passes a boolean mask, which PyTorch runs with its memory-efficient or math kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from attnbench.backend import Backend
from attnbench.workload.batch import Batch

from ._dense import gather_padded_kv, padded_mask, padded_queries, unpad_output


@dataclass
class SdpaPlan:
    q: torch.Tensor  # [B, Hq, Qmax, D]
    k: torch.Tensor  # [B, Hkv, Lmax, D]
    v: torch.Tensor
    mask: Optional[torch.Tensor]  # [B, 1, Qmax, Lmax] bool, or None
    is_causal: bool
    index: Optional[torch.Tensor]  # real tokens in [B*Qmax], or None when unpadded
    scale: float
    out_shape: tuple[int, int, int]


def _uniform(batch: Batch) -> Optional[str]:
    reqs = batch.requests
    if any(r.kv_len != reqs[0].kv_len or r.query != reqs[0].query for r in reqs):
        return None
    if all(r.query == 1 and r.tree_parents is None for r in reqs):
        return "none"  # one query sees every key
    if all(r.context == 0 and r.tree_parents is None for r in reqs):
        return "causal"
    return None


class SdpaBackend(Backend):
    name = "sdpa"

    def plan(self, batch: Batch) -> SdpaPlan:
        k, v = gather_padded_kv(batch)
        b, qmax, hq, d = batch.num_requests, batch.max_query_len, batch.num_q_heads, batch.head_dim
        kind = _uniform(batch)
        if kind is not None:
            q = batch.q.reshape(b, qmax, hq, d).transpose(1, 2)
            return SdpaPlan(q, k, v, None, kind == "causal", None, batch.scale, tuple(batch.q.shape))
        q, index = padded_queries(batch)
        return SdpaPlan(q, k, v, padded_mask(batch), False, index, batch.scale, tuple(batch.q.shape))

    def run(self, p: SdpaPlan) -> torch.Tensor:
        o = F.scaled_dot_product_attention(
            p.q, p.k, p.v, attn_mask=p.mask, is_causal=p.is_causal, scale=p.scale, enable_gqa=True
        )  # [B, Hq, Qmax, D]
        return unpad_output(o, p.index)
