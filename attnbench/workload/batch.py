"""Case -> Batch: packed queries, a paged KV cache, a block table in the asked layout.

A :class:`Batch` is the one neutral input every backend reads (the role of vLLM's
``CommonAttentionMetadata``). Everything is random (never zeros), the pages beyond each
request's ``kv_len`` included, so a kernel that reads past the end is caught. The layout of
pages is deterministic from the seed. See docs/semantics.md.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch

from attnbench.workload.kvcache import dequantize, quantize_fp8, quantize_out, quantize_q, storage_of, to_order
from attnbench.workload.masks import alibi_slopes, query_positions, request_mask  # noqa: F401 (re-exported)
from attnbench.workload.pages import copy_partial_prefix_pages, page_assignment  # noqa: F401 (re-exported)
from attnbench.workload.mla import default_scale, is_mla
from attnbench.workload.tree_arrays import deepest, node_depths  # noqa: F401 (re-exported)
from attnbench.workload.spec import DTYPE_NAMES, FP8_DTYPES, LAYOUTS, BatchSpec, Request, describe, variant_words  # noqa: F401  (re-exported)

@dataclass
class Batch:
    """The tensors and metadata of one batch, on one device.

    Shapes (N = total query tokens, B = requests, P = pages, Dv = v_head_dim):
      q            [N, Hq, D]            dtype
      k_cache      [P, page_size, Hkv, D] kv_dtype, NHD-indexable (with kv_order HND a permuted
                                         view of the contiguous [P, Hkv, page_size, D] storage)
      v_cache      [P, page_size, Hkv, Dv] kv_dtype (MLA: the view k_cache[..., :kv_lora_rank])
      k_scale, v_scale [1] or [Hkv]      float32: an FP8 cache's scales, or the given scales of a
                                         model-dtype cache (kv_cache.k_scale); None without either
      q_fp8        [N, Hq, D]            FP8 queries (model.q_dtype), None without; q_scale [1] float32
      sinks        [Hq]                  float32 sink logits (None without sinks)
      alibi_slopes [Hq]                  float32 (None without ALiBi)
      output       [N, Hq, Dv]           dtype (``out_shape``; Dv = D except for MLA)
      block_table  [B, max_pages]        int32; unused entries are 0 (the null page)
      query_start_loc [B + 1]            int32
      query_lens, context_lens, kv_lens [B] int32
    Host copies of the lengths (``requests``) let backends plan without device syncs.
    """

    spec: BatchSpec
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    query_lens: torch.Tensor
    context_lens: torch.Tensor
    kv_lens: torch.Tensor
    scale: float
    k_scale: Optional[torch.Tensor] = None
    v_scale: Optional[torch.Tensor] = None
    sinks: Optional[torch.Tensor] = None
    alibi_slopes: Optional[torch.Tensor] = None
    q_fp8: Optional[torch.Tensor] = None  # FP8 attention: the queries every backend reads (q_fp8 * q_scale)
    q_scale: Optional[torch.Tensor] = None
    _masks: dict = field(default_factory=dict, repr=False)

    # -- host-side views ------------------------------------------------------------------
    @functools.cached_property
    def host(self) -> "HostLens":
        """Host (numpy) copies of the lengths, made once per batch."""
        return host_lens(self.spec)

    @functools.cached_property
    def trees(self) -> "TreeInputs":
        """The tree requests' engine-native inputs (host arrays and their device copies),
        made once per step: ``new_step`` drops them."""
        return tree_inputs(self.spec, self.device)

    def new_step(self) -> None:
        """Forget what an engine builds in every step, before a timed plan or convert (issue
        24: these lived on the batch, so every timed plan after the first reused them): the
        tree requests' inputs and their upload to the device (``trees``: which requests are
        trees, their topology or, for dynamic trees, their parents), and the request masks
        (``mask``: a request's keys change with its length every step). Kept: the host
        lengths (``host``: the engine's scheduler hands them over, they are the plan's input),
        and what the backends cache per tree topology (built once, at start-up, by an engine
        whose tree shapes are static). docs/semantics.md, "What a row's times hold"."""
        self.__dict__.pop("trees", None)
        self._masks.clear()

    @property
    def requests(self) -> tuple[Request, ...]:
        return self.spec.requests

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype

    @property
    def num_requests(self) -> int:
        return len(self.spec.requests)

    @property
    def num_tokens(self) -> int:
        return self.q.shape[0]

    @property
    def num_q_heads(self) -> int:
        return self.spec.num_q_heads

    @property
    def num_kv_heads(self) -> int:
        return self.spec.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.spec.head_dim

    @property
    def page_size(self) -> int:
        return self.spec.page_size

    # -- attention variants (docs/semantics.md) -------------------------------------------
    @property
    def window(self) -> Optional[int]:
        return self.spec.window

    @property
    def softcap(self) -> Optional[float]:
        return self.spec.softcap

    @property
    def kv_dtype(self) -> torch.dtype:
        """The cache's torch dtype (a float8 dtype for an FP8 cache, else the model dtype)."""
        return self.k_cache.dtype

    @property
    def kv_order(self) -> str:
        return self.spec.kv_order

    @property
    def k_storage(self) -> torch.Tensor:
        """The K cache in its storage order: ``[P, page, Hkv, D]`` (NHD) or ``[P, Hkv, page, D]`` (HND)."""
        return storage_of(self.k_cache, self.spec.kv_order)

    @property
    def v_storage(self) -> torch.Tensor:
        return storage_of(self.v_cache, self.spec.kv_order)

    @property
    def causal(self) -> list[bool]:
        return [r.causal for r in self.spec.requests]

    @property
    def v_head_dim(self) -> int:  # value and output width: kv_lora_rank for MLA, else head_dim
        return self.spec.v_head_dim

    @property
    def out_shape(self) -> tuple[int, int, int]:  # (N, Hq, v_head_dim): every backend's output
        return (self.num_tokens, self.num_q_heads, self.v_head_dim)

    @property
    def kinds(self) -> list[str]:
        return [r.kind for r in self.spec.requests]

    @property
    def tree_parents(self) -> list[Optional[list[int]]]:
        return [list(r.tree_parents) if r.tree_parents is not None else None for r in self.spec.requests]

    @property
    def query_start(self) -> list[int]:
        out = [0]
        for r in self.spec.requests:
            out.append(out[-1] + r.query)
        return out

    @property
    def max_query_len(self) -> int:
        return max(r.query for r in self.spec.requests)

    @property
    def max_kv_len(self) -> int:
        return max(r.kv_len for r in self.spec.requests)

    def mask(self, i: int) -> torch.Tensor:
        """``[Q, L]`` bool on the CPU: which keys (logical slots) each query token of request i
        sees: the causal / non-causal / tree rule AND the window."""
        if i not in self._masks:
            self._masks[i] = request_mask(self.spec.requests[i], self.spec.window)
        return self._masks[i]

    def positions(self, i: int) -> torch.Tensor:
        """``[Q]`` int64 on the CPU: absolute positions of request i's query tokens (context
        C..; a prefill's j-th token at C + j; a tree node at C + its depth: slot != position)."""
        return query_positions(self.spec.requests[i])

    def gather_kv(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Request i's keys and values in logical order: two ``[L, Hkv, D]`` tensors in NHD
        order, dequantized (float32) when the cache is FP8, else in the model dtype."""
        r = self.spec.requests[i]
        n = self.spec.pages_of(r)
        pages = self.block_table[i, :n].long()
        k = self.k_cache[pages].reshape(-1, self.num_kv_heads, self.head_dim)[: r.kv_len]
        v = self.v_cache[pages].reshape(-1, self.num_kv_heads, self.v_head_dim)[: r.kv_len]
        return dequantize(k, self.k_scale), dequantize(v, self.v_scale)

    @property
    def out_dtype(self) -> torch.dtype:
        """The output's dtype: the model's, or the FP8 dtype of ``model.out_dtype``."""
        return self.dtype if self.spec.out_dtype is None else getattr(torch, FP8_DTYPES[self.spec.out_dtype][0])

    def finish_output(self, o: torch.Tensor) -> torch.Tensor:
        """An output ``o`` in the model dtype, or written in FP8 with ``out_scale`` (``quantize_out``)."""
        s = self.spec
        return o.to(self.dtype) if s.out_dtype is None else quantize_out(o, s.out_dtype, s.out_scale)

    def output_values(self, out: torch.Tensor) -> torch.Tensor:
        """A backend's output as values to check: itself, or an FP8 output times ``out_scale``."""
        return out if self.spec.out_dtype is None else out.float() * self.spec.out_scale

    def query_values(self) -> torch.Tensor:
        """``[N, Hq, D]``: ``q``, or with FP8 attention ``q_fp8.float() * q_scale`` (float32)."""
        return self.q if self.q_fp8 is None else dequantize(self.q_fp8, self.q_scale)


@dataclass(frozen=True)
class HostLens:
    """Host copies of a batch's lengths (int64 numpy), as an engine keeps them on the CPU
    every step: backends plan from these without a device sync or a loop over requests."""

    query_lens: np.ndarray  # [B]
    context_lens: np.ndarray  # [B]
    kv_lens: np.ndarray  # [B]
    query_start_loc: np.ndarray  # [B + 1]
    is_tree: np.ndarray  # [B] bool
    causal: np.ndarray  # [B] bool: False for a non-causal (bidirectional) prefill


@dataclass(frozen=True)
class TreeInputs:
    """The tree requests of a batch, as an engine has them at each step.

    Static trees (choices, full, branching, chain, fixed presets) are known at start-up: an
    engine holds their ``topologies`` and, per request, which one it uses (``topology_id``);
    data derived from a topology is built once per topology and cached. Dynamic trees
    (``tree: {..., dynamic: true}``, EAGLE-2/3's dynamic presets) change every step: the
    engine's input is the padded ``parents`` array, and everything derived from it is
    rebuilt in every plan, by tensor ops."""

    reqs: np.ndarray  # [Bt] int64: indices of the tree requests, in batch order
    sizes: np.ndarray  # [Bt] int64: nodes per tree
    tmax: int  # the largest tree (0 when there is none)
    max_depth: int  # the deepest node's depth (an engine knows its draft depth)
    dynamic: bool  # some tree is dynamic: the batch's tree data is rebuilt each plan
    topologies: tuple  # the distinct parent arrays, in first-seen order
    topology_id: np.ndarray  # [Bt] int64 index into ``topologies``
    parents_host: np.ndarray  # [Bt, max(Tmax, 1)] int32; -1: root or padding
    device: torch.device  # where the device copies below go

    # The device copies are made on first use (issue 34): a plan step rebuilds this object
    # (``Batch.new_step``), and a backend that plans from the host arrays (flash-attn) must
    # not pay host-to-device copies it never reads inside its timed plan.
    @functools.cached_property
    def parents(self) -> torch.Tensor:
        """``parents_host`` on the batch's device."""
        return torch.from_numpy(self.parents_host).to(self.device)

    @functools.cached_property
    def reqs_t(self) -> torch.Tensor:
        """``reqs`` as an int64 tensor on the batch's device."""
        return torch.from_numpy(self.reqs).to(self.device)

    @functools.cached_property
    def topology_id_t(self) -> torch.Tensor:
        """``topology_id`` on the batch's device."""
        return torch.from_numpy(self.topology_id).to(self.device)


def host_lens(spec: BatchSpec) -> HostLens:
    q = np.array([r.query for r in spec.requests], dtype=np.int64)
    c = np.array([r.context for r in spec.requests], dtype=np.int64)
    start = np.zeros(len(q) + 1, dtype=np.int64)
    np.cumsum(q, out=start[1:])
    tree = np.array([r.tree_parents is not None for r in spec.requests], dtype=bool)
    causal = np.array([r.causal for r in spec.requests], dtype=bool)
    return HostLens(q, c, q + c, start, tree, causal)


def tree_inputs(spec: BatchSpec, device: torch.device) -> TreeInputs:
    """A step's tree inputs, fresh arrays each step, from the spec's trees as arrays (``_spec_trees``:
    an engine holds its requests' trees as arrays, not tuples; issue 33: ~60-90 us a step to convert)."""
    reqs, sizes, max_depth, dynamic, index, ids, topo = _spec_trees(spec)
    return TreeInputs(reqs=reqs.copy(), sizes=sizes.copy(), tmax=int(sizes.max()) if len(reqs) else 0,
                      max_depth=max_depth, dynamic=dynamic, topologies=index, topology_id=ids.copy(),
                      parents_host=topo[ids], device=device)


_SPECS: dict = {}  # id(spec) -> (spec, its trees as read-only arrays)


def _spec_trees(spec: BatchSpec) -> tuple:
    """The spec's tree requests as arrays, once per spec (a frozen spec's trees never change)."""
    hit = _SPECS.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    reqs = [i for i, r in enumerate(spec.requests) if r.tree_parents is not None]
    index: dict = {}
    ids = np.array([index.setdefault(spec.requests[i].tree_parents, len(index)) for i in reqs], dtype=np.int64)
    sizes = np.array([spec.requests[i].query for i in reqs], dtype=np.int64)
    topo = np.full((len(index), max(int(sizes.max(initial=0)), 1)), -1, dtype=np.int32)  # each shape once
    for k, p in enumerate(index):
        topo[k, : len(p)] = p
    out = (np.array(reqs, dtype=np.int64), sizes, deepest(topo) if reqs else 0,
           any(spec.requests[i].tree_dynamic for i in reqs), tuple(index), ids, topo)
    topo.flags.writeable = False  # the arrays above are copied for each step
    if len(_SPECS) >= 64:
        _SPECS.clear()
    _SPECS[id(spec)] = (spec, out)
    return out


def _randn(shape: Sequence[int], generator: torch.Generator, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # Drawn in float32 on the target device, then cast: deterministic per device and seed.
    return torch.randn(*shape, generator=generator, device=device, dtype=torch.float32).to(dtype)


def materialize(spec: BatchSpec, seed: int, device: str | torch.device = "cpu") -> Batch:
    """Build the batch of ``spec`` from ``seed`` on ``device``."""
    device = torch.device(device)
    host_gen = torch.Generator().manual_seed(seed)
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    dtype = spec.torch_dtype
    reqs = spec.requests
    assignment = page_assignment(spec, host_gen)
    max_pages = max((len(a) for a in assignment), default=1) or 1
    table = torch.zeros(len(reqs), max_pages, dtype=torch.int32)
    for i, pages in enumerate(assignment):
        table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    qlens = torch.tensor([r.query for r in reqs], dtype=torch.int32)
    clens = torch.tensor([r.context for r in reqs], dtype=torch.int32)
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(qlens, 0)
    q = _randn((spec.num_tokens, spec.num_q_heads, spec.head_dim), dev_gen, dtype, device)
    (k_cache, k_scale), (v_cache, v_scale) = _caches(spec, table, dev_gen, device)
    if spec.k_scale is not None:  # given scales of a cache in the model dtype
        k_scale, v_scale = (torch.tensor([x], dtype=torch.float32, device=device) for x in (spec.k_scale, spec.v_scale))
    q_fp8, q_scale = quantize_q(q, spec.q_dtype)
    scale = spec.scale if spec.scale is not None else default_scale(spec)
    return Batch(
        spec=spec,
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        k_scale=k_scale,
        v_scale=v_scale,
        sinks=_sinks(spec, seed, device),
        alibi_slopes=alibi_slopes(spec.num_q_heads).to(device) if spec.alibi else None,
        q_fp8=q_fp8,
        q_scale=q_scale,
        block_table=table.to(device),
        query_start_loc=qsl.to(device),
        query_lens=qlens.to(device),
        context_lens=clens.to(device),
        kv_lens=(qlens + clens).to(device),
        scale=float(scale),
    )


#: sink logits are drawn uniform in [0, SINK_MAX): over the windows and contexts benchmarks
#: use, a head's sink then takes from a negligible to a dominant share of the denominator,
#: so a backend that drops the sinks fails the check
SINK_MAX = 8.0
_SINK_SEED = 0x5E1F_51A7  # mixed into the seed: the sinks' own stream, leaving q/K/V as before


def _caches(spec: BatchSpec, table: torch.Tensor, gen: torch.Generator, device: torch.device):
    """``((k_cache, k_scale), (v_cache, v_scale))`` in the spec's dtype and order. Values are
    drawn in float32 (identical to the model-dtype cache's draws), the shared prefixes' partial
    pages copied, then quantized to FP8 with scales from the data (docs/semantics.md). MLA: one
    latent cache; the values are the view of its first ``kv_lora_rank`` dims (same scales)."""
    shape_kv = (spec.num_pages, spec.page_size, spec.num_kv_heads, spec.head_dim)
    out = []
    for _ in range(1 if is_mla(spec) else 2):
        x = _randn(shape_kv, gen, torch.float32 if spec.fp8 else spec.torch_dtype, device)
        copy_partial_prefix_pages(spec, table, (x,))
        scale = None
        if spec.fp8:
            x, scale = quantize_fp8(x, spec.kv_dtype, spec.kv_scale == "per-head")
        out.append((to_order(x, spec.kv_order)[1], scale))
    if is_mla(spec):
        out.append((out[0][0][..., : spec.kv_lora_rank], out[0][1]))
    return out


def _sinks(spec: BatchSpec, seed: int, device: torch.device) -> Optional[torch.Tensor]:
    if not spec.sinks:
        return None
    gen = torch.Generator().manual_seed((seed ^ _SINK_SEED) % (1 << 63))
    return (torch.rand(spec.num_q_heads, generator=gen, dtype=torch.float32) * SINK_MAX).to(device)
