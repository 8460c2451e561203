"""Fused RoPE on FlashInfer (``pos_encoding_mode="ROPE_LLAMA"``, ``rope_scale``, ``rope_theta`` in
the wrappers' ``plan``; docs/semantics.md "Fused RoPE"): which routes compute attnbench's rotary.

FlashInfer's Llama rotary (``include/flashinfer/pos_enc.cuh``, the prefill kernel's
``q_smem_inplace_apply_rotary`` and ``k_smem_inplace_apply_rotary``) turns dims ``i`` and
``i + D/2`` by ``pos * rope_rcp_scale * rope_rcp_theta ** (2 i / D)``, as attnbench does, at
slot positions: a key at its index ``kv_idx``, a query at ``kv_len - qo_len + qo_idx`` (decode:
``kv_len - 1``). Those are attnbench's positions for prefills and decodes, and for a chain tree,
but not for a branching tree (a node sits at ``C + depth``, not at its slot) nor for a request
with more queries than keys (its first queries' positions are negative; FlashInfer's are unsigned).
Routes: ``decode``, ``decode-tc`` and ``fa2`` hand ``pos_encoding_mode`` to a kernel that applies
it, as for ALiBi (flashinfer_alibi.py); ``fa3``, ``persistent``, ``pod``, ``xqa`` and the cascade
do not. ALiBi is the same argument (one or the other), and the attention-sink wrapper's variant
takes none.
"""
from __future__ import annotations

ROPE_ROUTES = ("decode", "decode-tc", "fa2")


def rope_reasons(route: str, f) -> list[str]:
    """Why ``route`` cannot compute the fused RoPE of a batch with facts ``f`` ([] = it can, or
    the batch has none)."""
    if not f.rope:
        return []
    name, out = f"route {route}", []
    if route not in ROPE_ROUTES:
        out.append(f"{name}: FlashInfer applies its Llama RoPE on routes {', '.join(ROPE_ROUTES)} only (the others' "
                   "plan fixes or drops pos_encoding_mode, as for ALiBi)")
    if f.branching_trees:
        out.append(f"{name}: FlashInfer rotates a query at its slot, and a branching tree's nodes sit at C + depth")
    if f.short_kv:
        out.append(f"{name}: FlashInfer rotates query i at kv_len - qo_len + i, unsigned: negative with more "
                   "queries than keys")
    if f.alibi:
        out.append(f"{name}: pos_encoding_mode is ALiBi or RoPE, not both")
    if f.sinks:
        out.append(f"{name}: the attention-sink wrapper's variant has no RoPE")
    return out


def rope_plan_args(spec) -> dict:
    """The ``plan`` arguments of fused RoPE for a batch of ``spec`` ({} without)."""
    if not spec.rope:
        return {}
    return {"pos_encoding_mode": "ROPE_LLAMA", "rope_scale": float(spec.rope_scale), "rope_theta": float(spec.rope_theta)}
