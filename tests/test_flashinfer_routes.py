"""FlashInfer's route choice and skip reasons (attnbench/backends/flashinfer_routes.py), on the
CPU with the library absent: which route ``auto`` takes per batch and GPU generation, which
batches each named route cannot express (a skipped row naming the route), and the custom mask
with the window folded in. The kernels themselves run in
the GPU tests (tests/test_flashinfer_wiring_gpu.py) and scripts/gpu/validate.sh."""
import pytest
import torch

from attnbench.backend import make_backend
from attnbench.backends.flashinfer_plans import mask_flat
from attnbench.backends.flashinfer_routes import ROUTES, auto_route, facts_of, route_reasons
from attnbench.workload.batch import Request

from .conftest import make_batch

TREE = (-1, 0, 0, 1, 1, 2)
DECODES = [Request("decode", 1, 37), Request("decode", 1, 5)]
PREFILLS = [Request("prefill", 13, 20), Request("prefill", 5, 0)]
TREES = [Request("tree", 6, 11, TREE), Request("decode", 1, 9)]
MIXED = PREFILLS + DECODES


def facts(reqs, **kw):
    kw.setdefault("page_size", 16)
    return facts_of(make_batch(reqs, dtype="float16" if "kv_dtype" in kw else "float32", **kw))


@pytest.mark.parametrize("reqs, kw, sm, route", [
    (DECODES, {}, 9, "decode-tc"),
    (DECODES, {"sinks": True}, 9, "xqa"),
    (DECODES, {"sinks": True, "page_size": 5}, 9, "fa2"),  # XQA takes pages 16..128
    (DECODES, {"sinks": True, "k_scale": 0.37, "v_scale": 2.9}, 9, "fa2"),  # XQA: no K/V scales on a 16-bit cache
    (DECODES, {"sinks": True}, 8, "fa2"),  # XQA needs sm_90
    (TREES, {}, 9, "fa2"),  # a custom mask
    (PREFILLS, {}, 9, "fa3"),  # FlashInfer's own choice on Hopper
    (PREFILLS, {}, 8, "fa2"),
    (PREFILLS, {"kv_dtype": "fp8_e4m3"}, 9, "fa2"),  # fa3 wants FP8 queries too
    (PREFILLS + [Request("prefill", 4, 7, causal=False)], {}, 9, "fa2"),  # mixed causality: a mask
    (MIXED, {}, 9, "persistent"),  # prefills with decodes: measured fastest on an H100
    (MIXED, {"window": 8}, 9, "fa3"),  # BatchAttention has no window
    (MIXED, {"kv_dtype": "fp8_e4m3"}, 9, "fa2"),
    (DECODES, {"kv_dtype": "fp8_e5m2"}, 9, "decode"),  # e5m2: not on the fa2 kernel (issue 32)
    (DECODES, {"kv_dtype": "fp8_e4m3"}, 9, "decode-tc"),
])
def test_auto_takes_the_engine_route(reqs, kw, sm, route):
    f = facts(reqs, **kw)
    assert auto_route(f, sm) == route
    assert route_reasons(route, f, sm) == []  # what auto picks can always run the batch


@pytest.mark.parametrize("route, reqs, kw, needle", [
    ("fa3", TREES, {}, "no custom mask"),
    ("fa3", PREFILLS, {"kv_dtype": "fp8_e5m2"}, "FP8 queries"),
    ("decode", MIXED, {}, "decode-only"),
    ("decode-tc", DECODES, {"sinks": True}, "trtllm-gen backend only"),
    ("xqa", TREES, {}, "decode-only"),
    ("xqa", DECODES, {"page_size": 256}, "page sizes 16/32/64/128"),
    ("xqa", DECODES, {"softcap": 30.0}, "soft-cap"),
    ("xqa", DECODES, {"kv_dtype": "fp8_e4m3"}, "unspecified launch failure"),
    ("xqa", DECODES, {"k_scale": 0.37, "v_scale": 2.9}, "bmm1_scale/bmm2_scale over a 16-bit cache"),
    ("persistent", TREES, {}, "no custom mask"),
    ("persistent", MIXED, {"window": 4}, "takes no window_left"),
    ("pod", PREFILLS, {}, "needs both"),
    ("pod", DECODES[:1] + PREFILLS + DECODES[1:], {}, "interleave"),
    ("pod", MIXED, {"softcap": 5.0}, "no logit soft-cap"),
    ("fa3", PREFILLS, {"sinks": True, "softcap": 3.0}, "no soft-cap"),
    ("fa2", TREES, {"sinks": True}, "ignores a custom mask"),  # rel. err 0.99 on an H100
])
def test_a_route_that_cannot_express_the_batch_says_why(route, reqs, kw, needle):
    reasons = route_reasons(route, facts(reqs, **kw), 9)
    assert any(needle in r and f"route {route}" in r for r in reasons), reasons


@pytest.fixture
def finite_mask_fill(monkeypatch):
    """FlashInfer 0.5.3's math.cuh (``inf = 5e4``), whatever FlashInfer is installed here."""
    from attnbench.backends import flashinfer_routes

    monkeypatch.setattr(flashinfer_routes, "fa2_mask_fill", lambda: flashinfer_routes.FA2_MASK_FILL)


@pytest.mark.parametrize("route, reqs", [("fa2", TREES), ("fa2", PREFILLS), ("fa2", DECODES), ("decode-tc", DECODES)])
def test_e5m2_is_refused_on_the_fa2_kernel(route, reqs, finite_mask_fill):
    """Issue 32: FlashInfer 0.5.3's fa2 kernel (fa2, and decode-tc, which plans it) masks keys with
    the logit -5e4 before scaling by sm_scale * k_scale; an amax-scaled e5m2 cache makes that scale
    ~1e-5, so masked keys keep weight ~2^-0.5 (rel. err 0.58-0.77 on an H100, nothing raised): a
    skipped row naming the route, the library and why; e4m3 on the same route and e5m2 on the
    CUDA-core decode run."""
    f = facts(reqs, kv_dtype="fp8_e5m2")
    assert f.mask_bits < 1
    reasons = route_reasons(route, f, 9)
    assert len(reasons) == 1, reasons
    why = reasons[0]
    assert why.startswith(f"route {route}: FlashInfer's fa2 kernel masks keys with the finite logit -5e4")
    assert "fp8_e5m2" in why and "2^-0." in why and "math.cuh inf = 5e4" in why
    assert facts(reqs, kv_dtype="fp8_e4m3").mask_bits > 40
    assert not route_reasons(route, facts(reqs, kv_dtype="fp8_e4m3"), 9)
    assert not route_reasons("decode", facts(DECODES, kv_dtype="fp8_e5m2"), 9)


@pytest.mark.parametrize("route, reqs", [("fa2", TREES), ("decode-tc", DECODES)])
def test_e5m2_runs_where_flashinfer_masks_with_ieee_inf(route, reqs):
    """FlashInfer 0.7.2.post1's math.cuh makes math::inf IEEE infinity (0.5.3: the finite 5e4): a
    masked key keeps no weight whatever the scale, so the e5m2 refusal is gone with it; the
    header's text decides (read from the installed wheel, fa2_mask_fill)."""
    import dataclasses

    from attnbench.backends.flashinfer_routes import mask_fill_of

    v053 = "constexpr float loge2 = 0.69f;\n\nconstexpr float inf = 5e4;\n"
    v072 = "constexpr float inf = cuda::std::numeric_limits<float>::infinity();\n"
    assert mask_fill_of(v053) == 5e4 and mask_fill_of("constexpr float inf = 5e4f;") == 5e4
    assert mask_fill_of(v072) == float("inf") and mask_fill_of("no such line") is None
    f = dataclasses.replace(facts(reqs, kv_dtype="fp8_e5m2"), mask_fill=mask_fill_of(v072))
    assert f.mask_bits == float("inf") and not route_reasons(route, f, 9)
    f053 = dataclasses.replace(f, mask_fill=mask_fill_of(v053))
    assert route_reasons(route, f053, 9)


def test_the_fa2_mask_limit_is_the_logit_scale_not_the_format(finite_mask_fill):
    """The same e5m2 values stored 2^7 smaller (scale amax / 448: what tests/test_issue32_gpu.py
    runs on the GPU) pass; a 16-bit cache under a tiny softmax scale is refused the same way."""
    import dataclasses

    from attnbench.workload.kvcache import dequantize

    b = make_batch(TREES, dtype="bfloat16", page_size=16, kv_dtype="fp8_e5m2")
    k = dequantize(b.k_cache, b.k_scale)
    s = (k.abs().amax() / 448).reshape(1)
    small = dataclasses.replace(b, k_cache=(k / s).to(b.k_cache.dtype), k_scale=s, _masks={})
    f = facts_of(small)
    assert abs(f.mask_bits - 128 * facts_of(b).mask_bits) < 1e-3 * f.mask_bits and not route_reasons("fa2", f, 9)
    tiny = facts_of(make_batch(TREES, dtype="bfloat16", page_size=16, scale=1e-6))
    assert tiny.kv_dtype is None and any("-5e4" in r for r in route_reasons("fa2", tiny, 9))
    assert not route_reasons("fa2", facts(TREES), 9)


def test_e5m2_batches_through_the_backend_are_skipped_rows_naming_the_route(finite_mask_fill):
    """What a run shows: the mixed batch (auto: fa2) a skipped row saying why; decodes run."""
    tree = make_batch(TREES, dtype="bfloat16", page_size=16, kv_dtype="fp8_e5m2")
    r = make_backend("flashinfer").unsupported(tree)
    assert len(r) == 1 and r[0].startswith("route fa2: FlashInfer's fa2 kernel masks keys"), r
    decodes = make_batch(DECODES, dtype="bfloat16", page_size=16, kv_dtype="fp8_e5m2")
    assert make_backend("flashinfer:route=decode-tc").unsupported(decodes)
    assert make_backend("flashinfer").unsupported(decodes) == []  # auto: decode


def test_trees_with_sinks_have_no_flashinfer_route():
    """auto falls back to fa2 for trees; with sinks that route is refused too (skipped row)."""
    f = facts(TREES, sinks=True)
    assert route_reasons(auto_route(f, 9), f, 9)


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_runs_something(route):
    """Each declared route expresses at least one plain batch (no route is declared for show)."""
    ok = [reqs for reqs in (DECODES, PREFILLS, TREES, MIXED) if not route_reasons(route, facts(reqs), 9)]
    assert ok, route
    assert not route_reasons("pod", facts(MIXED), 9)


def test_backend_reasons_name_the_route_and_the_capabilities():
    tree = make_batch(TREES, dtype="bfloat16", page_size=16)
    r = make_backend("flashinfer:route=fa3").reasons(tree)
    assert any("route fa3" in x and "custom mask" in x for x in r), r
    assert any("CUDA" in x for x in r)  # this CPU machine
    assert not any("route" in x for x in make_backend("flashinfer").reasons(tree))  # auto: fa2 custom mask
    alibi = make_batch(DECODES, dtype="bfloat16", page_size=16, alibi=True)
    assert make_backend("flashinfer").unsupported(alibi) == []  # issue 32: decode-tc with pos_encoding_mode ALIBI
    alibi_tree = make_batch(TREES, dtype="bfloat16", page_size=16, alibi=True)
    assert any("ALiBi" in x and "variants.cuh" in x for x in make_backend("flashinfer").reasons(alibi_tree))
    per_head = make_batch(DECODES, dtype="bfloat16", page_size=16, kv_dtype="fp8_e4m3", kv_scale="per-head")
    assert any("per-head" in x for x in make_backend("flashinfer").reasons(per_head))


@pytest.mark.parametrize("window", [None, 1, 3, 9])
def test_custom_mask_folds_the_window_on_positions(window):
    reqs = TREES + [Request("prefill", 7, 6, causal=False), Request("prefill", 5, 4)]
    b = make_batch(reqs, page_size=4, window=window)
    want = torch.cat([b.mask(i).reshape(-1) for i in range(b.num_requests)])
    got = mask_flat(b)
    assert got.dtype == torch.bool and torch.equal(got.cpu(), want)
    if window is not None:  # the window hides something here (else the test could not fail)
        assert not torch.equal(want, torch.cat([make_batch(reqs, page_size=4).mask(i).reshape(-1)
                                                for i in range(b.num_requests)]))
