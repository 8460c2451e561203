"""The standard skip reasons a backend's declared capabilities give (``Backend.capability_reasons``):
head dims, request kinds and trees, and the attention variants (docs/semantics.md). One wording
each, so rows read alike across backends. ``cls`` is a Backend subclass."""
from __future__ import annotations

from typing import Any


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
    if spec.kv_dtype is not None:
        if spec.kv_dtype not in cls.kv_dtypes:
            has = f" (it reads {', '.join(cls.kv_dtypes)})" if cls.kv_dtypes else ""
            out.append(f"{label} does not read an {spec.kv_dtype} KV cache (kv_cache.dtype){has}")
        elif spec.kv_scale not in cls.kv_scales:
            out.append(f"{label} takes {'/'.join(cls.kv_scales)} FP8 scales, not {spec.kv_scale} (kv_cache.scale)")
    if spec.kv_order not in cls.kv_orders:
        out.append(f"{label} reads only {'/'.join(cls.kv_orders)} caches, not {spec.kv_order} (kv_cache.order)")
    return out
