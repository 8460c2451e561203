"""attnbench's own kernels as a backend: the adapter of attnbench/kernels/ (read its package docstring first).

``plan`` selects the batch's route once (kernels/routes.py: option ``route``, ``auto`` by default), builds that
route's plan (kernels/paged/plan.py, or kernels/mla/plan.py for MLA batches) and records the route in it; ``run``
only launches it, into preallocated buffers, so it can be captured in a CUDA graph. A named route that cannot take a
batch gives a skipped row with that route's reasons.

On CPU tensors the Triton kernels run under Triton's interpreter, which must be switched on with
``TRITON_INTERPRET=1`` before the kernels are imported (float32/float16 only there); the Gluon routes need a Hopper
GPU.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

import torch

from attnbench.backend import Backend, BackendOption
from attnbench.backend.options import resolve
from attnbench.kernels import routes
from attnbench.kernels.mla import plan as mla
from attnbench.kernels.paged.plan import Planner
from attnbench.kernels.shared import features as tf
from attnbench.kernels.shared import plan as tp
from attnbench.kernels.shared import step as ts
from attnbench.workload.batch import Batch

INTERPRETED_MODE = "interpreted (TRITON_INTERPRET=1)"


def _interpret_wanted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_mode() -> Optional[str]:
    """How this process imported triton: "interpreted", "compiled", or None (not yet).

    ``triton.jit`` reads TRITON_INTERPRET at import time (triton.language's own helpers
    such as ``tl.zeros`` included), so the mode cannot change afterwards."""
    tl = sys.modules.get("triton.language")
    if tl is None:
        return None
    return "interpreted" if type(tl.standard.zeros).__name__ == "InterpretedFunction" else "compiled"


def _int_option(name: str, help: str) -> BackendOption:
    return BackendOption(name, 0, type=int, help=help)


class TritonBackend(Backend):
    name = "triton"
    head_dims = (32, 64, 80, 96, 128, 256)  # 80 and 96 run padded to 128 lanes, the extra ones masked
    max_group = 128
    supports_mla = True  # MLA batches take the MLA routes
    # every variant in the paged route's one launch (kernels/shared/features.py): constexpr-specialized kernels
    supports_window = True
    supports_sinks = True
    supports_softcap = True
    supports_alibi = True
    supports_noncausal = True
    kv_dtypes = tf.FP8_NAMES
    kv_scales = ("per-tensor", "per-head")  # one scale per program either way
    kv_orders = ("NHD", "HND")  # read through the cache's strides
    options = {
        "route": BackendOption(
            "route", "auto", choices=routes.NAMES,
            help="auto: per batch, the first route of kernels/routes.py's table that takes it; or one route for "
                 "every batch (a batch it cannot take is skipped with its reasons)"),
        "splits": _int_option("splits", "KV splits a row block (0: the plan's rule, from the SM count)"),
        "block_m": _int_option("block_m", "rows a unit, query tokens x G (0: the route's choice)"),
        "block_n": _int_option("block_n", "keys a tile of the masked loop, <= 64 (0: the route's choice)"),
        "block_nf": _int_option("block_nf", "keys a tile of the unmasked loop, a multiple of block_n (0: the route's)"),
        "num_warps": _int_option("num_warps", "warps a program of the Triton kernels (0: the plan's choice)"),
        "num_stages": _int_option("num_stages", "pipeline stages of the Triton kernels (0: the plan's choice)"),
    }

    def __init__(self, **options) -> None:
        """``options``: the declared options' values (``TritonBackend(route="paged", splits=2)`` is
        ``-b triton:route=paged,splits=2``; a spec's values, set by the registry, replace them)."""
        if options:
            self.__dict__["_option_values"] = resolve(self.name, {k: str(v) for k, v in options.items() if v is not None},
                                                      self.options).values
        self.planner = Planner()  # the per-shape caches of the plans
        self._routes: dict = {}  # (options, batch's shape and layout) -> route

    def settings(self) -> routes.Options:
        """The options as the kernels take them (a frozen dataclass)."""
        return routes.Options(self.option("route"), **{k: int(self.option(k)) for k in routes.Options.TUNING})

    def unsupported(self, batch: Batch) -> list[str]:
        """Device and interpreter rules (CUDA, or the CPU under ``TRITON_INTERPRET=1``), then the route's."""
        reasons = []
        if batch.device.type == "cpu":
            if not _interpret_wanted():
                reasons.append("triton runs on CPU tensors only in its interpreter: set TRITON_INTERPRET=1")
            if batch.dtype == torch.bfloat16:
                reasons.append("bfloat16 under the Triton interpreter gives wrong tl.dot results; use float32/float16")
        elif batch.device.type != "cuda":
            reasons.append(f"device {batch.device.type} not supported (cuda, or cpu under TRITON_INTERPRET=1)")
        mode = triton_mode()
        want = "interpreted" if batch.device.type == "cpu" else "compiled"
        if mode is not None and mode != want and (want == "compiled" or _interpret_wanted()):
            reasons.append(f"triton was already imported {mode} in this process (it reads "
                           f"TRITON_INTERPRET at import); run {want} in a new process")
        for name, t in (("q", batch.q), ("k_cache", batch.k_cache), ("v_cache", batch.v_cache)):
            if t.stride(-1) != 1:
                reasons.append(f"{name} must have a contiguous last dimension")
        opts = self.settings()
        return reasons + self._route(batch, opts).refusals(batch, opts)

    def _route(self, batch: Batch, opts: routes.Options) -> routes.Route:
        """``routes.select``, once per options, shape and q / cache layout (its reasons read the same)."""
        q, k, v = batch.q, batch.k_cache, batch.v_cache
        key = (opts, ts.shape_key(batch, False, False), batch.device, q.stride(), k.shape, k.stride(), v.stride(),
               q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16, getattr(batch, "k_scale", None) is None,
               getattr(batch.spec, "kv_lora_rank", None))
        hit = self._routes.get(key)
        if hit is None:
            if len(self._routes) >= ts.SHAPES:
                self._routes.clear()
            hit = self._routes[key] = routes.select(batch, opts)
        return hit

    def plan(self, batch: Batch):
        """The chosen route's plan, which records the route that runs it (and the row's mode)."""
        opts = self.settings()
        chosen = self._route(batch, opts)
        dev = batch.device
        splits = opts.splits or None
        if chosen.mla:
            p = mla.plan(batch, tp.num_sms(dev), dev.type == "cpu", splits, shapes=self.planner.mla_shapes,
                         staging=self.planner.staging, **chosen.plan_kw, **opts.tiles())
        else:
            p = self.planner.plan(batch, {**opts.tiles(), **chosen.config(batch)}, splits, **chosen.plan_kw)
            p.mode = INTERPRETED_MODE if dev.type == "cpu" else ""
        p.route, why = routes.settle(chosen, p, opts)
        p.mode = "; ".join(m for m in (p.mode, routes.mode(p.route, chosen, why)) if m)
        return p

    def forget_shapes(self) -> None:
        """Drop the per-shape caches: the next plan pays what a step with a new query side pays
        (scripts/dev/triton_plan_time.py's new-shape column)."""
        self.planner.shapes.clear()
        self.planner.mla_shapes.clear()
        self._routes.clear()

    def run(self, p) -> torch.Tensor:
        return p.route.launch(p)
