"""Dense float biases for backends that take an additive attention mask (SDPA): the boolean
mask as 0 / -inf, plus ALiBi's ``slope_h * (key position - query position)``, plus one more
key column for the sinks (docs/semantics.md "Sinks": a key with a logit and no value is a
zero K row, a zero V row and a bias equal to the sink logit, since q . 0 = 0).
"""
from __future__ import annotations

from typing import Optional

import torch

from attnbench.workload.batch import Batch

from ._metadata import padded_positions


def needs_bias(batch: Batch) -> bool:
    """True when the batch has ALiBi or sinks (a boolean mask cannot say it)."""
    return batch.alibi_slopes is not None or batch.sinks is not None


def float_bias(batch: Batch, mask: torch.Tensor, dtype: torch.dtype, cols: Optional[torch.Tensor] = None,
               alibi: bool = True) -> torch.Tensor:
    """``[B, Hq|1, Qmax, Lmax (+1 with sinks)]`` in ``dtype`` from the boolean ``mask``
    ``[B, 1, Qmax, Lmax]``: 0 where allowed, -inf where not, ALiBi added (then one row per
    query head), the sink logit as the last column. Built in float32, each row shifted so its
    largest entry is 0 (``row_shifted``), cast once. ``cols``
    ``[B, Lmax]``: the logical slot of each mask column (a windowed gather), else 0..Lmax-1.
    ``alibi`` False: leave ALiBi out (it goes in before the soft-cap, ``alibi_bias``)."""
    b, _, qmax, lmax = mask.shape
    bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, float("-inf"))
    hq = batch.num_q_heads
    if batch.alibi_slopes is not None and alibi:
        bias = bias + alibi_bias(batch, qmax, lmax, cols)
    if batch.sinks is not None:
        bias = bias.expand(b, hq, qmax, lmax)
        sink = batch.sinks.float().view(1, hq, 1, 1).expand(b, hq, qmax, 1)
        bias = torch.cat([bias, sink], dim=-1)
    return row_shifted(bias).to(dtype)


def alibi_bias(batch: Batch, qmax: int, lmax: int, cols: Optional[torch.Tensor] = None,
               sinks: bool = False) -> torch.Tensor:
    """``[B, Hq, Qmax, Lmax (+1 zero column with sinks)]`` float32: ``slope_h * (key position -
    query position)``, unshifted; ``cols`` as in :func:`float_bias`."""
    if cols is None:
        qpos, kpos = padded_positions(batch, qmax, lmax)
    else:
        full = int(batch.host.kv_lens.max())
        qpos, kpos = padded_positions(batch, qmax, full)
        kpos = kpos.gather(1, cols.clamp(max=full - 1))
    dist = (kpos[:, None, :] - qpos[:, :, None]).float()  # [B, Qmax, Lmax]
    out = batch.alibi_slopes.float().view(1, -1, 1, 1) * dist[:, None]
    return torch.cat([out, out.new_zeros(*out.shape[:3], 1)], dim=-1) if sinks else out


def row_shifted(bias: torch.Tensor) -> torch.Tensor:
    """``bias`` less each row's largest finite entry (0 where a row has none): the softmax of a
    row does not change when one constant is added to all its logits, and the entries that carry
    its weight are then the ones near 0, where a 16-bit float is finest. Unshifted, ALiBi on a
    bidirectional prefill puts them at slope * (L - 1 - q), e.g. 172.5 for 346 tokens, where
    float16 steps by 0.125: SDPA's rows were off by 1e-2 (tolerance 5e-3) with 64 heads, whose
    slopes are not powers of two."""
    top = bias.amax(dim=-1, keepdim=True)
    return bias - torch.where(torch.isfinite(top), top, torch.zeros_like(top))


def with_sink_column(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, L, D]`` -> ``[B, H, L + 1, D]`` with a zero row last (the sink's K or V)."""
    return torch.cat([x, x.new_zeros(x.shape[0], x.shape[1], 1, x.shape[3])], dim=2)
