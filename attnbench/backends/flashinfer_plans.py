"""FlashInfer's routes (``flashinfer_routes.py`` says which applies): each builder makes its
wrapper the way an engine does for CUDA graphs (``use_cuda_graph=True`` with fixed buffers
sized to the batch, so ``run`` only launches kernels that read those buffers), calls the
wrapper's ``plan`` with the batch's metadata, and returns a ``Step``: the call ``run`` makes.

Wrappers are made once per backend instance and key (an engine makes them at start-up); the
plan call repeats each step. The cache is handed to FlashInfer in its storage order
(``batch.k_storage``: NHD or HND, ``kv_layout`` to match). An FP8 cache passes its per-tensor
``k_scale`` / ``v_scale`` at run, where the wrapper's ``run`` applies them (decode, prefill,
``BatchAttention``); where it does not, the same arithmetic is done here and said in the mode:
the attention-sink wrapper gets ``k_scale`` folded into its variant's ``sm_scale`` argument, and
POD gets it in ``plan``'s ``sm_scale`` and ``v_scale`` on the output it assembles (its ``run``
scales only the decode group). XQA gets a workspace of its own, zeroed at creation: sharing
one with another wrapper gave wrong outputs with no error (shared/device/NOTES.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from attnbench.workload.batch import Batch

from ._metadata import custom_mask_flat, dense_masks, flashinfer_page_layout
from .flashinfer_alibi import pos_encoding_mode
from .flashinfer_rope import rope_plan_args
from .flashinfer_routes import Facts

#: the float workspace of a backend instance's wrappers. 128 MB was too small for the fa2 prefill
#: wrapper in CUDA-graph mode on 4x1k (it asked for a 262 MB batch_prefill_tmp_v on an H100):
#: graph mode sizes the split-KV scratch for the fixed grid, so take what engines give it
WORKSPACE_BYTES = 1024 * 1024 * 1024
XQA_WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass
class Step:
    call: Callable[[], torch.Tensor]
    detail: str = ""  # what the mode adds (custom mask, sinks, ...)


def _i32(n: int, dev) -> torch.Tensor:
    return torch.empty(max(n, 1), dtype=torch.int32, device=dev)


def _kv(batch: Batch) -> tuple:
    return (batch.k_storage, batch.v_storage)


def _scales(batch: Batch) -> dict:
    if batch.k_scale is None:
        return {}
    return {"k_scale": float(batch.k_scale[0]), "v_scale": float(batch.v_scale[0])}


def uses_mask(batch: Batch, f: Facts) -> bool:
    """A custom mask (the window folded in): trees, mixed causality, a window on non-causal rows."""
    return f.needs_mask


def _window_left(batch: Batch, f: Facts) -> int:
    """FlashInfer's ``window_left`` (keys ``p - window_left .. p`` visible) = W - 1; -1 when the
    window is off or folded into a custom mask (trees: a node's position is not its slot)."""
    return -1 if batch.window is None or uses_mask(batch, f) else batch.window - 1


def mask_flat(batch: Batch) -> torch.Tensor:
    """Every request's ``[Q, L]`` mask, row-major, concatenated, bool on the device; the window
    folded in when there is one (FlashInfer's window reads slots, a tree node's position is not)."""
    if batch.window is None:
        return custom_mask_flat(batch)
    m = dense_masks(batch)
    q = torch.arange(m.shape[1], device=m.device)[None, :, None]
    k = torch.arange(m.shape[2], device=m.device)[None, None, :]
    inside = (q < batch.query_lens.long()[:, None, None]) & (k < batch.kv_lens.long()[:, None, None])
    return m[inside]


def made(cache: dict, key: tuple, make: Callable[[], Any]) -> Any:
    if key not in cache:
        cache[key] = make()
    return cache[key]


def decode_step(batch: Batch, f: Facts, ws: torch.Tensor, cache: dict, tensor_cores: bool) -> Step:
    import flashinfer

    dev, b = batch.device, batch.num_requests
    indptr, indices, last = flashinfer_page_layout(batch)
    w = made(cache, ("decode", tensor_cores, b, len(indices)), lambda: flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, kv_layout=batch.kv_order, use_cuda_graph=True, use_tensor_cores=tensor_cores,
        paged_kv_indptr_buffer=_i32(b + 1, dev), paged_kv_indices_buffer=_i32(len(indices), dev),
        paged_kv_last_page_len_buffer=_i32(b, dev)))
    w.plan(indptr, indices, last, batch.num_q_heads, batch.num_kv_heads, batch.head_dim, batch.page_size,
           window_left=_window_left(batch, f), logits_soft_cap=batch.softcap, q_data_type=batch.dtype,
           kv_data_type=batch.kv_dtype, sm_scale=batch.scale,
           **{"pos_encoding_mode": pos_encoding_mode(f.alibi), **rope_plan_args(batch.spec)})
    q, kv, sc = batch.q, _kv(batch), _scales(batch)
    return Step(lambda: w.run(q, kv, **sc), _alibi_detail(f))


def _alibi_detail(f: Facts, detail: str = "") -> str:
    """The mode's words for ALiBi (a JIT module of its own: the first-use key tells it apart)."""
    return ", ".join(x for x in (detail, "ALiBi (FlashInfer's slopes)" if f.alibi else "",
                                 "RoPE (FlashInfer's Llama rotary)" if f.rope else "") if x)


def _mask_bytes(batch: Batch) -> int:
    h = batch.host
    return int(((h.query_lens * h.kv_lens + 7) // 8).sum())


def prefill_step(batch: Batch, f: Facts, ws: torch.Tensor, cache: dict, kind: str) -> Step:
    """``BatchPrefillWithPagedKVCacheWrapper(backend=kind)``, or its attention-sink subclass."""
    import flashinfer

    dev, b = batch.device, batch.num_requests
    indptr, indices, last = flashinfer_page_layout(batch)
    # on the device: FlashInfer packs the custom mask there (segment_packbits wants a CUDA indptr)
    indptr, last = indptr.to(dev), last.to(dev)
    qo_indptr = torch.from_numpy(batch.host.query_start_loc.astype(np.int32)).to(dev)
    mask = mask_flat(batch) if uses_mask(batch, f) else None
    wl = _window_left(batch, f)
    bufs = dict(use_cuda_graph=True, qo_indptr_buf=_i32(b + 1, dev), paged_kv_indptr_buf=_i32(b + 1, dev),
                paged_kv_indices_buf=_i32(len(indices), dev), paged_kv_last_page_len_buf=_i32(b, dev))
    if mask is not None:
        bufs.update(custom_mask_buf=torch.empty(_mask_bytes(batch), dtype=torch.uint8, device=dev),
                    mask_indptr_buf=_i32(b + 1, dev))
    key = ("prefill", kind, f.sinks, mask is not None, b, len(indices), wl)
    if f.sinks:
        make = lambda: flashinfer.BatchAttentionWithAttentionSinkWrapper(  # noqa: E731
            ws, kv_layout=batch.kv_order, backend=kind, q_data_type=batch.dtype, kv_data_type=batch.kv_dtype,
            head_dim_qk=batch.head_dim, head_dim_vo=batch.head_dim, window_left=wl, **bufs)
    else:
        make = lambda: flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout=batch.kv_order, backend=kind, **bufs)  # noqa: E731
    w = made(cache, key, make)
    extra = {"custom_mask": mask} if mask is not None else {"causal": all(f.causal)}
    if f.alibi:  # alibi_reasons refuses it with sinks: the sink wrapper's variant has none
        extra["pos_encoding_mode"] = pos_encoding_mode(True)
    extra.update(rope_plan_args(batch.spec))  # rope_reasons: not with ALiBi or sinks
    fp8q = batch.q_fp8 is not None  # FP8 attention (fa3): FP8 queries, 16-bit output, q_scale at run
    if fp8q:
        extra["o_data_type"] = batch.dtype
    w.plan(qo_indptr, indptr, indices, last, batch.num_q_heads, batch.num_kv_heads, batch.head_dim, batch.page_size,
           sm_scale=batch.scale, window_left=wl, logits_soft_cap=batch.softcap,
           q_data_type=batch.q_fp8.dtype if fp8q else batch.dtype, kv_data_type=batch.kv_dtype, **extra)
    q, kv, sc = batch.q_fp8 if fp8q else batch.q, _kv(batch), _scales(batch)
    if fp8q:
        sc["q_scale"] = float(batch.q_scale[0])
    detail = "custom mask" if mask is not None else ("causal" if all(f.causal) else "non-causal")
    detail += ", FP8 attention (q_scale, k_scale, v_scale at run)" if fp8q else ""
    if f.sinks:
        return _sink_step(w, batch, detail)
    return Step(lambda: w.run(q, kv, **sc), _alibi_detail(f, detail))


def _sink_step(w: Any, batch: Batch, detail: str) -> Step:
    """The attention-sink wrapper's run: its variant's own arguments (``sinks``, ``sm_scale``) go
    to the kernel as given (prefill.py ``run`` extends the kernel's arguments with ``*args`` and
    folds ``k_scale`` only into an ``sm_scale`` it does not pass), so an FP8 cache's ``k_scale``
    is folded into the ``sm_scale`` argument here; ``v_scale`` is ``run``'s, applied to the output
    as on the plain wrapper."""
    sc = _scales(batch)
    q, kv, sinks = batch.q, _kv(batch), batch.sinks.float().contiguous()
    scale = batch.scale * sc.get("k_scale", 1.0)
    v = {"v_scale": sc["v_scale"]} if sc else {}
    fp8 = ", k_scale in its sm_scale" if sc else ""
    return Step(lambda: w.run(q, kv, sinks, scale, **v), f"{detail}, sink wrapper{fp8}")


def xqa_step(batch: Batch, f: Facts, cache: dict) -> Step:
    """TensorRT-LLM's XQA decode through ``trtllm_batch_decode_with_kv_cache(backend="xqa")``,
    on a workspace of its own (zeroed once, as its semaphores need)."""
    from flashinfer.decode import trtllm_batch_decode_with_kv_cache

    dev = batch.device
    ws = made(cache, ("xqa-workspace",), lambda: torch.zeros(XQA_WORKSPACE_BYTES, dtype=torch.uint8, device=dev))
    table = batch.block_table.to(torch.int32).contiguous()
    seq_lens = batch.kv_lens.to(torch.int32).contiguous()
    max_len = int(batch.host.kv_lens.max())
    out = torch.empty_like(batch.q)
    sinks = batch.sinks.float().contiguous() if batch.sinks is not None else None
    q, kv, wl, order = batch.q, _kv(batch), _window_left(batch, f), batch.kv_order
    sc = _scales(batch)  # TensorRT-LLM's bmm1_scale = sm_scale * k_scale, bmm2_scale = v_scale
    bmm1, bmm2 = batch.scale * sc.get("k_scale", 1.0), sc.get("v_scale", 1.0)

    def call() -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q, kv, ws, table, seq_lens, max_len, bmm1_scale=bmm1, bmm2_scale=bmm2, window_left=wl, out=out,
            sinks=sinks, kv_layout=order, backend="xqa")

    return Step(call, "own zeroed workspace")


def persistent_step(batch: Batch, f: Facts, cache: dict) -> Step:
    """``BatchAttention``: one persistent kernel over prefill and decode requests."""
    import flashinfer

    dev = batch.device
    indptr, indices, _ = flashinfer_page_layout(batch)
    w = made(cache, ("persistent",), lambda: flashinfer.BatchAttention(kv_layout=batch.kv_order, device=str(dev)))
    qo_indptr = torch.from_numpy(batch.host.query_start_loc.astype(np.int32))
    kv_lens = torch.from_numpy(batch.host.kv_lens.astype(np.int32))
    w.plan(qo_indptr.to(dev), indptr.to(dev), indices, kv_lens.to(dev), batch.num_q_heads, batch.num_kv_heads,
           batch.head_dim, batch.head_dim, batch.page_size, causal=all(f.causal), sm_scale=batch.scale,
           logits_soft_cap=batch.softcap, q_data_type=batch.dtype, kv_data_type=batch.kv_dtype)
    q, kv, sc = batch.q, _kv(batch), _scales(batch)  # run folds k_scale into sm_scale, the kernel applies v_scale
    cap = batch.softcap or 0.0
    return Step(lambda: w.run(q, kv, logits_soft_cap=cap, **sc)[0])


def pod_step(batch: Batch, f: Facts, ws: torch.Tensor, cache: dict) -> Step:
    """``BatchPODWithPagedKVCacheWrapper``: the prefill group and the decode group (each one run
    of the packed queries: prefills first, or decodes first as vLLM orders a batch) in one fused
    launch; its two outputs are written into one (the copy a concatenation makes). POD's ``run``
    folds ``k_scale`` into the decodes' scale only and scales only their output by ``v_scale``
    (pod.py), so an FP8 cache's ``k_scale`` goes into ``plan``'s ``sm_scale`` (both groups) and
    ``v_scale`` into the copies that assemble the output."""
    import flashinfer

    dev, h = batch.device, batch.host
    multi = h.query_lens > 1
    prefills_first = bool(multi[0])
    n1 = int(multi.sum() if prefills_first else (~multi).sum())  # requests of the first group
    qo = h.query_start_loc.astype(np.int32)
    t1 = int(qo[n1])
    indptr, indices, last = flashinfer_page_layout(batch)
    split = int(indptr[n1])
    first = (torch.from_numpy(qo[: n1 + 1].copy()).to(dev), indptr[: n1 + 1].to(dev), indices[:split], last[:n1])
    second = (torch.from_numpy(qo[n1:] - qo[n1]).to(dev), (indptr[n1:] - indptr[n1]).to(dev), indices[split:], last[n1:])
    pre, dec = (first, second) if prefills_first else (second, first)
    sc = _scales(batch)
    w = made(cache, ("pod",), lambda: flashinfer.BatchPODWithPagedKVCacheWrapper(ws, kv_layout=batch.kv_order))
    w.plan(*pre, *dec, num_qo_heads=batch.num_q_heads, num_kv_heads=batch.num_kv_heads, head_dim=batch.head_dim,
           page_size=batch.page_size, window_left=_window_left(batch, f), sm_scale=batch.scale * sc.get("k_scale", 1.0),
           q_data_type=batch.dtype, kv_data_type=batch.kv_dtype)  # no ALiBi: its kernel drops it (flashinfer_alibi.py)
    q, kv, v_scale = batch.q, _kv(batch), sc.get("v_scale")
    causal_p = all(f.prefill_causal)
    q_pre, q_dec = (q[:t1], q[t1:]) if prefills_first else (q[t1:], q[:t1])

    def call() -> torch.Tensor:
        o_p, o_d = w.run(q_pre, kv, q_dec, kv, causal_p=causal_p)
        out = torch.empty_like(q)
        a, b = (o_p, o_d) if prefills_first else (o_d, o_p)
        if v_scale is None:
            out[:t1].copy_(a)
            out[t1:].copy_(b)
        else:
            torch.mul(a, v_scale, out=out[:t1])
            torch.mul(b, v_scale, out=out[t1:])
        return out

    n_p = int(multi.sum())
    detail = f"{n_p} prefill + {batch.num_requests - n_p} decode requests" + ("" if prefills_first else ", decodes first")
    return Step(call, detail + (", k_scale in sm_scale, v_scale on the output" if sc else ""))


def workspace_for(cache: dict, dev: torch.device) -> torch.Tensor:
    """The float workspace the backend instance's wrappers share (zeroed, as FlashInfer asks)."""
    return made(cache, ("workspace", str(dev)), lambda: torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=dev))


def step_for(route: str, batch: Batch, f: Facts, cache: dict) -> Step:
    ws = workspace_for(cache, batch.device)
    if route in ("decode", "decode-tc"):
        return decode_step(batch, f, ws, cache, tensor_cores=route == "decode-tc")
    if route in ("fa2", "fa3"):
        return prefill_step(batch, f, ws, cache, route)
    if route == "xqa":
        return xqa_step(batch, f, cache)
    if route == "persistent":
        return persistent_step(batch, f, cache)
    if route == "pod":
        return pod_step(batch, f, ws, cache)
    raise ValueError(f"unknown FlashInfer route {route!r}")


def sm_major(dev: torch.device) -> Optional[int]:
    """The GPU's compute capability major (None off CUDA)."""
    return torch.cuda.get_device_capability(dev)[0] if dev.type == "cuda" else None
