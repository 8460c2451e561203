"""FlexAttention on K/V gathered out of the pages, padded per request.

Layout: queries ``[B, Hq, Qmax, D]`` and keys/values ``[B, Hkv, Lmax, D]`` (one batch row per
request, so the kernel's grid has B x heads x query blocks programs). The mask is a
``mask_mod``: keys past the request's ``kv_len`` are hidden; a query token sees keys causally
(bottom-right) for prefill/decode, and prefix + ancestors for tree nodes, read from a
per-token ancestor table; padding rows see key 0 only and are dropped.
``convert`` pads the queries and gathers K/V (what Flex needs because it cannot read the
pages: convert_ms); ``plan`` builds the mask_mod's tables by tensor ops and calls Flex's own
plan step, ``create_block_mask`` (plan_ms). On the GPU, ``flex_attention`` is compiled; batches with more
than one query per request force the flex (not the decoding) kernel, because the decoding
kernel failed for GQA tree masks on an H100 (docs/backends.md). On the CPU it runs unfused.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.backend import Backend
from attnbench.workload.batch import Batch

from ._dense import Dense, gather_padded_kv, padded_queries, unpad_output
from ._metadata import padded_tree_masks


@dataclass
class FlexPlan:
    q: torch.Tensor  # [B, Hq, Qmax, D]
    k: torch.Tensor  # [B, Hkv, Lmax, D]
    v: torch.Tensor
    block_mask: Any
    scale: float
    fn: Any
    kernel_options: dict
    index: torch.Tensor  # real tokens in [B * Qmax], packed order


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
        if batch.device.type == "cuda" and batch.dtype == torch.float32 and batch.head_dim > 128:
            return ["flex kernel: float32 with head_dim > 128 exceeds shared memory"]
        return []

    def convert(self, batch: Batch) -> Dense:
        k, v = gather_padded_kv(batch)
        q, index = padded_queries(batch)
        return Dense(batch, q, k, v, index)

    def plan(self, dense: Dense) -> FlexPlan:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        d = dense if isinstance(dense, Dense) else self.convert(dense)  # plan(batch) converts first
        batch = d.batch
        dev = batch.device
        b, qmax, lmax = d.q.shape[0], d.q.shape[2], d.k.shape[2]
        tmax = max(batch.trees.tmax, 1)
        q_causal, q_tree_base = _row_limits(batch, qmax)
        tree_anc = padded_tree_masks(batch, qmax, tmax)  # [B, Qmax, Tmax]
        kv_len = batch.kv_lens

        def mask_mod(bi, h, q_idx, kv_idx):
            rel = kv_idx - q_tree_base[bi, q_idx]
            in_tree = (rel >= 0) & tree_anc[bi, q_idx, rel.clamp(0, tmax - 1)]
            return (kv_idx < kv_len[bi]) & ((kv_idx <= q_causal[bi, q_idx]) | in_tree)

        block_mask = create_block_mask(mask_mod, B=b, H=None, Q_LEN=qmax, KV_LEN=lmax, device=dev)
        on_gpu = dev.type == "cuda"
        kernel_options = {"FORCE_USE_FLEX_ATTENTION": True} if on_gpu and qmax > 1 else {}
        return FlexPlan(
            q=d.q,
            k=d.k,
            v=d.v,
            block_mask=block_mask,
            scale=batch.scale,
            fn=_compiled_flex() if on_gpu else flex_attention,
            kernel_options=kernel_options,
            index=d.index,
        )

    def run(self, p: FlexPlan) -> torch.Tensor:
        kw = {"kernel_options": p.kernel_options} if p.kernel_options else {}
        o = p.fn(p.q, p.k, p.v, block_mask=p.block_mask, scale=p.scale, enable_gqa=True, **kw)
        return unpad_output(o, p.index)


def _row_limits(batch: Batch, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_causal, q_tree_base)``, ``[B, Qmax]`` int32 on the batch's device: the last slot each
    query row sees causally, and the first tree slot of a tree row (``2**30`` otherwise).
    Padding rows see key 0 only."""
    dev = batch.device
    qi = torch.arange(qmax, device=dev, dtype=torch.int32)[None, :]
    ctx = batch.context_lens[:, None]
    real = qi < batch.query_lens[:, None]
    tree = batch.trees.is_tree_t[:, None]
    q_causal = torch.where(real, torch.where(tree, ctx - 1, ctx + qi), 0).to(torch.int32)
    q_tree_base = torch.where(real & tree, ctx, 1 << 30).to(torch.int32)
    return q_causal, q_tree_base
