"""GPU checks of issue 24 (run on the GPU machine: pytest -m gpu tests/test_gpu_trust.py):

* item 6, stale graphs: a backend whose capture misses its first kernel (it skips it while
  the stream is capturing) replays the capture's intermediate; the row is a mismatch naming
  a stale CUDA graph, while the same backend capturing both kernels is ok;
* item 9, warm-L2 rows do not count host gaps: a backend that spends 300 µs on the host
  before a tiny kernel is timed (events, warm L2) near the kernel's time, not 300 µs."""
import time
from dataclasses import dataclass

import pytest
import torch

from attnbench.backend import registry
from attnbench.backend import Backend
from attnbench.execute.options import RunOptions
from attnbench.execute.runner import Runner
from attnbench.measure.timing import TimingConfig, time_cuda
from attnbench.workload.scenario import load_text

from .test_cli import TINY

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@dataclass
class _Plan:
    q: torch.Tensor
    ref: torch.Tensor
    q0: float  # a Python number: not an input the check changes
    tmp: torch.Tensor
    out: torch.Tensor


def _plan(batch) -> _Plan:
    from attnbench.workload.reference import reference_attention

    return _Plan(batch.q, reference_attention(batch)[0].to(batch.dtype), float(batch.q.float().sum()),
                 torch.empty_like(batch.q), torch.empty_like(batch.q))


class TwoKernels(Backend):
    """out = ref * sum(copy of q) / sum(q at plan time): right on the pristine inputs, and
    following a change of q; ``skip_in_capture``: the copy is not captured (a lost kernel)."""

    name = "two_kernels"
    skip_in_capture = False

    def plan(self, batch):
        return _plan(batch)

    def run(self, p):
        if not (self.skip_in_capture and torch.cuda.is_current_stream_capturing()):
            p.tmp.copy_(p.q)
        torch.mul(p.ref, p.tmp.float().sum() / p.q0, out=p.out)
        return p.out


class LosesAKernel(TwoKernels):
    name = "loses_a_kernel"
    skip_in_capture = True


def _rows(names):
    for cls in (TwoKernels, LosesAKernel):
        registry.register(cls)
    try:
        sf = load_text(TINY.replace("device: cpu", "device: cuda"), "t.yaml", ["sweep={}"])
        return {r.id.backend: r for r in Runner(sf, RunOptions(backends=names)).rows()}
    finally:
        for cls in (TwoKernels, LosesAKernel):
            registry._EXTRA.pop(cls.name, None)


def test_a_graph_that_lost_a_kernel_is_a_mismatch():
    rows = _rows(["two_kernels", "loses_a_kernel", "sdpa"])
    assert rows["two_kernels"].status == "ok" and rows["two_kernels"].timing.timing_method == "cuda-graph", rows["two_kernels"].reason
    bad = rows["loses_a_kernel"]
    assert bad.status == "mismatch" and "stale CUDA graph" in bad.reason, (bad.status, bad.reason)
    assert rows["sdpa"].status == "ok", rows["sdpa"].reason


def test_warm_l2_rows_do_not_count_host_gaps():
    q = torch.randn(64, 128, device="cuda")
    out = torch.empty_like(q)

    def run():
        time.sleep(300e-6)  # host work before the launch: the GPU must not idle inside the timed region
        torch.mul(q, 2.0, out=out)
        return out

    cfg = TimingConfig(warmup_ms=2, measure_ms=30, min_runs=20, cold_l2=False, cuda_graphs=False)
    res = time_cuda(run, torch.device("cuda"), cfg, capturable=False)
    med = sorted(res.samples_ms)[len(res.samples_ms) // 2]
    assert med < 0.15, f"warm-L2 median {med * 1e3:.1f} µs includes the 300 µs host gap"
