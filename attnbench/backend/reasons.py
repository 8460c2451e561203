"""The standard skip reasons a backend's declared capabilities give (``Backend.capability_reasons``):
head dims, request kinds and trees, and the attention variants (docs/semantics.md). One wording
each, so rows read alike across backends. ``cls`` is a Backend subclass."""
from __future__ import annotations

import os
from typing import Any, Optional

from attnbench.workload.mla import is_mla


def _dtype_name(d: Any) -> str:
    return str(d).replace("torch.", "")


def capability_reasons(cls: Any, batch: Any) -> list[str]:
    """The standard reasons, from the declared capabilities of ``cls`` (one wording each)."""
    label = cls.label or cls.name
    out = []
    if cls.cuda_only and batch.device.type != "cuda":
        out.append(f"{label} runs on CUDA devices only")
    if cls.dtypes and batch.dtype not in cls.dtypes:
        names = "/".join(_dtype_name(d) for d in cls.dtypes)
        out.append(f"{label} takes {names}, not {_dtype_name(batch.dtype)}")
    if not is_mla(batch):
        out += head_dim_reasons(cls, label, batch.head_dim)
    elif not cls.supports_mla:
        out.append(f"{label} cannot compute multi-head latent attention (attention: mla: {batch.num_q_heads}"
                   f" query heads on one latent head of {batch.head_dim} dims, values of {batch.v_head_dim})")
    ps = batch.page_size
    if ps % cls.page_size_multiple:
        out.append(f"{label} needs page_size divisible by {cls.page_size_multiple}, got {ps}")
    if cls.max_page_size is not None and ps > cls.max_page_size:
        out.append(f"{label} takes page_size at most {cls.max_page_size}, got {ps}")
    hq, hkv = batch.num_q_heads, batch.num_kv_heads
    if hq % hkv:
        out.append(f"num_q_heads {hq} is not a multiple of num_kv_heads {hkv}")
    elif cls.max_group is not None and hq // hkv > cls.max_group:
        out.append(f"{label} takes at most {cls.max_group} query heads per KV head, got {hq // hkv}")
    out += request_reasons(cls, label, batch)
    out += variant_reasons(cls, label, batch.spec)
    return out


def head_dim_reasons(cls: Any, label: str, d: int) -> list[str]:
    if cls.head_dims:
        if d not in cls.head_dims:
            return [f"{label} supports head_dim {', '.join(map(str, cls.head_dims))}, got {d}"]
        return []
    if d % cls.head_dim_multiple or (cls.max_head_dim is not None and d > cls.max_head_dim):
        most = f" and at most {cls.max_head_dim}" if cls.max_head_dim is not None else ""
        return [f"{label} needs head_dim a multiple of {cls.head_dim_multiple}{most}, got {d}"]
    return []


def request_reasons(cls: Any, label: str, batch: Any) -> list[str]:
    out = []
    kinds = sorted({r.kind for r in batch.requests} - set(cls.kinds))
    if kinds:
        out.append(f"{label} does not compute {'/'.join(kinds)} requests")
    trees = [r for r in batch.requests if r.tree_parents is not None]
    shapes = len({r.tree_parents for r in trees})
    if cls.max_tree_shapes is not None and shapes > cls.max_tree_shapes:
        allowed = "one tree" if cls.max_tree_shapes == 1 else f"at most {cls.max_tree_shapes} tree shapes"
        out.append(f"{label} takes {allowed} for the whole batch; this batch has {shapes} tree shapes")
    if cls.trees_need_context and any(r.context == 0 for r in trees):
        out.append(f"{label} needs a prefix (context >= 1) for every tree request")
    return out


def variant_reasons(cls: Any, label: str, spec: Any) -> list[str]:
    """One reason per attention variant the batch uses and the backend does not declare."""
    out = []
    wanted = [
        (spec.window is not None, cls.supports_window, f"a sliding window (model.window: {spec.window})"),
        (spec.sinks, cls.supports_sinks, "attention sinks (model.sinks)"),
        (spec.softcap is not None, cls.supports_softcap, f"logit soft-capping (model.softcap: {spec.softcap})"),
        (spec.alibi, cls.supports_alibi, "ALiBi (model.alibi)"),
        (any(not r.causal for r in spec.requests), cls.supports_noncausal, "non-causal prefill (causal: false)"),
    ]
    out += [f"{label} does not support {what}" for used, ok, what in wanted if used and not ok]
    out += feature_reasons(cls, label, spec)
    if spec.kv_dtype is not None:
        if spec.kv_dtype not in cls.kv_dtypes:
            has = f" (it reads {', '.join(cls.kv_dtypes)})" if cls.kv_dtypes else ""
            out.append(f"{label} does not read an {spec.kv_dtype} KV cache (kv_cache.dtype){has}")
        elif spec.kv_scale not in cls.kv_scales:
            out.append(f"{label} takes {'/'.join(cls.kv_scales)} FP8 scales, not {spec.kv_scale} (kv_cache.scale)")
    if spec.kv_order not in cls.kv_orders:
        out.append(f"{label} reads only {'/'.join(cls.kv_orders)} caches, not {spec.kv_order} (kv_cache.order)")
    return out


def feature_reasons(cls: Any, label: str, spec: Any) -> list[str]:
    """The batch features of issue 59 the batch uses and ``cls`` does not declare."""
    wanted = [
        (spec.k_scale is not None, cls.supports_16bit_kv_scales,
         f"K/V scales on a {spec.dtype} cache (kv_cache.k_scale/v_scale)"),
        (spec.short_kv, cls.supports_short_kv, "queries longer than their KV (kv_len < query)"),
        (spec.rope, cls.supports_rope, "fused RoPE (model.rope)"),
        (spec.alibi_first, cls.supports_alibi_before_softcap, "ALiBi before the soft-cap (model.score_order)"),
    ]
    out = [f"{label} does not support {what}" for used, ok, what in wanted if used and not ok]
    if spec.q_dtype is not None and spec.q_dtype not in cls.q_dtypes:
        out.append(f"{label} does not run FP8 attention with {spec.q_dtype} queries (model.q_dtype)")
    if spec.out_dtype is not None and spec.out_dtype not in cls.out_dtypes:
        out.append(f"{label} does not write an {spec.out_dtype} output (model.out_dtype)")
    return out


def device_reason(name: str, cuda_only: bool, cpu_env: Optional[str], device_type: str) -> Optional[str]:
    """See :meth:`Backend.device_reason` (a function, so that the listing of built-in
    backends can say it without importing them)."""
    if cuda_only and device_type != "cuda":
        return f"runs on CUDA devices only; this machine runs on {device_type}"
    if device_type == "cpu" and cpu_env and os.environ.get(cpu_env) != "1":
        return f"runs on a CPU only under {cpu_env}=1 (or name it with -b {name} to see its skipped rows)"
    return None
