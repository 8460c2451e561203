"""What a case costs to run on a CPU, roughly, from its shapes alone (no torch, no timing): the
weights of the progress ETA (a 16k-context case is not a 1k one), whether a scenario is sized
for a CPU, and about how long ``attnbench scenarios`` and ``run --list`` say it takes.

The model is deliberately coarse and says so where it is shown. One backend call on one CPU
thread takes about ``kv_bytes / CPU_BYTES_PER_S + flops / CPU_FLOPS``; a row spends its
warm-up and measurement budgets plus ``CALLS_PER_ROW`` such calls (warm-up, the timed calls
past the budget, plan and convert timing, the output check, the oracle's float64 pass) and a
fixed ``ROW_OVERHEAD_S``. The constants were fitted on a 2-core x86 CPU (quickstart and
decode-llama3-8b at 1k and 4k contexts, issue 35); another CPU, or a busy one, differs by a
factor, never by the orders of magnitude that tell a CPU-sized scenario from a GPU-sized one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from attnbench.workload.spec import DTYPE_NAMES, BatchSpec

if TYPE_CHECKING:
    from attnbench.workload.scenario import Case

CPU_BYTES_PER_S = 4e9  # one thread reading a KV cache (decode on 2-core x86: 3.8-4.2 GB/s)
CPU_FLOPS = 10e9  # one thread, attention arithmetic incl. softmax (fp32 SDPA: 8-21 GFLOP/s)
CALLS_PER_ROW = 13  # backend-call equivalents a row costs beyond its budgets (fitted, see above)
CPU_CALL_S = 0.01  # CPU-sized: every case's call estimate under this (the slowest backend takes ~5-10x it)
ROW_OVERHEAD_S = 0.3  # per row: materializing inputs, checks, Python
START_S = 3.0  # importing torch and the backends


def call_seconds(spec: BatchSpec) -> float:
    """About how long one backend call on ``spec`` takes on one CPU thread, in seconds."""
    el = DTYPE_NAMES[spec.dtype]
    caches = 1 if spec.attention == "mla" else 2
    kv_bytes = sum(r.kv_len for r in spec.requests) * spec.num_kv_heads * spec.head_dim * caches * el
    flops = 4 * sum(r.query * r.kv_len for r in spec.requests) * spec.num_q_heads * spec.head_dim
    return kv_bytes / CPU_BYTES_PER_S + flops / CPU_FLOPS


def case_seconds(case: "Case", backends: int) -> float:
    """About how long ``case`` takes on a CPU with ``backends`` rows (budgets included)."""
    t = case.scenario.timing
    per_row = ROW_OVERHEAD_S + (t.warmup_ms + t.measure_ms) / 1e3 + CALLS_PER_ROW * call_seconds(case.scenario.batch_spec())
    return backends * per_row


def cpu_sized(case: "Case") -> bool:
    """Its call estimate is a few milliseconds: on a CPU every default backend (the float64
    reference and flex take 5-15x the estimate) is timed several times in the default budgets.
    GPU-sized shapes on a CPU get rows timed once (n=1) and runs of minutes."""
    return call_seconds(case.scenario.batch_spec()) <= CPU_CALL_S


def scenario_estimate(cases: "list[Case]", backends: int) -> tuple[bool, float]:
    """(every case is CPU-sized, about how many seconds a run of them takes on a CPU)."""
    return all(cpu_sized(c) for c in cases), START_S + sum(case_seconds(c, backends) for c in cases)


def rough_duration(seconds: float) -> str:
    """``~10 s``, ``~2 min``, ``~1 h``: one significant figure, as rough as the model."""
    for unit, size in (("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size or unit == "s":
            return f"~{float(f'{seconds / size:.1g}'):g} {unit}"
    return ""  # not reached


def size_words(cases: "list[Case]", backends: int) -> str:
    """``CPU-sized, ~10 s on a CPU`` / ``GPU-sized: ~20 min on a CPU, where ... timed once (n=1)``."""
    small, secs = scenario_estimate(cases, backends)
    if small:
        return f"CPU-sized, {rough_duration(secs)} on a CPU"
    return f"GPU-sized: {rough_duration(secs)} on a CPU, where its slow cases are timed once (n=1)"
