"""A sliding window for backends that gather K/V into dense tensors (SDPA): gather only the
slots some query of each request can see (docs/semantics.md "Counting": from
``max(0, C - W + 1)`` to ``L - 1``), as an engine that uses a dense kernel on a windowed layer
would, instead of every slot since 0 and a mask hiding most of them. Request i's window
columns are logical slots ``start_i .. start_i + width - 1`` (``width``: the widest request's
span); columns past a request's kv_len are masked.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from attnbench.workload.batch import Batch
from attnbench.workload.kvcache import dequantize

from ._metadata import dense_masks


def window_columns(batch: Batch) -> Optional[torch.Tensor]:
    """``[B, width]`` int64 logical slots on the batch's device, or None when the batch has no
    window or the window leaves every slot needed (then the plain gather is the same)."""
    if batch.window is None:
        return None
    h = batch.host
    start = np.maximum(0, h.context_lens - batch.window + 1)
    width = int((h.kv_lens - start).max())
    if width >= int(h.kv_lens.max()):
        return None
    dev = batch.device
    return torch.from_numpy(start).to(dev)[:, None] + torch.arange(width, device=dev)[None, :]


def gather_window_kv(batch: Batch, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``k, v`` as ``[B, Hkv, width, D]`` in the model dtype (FP8 dequantized), read through the
    block table at the slots ``cols``; columns past a request's pages read page 0 (masked)."""
    ps = batch.page_size
    table = batch.block_table.long()
    logical = cols.clamp(max=table.shape[1] * ps - 1)
    page = table.gather(1, logical // ps)  # [B, width]
    off = logical % ps
    out = []
    for cache, scale in ((batch.k_cache, batch.k_scale), (batch.v_cache, batch.v_scale)):
        x = cache[page, off]  # [B, width, Hkv, D]: NHD indexing works for either storage order
        out.append(dequantize(x, scale).to(batch.dtype).transpose(1, 2).contiguous())
    return out[0], out[1]


def window_mask(batch: Batch, cols: torch.Tensor) -> torch.Tensor:
    """``[B, 1, Qmax, width]`` bool: the dense mask's columns ``cols`` (False past each kv_len);
    padding query rows see column 0 (never an all-False row)."""
    m = dense_masks(batch)  # [B, Qmax, Lmax]
    lmax = m.shape[2]
    idx = cols.clamp(max=lmax - 1)[:, None, :].expand(m.shape[0], m.shape[1], cols.shape[1])
    w = m.gather(2, idx) & (cols < batch.kv_lens.long()[:, None])[:, None, :]
    q = torch.arange(w.shape[1], device=w.device)[None, :]
    w[:, :, 0] |= q >= batch.query_lens.long()[:, None]
    return w[:, None]
