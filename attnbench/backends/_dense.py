"""What SDPA and Flex need because they cannot read a paged, packed batch: their ``convert``.

Both take padded dense tensors, one batch row per request: the queries padded to
``[B, Hq, Qmax, D]`` and each request's K/V gathered out of the pages into ``[B, Hkv, Lmax, D]``;
SDPA also takes a dense ``[B, 1, Qmax, Lmax]`` mask for batches that are not uniform. None of
it is work an engine does each step (it would read the pages in place), so it is timed as
convert_ms, apart from plan_ms. Everything is built by tensor ops, no loop over requests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from attnbench.workload.batch import Batch
from attnbench.workload.kvcache import dequantize
from attnbench.workload.mla import is_mla

from attnbench.workload.rope import apply_rope, rope_angles

from ._metadata import dense_masks, padded_positions


@dataclass
class Dense:
    """A batch converted to padded dense tensors (what ``convert`` returns)."""

    batch: Batch
    q: torch.Tensor  # [B, Hq, Qmax, D]
    k: torch.Tensor  # [B, Hkv, Lmax, D]
    v: torch.Tensor
    index: Optional[torch.Tensor]  # real tokens in [B * Qmax], packed order; None: nothing padded
    mask: Optional[torch.Tensor] = None  # [B, 1, Qmax, Lmax] bool (SDPA's, when not uniform)
    causal: bool = False  # SDPA: a uniform causal batch (no mask needed)
    alibi: Optional[torch.Tensor] = None  # SDPA: ALiBi added before the soft-cap (score_order)


def dense_working_set(spec, device_type: str, mask: bool) -> int:
    """Bytes SDPA or Flex allocate beyond the batch for ``spec`` (a BatchSpec): padded q and
    output, K/V gathered to ``[B, Hkv, Lmax, D]`` (and repeated to ``Hq`` heads plus the
    ``[B, Hq, Qmax, Lmax]`` float32 scores and probabilities where the kernel is unfused, on
    the CPU), and the ``[B, 1, Qmax, Lmax]`` bool mask (``mask``). An upper bound, for the
    runner's memory guard."""
    b = len(spec.requests)
    qmax = max(r.query for r in spec.requests)
    lmax = max(r.kv_len for r in spec.requests)
    el = {"float32": 4, "float16": 2, "bfloat16": 2}[spec.dtype]
    hq, hkv, d = spec.num_q_heads, spec.num_kv_heads, spec.head_dim
    total = 2 * b * qmax * hq * d * el + 2 * b * lmax * hkv * d * el
    if mask:
        total += b * qmax * lmax
    if device_type != "cuda":
        total += 2 * b * lmax * hq * d * el + 2 * b * hq * qmax * lmax * 4
    return total


def gather_padded_kv(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``k, v`` as ``[B, Hkv, Lmax, D]`` in the model dtype (an FP8 cache dequantized
    with its scales: ``fp8.float() * scale``, then cast); rows past each kv_len are left as
    gathered garbage. Reads either cache order through the NHD-indexable view. MLA: the latent
    rows are gathered once (one KV head) and ``v`` is the view of their first ``kv_lora_rank``
    dims."""
    b = batch.num_requests
    lmax = int(batch.host.kv_lens.max())
    ps = batch.page_size
    npages = -(-lmax // ps)
    pages = batch.block_table[:, :npages].long()  # [B, npages]
    if is_mla(batch):
        k = batch.k_cache[pages].reshape(b, npages * ps, batch.num_kv_heads, batch.head_dim)[:, :lmax]
        k = dequantize(k, batch.k_scale).to(batch.dtype).transpose(1, 2).contiguous()
        return k, k[..., : batch.v_head_dim]
    out = []
    for cache, scale in ((batch.k_cache, batch.k_scale), (batch.v_cache, batch.v_scale)):
        x = cache[pages].reshape(b, npages * ps, batch.num_kv_heads, batch.head_dim)[:, :lmax]
        out.append(dequantize(x, scale).to(batch.dtype).transpose(1, 2).contiguous())
    return out[0], out[1]


def padded_mask(batch: Batch) -> torch.Tensor:
    """``[B, 1, Qmax, Lmax]`` bool on the batch's device. Padding rows see key 0 (never all-False)."""
    m = dense_masks(batch)  # a fresh tensor: updated in place
    q = torch.arange(m.shape[1], device=m.device)[None, :]
    m[:, :, 0] |= q >= batch.query_lens.long()[:, None]
    return m[:, None]


def token_index(batch: Batch) -> torch.Tensor:
    """Flat index into ``[B * Qmax]`` of every real query token, in packed order."""
    h = batch.host
    qmax = int(h.query_lens.max())
    first = np.arange(batch.num_requests) * qmax - h.query_start_loc[:-1]
    idx = np.repeat(first, h.query_lens) + np.arange(int(h.query_start_loc[-1]))
    return torch.from_numpy(idx).to(batch.device)


def padded_queries(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed queries as ``[B, Hq, Qmax, D]`` (zeros in the padding) and their
    :func:`token_index`, which :func:`unpad_output` takes back."""
    b, qmax, hq, d = batch.num_requests, int(batch.host.query_lens.max()), batch.num_q_heads, batch.head_dim
    index = token_index(batch)
    q = batch.q.new_zeros(b * qmax, hq, d)
    q[index] = batch.q
    return q.reshape(b, qmax, hq, d).transpose(1, 2), index


def unpad_output(o: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """``[B, Hq, Qmax, D]`` -> the packed ``[N, Hq, D]`` (``index`` None: nothing was padded)."""
    b, hq, qmax, d = o.shape
    o = o.transpose(1, 2).reshape(b * qmax, hq, d)
    return o if index is None else o[index]


def rope_dense(batch: Batch, q: torch.Tensor, k: torch.Tensor, cols: Optional[torch.Tensor] = None):
    """Fused RoPE done in ``convert`` by a backend whose kernel cannot rotate (docs/semantics.md
    "Fused RoPE"): padded ``q`` ``[B, Hq, Qmax, D]`` and gathered ``k`` ``[B, Hkv, Lk, D]`` rotated at
    their positions in float32, then cast back to their dtype. ``cols`` ``[B, Lk]``: the logical
    slot of each key column (a windowed gather), else slots 0..Lk-1."""
    spec = batch.spec
    full = int(batch.host.kv_lens.max())
    qpos, kpos = padded_positions(batch, q.shape[2], full)
    kpos = kpos.gather(1, cols.clamp(max=full - 1)) if cols is not None else kpos[:, : k.shape[2]]
    d = batch.head_dim
    aq, ak = (rope_angles(p, d, spec.rope_theta, spec.rope_scale, torch.float32)[:, None] for p in (qpos, kpos))
    return apply_rope(q, aq).to(q.dtype), apply_rope(k, ak).to(k.dtype)
