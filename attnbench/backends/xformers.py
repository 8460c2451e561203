"""xformers: paged attention through ``memory_efficient_attention`` with its paged
block-diagonal biases, and trees through ``xformers.ops.tree_attention``.

Routes (the plan's ``mode``, copied into each result row):
- ``paged``: non-tree requests. One ``memory_efficient_attention_forward`` call over the whole
  cache viewed as one long sequence ``[1, P*page, Hkv, G, D]`` (BMGHK; GQA by a stride-0
  expand), with ``BlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens(...).make_paged(
  block_table, page_size, PagedBlockDiagonalCausalWithOffsetPaddedKeysMask)`` (causal,
  bottom-right aligned per request).
- ``tree_attention``: tree requests. ``tree_attention`` takes ONE tree for the whole batch
  (its spec bias is one ``[T, T]`` tensor): every tree request of a batch must have the same
  parent array, or the batch is skipped with that reason. The prefix is paged
  (``PagedBlockDiagonalPaddedKeysMask``, kv length = context), the tree's own K/V (slots
  ``C..L-1``) is passed dense: gathered by an index built in plan.
- ``paged+tree_attention``: both in one batch (two calls, outputs scattered back).
- Non-tree requests that mix causal and non-causal prefills take two paged calls, one per
  bias type (``_causal_groups.py``), each group's output copied into the packed output
  (``memory_efficient_attention_forward`` takes no output tensor); the mode then ends in
  ``(two calls: causal + non-causal)``. Triton-only mode's limits hold per call.

Capabilities (declared on the class): CUDA, float16/bfloat16 (the kernels that read the paged
biases take no other), ``page_size % 64 == 0`` (the split-K kernel's key block, required by the
paged biases), one tree shape per batch, tree requests with a prefix.

Triton-only mode (opt-in): option ``triton_only=on`` (``-b xformers:triton_only=on``; default
from ``ATTNBENCH_XFORMERS_TRITON_ONLY``).
xformers' C++/CUDA extension is built for one torch version. When it does not load (e.g. the
0.0.35 wheel, built for torch 2.10, under torch 2.11), xformers refuses even its Triton
kernels, and this backend is unavailable with that reason. With
``triton_only=on`` the backend sets
``xformers.ops.fmha.common._built_with_cuda = True`` before its first call, which lets the
Triton split-K kernel (``triton_splitk.FwOp``) run, and uses that kernel explicitly for every
call. Every row then says ``triton-only`` in its mode. That kernel takes causal query blocks
of at most 16 tokens, all of equal length, and head dims 16/32/64/128/256/512: other batches
are skipped in that mode with the reason (they need the CUDA extension's flash kernels).
Where it was validated (and what has not run yet): docs/backends.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from attnbench.backend import Backend, BackendOption
from attnbench.workload.batch import Batch

from ._causal_groups import TWO_CALLS, Group, causal_groups, put, split_requests, take
from ._common_libs import env_flag
from ._metadata import slots_of, token_ids, tree_masks

TRITON_ONLY_ENV = "ATTNBENCH_XFORMERS_TRITON_ONLY"
PAGE_MULTIPLE = 64
TRITON_MAX_CAUSAL_Q = 16
#: head dims of the Triton split-K kernel (xformers 0.0.35 ops/fmha/triton_splitk.py, FwOp.shape_not_supported_reasons)
TRITON_HEAD_DIMS = (16, 32, 64, 128, 256, 512)


def _extension_error() -> Optional[str]:
    """Why xformers' C++/CUDA extension did not load, or None (imports xformers)."""
    from xformers import _cpp_lib

    exc = getattr(_cpp_lib, "_cpp_library_load_exception", None)
    if exc is None:
        return None
    first = str(exc).strip().splitlines()
    return " ".join(line.strip() for line in first[:3])


def triton_only(opted_in: bool) -> bool:
    """True when xformers runs in Triton-only mode: its extension failed and the user opted in."""
    return opted_in and _extension_error() is not None


def _enable_triton_only() -> None:
    import xformers.ops.fmha.common as common

    common._built_with_cuda = True


@dataclass
class XformersPlan:
    mode: str
    q: torch.Tensor  # [N, Hq, D]
    k: torch.Tensor  # [1, P*page, Hkv, G, D]  (stride-0 expand over G)
    v: torch.Tensor
    scale: float
    op: Any  # explicit forward op (triton split-K) or None (xformers' dispatch)
    xops: Any
    tree_fn: Any = None
    # non-tree part: one paged call per causality (``_causal_groups.py``), with its bias
    paged: list[tuple[Group, Any]] = field(default_factory=list)
    # tree part
    tree_tok: Optional[torch.Tensor] = None
    tree_b: int = 0
    tree_t: int = 0
    tree_slot: Optional[torch.Tensor] = None  # [Bt*T] long rows of the flattened cache
    spec_bias: Optional[torch.Tensor] = None  # [T, T] 0 / -inf, q dtype
    prefix_bias: Any = None


class XformersBackend(Backend):
    name = "xformers"
    import_modules = ("xformers._cpp_lib", "xformers.ops")

    @classmethod
    def unavailable(cls) -> Optional[str]:
        why = super().unavailable()
        if why:
            return why
        err = _extension_error()
        if err is not None and not env_flag(TRITON_ONLY_ENV):
            return (
                f"xformers' C++/CUDA extension does not load with torch {torch.__version__} ({err}); "
                f"run -b xformers:triton_only=on (or set {TRITON_ONLY_ENV}=1) for its Triton split-K kernels only"
            )
        return None

    def why_unavailable(self) -> Optional[str]:
        why = Backend.unavailable.__func__(type(self))  # the library itself
        if why or self.option("triton_only") == "on":
            return why
        return type(self).unavailable()

    label = "xformers"
    # the kernels that read its paged biases (flash, Triton split-K: SUPPORTED_DTYPES) take 16-bit inputs only
    dtypes = (torch.float16, torch.bfloat16)
    page_size_multiple = PAGE_MULTIPLE
    max_tree_shapes = 1  # tree_attention's spec bias is one [T, T] tensor
    trees_need_context = True
    supports_noncausal = True  # the non-causal paged bias (PagedBlockDiagonalPaddedKeysMask)
    options = {
        "triton_only": BackendOption(
            "triton_only", False, type=bool, env=TRITON_ONLY_ENV,
            help="when xformers' C++/CUDA extension does not load, run its Triton split-K kernels only"),
    }

    def unsupported(self, batch: Batch) -> list[str]:
        reasons = []
        trees = batch.trees.tmax > 0
        if trees and abs(batch.scale - batch.head_dim ** -0.5) > 1e-12 * batch.scale:
            reasons.append("xformers tree_attention has no scale argument (it uses head_dim ** -0.5)")
        tonly = self._triton_only_reason_check()
        if tonly and batch.head_dim not in TRITON_HEAD_DIMS:
            reasons.append(f"xformers triton-only mode: the split-K kernel takes head dims "
                           f"{'/'.join(map(str, TRITON_HEAD_DIMS))}, got {batch.head_dim}")
        others = np.flatnonzero(~batch.host.is_tree)
        if len(others) and tonly:  # per call: the causal and the non-causal group apart
            for causal, reqs in split_requests(batch, others):
                qs = sorted(set(batch.host.query_lens[reqs].tolist()))
                if max(qs) > TRITON_MAX_CAUSAL_Q or len(qs) > 1:
                    reasons.append(
                        f"xformers triton-only mode: the split-K kernel takes causal query blocks of at most "
                        f"{TRITON_MAX_CAUSAL_Q} tokens, all of equal length per call (got {qs[:4]} in the "
                        f"{'causal' if causal else 'non-causal'} call); longer prefill needs xformers' CUDA extension"
                    )
        return reasons

    def _triton_only_reason_check(self) -> bool:
        try:
            return triton_only(self.option("triton_only") == "on")
        except Exception:
            return False

    def plan(self, batch: Batch) -> XformersPlan:
        import xformers.ops as xops

        tonly = triton_only(self.option("triton_only") == "on")
        op = None
        if tonly:
            _enable_triton_only()
            from xformers.ops.fmha import triton_splitk

            op = triton_splitk.FwOp
        hq, hkv, d, ps = batch.num_q_heads, batch.num_kv_heads, batch.head_dim, batch.page_size
        g = hq // hkv
        npages = batch.k_cache.shape[0]
        k = batch.k_cache.view(1, npages * ps, hkv, 1, d).expand(1, npages * ps, hkv, g, d)
        v = batch.v_cache.view(1, npages * ps, hkv, 1, d).expand(1, npages * ps, hkv, g, d)
        p = XformersPlan(mode="", q=batch.q, k=k, v=v, scale=batch.scale, op=op, xops=xops)
        is_tree = batch.host.is_tree
        trees, others = np.flatnonzero(is_tree), np.flatnonzero(~is_tree)
        if len(others):
            p.paged = _plan_paged(batch, others)
        if len(trees):
            _plan_trees(p, batch, split=bool(len(others)))
        route = "paged+tree_attention" if (len(trees) and len(others)) else ("tree_attention" if len(trees) else "paged")
        if len(p.paged) > 1:
            route = f"{route} ({TWO_CALLS})"
        p.mode = f"triton-only {route}" if tonly else route
        return p

    def run(self, p: XformersPlan) -> torch.Tensor:
        n, hq, d = p.q.shape
        hkv, g = p.k.shape[2], p.k.shape[3]
        out = None
        for call, bias in p.paged:  # one call per causality (a copy each when split or beside trees)
            q = take(p.q, call)
            o = p.xops.memory_efficient_attention_forward(
                q.view(1, q.shape[0], hkv, g, d), p.k, p.v, attn_bias=bias, scale=p.scale, op=p.op
            ).view(q.shape[0], hq, d)
            out = put(out, call, o, p.q)
        if p.tree_fn is None:
            return out
        b, t = p.tree_b, p.tree_t
        q = p.q if p.tree_tok is None else p.q[p.tree_tok]
        kf = p.k[0, :, :, 0]  # [P*page, Hkv, D], a view of the cache
        vf = p.v[0, :, :, 0]
        sk = kf[p.tree_slot].view(b, t, hkv, 1, d).expand(b, t, hkv, g, d)
        sv = vf[p.tree_slot].view(b, t, hkv, 1, d).expand(b, t, hkv, g, d)
        o = p.tree_fn(
            q.view(b, t, hkv, g, d),
            sk,
            sv,
            p.k,
            p.v,
            p.spec_bias,
            p.prefix_bias,
            prefix_op=p.op,
            suffix_op=p.op,
        ).reshape(b * t, hq, d)
        if out is None:
            return o
        out[p.tree_tok] = o
        return out


def _plan_paged(batch: Batch, others: np.ndarray) -> list[tuple[Group, Any]]:
    """The paged calls of the non-tree requests ``others``: one per causality, each with its
    bias (the causal one bottom-right aligned; decodes see every key either way)."""
    from xformers.ops.fmha import attn_bias as ab

    dev, ps = batch.device, batch.page_size
    calls = []
    for g in causal_groups(batch, others):
        if g.causal:
            bias = ab.BlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens(
                q_seqlen=g.query_lens.tolist(),
                kv_padding=g.block_table.shape[1] * ps,
                kv_seqlen=g.kv_lens.tolist(),
                device=dev,
            ).make_paged(block_tables=g.block_table, page_size=ps,
                         paged_type=ab.PagedBlockDiagonalCausalWithOffsetPaddedKeysMask)
        else:
            bias = ab.PagedBlockDiagonalPaddedKeysMask.from_seqlens(
                q_seqlen=g.query_lens.tolist(), kv_seqlen=g.kv_lens.tolist(), block_tables=g.block_table,
                page_size=ps, device=dev,
            )
        calls.append((g, bias))
    return calls


def _plan_trees(p: XformersPlan, batch: Batch, split: bool) -> None:
    """tree_attention's inputs for the tree requests, which share one shape (``split``: the
    batch has other requests too). The spec bias comes from the (cached, for static trees) mask."""
    from xformers.ops.fmha import attn_bias as ab
    from xformers.ops.tree_attention import tree_attention

    t = batch.trees
    dev, ps = batch.device, batch.page_size
    p.tree_fn = tree_attention
    n = t.tmax
    ctx = batch.host.context_lens[t.reqs]
    p.spec_bias = torch.zeros(n, n, dtype=batch.dtype, device=dev).masked_fill_(~tree_masks(batch)[0], float("-inf"))
    rows = batch.block_table[t.reqs_t].contiguous() if split else batch.block_table
    p.prefix_bias = ab.PagedBlockDiagonalPaddedKeysMask.from_seqlens(
        q_seqlen=[n] * len(t.reqs), kv_seqlen=ctx.tolist(), block_tables=rows, page_size=ps, device=dev
    )
    p.tree_slot = slots_of(batch, t.reqs, ctx, t.sizes, n).reshape(-1)
    p.tree_b, p.tree_t = len(t.reqs), n
    if split:
        p.tree_tok = torch.from_numpy(token_ids(batch, t.reqs)).to(dev)
