"""PyTorch scaled_dot_product_attention on K/V gathered out of the pages.

One SDPA call for the whole batch, padded to ``[B, H, Qmax/Lmax, D]``. Uniform batches need no
mask (equal-length decode) or a plain causal one (equal-length prefill without context),
which lets PyTorch pick its flash kernel; any other batch (mixed lengths, chunked prefill,
trees) passes a boolean mask, which PyTorch runs with its memory-efficient or math kernel.

SDPA cannot read a paged, packed batch: ``convert`` pads the queries, gathers K/V and builds
the dense mask (convert_ms); ``plan`` has nothing left to do (plan_ms ~ 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from attnbench.backend import Backend
from attnbench.workload.batch import Batch

from ._dense import Dense, gather_padded_kv, padded_mask, padded_queries, unpad_output


@dataclass
class SdpaPlan:
    q: torch.Tensor  # [B, Hq, Qmax, D]
    k: torch.Tensor  # [B, Hkv, Lmax, D]
    v: torch.Tensor
    mask: Optional[torch.Tensor]  # [B, 1, Qmax, Lmax] bool, or None
    is_causal: bool
    index: Optional[torch.Tensor]  # real tokens in [B*Qmax], or None when unpadded
    scale: float


def _uniform(batch: Batch) -> Optional[str]:
    h = batch.host
    if h.is_tree.any() or (h.query_lens != h.query_lens[0]).any() or (h.kv_lens != h.kv_lens[0]).any():
        return None
    if h.query_lens[0] == 1:
        return "none"  # one query sees every key
    if not h.context_lens.any():
        return "causal"
    return None


class SdpaBackend(Backend):
    name = "sdpa"

    def convert(self, batch: Batch) -> Dense:
        k, v = gather_padded_kv(batch)
        kind = _uniform(batch)
        if kind is not None:
            b, hq, d = batch.num_requests, batch.num_q_heads, batch.head_dim
            q = batch.q.reshape(b, -1, hq, d).transpose(1, 2)
            return Dense(batch, q, k, v, None, None, kind == "causal")
        q, index = padded_queries(batch)
        return Dense(batch, q, k, v, index, padded_mask(batch))

    def plan(self, dense: Dense) -> SdpaPlan:
        d = dense if isinstance(dense, Dense) else self.convert(dense)  # plan(batch) converts first
        return SdpaPlan(d.q, d.k, d.v, d.mask, d.causal, d.index, d.batch.scale)

    def run(self, p: SdpaPlan) -> torch.Tensor:
        o = F.scaled_dot_product_attention(
            p.q, p.k, p.v, attn_mask=p.mask, is_causal=p.is_causal, scale=p.scale, enable_gqa=True
        )  # [B, Hq, Qmax, D]
        return unpad_output(o, p.index)
