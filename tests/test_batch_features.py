"""The batch features of issue 59 (docs/semantics.md): K/V scales on a 16-bit cache, queries
longer than their KV, fused RoPE, ALiBi before the soft-cap, FP8 queries. The reference
against the independent token-by-token oracle, SDPA and Flex against the reference on random
inputs (odd lengths, shuffled pages), the standard skip reason for a backend that declares
none of them, and the FP8-attention tolerance."""
import pytest
import torch

from attnbench.backend import Backend, get_backend_class
from attnbench.workload.batch import Request
from attnbench.workload.reference import compare, default_tolerance, reference_attention
from attnbench.workload.trees import from_choices

from .conftest import make_batch
from .variant_oracle import naive_variants

TREE = tuple(from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]))
MIXED = [
    Request("decode", 1, 23),
    Request("prefill", 6, 9),
    Request("tree", len(TREE), 11, TREE),
    Request("prefill", 7, -4, causal=False),  # 7 queries over 3 keys
    Request("prefill", 4, 7, causal=False),
    Request("prefill", 9, -8, causal=False),  # 9 queries over 1 key
]
FEATURES = {
    "kv-scales": dict(k_scale=0.37, v_scale=2.9),
    "short-kv": {},
    "rope": dict(rope=True, rope_theta=500.0, rope_scale=2.0),
    "alibi-first": dict(alibi=True, softcap=1.5, score_order="alibi-softcap"),
    "all": dict(k_scale=1.7, v_scale=0.6, rope=True, alibi=True, softcap=2.0, score_order="alibi-softcap",
                window=5, sinks=True, kv_order="HND"),
}


def batch_for(feature, dtype="float32", **kw):
    return make_batch(MIXED, dtype=dtype, **{**dict(hq=6, hkv=2, d=16, page_size=3), **kw}, **FEATURES[feature])


@pytest.mark.slow
@pytest.mark.parametrize("feature", list(FEATURES))
def test_reference_matches_the_independent_oracle(feature):
    b = batch_for(feature, seed=len(feature))
    rel, _ = compare(reference_attention(b)[0], naive_variants(b))
    assert rel < 1e-6, rel


def test_fp8_queries_reference_matches_the_oracle():
    b = make_batch(MIXED, dtype="bfloat16", hq=6, hkv=2, d=16, page_size=3, seed=3, q_dtype="fp8_e4m3")
    assert b.q_fp8.dtype == torch.float8_e4m3fn and b.q_scale.shape == (1,)
    rel, _ = compare(reference_attention(b)[0], naive_variants(b))
    assert rel < 1e-6, rel


@pytest.mark.parametrize("feature", ["kv-scales", "rope", "alibi-first"])
def test_each_feature_changes_the_result(feature):
    plain = make_batch(MIXED, hq=6, hkv=2, d=16, page_size=3, seed=2)
    other = batch_for(feature, seed=2)
    assert compare(reference_attention(other)[0], reference_attention(plain)[0])[0] > 2e-2


def test_alibi_order_matters_only_with_both():
    both = dict(alibi=True, softcap=1.5)
    a = make_batch(MIXED, hq=6, hkv=2, d=16, page_size=3, seed=1, **both)
    b = make_batch(MIXED, hq=6, hkv=2, d=16, page_size=3, seed=1, score_order="alibi-softcap", **both)
    assert not a.spec.alibi_first and b.spec.alibi_first
    assert compare(reference_attention(a)[0], reference_attention(b)[0])[0] > 1e-2


def test_short_kv_positions_are_bottom_right():
    """7 queries over 3 keys: the keys are the last 3 new tokens' (positions 0..2), the queries at -4..2."""
    from attnbench.workload.masks import key_positions, query_positions

    r = MIXED[3]
    assert r.kv_len == 3 and key_positions(r).tolist() == [0, 1, 2]
    assert query_positions(r).tolist() == list(range(-4, 3))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sdpa", "flex"])
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_backends_match_the_reference(name, feature, dtype):
    b = batch_for(feature, dtype=dtype, seed=7)
    be = get_backend_class(name)()
    assert be.reasons(b) == []
    out = be.run(be.prepare(b))
    assert out.shape == b.out_shape and out.dtype == b.dtype
    rel, _ = compare(out, reference_attention(b)[0])
    assert rel < default_tolerance(b.dtype), (name, feature, rel)


def test_rope_is_in_convert_and_named():
    b = batch_for("rope", seed=1)
    for name in ("sdpa", "flex"):
        be = get_backend_class(name)()
        assert "rope in convert" in be.plan(be.convert(b)).mode


class Plain(Backend):
    name = "plain-test"
    supports_window = supports_sinks = supports_softcap = supports_alibi = supports_noncausal = True
    kv_orders = ("NHD", "HND")

    def plan(self, batch):
        return batch

    def run(self, plan):
        raise AssertionError("never run")


@pytest.mark.parametrize("feature, words", [
    ("kv-scales", "K/V scales on a float32 cache (kv_cache.k_scale/v_scale)"),
    ("short-kv", "queries longer than their KV (kv_len < query)"),
    ("rope", "fused RoPE (model.rope)"),
    ("alibi-first", "ALiBi before the soft-cap (model.score_order)"),
])
def test_a_backend_that_declares_nothing_skips_with_the_standard_reason(feature, words):
    reasons = Plain().reasons(batch_for(feature))
    assert f"plain-test does not support {words}" in reasons


def test_fp8_queries_are_skipped_by_backends_without_them():
    b = make_batch(MIXED, dtype="float16", hq=6, hkv=2, d=16, page_size=3, q_dtype="fp8_e5m2")
    for name in ("sdpa", "flex"):
        assert get_backend_class(name)().reasons(b) == [
            f"{name} does not run FP8 attention with fp8_e5m2 queries (model.q_dtype)"]
    assert get_backend_class("reference")().reasons(b) == []


def test_fp8_attention_tolerance_covers_p_in_fp8():
    """A kernel running FP8 attention also rounds P to e4m3 before its PV product (FA3's FP8
    path): emulated here in float64 on the reference's own inputs, its error sits above the bf16
    tolerance and within FP8_ATTENTION_RTOL (docs/semantics.md "FP8 attention")."""
    from attnbench.workload.reference import FP8_ATTENTION_RTOL

    reqs = [Request("decode", 1, 300), Request("prefill", 37, 150), Request("prefill", 64, 0)]
    b = make_batch(reqs, dtype="bfloat16", hq=8, hkv=2, d=64, page_size=16, seed=11, q_dtype="fp8_e4m3")
    ref = reference_attention(b)[0]
    q = b.query_values().double()
    worst = 0.0
    for i, r in enumerate(b.requests):
        k, v = (x.double() for x in b.gather_kv(i))
        qi = q[b.query_start[i]: b.query_start[i + 1]]
        s = torch.einsum("qhd,lhd->hql", qi, k.repeat_interleave(4, 1)) * b.scale
        s = s.masked_fill(~b.mask(i), float("-inf"))
        p = torch.exp(s - s.amax(-1, keepdim=True))
        p8 = p.to(torch.float8_e4m3fn).double()  # P in [0, 1] as an FP8 kernel keeps it
        o = torch.einsum("hql,lhd->qhd", p8, v.repeat_interleave(4, 1)) / p.sum(-1).T[..., None]
        worst = max(worst, compare(o, ref[b.query_start[i]: b.query_start[i + 1]])[0])
    assert default_tolerance(torch.bfloat16) < worst < FP8_ATTENTION_RTOL, worst


def test_flashinfer_takes_fp8_queries_on_fa3_only():
    """FP8 attention on FlashInfer (CPU-side: the route's reasons; the run is in the GPU tests)."""
    from attnbench.backends.flashinfer_routes import auto_route, facts_of, route_reasons

    reqs = [Request("prefill", 37, 64), Request("prefill", 20, 0)]
    same = facts_of(make_batch(reqs, dtype="bfloat16", q_dtype="fp8_e4m3", kv_dtype="fp8_e4m3"))
    assert auto_route(same, 9) == "fa3" and route_reasons("fa3", same, 9) == []
    assert any("fa3 kernels only" in r for r in route_reasons("fa2", same, 9))
    other = facts_of(make_batch(reqs, dtype="bfloat16", q_dtype="fp8_e4m3", kv_dtype="fp8_e5m2"))
    assert any("one FP8 dtype" in r for r in route_reasons("fa3", other, 9))
    plain_fp8 = facts_of(make_batch(reqs, dtype="bfloat16", kv_dtype="fp8_e4m3"))
    assert any("only with FP8 queries" in r for r in route_reasons("fa3", plain_fp8, 9))


def test_flashinfer_rope_routes():
    """Fused RoPE on FlashInfer: decode, decode-tc and fa2 take ROPE_LLAMA in plan; the other
    routes, branching trees and ALiBi give reasons, and auto picks a route that takes it."""
    from attnbench.backends.flashinfer_rope import rope_plan_args
    from attnbench.backends.flashinfer_routes import auto_route, facts_of, route_reasons

    mixed = [Request("prefill", 37, 64), Request("decode", 1, 90)]
    f = facts_of(make_batch(mixed, dtype="bfloat16", rope=True, rope_theta=5e5))
    assert route_reasons("fa2", f, 9) == [] and route_reasons(auto_route(f, 9), f, 9) == []
    for route in ("fa3", "persistent", "pod"):
        assert any("Llama RoPE" in r for r in route_reasons(route, f, 9)), route
    dec = facts_of(make_batch([Request("decode", 1, 90)] * 3, dtype="bfloat16", rope=True))
    assert route_reasons("decode", dec, 9) == [] and route_reasons("decode-tc", dec, 9) == []
    tree = facts_of(make_batch([Request("tree", len(TREE), 11, TREE)], dtype="bfloat16", rope=True))
    assert any("branching tree" in r for r in route_reasons("fa2", tree, 9))
    b = make_batch(mixed, dtype="bfloat16", rope=True, rope_theta=5e5, rope_scale=4.0)
    assert rope_plan_args(b.spec) == {"pos_encoding_mode": "ROPE_LLAMA", "rope_scale": 4.0, "rope_theta": 5e5}


def test_flashinfer_short_kv_on_fa2_only():
    from attnbench.backends.flashinfer_routes import auto_route, facts_of, route_reasons

    f = facts_of(make_batch(MIXED[3:], dtype="bfloat16"))
    assert f.short_kv and auto_route(f, 9) == "fa2" and route_reasons("fa2", f, 9) == []
    assert any("more queries than keys" in r for r in route_reasons("fa3", f, 9))


def test_the_input_guard_covers_fp8_queries():
    """A backend that writes into the FP8 queries is caught like one that writes into q."""
    from attnbench.execute.inputs import clone_batch, modified_inputs

    b = make_batch(MIXED, dtype="bfloat16", hq=6, hkv=2, d=16, page_size=3, q_dtype="fp8_e4m3")
    used = clone_batch(b)
    assert used.q_fp8.data_ptr() != b.q_fp8.data_ptr() and modified_inputs(b, used) == []
    used.q_fp8[0, 0, 0] = torch.tensor(3.0).to(used.q_fp8.dtype)
    assert "q_fp8" in modified_inputs(b, used)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reference", "sdpa", "flex"])
def test_fp8_output(name):
    """model.out_dtype: the output written as round_e4m3(O / out_scale); read back times the scale it
    is within FP8_ATTENTION_RTOL of the exact reference, and coarser than a bf16 output."""
    from attnbench.execute.output_check import check_output
    from attnbench.workload.reference import FP8_ATTENTION_RTOL, batch_tolerance

    reqs = [Request("decode", 1, 300), Request("prefill", 37, 150), Request("prefill", 9, -5, causal=False)]
    b = make_batch(reqs, dtype="bfloat16", hq=8, hkv=2, d=64, page_size=16, seed=11, out_dtype="fp8_e4m3",
                   out_scale=0.03)
    be = get_backend_class(name)()
    assert be.reasons(b) == [] and batch_tolerance(b) == FP8_ATTENTION_RTOL
    out = be.run(be.prepare(b))
    assert out.dtype == torch.float8_e4m3fn == b.out_dtype
    ref = reference_attention(b)[0]
    rel, _ = compare(b.output_values(out), ref)
    assert default_tolerance(torch.bfloat16) < rel < FP8_ATTENTION_RTOL, rel
    assert check_output(out, ref, b, FP8_ATTENTION_RTOL)[0].value == "ok"
    status, reason, _, _ = check_output(b.output_values(out).to(torch.bfloat16), ref, b, FP8_ATTENTION_RTOL)
    assert status.value == "mismatch" and "wrong dtype" in reason


def test_fp8_output_is_skipped_by_backends_without_it():
    b = make_batch(MIXED, dtype="float16", hq=6, hkv=2, d=16, page_size=3, out_dtype="fp8_e4m3")
    assert "plain-test does not write an fp8_e4m3 output (model.out_dtype)" in Plain().reasons(b)


def test_the_byte_floor_counts_fp8_queries_and_outputs_at_one_byte():
    from attnbench.measure.metrics import work_of

    reqs = [Request("prefill", 37, 64), Request("decode", 1, 90)]
    plain = make_batch(reqs, dtype="bfloat16", hq=8, hkv=2, d=64).spec
    both = make_batch(reqs, dtype="bfloat16", hq=8, hkv=2, d=64, q_dtype="fp8_e4m3", out_dtype="fp8_e4m3").spec
    assert work_of(plain).bytes - work_of(both).bytes == 38 * 8 * 64 * 2 - 4  # q and out halve; q_scale added
    assert work_of(plain).flops == work_of(both).flops
