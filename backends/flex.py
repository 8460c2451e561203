"""FlexAttention on K/V packed request after request (gathered out of the pages in ``plan``).

The mask is a ``mask_mod`` over the packed sequence: a query token sees keys of its own
request only, causally (bottom-right) for prefill/decode, and prefix + ancestors for tree
nodes, read from a per-token ancestor table built in ``plan``. ``plan`` also builds the
block mask. On the GPU, ``flex_attention`` is compiled (forcing the flex kernel: the decoding
kernel failed for GQA tree masks on an H100, NOTES.md); on the CPU it runs unfused.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.backend import Backend
from attnbench.batch import Batch
from attnbench.trees import ancestor_mask

from ._dense import gather_packed_kv


@dataclass
class FlexPlan:
    q: torch.Tensor  # [1, Hq, N, D]
    k: torch.Tensor  # [1, Hkv, sum(L), D]
    v: torch.Tensor
    block_mask: Any
    scale: float
    fn: Any
    kernel_options: dict


# On the CPU the unfused path is what runs (and is fine); its warning only adds noise.
warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    import torch._dynamo

    from torch.nn.attention.flex_attention import flex_attention

    # Every case of a sweep is a new static shape: allow more recompiles than the default 8,
    # or torch.compile would silently fall back to the unfused path after the eighth.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    return torch.compile(flex_attention, dynamic=False)


class FlexBackend(Backend):
    name = "flex"

    @classmethod
    def unavailable(cls):
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError:
            return f"torch {torch.__version__} has no FlexAttention (needs torch >= 2.5)"
        return None

    def unsupported(self, batch: Batch) -> list[str]:
        reasons = []
        if batch.num_q_heads % batch.num_kv_heads:
            reasons.append(f"num_q_heads {batch.num_q_heads} is not a multiple of num_kv_heads {batch.num_kv_heads}")
        if batch.device.type == "cuda" and batch.dtype == torch.float32 and batch.head_dim > 128:
            reasons.append("flex kernel: float32 with head_dim > 128 exceeds shared memory")
        return reasons

    def plan(self, batch: Batch) -> FlexPlan:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        dev = batch.device
        k, v, _ = gather_packed_kv(batch)
        n = batch.num_tokens
        tmax = max((r.query for r in batch.requests if r.tree_parents is not None), default=1)
        q_doc = torch.empty(n, dtype=torch.int32)
        q_causal = torch.empty(n, dtype=torch.int32)  # last key slot visible causally
        q_tree_base = torch.empty(n, dtype=torch.int32)  # first tree slot (a large value if none)
        tree_anc = torch.zeros(n, tmax, dtype=torch.bool)
        kv_doc, kv_local = [], []
        big = 1 << 30
        for i, (r, s) in enumerate(zip(batch.requests, batch.query_start)):
            q_doc[s : s + r.query] = i
            kv_doc.append(torch.full((r.kv_len,), i, dtype=torch.int32))
            kv_local.append(torch.arange(r.kv_len, dtype=torch.int32))
            if r.tree_parents is None:
                q_causal[s : s + r.query] = r.context + torch.arange(r.query, dtype=torch.int32)
                q_tree_base[s : s + r.query] = big
            else:
                q_causal[s : s + r.query] = r.context - 1
                q_tree_base[s : s + r.query] = r.context
                tree_anc[s : s + r.query, : r.query] = ancestor_mask(r.tree_parents)
        q_doc, q_causal, q_tree_base, tree_anc = (t.to(dev) for t in (q_doc, q_causal, q_tree_base, tree_anc))
        kv_doc = torch.cat(kv_doc).to(dev)
        kv_local = torch.cat(kv_local).to(dev)

        def mask_mod(b, h, q_idx, kv_idx):
            local = kv_local[kv_idx]
            rel = local - q_tree_base[q_idx]
            in_tree = (rel >= 0) & tree_anc[q_idx, rel.clamp(0, tmax - 1)]
            return (q_doc[q_idx] == kv_doc[kv_idx]) & ((local <= q_causal[q_idx]) | in_tree)

        total_kv = k.shape[0]
        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=n, KV_LEN=total_kv, device=dev)
        on_gpu = dev.type == "cuda"
        fn = _compiled_flex() if on_gpu else flex_attention
        kernel_options = {"FORCE_USE_FLEX_ATTENTION": True} if on_gpu else {}
        return FlexPlan(
            q=batch.q.transpose(0, 1).unsqueeze(0),
            k=k.transpose(0, 1).unsqueeze(0),
            v=v.transpose(0, 1).unsqueeze(0),
            block_mask=block_mask,
            scale=batch.scale,
            fn=fn,
            kernel_options=kernel_options,
        )

    def run(self, p: FlexPlan) -> torch.Tensor:
        kw = {"kernel_options": p.kernel_options} if p.kernel_options else {}
        o = p.fn(p.q, p.k, p.v, block_mask=p.block_mask, scale=p.scale, enable_gqa=True, **kw)
        return o.squeeze(0).transpose(0, 1)
