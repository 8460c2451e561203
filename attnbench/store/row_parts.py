"""The typed parts of a result row, each made where its facts are known.

- ``RowIdentity``: which measurement it is (scenario, case, backend: its key across runs) and
  where and how it ran (the backend's version, the route it took, the device), made with the row
  (``case_base_row``), the route and version filled in when the backend plans, the command that
  re-runs it by the CLI;
- ``RowWorkload``: what the case asks for, from its batch spec before any backend runs
  (``execute/cases.py``: ``case_base_row``);
- ``RowTiming``: the plan and convert samples (the runner's prepare step), the kernel's samples
  and their statistics (its finish step);
- ``RowCorrectness``: the tolerance the row was checked under and the errors of its checked output;
- ``RowRoofline``: the case's work (flops, bytes) and what the kernel time makes of it against
  the measured ceilings;
- ``RowProfile``: the ``--profile`` pass (kernels per call, their summed time, the trace).

The row (``store/rows.py``) holds these and its outcome (status, reason), and flattens everything
to the one on-disk form (rows.jsonl, results.csv, JSON), which is the same as before the row had
parts: field names are unique across the parts and the row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class RowIdentity:
    """``backend`` is the canonical spec text (``flashinfer:fa3``); ``mode`` the route the backend
    took (and why the tolerance changed, if it did); ``device_id`` the physical device (GPU-<uuid>
    or host:cpu: rows of a case share one); ``repro`` the one command that re-runs just this row."""

    scenario: str
    case_id: str
    backend: str
    backend_version: str = ""
    mode: str = ""
    device: str = ""
    device_id: str = ""
    repro: str = ""


@dataclass
class RowWorkload:
    """The case's batch: ``batch`` in words (``"32 decode@4k + 8 tree(41)@2k"``), its requests
    and query tokens, and the sweep values that made it (``params``)."""

    dtype: str = ""
    page_size: int = 0
    layout: str = ""
    batch: str = ""
    num_requests: int = 0
    num_tokens: int = 0
    params: dict = field(default_factory=dict)


@dataclass
class RowTiming:
    """Times in ms. The kernel's statistics are over ``samples_ms`` (kept, never only a median)."""

    plan_ms: float = math.nan  # the engine's per-step metadata work (the library's own plan call included)
    convert_ms: float = math.nan  # what attnbench adds because the library cannot read the batch natively (0: none)
    median_ms: float = math.nan
    p20_ms: float = math.nan
    p80_ms: float = math.nan
    min_ms: float = math.nan
    iqr_rel: float = math.nan
    n: int = 0
    step_ms: float = math.nan  # plan + kernel: what an engine pays each step (convert excluded)
    timing_method: str = ""
    threads: int = 0  # intra-op threads of a CPU row's backend (0: a GPU row)
    cold_l2: Optional[bool] = None
    flush: str = ""  # how the L2 was emptied before each timed call (timing.flush); "": not flushed (warm L2, CPU)
    timing_note: str = ""
    samples_ms: list = field(default_factory=list)
    # the median of each timing round (timing.rounds), in order: the unit that `check` and
    # `compare` replicate over, since calls within one round share the machine's state
    round_medians_ms: list = field(default_factory=list)
    # every timed call of the plan and of the convert (host, synchronized; one engine step each):
    # their spread, which `decide` spreads over the rounds (empty in runs made before they were kept)
    plan_samples_ms: list = field(default_factory=list)
    convert_samples_ms: list = field(default_factory=list)


@dataclass
class RowCorrectness:
    """The first (and the timed) output against the reference: ‖out − ref‖/‖ref‖, the largest
    absolute difference, and the relative tolerance they were held to."""

    rel_err: float = math.nan
    max_abs_err: float = math.nan
    tolerance: float = math.nan


@dataclass
class RowRoofline:
    """The case's work (flops, bytes moved) and, for a timed competitor, its rates (TFLOP/s,
    TB/s), the ceilings' floor (ms), the binding ceiling (``memory`` or ``compute``) and the %
    of it the kernel reached."""

    flops: int = 0
    bytes: int = 0
    tflops: float = math.nan
    tbps: float = math.nan
    floor_ms: float = math.nan
    bound: str = ""
    pct_of_ceiling: float = math.nan


@dataclass
class RowProfile:
    """The ``--profile`` pass: device kernels per call, their summed time per call (ms), the trace file."""

    kernels_per_call: Optional[int] = None
    kernel_sum_ms: float = math.nan
    trace: str = ""


#: the row's attribute -> its part's type, in the order the parts are shown
PARTS = {
    "id": RowIdentity,
    "workload": RowWorkload,
    "timing": RowTiming,
    "correctness": RowCorrectness,
    "roofline": RowRoofline,
    "profile": RowProfile,
}
