"""The memory guard: does a case, and each backend's share of it, fit in the memory left?

A case holds the pristine batch, the reference's output and the reference's own working set
(float64, one request at a time); each backend then adds its own copy of the batch, its
output and the working set it declares (``Backend.working_set_bytes``: SDPA and Flex gather
K/V into padded, head-repeated copies and dense score and mask tensors on the CPU). With
``timing.rounds > 1`` every backend's copy and plan are live at once. A backend that does not
fit gets a ``skipped`` row saying how much it needs and how much is available, never an OOM
kill; a case whose own inputs do not fit skips every row.

Available memory on a CPU is ``MemAvailable`` (``/proc/meminfo``: free plus reclaimable page
cache, what the kernel can hand out without swapping; ``MemFree`` alone under-reports it
severely), lowered to the cgroup's limit minus its usage where a cgroup v2 limit applies, and
to what the process's own limits leave: ``ulimit -v`` (RLIMIT_AS) minus its address space in use
(``VmSize``), ``ulimit -d`` (RLIMIT_DATA) minus its data segment (``VmData``): past them an
allocation fails whatever the machine has free (a case the guard let through died on
``DefaultCPUAllocator: can't allocate memory``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from attnbench.workload.spec import DTYPE_NAMES, BatchSpec


def _meminfo_available() -> Optional[int]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_left() -> Optional[int]:
    """Bytes the cgroup v2 limit leaves (None: no limit, or not readable)."""
    try:
        rel = Path("/proc/self/cgroup").read_text().strip().splitlines()[0].split("::", 1)[1]
        base = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text().strip()))
    except (OSError, ValueError, IndexError):
        return None


def _rlimits_left() -> Optional[int]:
    """Bytes the process's own limits leave it (RLIMIT_AS against VmSize, RLIMIT_DATA against
    VmData); None when neither is set or they cannot be read."""
    try:
        import resource

        status = {k: v for k, _, v in (line.partition(":") for line in
                                       Path("/proc/self/status").read_text().splitlines())}
        left = []
        for limit, field in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
            soft = resource.getrlimit(limit)[0]
            if soft != resource.RLIM_INFINITY and field in status:
                left.append(max(0, soft - int(status[field].split()[0]) * 1024))
        return min(left) if left else None
    except (ImportError, OSError, ValueError, IndexError):
        return None


def available_bytes(device) -> Optional[int]:
    """Bytes a case may still take on ``device`` (None: unknown, the guard is off)."""
    try:
        if device.type == "cuda":
            import torch

            return torch.cuda.mem_get_info(device)[0]
    except (RuntimeError, ValueError):
        return None
    known = [b for b in (_meminfo_available(), _cgroup_left(), _rlimits_left()) if b is not None]
    return min(known) if known else None


def reference_bytes(spec: BatchSpec) -> int:
    """The case's fixed part: its output as a float32 copy and the float64 oracle's largest
    request (q, K, V, scores and probabilities, one request at a time)."""
    hq, hkv, d = spec.num_q_heads, spec.num_kv_heads, spec.head_dim
    out = spec.num_tokens * hq * d * 4
    worst = max((r.query * hq * d + 2 * r.kv_len * hq * d + 3 * hq * r.query * r.kv_len + r.query * r.kv_len)
                for r in spec.requests)
    return out + 8 * worst + 8 * hkv  # hkv: keep the sum honest for tiny batches


def backend_bytes(cls, spec: BatchSpec, device_type: str) -> int:
    """One backend's share: its copy of the batch, its output, its declared working set."""
    el = DTYPE_NAMES[spec.dtype]
    out = spec.num_tokens * spec.num_q_heads * spec.head_dim * el
    declared = getattr(cls, "working_set_bytes", None)
    extra = int(declared(spec, device_type)) if callable(declared) else 0
    return spec.memory_bytes() + out + max(0, extra)


def split_by_memory(spec: BatchSpec, names: list[str], avail: Optional[int], device, all_live: bool
                    ) -> tuple[list[str], list[tuple[str, str]]]:
    """-> (the backends whose share fits in ``avail`` bytes, (name, skip reason) for the
    others). ``all_live`` (timing rounds): the shares add up. ``avail`` None: all fit."""
    if avail is None:
        return list(names), []
    from attnbench.backend import registry
    from attnbench.workload.units import format_bytes

    used = spec.memory_bytes() + reference_bytes(spec)  # the pristine inputs and the reference
    fits, skipped = [], []
    for n in names:
        try:
            share = backend_bytes(registry.get_backend_class(n), spec, device.type)
        except Exception:  # an unknown or broken backend: its own row says so later
            share = spec.memory_bytes()
        if used + share <= avail:
            fits.append(n)
            used += share if all_live else 0
            continue
        skipped.append((n, f"needs about {format_bytes(used + share)} (the case's inputs and reference "
                           f"{format_bytes(used)}, this backend's copy and working set {format_bytes(share)}); "
                           f"{format_bytes(avail)} available on {device}"))
    return fits, skipped
