"""FLOPs and bytes of a batch, measured device ceilings, and the roofline of a row.

FLOPs are exact from the mask: every allowed (query, key) pair costs ``4 * head_dim`` per
query head (QK^T and PV, a multiply-add each; with a window only the keys inside it; for MLA's
absorbed form ``2 * (576 + 512)``: scores over the whole latent row, values over its first
``kv_lora_rank`` dims).
Bytes are the minimum any backend must move:
each request's K and V slots (``kv_len`` of them, or with a window only those from the first
slot a query sees) read once per KV head (for MLA the one latent row of ``kv_lora_rank + rope_dim`` values, K and
V at once) at the cache's element size (1 byte for FP8, plus the
float32 scales), the slots on a shared
prefix's shared pages once for the whole group (docs/semantics.md, "Shared prefixes": a backend
that reads them once per request sits above this floor), q read and out written once, the
block-table entries in use, the length arrays, and one int32 parent per tree node. Ceilings are measured on the device (device-to-device copy, counting read +
write; a read-only stream; a dense matmul in the batch's dtype) and kept per device
(``measure/ceilings.py``).
The memory ceiling of the roofline is the faster of copy and read: attention reads far more
than it writes, and a read stream runs slightly faster than a copy.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import torch

from attnbench.workload.batch import BatchSpec
from attnbench.workload.masks import first_needed_slot, visible_pairs
from attnbench.workload.mla import is_mla


@dataclass(frozen=True)
class Work:
    flops: int
    bytes: int


def allowed_pairs(spec: BatchSpec) -> int:
    """(query, key) pairs the masks allow: causal, non-causal, tree, and the window."""
    return sum(visible_pairs(r, spec.window) for r in spec.requests)


def kv_slots(spec: BatchSpec) -> int:
    """K/V slots (per KV head) a backend must read at least once: each request's slots from
    the first one a query sees (a window leaves the older ones unread) to kv_len, with the
    slots on a prefix group's shared pages counted once for the group."""
    total = 0
    shared_from: dict = {}  # prefix group -> (lowest needed slot, shared slots)
    for r in spec.requests:
        lo = first_needed_slot(r, spec.window)
        sh = spec.shared_pages(r) * spec.page_size
        total += r.kv_len - max(lo, sh)
        if sh:
            low, _ = shared_from.get(r.prefix_group, (sh, sh))
            shared_from[r.prefix_group] = (min(low, lo), sh)
    return total + sum(sh - low for low, sh in shared_from.values())


def work_of(spec: BatchSpec) -> Work:
    el = torch.empty((), dtype=spec.torch_dtype).element_size()
    # QK^T over head_dim and PV over v_head_dim, a multiply-add each (4 * head_dim for MHA)
    flops = 2 * (spec.head_dim + spec.v_head_dim) * spec.num_q_heads * allowed_pairs(spec)
    caches = 1 if is_mla(spec) else 2  # MLA: the latent row (K and V at once) read once
    kv = caches * kv_slots(spec) * spec.num_kv_heads * spec.head_dim * spec.kv_element_bytes
    kv += caches * 4 * spec.kv_scale_count  # FP8 scales, float32
    kv += 8 if spec.k_scale is not None else 0  # a 16-bit cache's two float32 scales
    q_el, o_el = (1 if d is not None else el for d in (spec.q_dtype, spec.out_dtype))  # FP8 q / output: 1 byte
    qo = spec.num_tokens * spec.num_q_heads * (spec.head_dim * q_el + spec.v_head_dim * o_el)
    qo += 4 * (spec.q_dtype is not None)  # q_scale
    table = sum(4 * spec.pages_of(r) for r in spec.requests)
    lens = 4 * 3 * len(spec.requests)
    trees = sum(4 * r.query for r in spec.requests if r.tree_parents is not None)
    per_head = 4 * spec.num_q_heads * (int(spec.sinks) + int(spec.alibi))  # float32 sinks / slopes
    return Work(flops=flops, bytes=kv + qo + table + lens + trees + per_head)


@dataclass(frozen=True)
class Ceilings:
    """Measured ceilings of one device (``measure/ceilings.py`` measures and keeps them)."""

    device_name: str
    copy_tbps: float  # TB/s, bytes read + written
    matmul_tflops: dict  # dtype name -> TFLOP/s
    read_tbps: float = 0.0  # TB/s of a read-only stream (a sum over the same buffer)
    measured_at: dict = field(default_factory=dict)  # "memory" / dtype -> UTC time of the measurement

    @property
    def memory_tbps(self) -> float:
        """The memory ceiling of a read-dominated kernel such as attention: the faster of a
        copy and a read-only stream (on an H100 a read stream runs a little above a copy)."""
        return max(self.copy_tbps, self.read_tbps)


def device_name(device: torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu {platform.processor() or platform.machine()} ({os.cpu_count()} threads)"


def device_identity(device: torch.device) -> str:
    """A stable identity of the physical device: ``GPU-<uuid>`` for a CUDA device (the UUID
    that nvidia-smi shows, the same whatever CUDA_VISIBLE_DEVICES renumbers), else
    ``host:cuda:<index>`` when the driver gives no UUID; ``host:cpu`` for the CPU."""
    import socket

    device = torch.device(device)
    host = socket.gethostname()
    if device.type != "cuda":
        return f"{host}:{device.type}"
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
    except (AttributeError, RuntimeError):
        uuid = ""
    if uuid:
        return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    physical = visible[index] if index < len(visible) else str(index)
    return f"{host}:cuda:{physical}"


@dataclass(frozen=True)
class Roofline:
    tflops: float
    tbps: float
    floor_ms: float
    bound: str  # "memory" | "compute"
    pct_of_ceiling: float


def roofline(work: Work, median_ms: float, ceilings: Optional[Ceilings], dtype: str) -> Roofline:
    sec = median_ms / 1e3
    tflops = work.flops / sec / 1e12 if sec > 0 else float("nan")
    tbps = work.bytes / sec / 1e12 if sec > 0 else float("nan")
    if ceilings is None or dtype not in ceilings.matmul_tflops:
        return Roofline(tflops, tbps, float("nan"), "", float("nan"))
    t_mem = work.bytes / (ceilings.memory_tbps * 1e12)
    t_cmp = work.flops / (ceilings.matmul_tflops[dtype] * 1e12)
    floor = max(t_mem, t_cmp)
    return Roofline(tflops, tbps, floor * 1e3, "memory" if t_mem >= t_cmp else "compute", 100 * floor / sec if sec > 0 else float("nan"))
