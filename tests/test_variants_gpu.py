"""The attention variants on the GPU: every backend installed here, for each feature alone and
all together, against the float64 reference on CUDA, at the head dims the shipped scenarios
use; a backend that has not turned a feature on must give reasons (a skipped row), never a
wrong answer. Run on the GPU machine: ``pytest -m gpu tests/test_variants_gpu.py -rs``."""
import pytest
import torch

from attnbench.backend import get_backend_class
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, default_tolerance, reference_attention
from attnbench.workload.trees import parse_tree

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BACKENDS = ["reference", "sdpa", "flex", "triton", "flashinfer", "flash-attn", "xformers"]
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


def _requests(noncausal: bool):
    eagle = tuple(parse_tree({"preset": "eagle-mc_sim_7b_63"}))
    reqs = [Request("decode", 1, c) for c in (1000, 77, 3000)]
    reqs += [Request("prefill", 33, 500), Request("prefill", 64, 0)]
    reqs += [Request("tree", len(eagle), 777, eagle), Request("tree", len(eagle), 130, eagle)]
    if noncausal:
        reqs.append(Request("prefill", 40, 0, causal=False))
    return tuple(reqs)


def _batch(feature: str, head_dim: int, noncausal: bool, page_size: int = 16):
    hq, hkv = (64, 8) if head_dim == 64 else (16, 8) if head_dim == 256 else (32, 8)
    spec = BatchSpec(_requests(noncausal), hq, hkv, head_dim, "bfloat16", page_size, "shuffled", **FEATURES[feature])
    return materialize(spec, seed=head_dim + len(feature), device="cuda")


@pytest.mark.parametrize("noncausal", [False, True], ids=["causal", "noncausal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("name", BACKENDS)
def test_backend_feature_on_gpu(name, feature, head_dim, noncausal):
    cls = get_backend_class(name)
    why = cls.unavailable()
    if why:
        pytest.skip(f"{name}: {why}")
    batch = _batch(feature, head_dim, noncausal)
    be = cls()
    reasons = be.reasons(batch)
    if reasons:
        assert all(isinstance(r, str) and r for r in reasons)
        pytest.skip(f"{name}: " + "; ".join(reasons))
    out = be.run(be.prepare(batch))
    torch.cuda.synchronize()
    ref, _ = reference_attention(batch)
    rel, _ = compare(out, ref)
    assert out.shape == batch.q.shape and out.dtype == batch.dtype
    assert rel < default_tolerance(batch.dtype), f"{name} {feature} d={head_dim}: rel err {rel:.2e}"


@pytest.mark.parametrize("name", ["sdpa", "reference"])
def test_page_size_one_and_fp8_on_gpu(name):
    batch = _batch("all", 128, True, page_size=1)
    be = get_backend_class(name)()
    ref, _ = reference_attention(batch)
    assert compare(be.run(be.prepare(batch)), ref)[0] < default_tolerance(batch.dtype)
