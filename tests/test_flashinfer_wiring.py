"""What attnbench hands FlashInfer on the routes issue 32 wired (persistent and pod with FP8, pod
with windows and decodes first, the sink wrapper with FP8), on the CPU: a stand-in ``flashinfer``
module records each wrapper's ``plan`` and ``run`` arguments and returns outputs made from the
queries it was given, so the tests see the scales, the window, the prefill/decode split and the
order in which the output is put back together. The kernels themselves are checked against the
reference on the GPU (tests/test_flashinfer_wiring_gpu.py)."""
import sys
import types

import pytest
import torch

from attnbench.backend import make_backend
from attnbench.backends.flashinfer_plans import step_for
from attnbench.backends.flashinfer_routes import (DECODES_FIRST, INTERLEAVED, PREFILLS_FIRST, auto_route, facts_of,
                                                  route_reasons)
from attnbench.workload.batch import Request

from .conftest import make_batch

PREFILLS = [Request("prefill", 13, 20), Request("prefill", 5, 0)]
DECODES = [Request("decode", 1, 37), Request("decode", 1, 5)]


class _Recorder:
    calls: list = []

    def __init__(self, *args, **kwargs):
        self.init = kwargs

    def plan(self, *args, **kwargs):
        _Recorder.calls.append(("plan", type(self).__name__, args, kwargs))


class _Pod(_Recorder):
    def run(self, q_p, kv_p, q_d, kv_d, **kwargs):
        _Recorder.calls.append(("run", "pod", (q_p, q_d), kwargs))
        return q_p * 2, q_d * 3  # which group went where shows in the output


class _Persistent(_Recorder):
    def run(self, q, kv, **kwargs):
        _Recorder.calls.append(("run", "persistent", (q,), kwargs))
        return q.clone(), None


class _Sink(_Recorder):
    def run(self, q, kv, *args, **kwargs):
        _Recorder.calls.append(("run", "sink", args, kwargs))
        return q.clone()


@pytest.fixture
def fake_flashinfer(monkeypatch):
    mod = types.ModuleType("flashinfer")
    mod.BatchPODWithPagedKVCacheWrapper = _Pod
    mod.BatchAttention = _Persistent
    mod.BatchAttentionWithAttentionSinkWrapper = _Sink
    monkeypatch.setitem(sys.modules, "flashinfer", mod)
    _Recorder.calls = []
    return _Recorder.calls


def _batch(reqs, **kw):
    kw.setdefault("page_size", 4)
    return make_batch(reqs, dtype="float16", **kw)


def _scales(b):
    return float(b.k_scale[0]), float(b.v_scale[0])


@pytest.mark.parametrize("reqs, order", [(PREFILLS + DECODES, PREFILLS_FIRST), (DECODES + PREFILLS, DECODES_FIRST),
                                         (DECODES[:1] + PREFILLS + DECODES[1:], INTERLEAVED)])
def test_the_order_of_prefills_and_decodes(reqs, order):
    f = facts_of(_batch(reqs))
    assert f.mixed_order == order
    refused = route_reasons("pod", f, 9)
    assert bool(refused) == (order == INTERLEAVED), refused
    if refused:  # POD's API contract, named with its file
        assert "two tensors (q_p, q_d; 0.5.3 and 0.7.2.post1: pod.py)" in refused[0] and "interleave" in refused[0]


@pytest.mark.slow
@pytest.mark.parametrize("reqs", [PREFILLS + DECODES, DECODES + PREFILLS])
@pytest.mark.parametrize("kw", [{}, {"window": 6}, {"kv_dtype": "fp8_e4m3"}, {"kv_dtype": "fp8_e4m3", "window": 3}])
def test_pod_gets_the_groups_the_window_and_the_fp8_scales(fake_flashinfer, reqs, kw):
    b = _batch(reqs, **kw)
    f = facts_of(b)
    assert route_reasons("pod", f, 9) == []
    step = step_for("pod", b, f, {})
    out = step.call()
    (_, _, args, plan), (_, _, (q_p, q_d), run) = fake_flashinfer
    k_scale, v_scale = _scales(b) if "kv_dtype" in kw else (1.0, 1.0)
    assert plan["window_left"] == (kw["window"] - 1 if "window" in kw else -1)
    assert plan["sm_scale"] == pytest.approx(b.scale * k_scale)  # both groups: POD's run scales only the decodes
    assert "k_scale" not in run and "v_scale" not in run and run["causal_p"] is True
    assert plan["kv_data_type"] == b.kv_dtype and plan["q_data_type"] == b.dtype
    qo_p, qo_d = args[0].tolist(), args[4].tolist()
    assert qo_p == [0, 13, 18] and qo_d == [0, 1, 2]  # prefill and decode groups, each from 0
    t_p = 18
    pre = b.q[:t_p] if reqs[0].kind == "prefill" else b.q[2:]
    assert torch.equal(q_p, pre) and q_d.shape[0] == 2
    want = torch.cat([pre * 2, q_d * 3]) if reqs[0].kind == "prefill" else torch.cat([q_d * 3, pre * 2])
    assert torch.allclose(out.float(), (want * v_scale).float(), rtol=2e-3)
    assert ("decodes first" in step.detail) == (reqs[0].kind == "decode")
    assert ("v_scale on the output" in step.detail) == ("kv_dtype" in kw)


@pytest.mark.slow
def test_pod_takes_non_causal_prefills_as_one_group(fake_flashinfer):
    reqs = [Request("prefill", 7, 6, causal=False), Request("prefill", 4, 0, causal=False)] + DECODES
    b = _batch(reqs)
    f = facts_of(b)
    assert route_reasons("pod", f, 9) == []
    step_for("pod", b, f, {}).call()
    assert fake_flashinfer[-1][3]["causal_p"] is False
    assert route_reasons("pod", facts_of(_batch(reqs, window=4)), 9)  # window_left is for causal rows
    mixed = facts_of(_batch(reqs + [Request("prefill", 3, 2)]))
    assert any("one causal_p" in r for r in route_reasons("pod", mixed, 9))


def test_pod_soft_cap_names_the_library():
    why = route_reasons("pod", facts_of(_batch(PREFILLS + DECODES, softcap=5.0)), 9)
    assert len(why) == 1 and "pod.py plan fixes logits_soft_cap = 0.0" in why[0]


@pytest.mark.slow
@pytest.mark.parametrize("reqs", [PREFILLS + DECODES, PREFILLS, DECODES])
def test_persistent_passes_the_fp8_scales_to_run(fake_flashinfer, reqs):
    b = _batch(reqs, kv_dtype="fp8_e4m3")
    f = facts_of(b)
    assert route_reasons("persistent", f, 9) == []
    step_for("persistent", b, f, {}).call()
    (_, _, _, plan), (_, _, _, run) = fake_flashinfer
    k_scale, v_scale = _scales(b)
    assert plan["kv_data_type"] == b.kv_dtype and plan["sm_scale"] == b.scale
    assert run["k_scale"] == k_scale and run["v_scale"] == v_scale  # BatchAttention.run folds k, the kernel applies v


def test_auto_keeps_fa2_for_fp8_mixed_batches():
    """persistent runs FP8 now, but auto's choice of it was timed on 16-bit caches only."""
    assert auto_route(facts_of(_batch(PREFILLS + DECODES, kv_dtype="fp8_e4m3")), 9) == "fa2"
    assert auto_route(facts_of(_batch(PREFILLS + DECODES)), 9) == "persistent"


@pytest.mark.slow
@pytest.mark.parametrize("reqs", [DECODES, PREFILLS + DECODES])
def test_the_sink_wrapper_gets_k_scale_in_its_sm_scale(fake_flashinfer, reqs):
    b = _batch(reqs, kv_dtype="fp8_e4m3", sinks=True, window=5)
    f = facts_of(b)
    assert route_reasons("fa2", f, 9) == []
    step = step_for("fa2", b, f, {})
    step.call()
    (_, _, args, run) = fake_flashinfer[-1]
    k_scale, v_scale = _scales(b)
    sinks, sm_scale = args
    assert torch.equal(sinks, b.sinks.float()) and sm_scale == pytest.approx(b.scale * k_scale)
    assert run == {"v_scale": v_scale} and "k_scale in its sm_scale" in step.detail
    assert make_backend("flashinfer").unsupported(b) == []  # auto: fa2 with the sink wrapper


@pytest.mark.slow
def test_sink_wrapper_without_fp8_is_unchanged(fake_flashinfer):
    b = _batch(DECODES, sinks=True)
    step = step_for("fa2", b, facts_of(b), {})
    step.call()
    (_, _, args, run) = fake_flashinfer[-1]
    assert args[1] == b.scale and run == {} and step.detail.endswith("sink wrapper")


@pytest.mark.parametrize("route, kw, needle", [
    ("persistent", {"sinks": True}, "BatchAttention takes no sinks (0.5.3 attention.py, 0.7.2.post1 attention/_core.py"),
    ("pod", {"sinks": True}, "BatchPODWithPagedKVCacheWrapper takes no sinks (0.5.3 and 0.7.2.post1: pod.py"),
    ("decode", {"sinks": True}, "trtllm-gen backend only"),
    ("persistent", {"window": 4}, "BatchAttention.plan takes no window_left (0.5.3 attention.py, 0.7.2.post1 "
                                  "attention/_core.py)"),
    ("fa2", {"sinks": True, "softcap": 3.0}, "AttentionSink in jit/attention/variants.py, which has no logits "
                                              "transform) has no soft-cap"),
])
def test_reasons_name_flashinfer_and_its_file(route, kw, needle):
    """Each reason names FlashInfer's limit, its file and the releases whose source shows it."""
    reqs = DECODES if route == "decode" else PREFILLS + DECODES
    why = route_reasons(route, facts_of(_batch(reqs, **kw)), 9)
    assert any(needle in r and r.startswith(f"route {route}: FlashInfer's") and "0.5.3" in r and "0.7.2.post1" in r
               for r in why), why


@pytest.mark.parametrize("route", ["persistent", "pod"])
def test_e5m2_is_refused_on_the_routes_that_share_the_fa2_masking(route, monkeypatch):
    """persistent.cuh and batch_pod.cuh run prefill.cuh's logits_mask before the scale (issue 32;
    FlashInfer 0.5.3's header, whatever FlashInfer is installed here)."""
    from attnbench.backends import flashinfer_routes

    monkeypatch.setattr(flashinfer_routes, "fa2_mask_fill", lambda: flashinfer_routes.FA2_MASK_FILL)
    why = route_reasons(route, facts_of(_batch(PREFILLS + DECODES, kv_dtype="fp8_e5m2")), 9)
    assert len(why) == 1 and "masks keys with the finite logit -5e4" in why[0], why
    assert not route_reasons(route, facts_of(_batch(PREFILLS + DECODES, kv_dtype="fp8_e4m3")), 9)


@pytest.mark.slow
def test_every_gpu_case_is_one_its_route_accepts():
    """tests/test_flashinfer_wiring_gpu.py's batches, materialized here: each route takes its case
    (so a GPU failure there is FlashInfer's output, not a refusal), and the warm-up builds them."""
    from attnbench.workload.batch import materialize

    from .test_flashinfer_wiring_gpu import warmup_items

    items = warmup_items()
    assert len(items) == len({label for _, _, label in items}) > 20
    for spec_str, spec, label in items:
        f = facts_of(materialize(spec, 7, "cpu"))
        route = spec_str.split("route=")[1]
        assert route_reasons(auto_route(f, 9) if route == "auto" else route, f, 9) == [], label


@pytest.mark.slow
@pytest.mark.parametrize("route", ["persistent", "pod"])
def test_the_gpu_e5m2_case_is_refused_and_its_in_range_copy_is_not(route):
    from attnbench.workload.batch import materialize

    from .test_flashinfer_wiring_gpu import DECODES as D, PREFILLS as P, _spec
    from .test_issue32_gpu import _within_e4m3_range

    e5 = materialize(_spec(P + D, kv_dtype="fp8_e5m2"), seed=11, device="cpu")
    assert route_reasons(route, facts_of(e5), 9)
    assert route_reasons(route, facts_of(_within_e4m3_range(e5)), 9) == []
