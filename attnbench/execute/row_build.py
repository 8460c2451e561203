"""The runner's measurements made into a row's typed parts (``store/row_parts.py``): each part
built whole from what its step learnt, rather than field by field on the row."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from attnbench.measure.metrics import Roofline, Work
from attnbench.measure.profiling import Profile
from attnbench.measure.stats import Summary, kept
from attnbench.measure.timing import TimingResult
from attnbench.store.row_parts import RowProfile, RowRoofline, RowTiming


def host_timed(timing: RowTiming, plan_ms: Sequence[float], convert_ms: Sequence[float]) -> RowTiming:
    """``timing`` with the plan's and the convert's timed calls (ms, one engine step each) and
    their medians; no convert calls: the library reads the batch natively (convert 0 ms)."""
    plan = kept(plan_ms)
    return replace(timing, plan_samples_ms=plan, plan_ms=Summary.of(plan).median,
                   convert_samples_ms=kept(convert_ms), convert_ms=Summary.of(convert_ms).median if convert_ms else 0.0)


def kernel_timed(timing: RowTiming, samples: Sequence[float], round_medians: Sequence[float], last: TimingResult,
                 timer_note: str = "", extra_note: str = "") -> RowTiming:
    """``timing`` with the kernel's samples over every round (ms), their statistics, the plan +
    kernel step (``timing``'s plan_ms: all its samples are in), and how the last round was timed;
    ``timer_note``: what the timer said over every round (``measure.left_out.row_note``), then
    ``extra_note`` (what the graph check found)."""
    s = Summary.of(samples)
    return replace(
        timing, samples_ms=kept(samples), round_medians_ms=kept(round_medians),
        median_ms=s.median, p20_ms=s.p20, p80_ms=s.p80, min_ms=s.min, iqr_rel=s.iqr_rel, n=s.n,
        step_ms=timing.plan_ms + s.median, timing_method=last.method, cold_l2=last.cold_l2, flush=last.flush,
        timing_note="; ".join(x for x in (timer_note, extra_note) if x),
    )


def roofline_part(work: Work, rf: Roofline) -> RowRoofline:
    """The case's work and what the kernel time made of it under the ceilings."""
    return RowRoofline(flops=work.flops, bytes=work.bytes, tflops=rf.tflops, tbps=rf.tbps, floor_ms=rf.floor_ms,
                       bound=rf.bound, pct_of_ceiling=rf.pct_of_ceiling)


def profile_part(prof: Profile) -> RowProfile:
    return RowProfile(kernels_per_call=prof.kernels_per_call, kernel_sum_ms=prof.kernel_ms_per_call, trace=prof.trace)
