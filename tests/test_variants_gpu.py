"""The attention variants on the GPU: every backend installed here, for each feature alone and
all together, against the float64 reference on CUDA, at the head dims the shipped scenarios
use; a backend that has not turned a feature on must give reasons (a skipped row naming the
library's limitation), never a wrong answer. Run on the GPU machine:
``pytest -m gpu tests/test_variants_gpu.py -rs`` (or all of ``-m gpu``: the tests lane of scripts/gpu/validate.sh).

Each library is tested on the batch it can read, so that its kernels run rather than skip:
- flash-attn 2 reads pages of a multiple of 256 tokens only (``flash_api.cpp``: "Paged KV cache
  block size must be divisible by 256"): its batch is paged by 256. The prebuilt GPU-machine
  build has head dim 128 only (``ATTNBENCH_FA2_HDIM128_ONLY=1``): other head dims are skipped
  rows saying so.
- xformers reads pages of a multiple of 64 (its split-K kernel's key block): paged by 64. Where
  its C++/CUDA extension does not load (torch 2.11) it runs in Triton-only mode
  (tests/gpu_backends.py), whose split-K kernel takes the non-tree requests of a call at one
  query length, causal ones of at most 16 tokens: its batch holds the decodes and the trees
  (non-causal: two 16-token causal and two 16-token bidirectional prefills, interleaved, and the
  trees: one call per causality).
- flash-attn and xformers take one causality per call: their non-causal batch (causal and
  non-causal prefills) runs as two calls (issue 32, backends/_causal_groups.py).
Every other backend reads the mixed batch below at page 16."""
import pytest
import torch

from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, default_tolerance, reference_attention
from attnbench.workload.trees import chain, parse_tree

from .gpu_backends import gpu_backend, skip_for, xformers_triton_only

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BACKENDS = ["reference", "sdpa", "flex", "triton", "flashinfer", "flash-attn", "flash-attn4", "xformers"]
FEATURES = {
    "plain": {},
    "window": dict(window=128),
    "sinks": dict(sinks=True),
    "window+sinks": dict(window=128, sinks=True),
    "softcap": dict(softcap=50.0),
    "alibi": dict(alibi=True),
    "fp8-e4m3": dict(kv_dtype="fp8_e4m3"),
    "fp8-e5m2": dict(kv_dtype="fp8_e5m2"),
    "fp8-per-head": dict(kv_dtype="fp8_e4m3", kv_scale="per-head"),
    "hnd": dict(kv_order="HND"),
    "all": dict(window=100, sinks=True, softcap=30.0, alibi=True, kv_dtype="fp8_e4m3", kv_scale="per-head", kv_order="HND"),
}
HEAD_DIMS = [64, 128, 256]
#: the page size each library reads (the others: 16)
PAGE = {"flash-attn": 256, "xformers": 64}


def _requests(noncausal: bool, name: str = "", triton_only: bool = False):
    eagle = tuple(parse_tree({"preset": "eagle-mc_sim_7b_63"}))
    decodes = [Request("decode", 1, c) for c in (1000, 77, 3000)]
    prefills = [Request("prefill", 33, 500), Request("prefill", 64, 0)]
    trees = [Request("tree", len(eagle), 777, eagle), Request("tree", len(eagle), 130, eagle)]
    bidir = [Request("prefill", 40, 0, causal=False)]
    if name == "xformers" and triton_only:
        nc = [Request("prefill", 16, c, causal=False) for c in (300, 1000)]
        causal = [Request("prefill", 16, c) for c in (500, 0)]
        others = [causal[0], nc[0], causal[1], nc[1]] if noncausal else decodes  # two calls, interleaved
        return tuple(others + trees)
    return tuple(decodes + prefills + trees + (bidir if noncausal else []))


def batch_spec(feature: str, head_dim: int, noncausal: bool, name: str = "", page_size=None,
               triton_only: bool = False) -> BatchSpec:
    """The test's batch for backend ``name`` (page size and requests it reads; see the module
    docstring). scripts/gpu/flashinfer_warmup.py --tests builds FlashInfer's kernels from these."""
    hq, hkv = (64, 8) if head_dim == 64 else (16, 8) if head_dim == 256 else (32, 8)
    page = page_size or PAGE.get(name, 16)
    return BatchSpec(_requests(noncausal, name, triton_only), hq, hkv, head_dim, "bfloat16", page, "shuffled",
                     **FEATURES[feature])


def matrix():
    """(backend, feature, head_dim, noncausal) of every test_backend_feature_on_gpu case."""
    return [(n, f, d, c) for n in BACKENDS for f in FEATURES for d in HEAD_DIMS for c in (False, True)]


def _batch(feature: str, head_dim: int, noncausal: bool, page_size=None, name: str = "", triton_only: bool = False):
    spec = batch_spec(feature, head_dim, noncausal, name, page_size, triton_only)
    return materialize(spec, seed=head_dim + len(feature), device="cuda")


@pytest.mark.parametrize("noncausal", [False, True], ids=["causal", "noncausal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("name", BACKENDS)
def test_backend_feature_on_gpu(name, feature, head_dim, noncausal):
    be, why = gpu_backend(name)
    if be is None:
        pytest.skip(f"{name}: {why}")
    tonly = name == "xformers" and xformers_triton_only()
    batch = _batch(feature, head_dim, noncausal, name=name, triton_only=tonly)
    reasons = be.reasons(batch)
    if reasons:
        skip_for(name, reasons)
    plan = be.prepare(batch)
    if tonly:
        assert str(plan.mode).startswith("triton-only"), plan.mode
    out = be.run(plan)
    torch.cuda.synchronize()
    ref, _ = reference_attention(batch)
    rel, _ = compare(out, ref)
    assert out.shape == batch.q.shape and out.dtype == batch.dtype
    assert rel < default_tolerance(batch.dtype), f"{name} {feature} d={head_dim} ({getattr(plan, 'mode', '')}): rel err {rel:.2e}"


@pytest.mark.parametrize("noncausal", [False, True], ids=["causal", "noncausal"])
@pytest.mark.parametrize("feature", ["window", "alibi", "softcap"])
def test_flash_attn_row_order_variants_on_chains(feature, noncausal):
    """flash-attn 2's window and ALiBi read row order, so the EAGLE-tree batch above skips them
    (a branching tree node sits at C + depth, not at its row): here they run on decodes,
    prefills and chains (a chain's rows are its positions), paged by 256, head dim 128. The
    non-causal batch adds causal prefills and chains beside the bidirectional ones: two calls,
    each with its window edges (ALiBi is refused there: a non-causal row's bias is not row order)."""
    be, why = gpu_backend("flash-attn")
    if be is None:
        pytest.skip(f"flash-attn: {why}")
    ch = tuple(chain(7))  # 8 nodes in a line
    reqs = [Request("decode", 1, c) for c in (1000, 77, 3000)]
    reqs += [Request("tree", len(ch), c, ch) for c in (700, 40)] + [Request("prefill", 33, 500), Request("prefill", 64, 0)]
    if noncausal:
        reqs[1:1] = [Request("prefill", 40, 0, causal=False), Request("prefill", 24, 300, causal=False)]
    spec = BatchSpec(tuple(reqs), 32, 8, 128, "bfloat16", 256, "shuffled", **FEATURES[feature])
    batch = materialize(spec, seed=7, device="cuda")
    reasons = be.reasons(batch)
    if reasons:
        skip_for("flash-attn", reasons)
    plan = be.prepare(batch)
    out = be.run(plan)
    rel, _ = compare(out, reference_attention(batch)[0])
    assert rel < default_tolerance(batch.dtype), f"flash-attn {feature} on chains ({plan.mode}): rel err {rel:.2e}"


@pytest.mark.parametrize("name", ["sdpa", "reference"])
def test_page_size_one_and_fp8_on_gpu(name):
    batch = _batch("all", 128, True, page_size=1)
    be, _ = gpu_backend(name)
    ref, _ = reference_attention(batch)
    assert compare(be.run(be.prepare(batch)), ref)[0] < default_tolerance(batch.dtype)
