"""FlashInfer on the paged cache, on the route an engine would take on this GPU, or the one
named by the option ``route`` (``-b flashinfer:route=fa3``; ``flashinfer_routes.py`` lists the
routes, what each can express and the ``auto`` choice; ``flashinfer_plans.py`` builds them).

- ``plan`` derives FlashInfer's layout from ours by array ops (``indptr`` / ``indices`` /
  ``last_page_len`` from the block table; a custom mask per element from the batch's masks,
  with the window folded in where positions are not slots) and calls the wrapper's ``plan()``,
  so the plan time includes FlashInfer's own scheduling, as an engine's step does.
- Wrappers are built as engines build them for CUDA graphs (``use_cuda_graph=True``, fixed
  buffers sized to the batch), once per backend instance; their rows are graph-timed like the
  others' (the cascade route, whose multi-level wrapper is built without graph buffers here,
  is event-timed and says so).
- Batches whose requests share prefix pages take the cascade (``flashinfer_cascade.py``) under
  ``route=auto``; option ``cascade=off`` (default from ``ATTNBENCH_FLASHINFER_CASCADE``) turns it
  off.
- A route that cannot express a batch gives a skipped row naming the route and why.
- JIT: FlashInfer compiles a route's kernels on first use (needs nvcc; fa3 took 81 s, XQA
  6-9 s on an H100). The first plan of each kernel set in a process runs one extra untimed call
  and reports the seconds that plan and call took (JIT build or load + first call) as a warning and in
  ``FIRST_USE_S``; no row's plan or kernel time contains it.
- Variants: FP8 caches with per-tensor scales (``k_scale``/``v_scale`` at run; folded into the
  scale by hand on the sink wrapper and POD, ``flashinfer_plans.py``), ``window_left``
  = W - 1, ``logits_soft_cap``, sinks (the attention-sink wrapper on fa2/fa3, or XQA's sinks),
  both cache orders natively (``kv_layout`` = the batch's order), ALiBi (``pos_encoding_mode=
  "ALIBI"`` on the decode, fa2 and POD routes, FlashInfer's own slopes; not on trees that branch,
  nor with soft-cap or sinks: ``flashinfer_alibi.py``). FlashInfer's LSE is base 2; this backend
  does not use it (ALiBi moves it by a constant per row, so the cascade, which merges by LSE, is
  not taken with ALiBi).

Where it was validated: docs/backends.md.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.backend import Backend, BackendOption
from attnbench.workload.batch import Batch
from attnbench.workload.mla import is_mla

from . import flashinfer_mla
from .flashinfer_cascade import CASCADE_ENV, plan_cascade
from .flashinfer_plans import sm_major, step_for, workspace_for
from .flashinfer_routes import ROUTES, auto_route, facts_of, route_reasons

HEAD_DIMS = (64, 128, 256)
BACKEND_ENV = "ATTNBENCH_FLASHINFER_BACKEND"

#: seconds the first use of each route took in this process (JIT build or load + first call)
FIRST_USE_S: dict[str, float] = {}


@dataclass
class FlashInferPlan:
    mode: str
    call: Any  # () -> output [N, Hq, D]
    capturable: bool = True


class FlashInferBackend(Backend):
    name = "flashinfer"
    import_modules = ("flashinfer",)
    label = "FlashInfer"
    dtypes = (torch.float16, torch.bfloat16)
    head_dims = HEAD_DIMS
    supports_window = True
    supports_sinks = True
    supports_softcap = True
    supports_noncausal = True
    supports_alibi = True  # on the routes and batches flashinfer_alibi.py allows; the others give reasons
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")
    kv_scales = ("per-tensor",)
    kv_orders = ("NHD", "HND")
    # a 16-bit cache's k_scale/v_scale go where an FP8 cache's per-tensor scales go (run's k_scale
    # folded into sm_scale, v_scale on the output, for any cache dtype; XQA's bmm1/bmm2 scales)
    supports_16bit_kv_scales = True
    q_dtypes = ("fp8_e4m3", "fp8_e5m2")  # FP8 attention on route fa3 (flashinfer_routes._fp8_query_reasons)
    supports_rope = True  # ROPE_LLAMA on routes decode, decode-tc, fa2 (flashinfer_rope.py)
    supports_short_kv = True  # non-causal requests with more queries than keys: route fa2
    options = {
        "route": BackendOption(
            "route", "auto", choices=ROUTES, env=BACKEND_ENV,
            help="auto: per batch, the route an engine takes on this GPU; or one route for every batch"),
        "cascade": BackendOption(
            "cascade", True, type=bool, env=CASCADE_ENV,
            help="route auto: read shared prefix pages once per group (MultiLevelCascadeAttentionWrapper)"),
    }

    supports_mla = True  # MLA batches: BatchMLAPagedAttentionWrapper (flashinfer_mla.py)

    def unsupported(self, batch: Batch) -> list[str]:
        """The chosen route's reasons (auto: the route it picks for this batch)."""
        if is_mla(batch):
            return flashinfer_mla.mla_reasons(batch, self.option("route"))
        f, major = facts_of(batch), sm_major(batch.device)
        route = self.option("route")
        return route_reasons(auto_route(f, major) if route == "auto" else route, f, major)

    def _cascade(self, batch: Batch, f) -> Any:
        if self.option("route") != "auto" or self.option("cascade") != "on" or f.sinks or f.softcap or f.window:
            return None
        if f.alibi or f.rope:  # each level's ALiBi is off by its own constant per row, and the levels merge
            return None  # by LSE; the cascade's levels rotate at their own slots
        if batch.k_scale is not None or batch.kv_order != "NHD" or not all(f.causal):
            return None  # the cascade module reads a plain NHD cache with causal masks
        ws = workspace_for(self.__dict__.setdefault("_wrappers", {}), batch.device)
        return plan_cascade(batch, ws, self.__dict__.setdefault("_cascade_wrappers", {}))

    def plan(self, batch: Batch) -> FlashInferPlan:
        t0 = time.perf_counter()  # a first use's seconds include the plan (FlashInfer JIT-builds there)
        if is_mla(batch):  # BatchMLAPagedAttentionWrapper (flashinfer_mla.py)
            p = flashinfer_mla.plan(batch, self.option("route"), workspace_for(self.__dict__.setdefault("_wrappers", {}),
                                    batch.device), self.__dict__.setdefault("_mla_wrappers", {}))
            return self._first_use(p.mode, batch, FlashInferPlan(p.mode, lambda: flashinfer_mla.run(p), False), t0)
        f = facts_of(batch)
        cascade = self._cascade(batch, f)
        if cascade is not None:  # shared prefix pages: the cascade route (flashinfer_cascade.py)
            w, q, kv = cascade[1], batch.q, (batch.k_cache, batch.v_cache)
            plan = FlashInferPlan(f"auto: {cascade[0]} (event-timed)", lambda: w.run(q, kv), False)
            return self._first_use(cascade[0], batch, plan, t0)
        route = self.option("route")
        chosen = auto_route(f, sm_major(batch.device)) if route == "auto" else route
        step = step_for(chosen, batch, f, self.__dict__.setdefault("_wrappers", {}))
        mode = chosen + (f" ({step.detail})" if step.detail else "")
        return self._first_use(mode, batch, FlashInferPlan(f"auto: {mode}" if route == "auto" else mode, step.call), t0)

    def _first_use(self, mode: str, batch: Batch, plan: FlashInferPlan, t0: float) -> FlashInferPlan:
        """The first plan of a kernel set in this process (route and what its JIT module is
        built for): one untimed call, its seconds reported apart from every row."""
        key = f"{mode} {batch.dtype} kv {batch.kv_dtype} d{batch.head_dim} page {batch.page_size}".replace("torch.", "")
        if key not in FIRST_USE_S:
            plan.call()
            torch.cuda.synchronize()
            FIRST_USE_S[key] = time.perf_counter() - t0
            warnings.warn(f"flashinfer {key}: first use (JIT build or load + first call) took "
                          f"{FIRST_USE_S[key]:.1f} s, outside every row's time", stacklevel=2)
        return plan

    def run(self, p: FlashInferPlan) -> torch.Tensor:
        return p.call()
