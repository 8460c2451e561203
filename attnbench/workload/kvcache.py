"""How the KV cache is stored (docs/semantics.md "FP8 KV cache", "Cache order"): FP8
quantization with scales taken from the data, and the NHD/HND storage orders.

An FP8 cache holds ``x / scale`` rounded to the FP8 dtype, with ``scale = amax(|x|) / fp8_max``
(per tensor, or per KV head), as engines calibrate their KV scales from the data; dequantized,
``x ~= fp8.float() * scale``. The HND order stores pages as ``[P, Hkv, page, D]``; the batch
keeps an NHD-indexable view ``[P, page, Hkv, D]`` of that storage.
"""
from __future__ import annotations

from typing import Optional

import torch

from attnbench.workload.spec import FP8_DTYPES


def fp8_scale(x: torch.Tensor, kv_dtype: str, per_head: bool) -> torch.Tensor:
    """float32 ``[1]`` (per tensor) or ``[Hkv]`` (per head) scales of an NHD cache ``x``
    ``[P, page, Hkv, D]``: amax / the FP8 dtype's largest value (never 0)."""
    fmax = FP8_DTYPES[kv_dtype][1]
    if per_head:
        amax = x.abs().amax(dim=(0, 1, 3)).float()
    else:
        amax = x.abs().amax().float().reshape(1)
    return (amax / fmax).clamp_min(torch.finfo(torch.float32).tiny)


def quantize_fp8(x: torch.Tensor, kv_dtype: str, per_head: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8 cache, float32 scale)`` of a float NHD cache ``x`` ``[P, page, Hkv, D]``."""
    name, fmax = FP8_DTYPES[kv_dtype]
    scale = fp8_scale(x, kv_dtype, per_head)
    q = (x.float() / scale.view(1, 1, -1, 1)).clamp_(-fmax, fmax)
    return q.to(getattr(torch, name)), scale


def quantize_q(q: torch.Tensor, q_dtype: Optional[str]) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(q_fp8, q_scale [1])`` of the drawn queries ``[N, Hq, D]`` for FP8 attention: one scale per
    tensor, ``amax(|q|) / fp8_max``, as the FP8 caches' (docs/semantics.md); ``(None, None)`` without."""
    if q_dtype is None:
        return None, None
    x, scale = quantize_fp8(q.float().unsqueeze(0), q_dtype, per_head=False)  # [1, N, Hq, D] as [P, page, H, D]
    return x[0], scale


def quantize_out(o: torch.Tensor, out_dtype: str, out_scale: float) -> torch.Tensor:
    """An attention output ``o`` written in FP8: ``round_fp8(clamp(o / out_scale))`` (docs/semantics.md
    "FP8 output"), computed in float32."""
    name, fmax = FP8_DTYPES[out_dtype]
    return (o.float() / out_scale).clamp_(-fmax, fmax).to(getattr(torch, name))


def dequantize(x: torch.Tensor, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """An ``[..., Hkv, D]`` slice of the cache as float32 values (``x.float() * scale``), or
    ``x`` itself when the cache is not FP8 (``scale`` None)."""
    if scale is None:
        return x
    return x.float() * scale.view(*([1] * (x.dim() - 2)), -1, 1)


def to_order(nhd: torch.Tensor, order: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(storage, nhd view)``: for HND the contiguous ``[P, Hkv, page, D]`` storage and its
    permuted ``[P, page, Hkv, D]`` view; for NHD the tensor itself twice."""
    if order == "NHD":
        return nhd, nhd
    storage = nhd.permute(0, 2, 1, 3).contiguous()
    return storage, storage.permute(0, 2, 1, 3)


def storage_of(cache: torch.Tensor, order: str) -> torch.Tensor:
    """The engine's storage tensor behind an NHD-indexable cache view (see :func:`to_order`)."""
    return cache if order == "NHD" else cache.permute(0, 2, 1, 3)
