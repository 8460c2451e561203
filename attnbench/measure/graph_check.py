"""Is a captured CUDA graph stale? Checked once per row for every backend timed by graph replay.

A kernel missing from a capture (a launch the capture did not record: flashinfer-bench#414
saw it with CuTe-DSL kernels) leaves the graph's output as the capture wrote it: every replay
returns that output, the per-call checksums agree with it, and the final reference check
passes because the inputs never changed. Two checks catch it (``GraphCheck``):

1. kernel count: one eager call and one replay under the profiler; a replay that launches
   fewer kernels than the eager call may be missing some. The count alone is no verdict (a
   library may launch less under capture on purpose; some CUPTI versions report no graph
   kernels): with check 2 failing it is named in the reason, with check 2 passing it is a
   note on the row.
2. the output follows its inputs: the plan's q-sized float tensors (the queries, the plan's
   own copies of them, small caches, FP8 ones in float32) are changed (random factors in
   [0.5, 1.5)), then one replay (first, into an output filled with NaN) and one eager call
   must agree; the tensors are restored exactly afterwards (from copies, also when a change
   fails), so the row's input check and final reference check see the pristine inputs.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch


def _tensors(obj, depth: int = 2, seen: Optional[set] = None) -> list[torch.Tensor]:
    """Floating tensors reachable from ``obj`` (dataclass fields, items, attributes of
    attnbench's own objects), ``depth`` levels down, one per storage."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() and obj.numel():
            key = obj.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                return [obj]
        return []
    if depth < 0 or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return []
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
    elif isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    elif type(obj).__module__.startswith("attnbench") and hasattr(obj, "__dict__") and not callable(obj):
        children = list(vars(obj).values())  # our own plan objects; never a library's (or a module's) globals
    else:
        return []
    return [t for c in children for t in _tensors(c, depth - 1, seen)]


def _own_elements(t: torch.Tensor) -> Optional[torch.Tensor]:
    """A view of ``t`` that holds each of its memory locations once, so that it can be changed
    in place: a broadcast (``expand``: stride 0, as a plan's GQA-expanded queries or its
    per-head factors are) is narrowed to one index along each such dimension; the change then
    shows through every view of the storage. None when the view still overlaps itself (other
    strides that alias): that tensor is left as it is, the others are still changed."""
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if stride == 0 and size > 1:
            t = t.narrow(dim, 0, 1)
    if torch._debug_has_internal_overlap(t) == 1:  # 1: overlaps for sure (0 none, 2 unknown)
        return None
    return t


def perturb_small_inputs(plan, limit: int) -> Callable[[], None]:
    """Multiply each float tensor of ``plan`` with at most ``limit`` elements, in place, by its
    own random factors in [0.5, 1.5) (one per element: a uniform scale would leave an
    intermediate that copies an input equal to the scaled input, so a stale copy would pass);
    returns the function that restores them exactly.

    FP8 tensors (a plan's own small K/V caches) are multiplied in float32 and clamped to the
    format's largest finite value: CUDA has no FP8 multiply ("mul_cuda" not implemented for
    'Float8_e4m3fn'), and a cache scaled to its amax holds that largest value, which a factor
    above 1 would overflow into NaN (e4m3fn has no inf). If changing one tensor fails, the ones
    already changed are restored before the error goes up: the row's input check must never
    find a change of attnbench's own making (issue 32)."""
    picked = [_own_elements(t) for t in _tensors(plan) if t.numel() <= limit]
    picked = [t for t in picked if t is not None]
    saved = [t.clone() for t in picked]

    changed = 0

    def restore() -> None:
        with torch.no_grad():
            for t, s in zip(picked[:changed], saved):
                t.copy_(s)

    with torch.no_grad():
        for k, t in enumerate(picked):
            try:
                gen = torch.Generator(device=t.device).manual_seed(1234 + k)
                factor = torch.rand(t.shape, generator=gen, device=t.device) + 0.5
                if t.element_size() == 1:  # FP8: no multiply of its own; in range
                    fmax = torch.finfo(t.dtype).max
                    t.copy_((t.float() * factor).clamp_(-fmax, fmax))
                else:
                    t.mul_(factor.to(t.dtype))
                changed += 1
            except Exception as e:
                restore()
                try:  # the tensor it failed on, in case the failure came after a partial write
                    t.copy_(saved[k])
                except Exception:
                    pass
                raise RuntimeError(
                    f"attnbench's graph check (not the backend) could not change the plan's {t.dtype} "
                    f"tensor {tuple(t.shape)} to see the replay follow it: {type(e).__name__}: "
                    f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}") from e
    return restore


def kernels_launched(fn: Callable[[], object], device: torch.device) -> int:
    """GPU kernels (memcpy/memset left out) one call of ``fn`` launches, seen by the profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize(device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset", "cudaMem")))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / (b.norm() + 1e-300))


@dataclass
class GraphCheck:
    """Run once per row by the timer on its captured graph (``time_cuda``'s ``graph_check``)."""

    plan: object
    limit: int  # the largest tensor (elements) the input change scales: q-sized, not the KV cache
    tol: float  # how closely the replay must agree with the eager call (the row's tolerance)
    count: Callable[[Callable[[], object], torch.device], int] = kernels_launched
    note: str = ""  # fewer kernels in a replay than in an eager call, with an output that follows

    def __call__(self, run: Callable[[], torch.Tensor], replay: Callable[[], object], static_out: torch.Tensor,
                 device: torch.device) -> str:
        """A problem (the row's mismatch reason), or ""."""
        eager_n, graph_n = self.count(run, device), self.count(replay, device)
        fewer = (f"a replay launches {graph_n} kernel(s), one eager call {eager_n}"
                 if 0 < graph_n < eager_n else "")
        follows = self._follows(run, replay, static_out)
        if follows:
            return "stale CUDA graph: " + "; ".join(x for x in (follows, fewer) if x)
        # fewer kernels but an output that follows its inputs: a library may launch less under
        # capture on purpose (a check, a lazy init); said in the row's notes, not a mismatch
        self.note = f"{fewer} (its output follows its inputs like the eager call's)" if fewer else ""
        return ""

    def _follows(self, run: Callable[[], torch.Tensor], replay: Callable[[], object], static_out: torch.Tensor) -> str:
        """What is wrong with the replay's output after a change of inputs, or ""."""
        replay()
        before = static_out.detach().clone()
        restore = perturb_small_inputs(self.plan, self.limit)
        try:
            # the replay first: the buffers between its kernels still hold the last replay's values, as
            # they would in a stale graph (an eager call first would write them fresh); what it leaves
            # unwritten shows as NaN
            static_out.fill_(float("nan"))
            replay()
            after = static_out.detach().clone()
            eager = run().detach().clone()
        finally:
            restore()
        if not _rel(after, eager) <= self.tol:  # NaN (unwritten) fails too
            moved = ("left values unwritten" if not torch.isfinite(after).all() else
                     "did not change" if _rel(after, before) <= self.tol else "changed, but not like the eager call's")
            return (f"after the inputs changed between replays, the replay's output {moved} "
                    f"(relative difference to one eager call {_rel(after, eager):.3g})")
        return ""
