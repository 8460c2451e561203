"""GPU checks of issue 59's batch features (``pytest -m gpu tests/test_batch_features_gpu.py -rA``):
SDPA and compiled Flex on every feature, and FlashInfer's routes on K/V scales of a 16-bit cache
(its ``run`` folds ``k_scale`` into ``sm_scale`` and scales the output by ``v_scale`` for any cache
dtype; XQA takes them as ``bmm1_scale``/``bmm2_scale``), each against the float64 reference on
random inputs, odd lengths and shuffled pages."""
from __future__ import annotations

import warnings

import pytest
import torch

from attnbench.backend import get_backend_class, make_backend
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, default_tolerance, reference_attention
from attnbench.workload.trees import from_choices

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TREE = tuple(from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]))
MIXED = (Request("decode", 1, 1031), Request("prefill", 77, 300), Request("tree", len(TREE), 513, TREE),
         Request("prefill", 45, 0, causal=False))
SHORT = (Request("prefill", 301, -250, causal=False), Request("prefill", 64, 33, causal=False))  # 51 and 97 keys
DECODES = tuple(Request("decode", 1, c) for c in (1500, 77, 600, 3001))
FEATURES = {
    "kv-scales": (MIXED, dict(k_scale=0.37, v_scale=2.9)),
    "short-kv": (SHORT, {}),
    "rope": (MIXED, dict(rope=True, rope_theta=5e5, rope_scale=2.0)),
    "alibi-first": (MIXED, dict(alibi=True, softcap=20.0, score_order="alibi-softcap")),
}


def _batch(reqs, seed=0, **kw):
    return materialize(BatchSpec(tuple(reqs), 32, 8, 128, "bfloat16", 16, "shuffled", **kw), seed, "cuda")


def _check(be, b):
    assert be.reasons(b) == [], be.reasons(b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = be.run(be.prepare(b))
    torch.cuda.synchronize()
    rel, _ = compare(out, reference_attention(b)[0])
    assert rel < default_tolerance(b.dtype), rel


@pytest.mark.parametrize("name", ["sdpa", "flex"])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_sdpa_and_flex_on_the_gpu(name, feature):
    reqs, kw = FEATURES[feature]
    _check(get_backend_class(name)(), _batch(reqs, seed=3, **kw))


@pytest.mark.parametrize("route", ["auto", "decode", "decode-tc", "fa2", "fa3", "persistent", "pod", "xqa"])
def test_flashinfer_takes_16bit_kv_scales(route):
    cls = get_backend_class("flashinfer")
    if cls.unavailable():
        pytest.skip(cls.unavailable())
    be = make_backend(f"flashinfer:route={route}")
    reqs = DECODES if route in ("decode", "decode-tc", "xqa") else (MIXED[1], MIXED[3]) if route == "fa3" else DECODES + MIXED[1:2]
    b = _batch(reqs, seed=5, k_scale=0.37, v_scale=2.9)
    if be.reasons(b):
        pytest.skip("; ".join(be.reasons(b)))
    _check(be, b)


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_flashinfer_fa3_runs_fp8_attention(dtype):
    """FP8 queries over an FP8 cache of the same dtype on FlashInfer's fa3 route (Hopper): rows
    within FP8_ATTENTION_RTOL of the reference, which reads the same quantized q, K and V."""
    from attnbench.workload.reference import FP8_ATTENTION_RTOL

    cls = get_backend_class("flashinfer")
    if cls.unavailable() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip(cls.unavailable() or "fa3 needs sm_90")
    reqs = (Request("prefill", 77, 300), Request("prefill", 130, 0), Request("prefill", 1, 2049))
    b = _batch(reqs, seed=9, q_dtype=dtype, kv_dtype=dtype)
    be = make_backend("flashinfer")  # auto: fa3 for FP8 queries
    assert be.reasons(b) == [], be.reasons(b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = be.prepare(b)
        out = be.run(plan)
    assert "fa3" in plan.mode and "FP8 attention" in plan.mode
    rel, _ = compare(out, reference_attention(b)[0])
    assert rel < FP8_ATTENTION_RTOL, rel


@pytest.mark.parametrize("route", ["auto", "decode", "decode-tc", "fa2"])
def test_flashinfer_fused_rope(route):
    """ROPE_LLAMA in FlashInfer's plan against the reference's exact rotary at positions."""
    cls = get_backend_class("flashinfer")
    if cls.unavailable():
        pytest.skip(cls.unavailable())
    chain = (Request("tree", 4, 700, (-1, 0, 1, 2)),)  # a chain: its nodes' positions are their slots
    reqs = DECODES if route in ("decode", "decode-tc") else DECODES + MIXED[1:2] + chain
    _check(make_backend(f"flashinfer:route={route}"), _batch(reqs, seed=4, rope=True, rope_theta=5e5, rope_scale=2.0))


def test_flashinfer_short_kv_on_fa2():
    cls = get_backend_class("flashinfer")
    if cls.unavailable():
        pytest.skip(cls.unavailable())
    _check(make_backend("flashinfer"), _batch(SHORT, seed=6))
    _check(make_backend("flashinfer"), _batch(SHORT, seed=6, window=40, softcap=30.0))


@pytest.mark.parametrize("name", ["sdpa", "flex"])
def test_fp8_output_on_the_gpu(name):
    from attnbench.workload.reference import FP8_ATTENTION_RTOL

    b = _batch(MIXED, seed=8, out_dtype="fp8_e4m3", out_scale=0.02)
    be = get_backend_class(name)()
    assert be.reasons(b) == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = be.run(be.prepare(b))
    assert out.dtype == torch.float8_e4m3fn
    rel, _ = compare(b.output_values(out), reference_attention(b)[0])
    assert rel < FP8_ATTENTION_RTOL, rel
