"""PyTorch scaled_dot_product_attention on K/V gathered out of the pages.

One SDPA call for the whole batch, padded to ``[B, H, Qmax/Lmax, D]``. Uniform batches need no
mask (equal-length decode) or a plain causal one (equal-length prefill without context),
which lets PyTorch pick its flash kernel; any other batch (mixed lengths, chunked prefill,
trees, a window, non-causal prefills) passes a boolean mask, which PyTorch runs with its
memory-efficient or math kernel. ALiBi and sinks go in as a float bias (``_bias.py``: a sink
is one more key whose K and V are zero and whose bias is the sink logit). SDPA has no
soft-cap: a soft-capped batch runs an eager path (matmul, tanh, bias, softmax, matmul; mode
``eager-softcap``), as model code without a fused kernel does.

SDPA cannot read a paged, packed batch: ``convert`` pads the queries, gathers K/V (an FP8
cache dequantized to the model dtype; with a window only the slots it lets through,
``_window.py``) and builds the dense mask or bias (convert_ms); ``plan`` has nothing left to
do (plan_ms ~ 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

from attnbench.backend import Backend
from attnbench.workload.batch import Batch
from attnbench.workload.mla import is_mla

from ._bias import alibi_bias, float_bias, needs_bias, with_sink_column
from . import sdpa_mla
from ._dense import Dense, dense_working_set, gather_padded_kv, padded_mask, padded_queries, rope_dense, unpad_output
from ._window import gather_window_kv, window_columns, window_mask


@dataclass
class SdpaPlan:
    q: torch.Tensor  # [B, Hq, Qmax, D]
    k: torch.Tensor  # [B, Hkv, Lmax(+1 with sinks), D]
    v: torch.Tensor
    mask: Optional[torch.Tensor]  # [B, 1, Qmax, Lmax] bool, [B, Hq|1, Qmax, Lmax(+1)] float, or None
    is_causal: bool
    index: Optional[torch.Tensor]  # real tokens in [B*Qmax], or None when unpadded
    scale: float
    softcap: Optional[float] = None  # set: the eager path (SDPA has no soft-cap)
    mode: str = ""
    alibi: Optional[torch.Tensor] = None  # [B, Hq, Qmax, L(+1)] float32, added before the soft-cap
    finish: Any = None  # Batch.finish_output: the output in the model dtype or in FP8 (model.out_dtype)


def _uniform(batch: Batch) -> Optional[str]:
    h = batch.host
    if batch.window is not None or not h.causal.all() or needs_bias(batch) or batch.softcap is not None or batch.spec.rope:
        return None
    if h.is_tree.any() or (h.query_lens != h.query_lens[0]).any() or (h.kv_lens != h.kv_lens[0]).any():
        return None
    if h.query_lens[0] == 1:
        return "none"  # one query sees every key
    if not h.context_lens.any():
        return "causal"
    return None


class SdpaBackend(Backend):
    name = "sdpa"
    supports_window = supports_sinks = supports_softcap = supports_alibi = supports_noncausal = True
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")  # dequantized in convert
    kv_scales = ("per-tensor", "per-head")
    kv_orders = ("NHD", "HND")

    supports_mla = True
    # k_scale/v_scale (and FP8 scales) applied in convert; more queries than keys: the padded mask;
    # RoPE: q and k rotated in convert (mode "rope in convert"); ALiBi before the soft-cap: eager path
    supports_16bit_kv_scales = supports_short_kv = supports_rope = supports_alibi_before_softcap = True
    out_dtypes = ("fp8_e4m3",)  # the output written in FP8 after the kernel (an elementwise op in run)

    @classmethod
    def working_set_bytes(cls, spec, device_type: str) -> int:
        return dense_working_set(spec, device_type, mask=True)

    def convert(self, batch: Batch) -> Dense:
        if is_mla(batch):
            return sdpa_mla.convert(batch)
        kind = _uniform(batch)
        if kind is not None:
            k, v = gather_padded_kv(batch)
            b, hq, d = batch.num_requests, batch.num_q_heads, batch.head_dim
            q = batch.q.reshape(b, -1, hq, d).transpose(1, 2)
            return Dense(batch, q, k, v, None, None, kind == "causal")
        q, index = padded_queries(batch)
        cols = window_columns(batch)  # a window: gather only the slots it lets through
        if cols is None:
            (k, v), mask = gather_padded_kv(batch), padded_mask(batch)
        else:
            (k, v), mask = gather_window_kv(batch, cols), window_mask(batch, cols)
        if batch.spec.rope:
            q, k = rope_dense(batch, q, k, cols)
        alibi = None
        if batch.spec.alibi_first:  # the eager path adds ALiBi before its tanh, the mask and sinks after
            alibi = alibi_bias(batch, mask.shape[2], mask.shape[3], cols, sinks=batch.sinks is not None)
        if needs_bias(batch) or batch.softcap is not None:
            mask = float_bias(batch, mask, torch.float32 if batch.softcap is not None else batch.dtype, cols,
                              alibi=alibi is None)
            if batch.sinks is not None:
                k, v = with_sink_column(k), with_sink_column(v)
        return Dense(batch, q, k, v, index, mask, alibi=alibi)

    def plan(self, dense: Dense) -> SdpaPlan:
        d = dense if isinstance(dense, (Dense, sdpa_mla.SdpaMlaPlan)) else self.convert(dense)  # plan(batch) converts first
        if isinstance(d, sdpa_mla.SdpaMlaPlan):
            return d
        cap = d.batch.softcap
        mode = ("eager-softcap" if cap else "") + (", alibi before softcap" if d.alibi is not None else "")
        mode += ", rope in convert" if d.batch.spec.rope else ""
        mode += ", fp8 output after the kernel" if d.batch.spec.out_dtype else ""
        return SdpaPlan(d.q, d.k, d.v, d.mask, d.causal, d.index, d.batch.scale, cap, mode.lstrip(", "), d.alibi,
                        d.batch.finish_output)

    def run(self, p: SdpaPlan) -> torch.Tensor:
        if isinstance(p, sdpa_mla.SdpaMlaPlan):
            return sdpa_mla.run(p)
        if p.softcap is not None:
            return p.finish(unpad_output(_eager(p), p.index))
        o = F.scaled_dot_product_attention(
            p.q, p.k, p.v, attn_mask=p.mask, is_causal=p.is_causal, scale=p.scale, enable_gqa=True
        )  # [B, Hq, Qmax, D]
        return p.finish(unpad_output(o, p.index))


def _eager(p: SdpaPlan) -> torch.Tensor:
    """Soft-capped attention by plain torch ops: scores in float32 from the model-dtype
    matmul, ``c * tanh(s / c)``, the float bias (mask, ALiBi, sink column), softmax, then
    the PV matmul in the model dtype. ``[B, Hq, Qmax, D]``."""
    b, hq, qmax, d = p.q.shape
    hkv = p.k.shape[1]
    g = hq // hkv
    q = p.q.reshape(b, hkv, g * qmax, d)
    s = torch.matmul(q, p.k.transpose(-1, -2)).float().view(b, hkv, g, qmax, -1) * p.scale
    if p.alibi is not None:  # model.score_order: alibi-softcap
        s = s + p.alibi.view(b, hkv, g, qmax, -1)
    s = p.softcap * torch.tanh(s / p.softcap)
    s = s + _heads(p.mask, hkv, g)
    w = torch.softmax(s, dim=-1).to(p.v.dtype).view(b, hkv, g * qmax, -1)
    return torch.matmul(w, p.v).view(b, hq, qmax, d)


def _heads(mask: torch.Tensor, hkv: int, g: int) -> torch.Tensor:
    """A ``[B, Hq|1, Qmax, L]`` float bias as ``[B, Hkv|1, G|1, Qmax, L]`` (query head h = kv * G + j)."""
    b, h, qmax, l = mask.shape
    return mask.view(b, 1, 1, qmax, l) if h == 1 else mask.view(b, hkv, g, qmax, l)
