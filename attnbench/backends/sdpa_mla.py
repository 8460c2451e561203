"""SDPA on an MLA batch (the latent cache as one KV head, gathered in ``convert``).

The query heads are folded into the query axis (MQA's trick, the one FlashMLA uses): a
request's ``Qmax * Hq`` (token, head) rows attend to ``[B, 1, L, 576]`` keys, one KV head
read once per request. Decode batches of equal lengths need no mask; other batches take a
``[B, 1, Qmax * Hq, Lmax]`` mask (each token's row repeated for its heads) while it stays
under ``FOLD_MASK_LIMIT`` elements; past that (long prefills) the queries stay
``[B, Hq, Qmax, 576]`` and the latent is broadcast over the heads (``expand``: a stride-0
view, no copy) with one ``[B, 1, Qmax, Lmax]`` mask for every head. The values are the
latent's first ``kv_lora_rank`` dims (a view of the gathered keys)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from attnbench.workload.batch import Batch

from ._dense import gather_padded_kv, padded_mask, padded_queries, unpad_output


@dataclass
class SdpaMlaPlan:
    q: torch.Tensor  # [B, 1, Qmax * Hq, D] (folded) or [B, Hq, Qmax, D]
    k: torch.Tensor  # [B, 1 or Hq (expanded), Lmax, D]
    v: torch.Tensor  # [B, 1 or Hq, Lmax, Dv]: a view of k
    mask: Optional[torch.Tensor]  # [B, 1, Qmax * Hq or Qmax, Lmax] bool, or None
    index: Optional[torch.Tensor]  # real tokens in [B*Qmax], or None (equal decodes)
    scale: float
    folded: bool
    mode: str = ""
    heads: int = 0  # Hq (to unfold the output)


def _equal_decodes(batch: Batch) -> bool:
    h = batch.host
    return bool((h.query_lens == 1).all() and not h.is_tree.any() and (h.kv_lens == h.kv_lens[0]).all())


#: largest folded mask (elements, one byte each) before the broadcast route is taken instead
FOLD_MASK_LIMIT = 1 << 28


def convert(batch: Batch) -> SdpaMlaPlan:
    """Gather the latent rows, pad and fold the queries, build the mask (convert_ms)."""
    k, v = gather_padded_kv(batch)  # [B, 1, Lmax, D], its view [..., :Dv]
    b, hq = batch.num_requests, batch.num_q_heads
    if _equal_decodes(batch):
        q = batch.q.reshape(b, 1, hq, batch.head_dim)
        return SdpaMlaPlan(q, k, v, None, None, batch.scale, True, "heads folded into queries (MQA decode)", hq)
    q, index = padded_queries(batch)
    lmax, qmax = k.shape[2], q.shape[2]
    if b * qmax * hq * lmax <= FOLD_MASK_LIMIT:
        mask = padded_mask(batch)  # [B, 1, Qmax, Lmax]
        mask = mask[:, :, :, None, :].expand(b, 1, qmax, hq, lmax).reshape(b, 1, qmax * hq, lmax)
        qf = q.transpose(1, 2).reshape(b, 1, qmax * hq, q.shape[-1])
        return SdpaMlaPlan(qf, k, v, mask, index, batch.scale, True, "heads folded into queries, masked", hq)
    k = k.expand(b, hq, lmax, k.shape[-1])
    v = v.expand(b, hq, lmax, v.shape[-1])
    return SdpaMlaPlan(q, k, v, padded_mask(batch), index, batch.scale, False, "latent broadcast over heads, masked")


def run(p: SdpaMlaPlan) -> torch.Tensor:
    o = F.scaled_dot_product_attention(p.q, p.k, p.v, attn_mask=p.mask, scale=p.scale)
    if not p.folded:
        return unpad_output(o, p.index)
    hq = p.heads  # folded: [B, 1, Qmax * Hq, Dv]
    o = o.reshape(-1, hq, o.shape[-1])  # [B * Qmax, Hq, Dv]
    return o if p.index is None else o[p.index]
