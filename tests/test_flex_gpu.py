"""Flex on the GPU against the reference, request by request (issue 32), both mask builds, on the
batches where the H100 gave wrong outputs with ``mask=blocks`` (trees then decodes at another
context, small trees beside a 300-token prefill; GQA, shuffled pages 16 and 256) and on the
mixed batch of tests/test_variants_gpu.py with windows, sinks, ALiBi and soft-cap. The batches
are scripts/gpu/flex_diag.py's. Run on the GPU machine: ``pytest -m gpu tests/test_flex_gpu.py``."""

import pytest
import torch

from attnbench.backend import make_backend
from attnbench.backends._flex_audit import kernel_block_sets, stride_problems
from attnbench.workload.reference import compare, default_tolerance, reference_attention

from .scripts import load_script

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

diag = load_script("scripts/gpu/flex_diag.py", register=True)


@pytest.mark.parametrize("mask", ["blocks", "dense"])
@pytest.mark.parametrize("case", list(diag.CASES))
def test_flex_matches_the_reference_per_request_on_gpu(case, mask):
    batch = diag.build(case, "cuda", small=False)
    be = make_backend(f"flex:mask={mask}")
    assert be.reasons(batch) == []  # windows, sinks and ALiBi run on CUDA again
    plan = be.prepare(batch)
    if mask == "blocks":
        bm = plan.block_mask
        lmax = int(batch.host.kv_lens.max())
        assert stride_problems(bm) == []
        kp, kf = kernel_block_sets(bm, lmax, kernel=True)
        lp, lf = kernel_block_sets(bm, lmax, kernel=False)
        assert torch.equal(kp, lp) and torch.equal(kf, lf)
    out = be.run(plan)
    torch.cuda.synchronize()
    ref, _ = reference_attention(batch)
    tol = default_tolerance(batch.dtype)
    rows = diag.per_request(batch, out, ref, tol)
    bad = [(i, lab, f"{rel:.2e}", f"{h} heads") for i, (lab, rel, h) in enumerate(rows) if rel > tol]
    assert not bad, f"{case} mask={mask}: {len(bad)}/{len(rows)} requests off: {bad[:8]}"
    assert compare(out, ref)[0] < tol
