"""Issue 32 A: the triton backend on an FP8 cache with a window and trees was an ``error`` row
on every GPU row: ``modified its inputs (q); before that: NotImplementedError: "mul_cuda" not
implemented for 'Float8_e4m3fn'``.

Root cause (not the kernel, which dequantizes in float32 with its scales): the timer's stale-graph
check (measure/graph_check.py) multiplies every small float tensor of a plan in place by random
factors, the plan's own FP8 K/V caches included. The factors were cast to the tensor's dtype,
so an FP8 cache got ``fp8 * fp8``: CUDA has no such kernel (the error), the CPU has one and
overflows (e4m3's 448 is the data's amax here) into NaN. The error left the tensors already
perturbed (q first) unrestored, so the runner's input check then blamed the backend for a
``q`` it never wrote. It ran only on CUDA, so no CPU test saw it; the same check here, on the
CPU, with the triton kernels interpreted, reproduces both halves.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from attnbench.execute.inputs import clone_batch, modified_inputs
from attnbench.measure.graph_check import GraphCheck, perturb_small_inputs
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention

from attnbench.workload.trees import from_choices

from .test_triton_backend import CHOICES, TritonBackend, need_interpreter, tree
from .interpreted import interpret_on_cpu  # noqa: F401 (an autouse fixture)

# the combination: FP8 e4m3 KV, window 48, head dim 64, 8 q / 2 kv heads, decodes, trees
# and a chunked prefill (float16 queries: the interpreter's bfloat16 tl.dot is wrong)
REQUESTS = (
    Request("decode", 1, 100),
    tree(from_choices(CHOICES), 70),
    Request("prefill", 20, 60),  # chunked prefill
    Request("decode", 1, 30),
    tree(from_choices(CHOICES), 9),
)


def _batch(page: int, scale: str, kv_dtype: str = "fp8_e4m3"):
    spec = BatchSpec(REQUESTS, 8, 2, 64, "float16", page, "shuffled", window=48, kv_dtype=kv_dtype, kv_scale=scale)
    return materialize(spec, seed=page)


FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@pytest.fixture
def cuda_like_fp8(monkeypatch):
    """On the CPU, torch multiplies FP8 tensors in place; CUDA has no such kernel. Make the CPU
    refuse it as CUDA does, so that the check is tested as it runs on the GPU."""
    real = torch.Tensor.mul_

    def mul_(self, other, *a, **kw):
        if self.dtype in FP8 or getattr(other, "dtype", None) in FP8:
            raise NotImplementedError(f'"mul_cuda" not implemented for {str(self.dtype).replace("torch.", "")!r}')
        return real(self, other, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "mul_", mul_)


def _count(fn, device):  # the kernel count needs CUDA's profiler; one "kernel" either way here
    return 1


@pytest.mark.parametrize("scale", ["per-tensor", "per-head"])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.slow
def test_graph_check_on_the_fp8_window_tree_batch(page, scale, cuda_like_fp8):
    """The check the timer runs on a captured graph, with the eager call standing in for the
    replay: no false alarm, the caches really perturbed (finite FP8), every input back bit for bit."""
    need_interpreter()
    pristine = _batch(page, scale)
    batch = clone_batch(pristine)
    be = TritonBackend()
    assert be.reasons(batch) == []
    plan = be.plan(batch)
    ref, _ = reference_attention(pristine)
    out = be.run(plan)
    assert compare(out, ref)[0] < 3e-3

    seen = []

    def run():  # the check's calls: before the change, then on the changed inputs
        seen.append(batch.k_cache.clone())
        return be.run(plan)

    limit = max(4 * batch.q.numel(), 1 << 22)  # the runner's limit: these small caches are in it
    assert GraphCheck(plan, limit, 3e-3, count=_count)(run, run, plan.out, torch.device("cpu")) == ""
    k = seen[-1]
    assert k.dtype == torch.float8_e4m3fn and torch.isfinite(k.float()).all()
    assert not torch.equal(k.view(torch.uint8), pristine.k_cache.view(torch.uint8))  # changed, and
    assert modified_inputs(pristine, batch) == []  # restored exactly
    assert compare(be.run(plan), ref)[0] < 3e-3


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_tensors_are_perturbed_in_float32_within_range(dtype):
    """At the format's largest value (what a cache scaled to its amax holds) the factors up to
    1.5 would overflow: they are clamped to the largest finite value, never inf/NaN."""
    fmax = torch.finfo(dtype).max
    x = torch.tensor([fmax, -fmax, 1.0, -0.5, 0.0] * 20).to(dtype)
    before = x.clone()
    restore = perturb_small_inputs({"x": x}, 1000)
    assert torch.isfinite(x.float()).all() and x.float().abs().max() <= fmax
    assert not torch.equal(x.view(torch.uint8), before.view(torch.uint8))
    restore()
    assert torch.equal(x.view(torch.uint8), before.view(torch.uint8))


@dataclass
class _Plan:
    q: torch.Tensor
    stuck: torch.Tensor  # an input the in-place change fails on


def test_a_failed_perturbation_restores_what_it_changed_and_names_itself():
    """Whatever tensor the change fails on (here an inference tensor, read-only outside
    inference mode), the ones already changed are restored before the error goes up, and the
    error says it is attnbench's graph check, not the backend."""
    q = torch.randn(5, 4)
    with torch.inference_mode():
        stuck = torch.ones(3)
    q0 = q.clone()
    with pytest.raises(RuntimeError, match="graph check") as e:
        perturb_small_inputs(_Plan(q, stuck), 1000)
    assert torch.equal(q, q0)
    assert "not the backend" in str(e.value)


def test_runner_keeps_the_real_error_first(monkeypatch):
    """A row that failed and also left its inputs modified: the failure stays the primary
    reason, the input check's finding follows it."""
    from attnbench.execute.runner import Runner
    from attnbench.store.rows import Row, Status

    pristine = _small()
    own = clone_batch(pristine)
    own.q.view(-1)[0] += 1
    row = Row.__new__(Row)
    row.status, row.reason = Status.ERROR, 'NotImplementedError: "mul_cuda" not implemented'
    Runner._check_inputs(None, row, pristine, own)
    assert row.status == "error"
    assert row.reason.startswith('NotImplementedError: "mul_cuda"') and "modified its inputs (q)" in row.reason
    row.status, row.reason = Status.OK, ""
    Runner._check_inputs(None, row, pristine, own)
    assert row.status == "error" and row.reason == "modified its inputs (q)"


def _small():
    return materialize(BatchSpec((Request("decode", 1, 5),), 2, 1, 8, "float32", 4, "contiguous"), 0)
