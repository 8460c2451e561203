"""The reference as a backend: float64 torch, per request. Slow, exact; the oracle itself."""
from __future__ import annotations

import torch

from attnbench.backend import Backend
from attnbench.workload.batch import Batch
from attnbench.workload.reference import reference_attention


class ReferenceBackend(Backend):
    name = "reference"
    supports_mla = True
    capturable = False  # per-request Python loop with host-side mask building
    supports_window = supports_sinks = supports_softcap = supports_alibi = supports_noncausal = True
    kv_dtypes = ("fp8_e4m3", "fp8_e5m2")  # read dequantized (float32) by gather_kv
    kv_scales = ("per-tensor", "per-head")
    kv_orders = ("NHD", "HND")
    supports_16bit_kv_scales = supports_short_kv = supports_rope = supports_alibi_before_softcap = True
    q_dtypes = ("fp8_e4m3", "fp8_e5m2")  # the FP8 queries read dequantized
    out_dtypes = ("fp8_e4m3",)  # the exact output written in FP8

    def plan(self, batch: Batch) -> Batch:
        return batch

    def run(self, plan: Batch) -> torch.Tensor:
        return plan.finish_output(reference_attention(plan)[0])
