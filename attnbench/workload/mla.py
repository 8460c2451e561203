"""Multi-head latent attention (DeepSeek-V2/V3/R1, Kimi K2) in its absorbed form: the shapes,
the default softmax scale and the checks of an MLA batch spec (docs/semantics.md, "MLA").

One latent row per token is cached: ``[c_kv (kv_lora_rank) | k_rope (rope_dim)]``, one "KV
head" of ``head_dim = kv_lora_rank + rope_dim``. Every query head's absorbed query has the
same width; its scores are ``q . row * scale`` and its values are the row's first
``kv_lora_rank`` dims (``c_kv``), so the output has ``kv_lora_rank`` dims a head. No torch
import here (scenario validation stays fast)."""
from __future__ import annotations

from typing import Any

ATTENTIONS = ("mha", "mla")
#: DeepSeek-V2/V3/R1 and Kimi K2: the per-head width of the non-rotary query/key part before
#: absorption. The softmax scale of the absorbed form keeps the original head's scale.
DEFAULT_QK_NOPE_HEAD_DIM = 128
DEFAULT_KV_LORA_RANK = 512
DEFAULT_ROPE_DIM = 64


def is_mla(spec: Any) -> bool:
    """True for an MLA spec or batch (anything with a ``spec`` or an ``attention`` field)."""
    spec = getattr(spec, "spec", spec)
    return getattr(spec, "attention", "mha") == "mla"


def default_mla_scale(rope_dim: int, qk_nope_head_dim: int = DEFAULT_QK_NOPE_HEAD_DIM) -> float:
    """``1 / sqrt(qk_nope_head_dim + rope_dim)``: the scale of the model's original per-head
    dot product (192 dims for DeepSeek-V3), not of the 576-wide absorbed one: absorbing
    W_UK into the query changes no score, so the scale stays the model's."""
    return (qk_nope_head_dim + rope_dim) ** -0.5


def default_scale(spec: Any) -> float:
    """A BatchSpec's scale when none is given: ``head_dim ** -0.5``; for MLA the original head's."""
    return default_mla_scale(spec.rope_dim) if is_mla(spec) else spec.head_dim ** -0.5


def spec_problems(attention: str, num_kv_heads: int, head_dim: int, kv_lora_rank: int, rope_dim: int) -> list[str]:
    """What is wrong with these BatchSpec fields ([] when they fit together)."""
    if attention not in ATTENTIONS:
        return [f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}"]
    if attention == "mha":
        if kv_lora_rank or rope_dim:
            return ["kv_lora_rank and rope_dim are for attention 'mla' only"]
        return []
    out = []
    if kv_lora_rank < 1 or rope_dim < 0:
        out.append(f"MLA needs kv_lora_rank >= 1 and rope_dim >= 0, got {kv_lora_rank} and {rope_dim}")
    if num_kv_heads != 1:
        out.append(f"MLA caches one latent head: num_kv_heads must be 1, got {num_kv_heads}")
    if head_dim != kv_lora_rank + rope_dim:
        out.append(f"MLA head_dim must be kv_lora_rank + rope_dim = {kv_lora_rank + rope_dim}, got {head_dim}")
    return out


def model_problems(model: Any) -> list[str]:
    """Problems of a scenario's ``model:`` section (the pydantic ModelShape), as messages
    naming the key and the fix."""
    if model.attention == "mha":
        out = [f"{k} is for attention: mla only; remove it or add attention: mla"
               for k in ("kv_lora_rank", "rope_dim", "qk_nope_head_dim") if getattr(model, k) is not None]
        out += [f"{k} is required (e.g. {k}: {ex}); for multi-head latent attention write attention: mla"
                for k, ex in (("num_kv_heads", 8), ("head_dim", 128)) if getattr(model, k) is None]
        if not out and model.num_q_heads % model.num_kv_heads:
            out.append(f"num_q_heads ({model.num_q_heads}) must be a multiple of num_kv_heads ({model.num_kv_heads})")
        return out
    rank = model.kv_lora_rank if model.kv_lora_rank is not None else DEFAULT_KV_LORA_RANK
    rope = model.rope_dim if model.rope_dim is not None else DEFAULT_ROPE_DIM
    out = [f"attention: mla does not take {k} (DeepSeek-V3/R1 and Kimi K2 use none); remove it"
           for k in ("window", "softcap") if getattr(model, k, None) is not None]
    out += [f"attention: mla does not take {k}: true (DeepSeek-V3/R1 and Kimi K2 use none); remove it"
            for k in ("sinks", "alibi") if getattr(model, k, False)]
    if model.num_kv_heads not in (None, 1):
        out.append(f"attention: mla caches one latent vector a token: leave num_kv_heads out (it is 1),"
                   f" got {model.num_kv_heads}")
    if model.head_dim not in (None, rank + rope):
        out.append(f"attention: mla: head_dim is kv_lora_rank + rope_dim = {rank + rope}; leave it out,"
                   f" got {model.head_dim}")
    return out


def attention_fields(model: Any) -> dict:
    """The BatchSpec fields of a scenario's ``model:`` attention: num_kv_heads, head_dim and
    scale, plus the MLA fields (defaults filled in) for ``attention: mla``."""
    if not is_mla(model):
        return dict(num_kv_heads=model.num_kv_heads, head_dim=model.head_dim, scale=model.scale)
    rank = model.kv_lora_rank if model.kv_lora_rank is not None else DEFAULT_KV_LORA_RANK
    rope = model.rope_dim if model.rope_dim is not None else DEFAULT_ROPE_DIM
    nope = model.qk_nope_head_dim if model.qk_nope_head_dim is not None else DEFAULT_QK_NOPE_HEAD_DIM
    scale = model.scale if model.scale is not None else default_mla_scale(rope, nope)
    return dict(num_kv_heads=1, head_dim=rank + rope, scale=scale, attention="mla", kv_lora_rank=rank, rope_dim=rope)


def check_model(model: Any) -> None:
    """ValueError with every problem of :func:`model_problems` (pydantic names the field)."""
    problems = model_problems(model)
    if problems:
        raise ValueError("; ".join(problems))
