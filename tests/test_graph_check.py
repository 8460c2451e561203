"""Stale CUDA graphs (issue 24 item 6): a kernel missing from a capture leaves every replay's
output as the capture wrote it, and checksums and the final check agree with it. The logic of
measure/graph_check.py on the CPU, with a scripted "graph": its replay recomputes into the
static output (a good capture), or does not (a stale one), or launches fewer kernels. The
same check on real graphs runs in tests/test_gpu_trust.py."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.measure.graph_check import GraphCheck, perturb_small_inputs


@dataclass
class _Plan:
    q: torch.Tensor
    k: torch.Tensor
    out: torch.Tensor
    ids: torch.Tensor  # not a float: left alone


def _plan() -> _Plan:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(6, 4, 8, generator=g), torch.randn(10, 4, 8, generator=g)
    return _Plan(q, k, torch.empty(6, 4, 8), torch.arange(6))


def _run(p: _Plan) -> torch.Tensor:
    w = torch.softmax(torch.einsum("nhd,khd->hnk", p.q, p.k), -1)
    p.out.copy_(torch.einsum("hnk,khd->nhd", w, p.k))
    return p.out


def _counts(eager: int, graph: int):
    return lambda fn, device: eager if fn.__name__ == "run" else graph


def test_a_replay_that_follows_its_inputs_passes_and_the_inputs_come_back():
    p = _plan()
    q0, k0 = p.q.clone(), p.k.clone()

    def run():
        return _run(p)

    def replay():  # a good capture: recomputes into the static output
        _run(p)

    assert GraphCheck(p, 1000, 1e-6, count=_counts(2, 2))(run, replay, p.out, torch.device("cpu")) == ""
    assert torch.equal(p.q, q0) and torch.equal(p.k, k0)


def test_a_replay_missing_a_kernel_is_stale():
    """The "graph" computes the attention weights into a buffer, then the output from them;
    a capture that lost the first kernel replays the second on the weights of the capture."""
    p = _plan()
    w = torch.softmax(torch.einsum("nhd,khd->hnk", p.q, p.k), -1)  # what the capture wrote

    def run():
        return _run(p).clone()

    def stale():  # only the second kernel: reads the capture's weights
        p.out.copy_(torch.einsum("hnk,khd->nhd", w, p.k))

    stale()
    why = GraphCheck(p, p.q.numel(), 1e-3, count=_counts(2, 2))(run, stale, p.out, torch.device("cpu"))
    assert why.startswith("stale CUDA graph") and "did not change" in why

    def writes_nothing():
        pass

    why = GraphCheck(p, p.q.numel(), 1e-3, count=_counts(2, 2))(run, writes_nothing, p.out, torch.device("cpu"))
    assert why.startswith("stale CUDA graph") and "left values unwritten" in why


def test_fewer_kernels_in_a_replay_is_named_and_alone_only_noted():
    p = _plan()

    def run():
        return _run(p)

    def replay():
        _run(p)

    def stale():
        pass

    check = GraphCheck(p, 1000, 1e-3, count=lambda fn, d: {run: 3, stale: 2}[fn])
    why = check(run, stale, p.out, "cpu")
    assert why.startswith("stale CUDA graph") and "a replay launches 2 kernel(s), one eager call 3" in why
    # fewer kernels with an output that follows its inputs: a note, no verdict
    check = GraphCheck(p, 1000, 1e-3, count=lambda fn, d: {run: 3, replay: 2}[fn])
    assert check(run, replay, p.out, "cpu") == "" and "a replay launches 2 kernel(s)" in check.note


def test_perturbation_changes_small_float_tensors_and_restores_them_exactly():
    p = _plan()
    q0, k0, ids0 = p.q.clone(), p.k.clone(), p.ids.clone()
    restore = perturb_small_inputs(p, limit=p.q.numel())  # k is larger: left alone
    ratio = p.q / q0
    assert ratio.min() >= 0.5 and ratio.max() < 1.5 and ratio.std() > 0.1  # not one scale for all
    assert torch.equal(p.k, k0) and torch.equal(p.ids, ids0)
    restore()
    assert torch.equal(p.q, q0)


def test_a_broadcast_plan_tensor_is_changed_through_its_storage():
    """A plan holding an expanded view (stride 0: GQA queries broadcast over the heads of a
    group, a per-head factor broadcast over rows) cannot be written in place as it is (seen on an
    H200 with xformers and flash-attn rows: "more than one element of the written-to tensor refers
    to a single memory location"): the change goes through one index of each broadcast dimension,
    every view follows it, and restore puts the exact values back."""
    base = torch.randn(1, 7, 2, 1, 16)
    q = base.expand(1, 7, 2, 4, 16)  # 4 query heads per KV head share one storage row
    slopes = torch.rand(3).view(3, 1).expand(3, 5)
    b0, s0 = base.clone(), slopes.clone()
    restore = perturb_small_inputs({"q": q, "slopes": slopes}, 10_000)
    assert not torch.equal(base, b0) and not torch.equal(slopes, s0)
    assert torch.equal(q[:, :, :, 0], q[:, :, :, 3])  # still one storage: every head sees the change
    restore()
    assert torch.equal(base, b0) and torch.equal(slopes, s0)
