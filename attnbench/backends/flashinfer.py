"""FlashInfer on the paged cache: the decode wrapper for decode-only batches, the prefill
wrapper (causal, or with a custom mask) for everything else.

Routes (the plan's ``mode``, copied into each result row):
- ``decode``: every request has one query token and no tree:
  ``BatchDecodeWithPagedKVCacheWrapper`` (tensor cores when the GQA group is > 4, as vLLM does).
- ``prefill-causal``: prefill / chunked prefill / mixed batches without trees:
  ``BatchPrefillWithPagedKVCacheWrapper.plan(..., causal=True)`` (FlashInfer's causal mask is
  bottom-right aligned, as docs/semantics.md asks).
- ``prefill-custom-mask``: batches with trees: the same wrapper with ``custom_mask``, every
  request's ``[Q, L]`` mask flattened row-major and concatenated (causal rows for the non-tree
  requests of the batch).
- ``cascade`` / ``cascade-custom-mask``: batches whose requests share prefix pages: the
  shared pages read once per group (``flashinfer_cascade.py``; option ``cascade=off``, default
  from ``ATTNBENCH_FLASHINFER_CASCADE``, turns it off).

``plan`` derives FlashInfer's layout from ours by array ops (``indptr`` / ``indices`` /
``last_page_len`` from the block table; the custom mask per element from the batch's tree
masks, no per-request pieces), the cache passed as the ``(k_cache, v_cache)`` tuple with
``kv_layout="NHD"`` (ours is ``[P, page, Hkv, D]``), and calls the wrapper's ``plan()``, so
the plan time includes FlashInfer's own scheduling (as an engine's step does). The wrappers
are made once per backend instance (an engine makes them at start-up), on the first plan. FlashInfer's LSE is base 2; this backend
does not use it.

Option ``route`` (``-b flashinfer:route=fa3``; default from ``ATTNBENCH_FLASHINFER_BACKEND``):
``auto`` as above (the prefill wrapper on FlashInfer's ``fa2`` kernels); ``fa2`` / ``fa3``: every
batch through the prefill wrapper on that kernel family (``fa3`` has no custom mask: batches
with trees are skipped, naming the route).

Kernels are JIT-compiled by FlashInfer on first use (needs nvcc), unless a matching
``flashinfer-jit-cache`` / ``flashinfer-cubin`` is installed. Not captured in CUDA graphs
(``capturable = False``). Where it was validated: docs/backends.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnbench.backend import Backend, BackendOption
from attnbench.workload.batch import Batch

from ._metadata import custom_mask_flat, flashinfer_page_layout
from .flashinfer_cascade import CASCADE_ENV, plan_cascade

WORKSPACE_BYTES = 128 * 1024 * 1024
HEAD_DIMS = (64, 128, 256)
BACKEND_ENV = "ATTNBENCH_FLASHINFER_BACKEND"

_workspaces: dict = {}


def _workspace(device: torch.device) -> torch.Tensor:
    key = str(device)
    if key not in _workspaces:
        _workspaces[key] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _workspaces[key]


@dataclass
class FlashInferPlan:
    mode: str
    wrapper: Any
    q: torch.Tensor
    kv: tuple


class FlashInferBackend(Backend):
    name = "flashinfer"
    library = "flashinfer"
    distribution = "flashinfer-python"
    install_hint = "pip install 'attnbench[flashinfer]' (JIT needs nvcc, or add flashinfer-cubin / flashinfer-jit-cache)"
    capturable = False  # wrappers built without use_cuda_graph=True
    import_modules = ("flashinfer",)
    label = "FlashInfer"
    cuda_only = True
    dtypes = (torch.float16, torch.bfloat16)
    head_dims = HEAD_DIMS
    options = {
        "route": BackendOption(
            "route", "auto", choices=("auto", "fa2", "fa3"), env=BACKEND_ENV,
            help="auto: per batch (decode wrapper, prefill wrapper fa2); fa2/fa3: the prefill wrapper on that kernel"),
        "cascade": BackendOption(
            "cascade", True, type=bool, env=CASCADE_ENV,
            help="read shared prefix pages once per group (MultiLevelCascadeAttentionWrapper) where a batch has them"),
    }

    def unsupported(self, batch: Batch) -> list[str]:
        if self.option("route") == "fa3" and bool(batch.host.is_tree.any()):
            return ["route fa3: FlashInfer's fa3 prefill kernels take no custom mask, and this batch has trees"]
        return []

    def _wrapper(self, kind: str, device: torch.device, **kw) -> Any:
        """The wrapper of ``kind`` ("decode" or "prefill"), made once and reused by every plan."""
        import flashinfer

        cache = self.__dict__.setdefault("_wrappers", {})
        key = (kind, str(device), tuple(sorted(kw.items())))
        if key not in cache:
            cls = flashinfer.BatchDecodeWithPagedKVCacheWrapper if kind == "decode" else (
                flashinfer.BatchPrefillWithPagedKVCacheWrapper)
            cache[key] = cls(_workspace(device), kv_layout="NHD", **kw)
        return cache[key]

    def plan(self, batch: Batch) -> FlashInferPlan:
        dev = batch.device
        hq, hkv, d, ps = batch.num_q_heads, batch.num_kv_heads, batch.head_dim, batch.page_size
        indptr, indices, last = flashinfer_page_layout(batch)
        kv = (batch.k_cache, batch.v_cache)
        cascade = None
        if self.option("cascade") == "on":
            cascade = plan_cascade(batch, _workspace(dev), self.__dict__.setdefault("_cascade_wrappers", {}))
        if cascade is not None:  # shared prefix pages: the cascade route (flashinfer_cascade.py)
            return FlashInferPlan(cascade[0], cascade[1], batch.q, kv)
        h = batch.host
        trees = bool(h.is_tree.any())
        route = self.option("route")
        if route == "auto" and not trees and (h.query_lens == 1).all():
            w = self._wrapper("decode", dev, use_tensor_cores=hq // hkv > 4)
            w.plan(indptr.to(dev), indices, last.to(dev), hq, hkv, d, ps,
                   q_data_type=batch.dtype, kv_data_type=batch.dtype, sm_scale=batch.scale)
            return FlashInferPlan("decode", w, batch.q, kv)
        qo_indptr = torch.from_numpy(h.query_start_loc.astype("int32"))
        kind = "fa2" if route == "auto" else route
        w = self._wrapper("prefill", dev, backend=kind)
        extra: dict = {"custom_mask": custom_mask_flat(batch)} if trees else {"causal": True}
        w.plan(qo_indptr.to(dev), indptr.to(dev), indices, last.to(dev), hq, hkv, d, ps,
               sm_scale=batch.scale, q_data_type=batch.dtype, kv_data_type=batch.dtype, **extra)
        mode = "prefill-custom-mask" if trees else "prefill-causal"
        return FlashInferPlan(mode if route == "auto" else f"{route}:{mode}", w, batch.q, kv)

    def run(self, p: FlashInferPlan) -> torch.Tensor:
        return p.wrapper.run(p.q, p.kv)
