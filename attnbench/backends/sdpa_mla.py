"""SDPA on an MLA batch (the latent cache as one KV head, gathered in ``convert``).

Decode batches of equal lengths fold the query heads into the query axis (MQA's trick, the
one FlashMLA uses): ``[B, 1, Hq, 576]`` queries against ``[B, 1, L, 576]`` keys, one KV head
read once per request, no mask. Any other batch keeps ``[B, Hq, Qmax, 576]`` queries and
broadcasts the latent over the heads (``expand``: a stride-0 view, no copy) with one
``[B, 1, Qmax, Lmax]`` mask for every head. The values are the latent's first
``kv_lora_rank`` dims (a view of the gathered keys)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from attnbench.workload.batch import Batch

from ._dense import gather_padded_kv, padded_mask, padded_queries, unpad_output


@dataclass
class SdpaMlaPlan:
    q: torch.Tensor  # [B, 1, Hq, D] (folded decode) or [B, Hq, Qmax, D]
    k: torch.Tensor  # [B, 1 or Hq (expanded), Lmax, D]
    v: torch.Tensor  # [B, 1 or Hq, Lmax, Dv]: a view of k
    mask: Optional[torch.Tensor]  # [B, 1, Qmax, Lmax] bool, or None
    index: Optional[torch.Tensor]  # real tokens in [B*Qmax], or None (folded decode)
    scale: float
    folded: bool
    mode: str = ""


def _equal_decodes(batch: Batch) -> bool:
    h = batch.host
    return bool((h.query_lens == 1).all() and not h.is_tree.any() and (h.kv_lens == h.kv_lens[0]).all())


def convert(batch: Batch) -> SdpaMlaPlan:
    """Gather the latent rows, pad (or fold) the queries, build the mask (convert_ms)."""
    k, v = gather_padded_kv(batch)  # [B, 1, Lmax, D], its view [..., :Dv]
    b, hq = batch.num_requests, batch.num_q_heads
    if _equal_decodes(batch):
        q = batch.q.reshape(b, 1, hq, batch.head_dim)
        return SdpaMlaPlan(q, k, v, None, None, batch.scale, True, "heads folded into queries (MQA decode)")
    q, index = padded_queries(batch)
    lmax = k.shape[2]
    k = k.expand(b, hq, lmax, k.shape[-1])
    v = v.expand(b, hq, lmax, v.shape[-1])
    return SdpaMlaPlan(q, k, v, padded_mask(batch), index, batch.scale, False, "latent broadcast over heads, masked")


def run(p: SdpaMlaPlan) -> torch.Tensor:
    o = F.scaled_dot_product_attention(p.q, p.k, p.v, attn_mask=p.mask, scale=p.scale)
    if p.folded:  # [B, 1, Hq, Dv]: one token per request
        return o.reshape(o.shape[0], o.shape[2], o.shape[3])
    return unpad_output(o, p.index)
