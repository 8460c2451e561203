"""One torch.profiler pass per row, after timing (never during it).

The pass runs ``plan`` once and ``run`` a few times, each inside its own labelled range that
ends with a device synchronize, so every kernel can be attributed to the range it ran in
by its start time: plan-time kernels (layout conversion, metadata) and run-time kernels
are told apart. The L2 is flushed before each run, as in timing, in a range of its own whose
kernels are left out. Per row: a kernel table (name, calls per run, total µs per run, share),
the number of kernels launched per call, their summed device time per call, and a Chrome /
Perfetto trace file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from attnbench.measure.timing import L2Flusher
from attnbench.workload.units import safe_name

RUNS = 5


@dataclass
class Profile:
    kernels_per_call: int
    kernel_ms_per_call: float
    kernels: list[dict]  # name, calls_per_run, us_per_run, share
    plan_kernels: list[dict] = field(default_factory=list)
    trace: str = ""


def _ranges(events, prefix: str):
    out = []
    for e in events:
        if e.name.startswith(prefix) and e.device_type == torch.autograd.DeviceType.CPU:
            out.append((e.name, e.time_range.start, e.time_range.end))
    return out


def _table(kernels: list, runs: int) -> list[dict]:
    agg: dict[str, list[float]] = {}
    for name, dur in kernels:
        agg.setdefault(name, []).append(dur)
    total = sum(sum(v) for v in agg.values()) or 1.0
    rows = [
        {"name": n, "calls_per_run": len(v) / runs, "us_per_run": sum(v) / runs, "share": sum(v) / total}
        for n, v in agg.items()
    ]
    return sorted(rows, key=lambda r: -r["us_per_run"])


def profile_row(plan: Callable, run: Callable, device: torch.device, out_dir: Path, case_id: str, backend: str) -> Profile:
    """The profiler pass of one row: kernel tables, counts and a trace written under ``out_dir``."""
    cuda = torch.device(device).type == "cuda"
    prof = _record(plan, run, device, cuda)
    events = prof.events()
    plan_k, run_k = _gpu_kernels(events) if cuda else _cpu_ops(events)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = safe_name(f"{case_id}__{backend}", 120)
    trace = out_dir / f"{stem}.trace.json"
    prof.export_chrome_trace(str(trace))
    p = Profile(
        kernels_per_call=round(len(run_k) / RUNS),
        kernel_ms_per_call=sum(d for _, d in run_k) / RUNS / 1e3,
        kernels=_table(run_k, RUNS),
        plan_kernels=_table(plan_k, 1),
        trace=str(trace),
    )
    (out_dir / f"{stem}.kernels.json").write_text(
        json.dumps(
            {
                "case_id": case_id,
                "backend": backend,
                "runs_profiled": RUNS,
                "kernels_per_call": p.kernels_per_call,
                "kernel_ms_per_call": p.kernel_ms_per_call,
                "run_kernels": p.kernels,
                "plan_kernels": p.plan_kernels,
            },
            indent=1,
        )
    )
    return p


def _record(plan: Callable, run: Callable, device: torch.device, cuda: bool):
    """One plan and ``RUNS`` runs under torch.profiler, each in a labelled, synchronized range
    (the L2 flush before each run in a range of its own)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    flush = L2Flusher(device) if cuda else None
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    with profile(activities=activities) as prof:
        with record_function("attnbench.plan"):
            plan()
            sync()
        for i in range(RUNS):
            with record_function(f"attnbench.flush{i}"):
                if flush is not None:
                    flush()
                sync()
            with record_function(f"attnbench.run{i}"):
                run()
                sync()
    return prof


def _gpu_kernels(events) -> tuple[list, list]:
    """(plan kernels, run kernels) as (name, µs): each GPU kernel goes to the range it started in."""
    ranges = _ranges(events, "attnbench.")
    plan_k, run_k = [], []
    for e in events:
        # Our own ranges also show up on the GPU timeline (as user annotations): not kernels.
        if e.device_type != torch.autograd.DeviceType.CUDA or e.name.startswith("attnbench."):
            continue
        start = e.time_range.start
        for name, s, t in ranges:
            if s <= start <= t:
                if name == "attnbench.plan":
                    plan_k.append((e.name, e.time_range.elapsed_us()))
                elif name.startswith("attnbench.run"):
                    run_k.append((e.name, e.time_range.elapsed_us()))
                break
    return plan_k, run_k


def _cpu_ops(events) -> tuple[list, list]:
    """On the CPU the "kernels" are the aten ops called directly inside each range."""
    plan_k, run_k = [], []
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("aten::") and e.cpu_parent is not None:
            if e.cpu_parent.name.startswith("attnbench.run"):
                run_k.append((e.name, e.time_range.elapsed_us()))
            elif e.cpu_parent.name == "attnbench.plan":
                plan_k.append((e.name, e.time_range.elapsed_us()))
    return plan_k, run_k
