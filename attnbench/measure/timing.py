"""One timer for every backend: CUDA graphs, CUDA events, or the CPU clock.

Follows triton's ``do_bench``: warm-up and measurement are time budgets turned into call
counts from a quick estimate; on a GPU, the L2 cache is flushed before every timed call,
outside the timed region (by default a read of a buffer twice its size: ``L2Flusher``, the
mode is ``timing.flush``); every per-call sample is kept. The settings are
``workload.timing_spec.TimingConfig``, importable from here.
Under CUDA graphs, the backend's ``run`` is captured once and each sample times one replay.
If capture fails the timer falls back to events and says so in ``note``.

The output of the timed path is returned too, computed after poisoning the previous
output with NaN, so that a graph replay (or a kernel) that leaves its output unwritten
cannot pass the reference check.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from attnbench.measure.checksum import checksum
from attnbench.measure.left_out import LeftOut, advanced, left_out_note
from attnbench.workload.timing_spec import FLUSH_MODES, SOFT_MIN_RUNS, TimingConfig


@dataclass
class TimingResult:
    samples_ms: list[float]
    method: str  # "cuda-graph" | "cuda-events" | "cpu" | "cpu-thread" | "cpu-process"
    cold_l2: bool
    output: Optional[torch.Tensor] = None
    note: str = ""
    checksums: Optional[torch.Tensor] = None  # [n, 4] per timed call (measure/checksum.py), CPU
    flush: str = ""  # how the L2 was emptied before each timed call ("": it was not, warm L2 or a CPU)
    graph_problem: str = ""  # what measure/graph_check.py found wrong with the captured graph
    left_out: Optional[LeftOut] = None  # CPU clocks: the calls it did not advance over (measure/left_out.py)


def _counts(estimate_ms: float, cfg: TimingConfig) -> tuple[int, int]:
    """(warm-up calls, timed calls) for a call of about ``estimate_ms``. The budget decides;
    ``cfg.min_runs`` is a floor when set. Unset, the floor is SOFT_MIN_RUNS, but only as many
    of those as fit in twice ``measure_ms``: a 40 ms call under a 10 ms budget is timed once,
    not 5 times (200 ms), while a 3 ms call still gets its 5."""
    est = max(estimate_ms, 1e-4)
    warm = max(1, int(math.ceil(cfg.warmup_ms / est))) if cfg.warmup_ms > 0 else 0
    floor = cfg.min_runs if cfg.min_runs is not None else min(SOFT_MIN_RUNS, int(2 * cfg.measure_ms / est))
    n = int(min(cfg.max_runs, max(1, floor, math.ceil(cfg.measure_ms / est))))
    return min(warm, cfg.max_runs), n


def _poison(t: Optional[torch.Tensor]) -> None:
    from attnbench.measure.poison import poison_fill  # NaN with a payload: "never written" is told from computed NaN

    poison_fill(t)


CPU_CLOCKS = {"wall": time.perf_counter_ns, "thread": time.thread_time_ns, "process": time.process_time_ns}
CPU_METHODS = {"wall": "cpu", "thread": "cpu-thread", "process": "cpu-process"}
# Other threads "worked" in a call when the process's CPU time exceeds the calling thread's by more
# than this share of it plus this much per call (reading the process clock costs ~0.7 us: a 5 us
# inline call read 16% more by it; a call whose work ran in a pool thread read 43x more).
OTHER_THREADS_SHARE = 0.10
OTHER_THREADS_NS_PER_CALL = 2000


def _clocked(run: Callable[[], torch.Tensor], clocks: list) -> tuple[torch.Tensor, list[float]]:
    """One call between readings of ``clocks`` (outermost first, so the last one's interval holds
    nothing but the call); -> (output, ms by each clock)."""
    starts = [c() for c in clocks]
    out = run()
    ends = [c() for c in reversed(clocks)][::-1]
    return out, [(e - b) / 1e6 for b, e in zip(starts, ends)]


def other_threads_note(thread_ms: list[float], process_ms: list[float], wall_ms: list[float]) -> str:
    """Why the thread's clock cannot time these calls ("" when it can): other threads of the
    process (a backend's own pool, an OpenMP library outside torch's) did work in them that the
    calling thread's CPU clock does not count (0.18 ms read for 0.58 ms of work, issue 37). Judged
    on the median call, so that a helper thread that spins now and then (an OpenMP pool after a
    parallel region) does not move a backend whose work is all inline onto the process clock."""
    mid = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    extra = mid([p - t for p, t in zip(process_ms, thread_ms)])
    if extra <= OTHER_THREADS_SHARE * mid(thread_ms) + OTHER_THREADS_NS_PER_CALL / 1e6:
        return ""
    return (f"other threads of the process worked during the calls (the median call: {mid(process_ms):.4g} ms of "
            f"CPU time in all threads, {mid(thread_ms):.4g} ms in the calling one, wall {mid(wall_ms):.4g} ms): "
            "timed by the process's CPU clock, all its threads' work")


def time_cpu(run: Callable[[], torch.Tensor], cfg: TimingConfig) -> TimingResult:
    """A clock around each call (the CPU has no L2 to flush the way a GPU does).

    ``cfg.cpu_clock``: ``wall`` (method ``cpu``) or ``thread``, the calling thread's CPU time
    (method ``cpu-thread``): with one intra-op thread every instruction of the call runs on
    this thread, and time slices the OS gives other processes do not count, so a busy
    machine does not move the median. Several intra-op threads need the wall clock. A backend
    may still work in threads of its own (a pool, an OpenMP library): the process's CPU clock
    and the wall clock are read around each call too, and where other threads did work
    (``other_threads_note``) the samples are the process's CPU time, all threads' work and still
    blind to other processes, and the row says so (method ``cpu-process``; ``process``: always).

    No call is spent for nothing (a slow CPU backend, 50 ms a call, made these calls most of a
    sweep's time): the runner has made a first, checked call already, so the estimate call is
    the first warm-up call; the previous output is poisoned before the last timed call, whose
    output is the one returned for the check.
    """
    single = cfg.cpu_clock == "wall"
    clocks = [time.perf_counter_ns] if single else [time.perf_counter_ns, time.process_time_ns, time.thread_time_ns]
    out, first = _clocked(run, clocks)
    warm, n = _counts(max(first[-2:]), cfg)  # the process clock too: work done in a pool must fit the budget
    for _ in range(warm - 1):
        out = run()
    timed, sums = [], []
    for i in range(n):
        if i == n - 1:
            _poison(out)  # outside the timed region
        out, ms = _clocked(run, clocks)
        timed.append(ms)
        sums.append(checksum(out))
    if single:
        return TimingResult([t[0] for t in timed], "cpu", cold_l2=False, output=out, checksums=_stacked(sums))
    wall, process, thread = (list(c) for c in zip(*timed))
    note = other_threads_note(thread, process, wall)
    clock = "process" if note or cfg.cpu_clock == "process" else "thread"
    samples, gap = advanced(process if clock == "process" else thread, clock)
    note = "; ".join(x for x in (note, left_out_note([gap])) if x)
    if not samples:  # the CPU clock never moved: the wall clock times the calls
        return TimingResult(wall, "cpu", cold_l2=False, output=out, checksums=_stacked(sums), note=note, left_out=gap)
    return TimingResult(samples, CPU_METHODS[clock], cold_l2=False, output=out, checksums=_stacked(sums), note=note,
                        left_out=gap)


def _stacked(sums: list) -> Optional[torch.Tensor]:
    return torch.stack(sums).cpu() if sums and all(s is not None for s in sums) else None



class L2Flusher:
    """Empties the L2 cache before a timed call, leaving no dirty line behind.

    ``read`` (the default) sums a buffer of twice the L2 size: every line the timed call
    could hit is evicted, and whatever the previous call left dirty (its output) is written
    back now, during the flush, not while the next timed call runs. ``write`` (what attnbench
    did first) zeroes the buffer instead: that leaves 2x L2 of dirty lines whose write-back
    overlaps the timed call and adds ~10 us to every memory-bound call on an H100.
    ``write+read`` writes, then reads. The GPU validation measures all three
    (``scripts/gpu/gpu_checks.py``, check ``l2-flush``).
    """

    def __init__(self, device: torch.device, mode: str = "read"):
        if mode not in FLUSH_MODES:
            raise ValueError(f"flush mode {mode!r}: choose one of {', '.join(FLUSH_MODES)}")
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20) or 50 * 2**20
        self.mode = mode
        self.buf = torch.empty(2 * l2 // 4 + 1024, dtype=torch.int32, device=device)
        self.buf.fill_(1)
        self.sink = torch.empty((), dtype=torch.int64, device=device)

    def __call__(self) -> None:
        if self.mode != "read":
            self.buf.fill_(1)
        if self.mode != "write":
            torch.sum(self.buf, 0, dtype=torch.int64, out=self.sink)


class GpuWait:
    """A GPU-side wait queued before each timed call's flush and start event (issue 24).

    The start event is recorded when the GPU reaches it; if the GPU ran out of work before the
    host queued the call (a Python-heavy ``run``, a busy host, a warm-L2 row with no flush
    to cover the host's time), the gap up to the call's first kernel was counted: a warm 8x4k
    decode read 63.6 µs against 56.1 µs cold with the host busy. So the GPU spins
    (``torch.cuda._sleep``) before each of them, outside the timed region, for twice the
    median host time of queueing the flush, the start event and the call (what the timer saw
    so far: ``saw_host``), plus 20 µs, at most 2 ms: they are queued while it spins. The spin
    counts SM clock cycles: their rate is measured at each timer start (0.13 ms at boost clock)
    and the highest rate seen on the device is kept, since an idle GPU's low clock (345 MHz
    seen on an H100, against ~2 GHz busy) would make every later wait several times too short."""

    _cycles_per_us: dict = {}

    def __init__(self, device: torch.device):
        self.device = device
        self.seen: list[float] = []
        self.host_us = 20.0
        self.cycles_per_us(device, measure=True)

    def saw_host(self, us: float) -> None:
        if len(self.seen) < 16:  # the first iterations (the estimate) size the wait of the rest
            self.seen.append(us)
            self.host_us = sorted(self.seen)[len(self.seen) // 2]

    @classmethod
    def cycles_per_us(cls, device: torch.device, measure: bool = False) -> float:
        key = str(device)
        if measure or key not in cls._cycles_per_us:
            cycles = 1 << 18
            with torch.cuda.device(device):
                torch.cuda._sleep(cycles)  # untimed: loads the spin kernel and raises the clock
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                torch.cuda._sleep(cycles)
                e.record()
                e.synchronize()
            rate = cycles / max(s.elapsed_time(e) * 1e3, 1.0)
            cls._cycles_per_us[key] = max(rate, cls._cycles_per_us.get(key, 0.0))
        return cls._cycles_per_us[key]

    @staticmethod
    def wait_us(host_us: float) -> float:
        return min(2 * host_us + 20.0, 2000.0)

    def __call__(self) -> None:
        torch.cuda._sleep(int(self.wait_us(self.host_us) * self.cycles_per_us(self.device)))


def _capture(run: Callable[[], torch.Tensor], device: torch.device):
    """Capture ``run`` in a CUDA graph; returns (graph, static output)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):  # warm up on a side stream, as torch.cuda.graphs asks
            run()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = run()
    torch.cuda.synchronize(device)
    return graph, static_out


def time_cuda(
    run: Callable[[], torch.Tensor], device: torch.device, cfg: TimingConfig, capturable: bool = True,
    graph_check: Optional[Callable] = None,
) -> TimingResult:
    """``graph_check(run, replay, static_out, device) -> problem`` runs once on a captured graph,
    after the samples (measure/graph_check.py)."""
    device = torch.device(device)
    note = ""
    method = "cuda-events"
    static_out = None
    step: Callable[[], object] = run
    if cfg.cuda_graphs and capturable:
        try:
            graph, static_out = _capture(run, device)
            step = graph.replay
            method = "cuda-graph"
        except Exception as e:  # capture is not possible for this backend: say so, use events
            torch.cuda.synchronize(device)
            note = f"graph capture failed ({type(e).__name__}: {str(e).splitlines()[0][:120]}); timed with events"
    elif cfg.cuda_graphs:
        note = "backend is not graph-capturable; timed with events"
    flush = L2Flusher(device, cfg.flush) if cfg.cold_l2 else (lambda: None)
    stream = torch.cuda.current_stream(device)
    wait = GpuWait(device)
    sums: list = []

    def timed(n: int, check: bool = False) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            t0 = time.perf_counter()
            wait()  # the GPU waits while the host queues the flush, the start event and the call
            flush()
            starts[i].record(stream)
            out = step()
            ends[i].record(stream)
            wait.saw_host((time.perf_counter() - t0) * 1e6)
            if check:  # queued after the end event: outside the timed region
                sums.append(checksum(static_out if static_out is not None else out))
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    est = sorted(timed(5))[2]
    warm, n = _counts(est, cfg)
    for _ in range(warm):
        step()
    samples = timed(n, check=True)
    graph_problem = graph_check(run, step, static_out, device) if graph_check and static_out is not None else ""
    return TimingResult(samples, method, cold_l2=cfg.cold_l2, output=_final_output(run, step, static_out, device),
                        note=note, checksums=_stacked(sums), flush=cfg.flush if cfg.cold_l2 else "",
                        graph_problem=graph_problem)


def _final_output(run: Callable[[], torch.Tensor], step: Callable[[], object], static_out, device) -> torch.Tensor:
    """The output of the timed path, after poisoning what the last call wrote."""
    if static_out is not None:
        _poison(static_out)
        step()
        torch.cuda.synchronize(device)
        return static_out.clone()
    last = run()
    _poison(last)
    final = run()
    torch.cuda.synchronize(device)
    return final


def time_run(
    run: Callable[[], torch.Tensor], device: torch.device, cfg: TimingConfig, capturable: bool = True,
    graph_check: Optional[Callable] = None,
) -> TimingResult:
    """Time ``run`` on ``device``: the GPU path when it is a CUDA device, the CPU clock otherwise."""
    if torch.device(device).type == "cuda":
        return time_cuda(run, device, cfg, capturable, graph_check)
    return time_cpu(run, cfg)


def median_seconds(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` calls after one warm-up (CUDA events on a GPU,
    the host clock on a CPU); for the ceiling measurements, which need no L2 flush."""
    cuda = torch.device(device).type == "cuda"
    fn()
    times = []
    for _ in range(reps):
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


@contextlib.contextmanager
def cpu_threads(device: torch.device, threads: int):
    """Intra-op threads for CPU work inside the block (as torch.utils.benchmark times with one
    thread by default: several threads on a shared machine make medians swing 30-100x);
    nothing changes for a CUDA device."""
    if torch.device(device).type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def time_host(fn: Callable[[], object], device: torch.device, budget_ms: float = 50.0, max_runs: int = 20,
              warmup_ms: float = 10.0, min_warmup: int = 2, max_warmup: Optional[int] = None) -> list[float]:
    """Synchronized host wall time of ``fn`` (a backend's plan or convert), in ms; a few samples.

    The first calls are not timed: at least ``min_warmup``, and more until ``warmup_ms`` have
    passed (at most ``max_runs``). The first calls of host work in a process run slower (lazy
    initialization, the allocator's first requests, cold caches and branch predictors): sdpa's
    convert read 2.8-9.7 ms in the first case of a quickstart run and 1.0-1.3 ms in the
    others, in 9 of 10 runs, when the first calls were timed (issue 24). Then samples until
    ``budget_ms`` is spent (at least one, at most ``max_runs``): a slow convert is not timed 3
    times over the row's budget (issue 26). ``max_warmup`` caps the warm-up calls apart (default: ``max_runs``)."""
    cuda = torch.device(device).type == "cuda"

    def once() -> float:
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) * 1e3

    warm, spent = 0, 0.0
    while warm < min_warmup or (spent < warmup_ms and warm < (max_runs if max_warmup is None else max_warmup)):
        spent += once()
        warm += 1
    samples: list[float] = []
    spent = 0.0
    while len(samples) < max_runs and (not samples or spent < budget_ms):  # a slow plan: one sample, not 3
        samples.append(once())
        spent += samples[-1]
    return samples
