"""FlashInfer's ALiBi (attnbench/backends/flashinfer_alibi.py, issue 32), on the CPU with the
library absent: which routes take it and what every other case's reason names, the route ``auto``
takes for ALiBi batches, what the wrappers' ``plan`` gets (a stand-in ``flashinfer`` module), and
the claim the refusals rest on: FlashInfer's bias ``slope * (kv slot - query row)``
(``variants.cuh``), put in place of attnbench's positions in the float64 reference, gives
attnbench's output exactly on every batch the routes accept and a different one on every batch
refused for it. The kernels run in tests/test_flashinfer_alibi_gpu.py."""
import random
import sys
import types

import pytest
import torch

from attnbench.backend import make_backend
from attnbench.backends import flashinfer as fi_backend
from attnbench.backends.flashinfer_alibi import ALIBI_ROUTES, NO_ALIBI, alibi_reasons
from attnbench.backends.flashinfer_plans import step_for
from attnbench.backends.flashinfer_routes import ROUTES, auto_route, facts_of, route_reasons
from attnbench.workload import reference as ref_mod
from attnbench.workload.batch import Request
from attnbench.workload.reference import compare, reference_attention
from attnbench.workload.trees import random_tree

from .conftest import make_batch

BRANCHING = (-1, 0, 0, 1, 1, 2)
CHAIN = (-1, 0, 1, 2, 3)
DECODES = [Request("decode", 1, 37), Request("decode", 1, 5)]
PREFILLS = [Request("prefill", 13, 20), Request("prefill", 5, 0)]
NONCAUSAL = [Request("prefill", 7, 6, causal=False), Request("prefill", 4, 0, causal=False)]
CHAINS = [Request("tree", len(CHAIN), 11, CHAIN), Request("tree", len(CHAIN), 0, CHAIN)]
TREES = [Request("tree", len(BRANCHING), 11, BRANCHING)] + DECODES


def _batch(reqs, dtype="float32", **kw):
    kw.setdefault("page_size", 4)
    return make_batch(reqs, hq=6, hkv=2, dtype=dtype, alibi=True, **kw)  # 6 heads: not a power of two


def random_requests(rng: random.Random) -> list[Request]:
    reqs = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.choice(["decode", "prefill", "prefill-nc", "chain", "tree"])
        ctx = rng.choice([0, 1, rng.randint(2, 60)])
        if kind == "decode":
            reqs.append(Request("decode", 1, ctx))
        elif kind.startswith("prefill"):
            reqs.append(Request("prefill", rng.randint(1, 20), ctx, causal=kind == "prefill"))
        else:
            n = rng.randint(1, 9)
            tree = tuple(range(-1, n - 1)) if kind == "chain" else tuple(random_tree(
                {"nodes": n, "max_depth": min(n - 1, 3), "max_children": 3, "seed": rng.randint(0, 99)}))
            reqs.append(Request("tree", n, ctx, tree))
    return reqs


def flashinfer_formula(batch) -> torch.Tensor:
    """The reference with FlashInfer's ALiBi: ``slope * (kv_idx - qo_idx)``, key slot less query row
    (a constant C added to both positions changes nothing)."""
    saved = ref_mod.query_positions, ref_mod.key_positions
    ref_mod.query_positions = lambda r: r.context + torch.arange(r.query, dtype=torch.long)
    ref_mod.key_positions = lambda r: torch.arange(r.kv_len, dtype=torch.long)
    try:
        return reference_attention(batch)[0]
    finally:
        ref_mod.query_positions, ref_mod.key_positions = saved


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40))
def test_fa2_takes_alibi_exactly_where_flashinfers_formula_is_attnbenchs(seed):
    """On random batches: no ALiBi reason on fa2 (the route that takes every kind) <=> no branching
    tree <=> FlashInfer's formula gives the reference's output (float64, the same inputs)."""
    rng = random.Random(seed)
    b = _batch(random_requests(rng), window=rng.choice([None, None, 3, 9]), seed=seed)
    f = facts_of(b)
    branching = any(r.tree_parents is not None and any(p != i - 1 for i, p in enumerate(r.tree_parents))
                    for r in b.requests)
    assert bool(alibi_reasons("fa2", f)) == branching == f.branching_trees
    rel, _ = compare(flashinfer_formula(b), reference_attention(b)[0])
    assert (rel > 1e-4) if branching else (rel < 1e-6), (rel, [r.tree_parents for r in b.requests])
    if not branching:
        assert route_reasons(auto_route(f, 9), f, 9) == [] and route_reasons(auto_route(f, 8), f, 8) == []


@pytest.mark.parametrize("route, reqs, kw, needle", [
    ("fa3", PREFILLS, {}, "hopper/variants.cuh"),
    ("persistent", PREFILLS + DECODES, {}, "BatchAttention has no ALiBi (0.5.3 attention.py, 0.7.2.post1 attention/_core.py"),
    ("xqa", DECODES, {"page_size": 16}, "XQA decode has no ALiBi"),
    ("fa2", TREES, {}, "C + depth"),
    ("fa2", PREFILLS, {"softcap": 30.0}, "before the soft-cap's tanh"),
    ("decode", DECODES, {"softcap": 30.0}, "before the soft-cap's tanh"),
    ("decode-tc", DECODES, {"softcap": 30.0}, "before the soft-cap's tanh"),
    ("fa2", DECODES, {"sinks": True}, "AttentionSink in jit/attention/variants.py, which has no logits transform) has no ALiBi"),
])
def test_refusals_name_flashinfer_and_its_file(route, reqs, kw, needle):
    why = route_reasons(route, facts_of(_batch(reqs, **kw)), 9)
    assert any(needle in r and r.startswith(f"route {route}: FlashInfer") and "0.5.3" in r and "0.7.2.post1" in r
               for r in why), why  # the releases whose source shows the limit
    without = route_reasons(route, facts_of(make_batch(reqs, hq=6, hkv=2, page_size=kw.get("page_size", 4),
                                                       **{k: v for k, v in kw.items() if k != "page_size"})), 9)
    assert not any("ALiBi" in r for r in without)  # the reason is ALiBi's


@pytest.mark.parametrize("route", ROUTES[1:])
@pytest.mark.parametrize("reqs", [DECODES, PREFILLS, NONCAUSAL, CHAINS + PREFILLS, NONCAUSAL + PREFILLS,
                                  PREFILLS + DECODES, DECODES + NONCAUSAL], ids=str)
def test_each_route_takes_alibi_unless_flashinfer_has_none(route, reqs):
    """ALiBi adds a reason only on fa3 / persistent / xqa: on the others a batch the route takes
    without ALiBi it takes with ALiBi (decodes, causal and non-causal prefills, chains)."""
    plain = route_reasons(route, facts_of(make_batch(reqs, hq=6, hkv=2, page_size=16)), 9)
    with_alibi = route_reasons(route, facts_of(_batch(reqs, page_size=16)), 9)
    if route in ALIBI_ROUTES:
        assert with_alibi == plain
    else:
        assert route in NO_ALIBI and with_alibi == plain + [f"route {route}: {NO_ALIBI[route]}"]


@pytest.mark.parametrize("reqs, sm, route", [
    (DECODES, 9, "decode-tc"), (PREFILLS, 9, "fa2"), (PREFILLS, 8, "fa2"), (PREFILLS + DECODES, 9, "fa2"),
    (CHAINS + DECODES, 9, "fa2"), (NONCAUSAL, 9, "fa2")])
def test_auto_takes_a_route_with_alibi(reqs, sm, route):
    f = facts_of(_batch(reqs, page_size=16))
    assert auto_route(f, sm) == route and route_reasons(route, f, sm) == []
    assert make_backend("flashinfer").unsupported(_batch(reqs, page_size=16)) == []  # this CPU: sm unknown


def test_the_fa2_mask_limit_does_not_arise_with_alibi(monkeypatch):
    """With ALiBi the kernel scales in its logits transform, before the -5e4 mask (variants.cuh):
    an amax-scaled e5m2 cache runs on fa2 and decode-tc (without ALiBi: refused, issue 32; on
    FlashInfer 0.5.3's header, whatever FlashInfer is installed here)."""
    from attnbench.backends import flashinfer_routes

    monkeypatch.setattr(flashinfer_routes, "fa2_mask_fill", lambda: flashinfer_routes.FA2_MASK_FILL)
    for reqs, route in ((PREFILLS + DECODES, "fa2"), (DECODES, "decode-tc")):
        plain = facts_of(make_batch(reqs, hq=6, hkv=2, dtype="float16", kv_dtype="fp8_e5m2", d=256))
        assert any("finite logit -5e4" in r for r in route_reasons(route, plain, 9))
        assert route_reasons(route, facts_of(_batch(reqs, "float16", kv_dtype="fp8_e5m2", d=256)), 9) == []


def test_the_cascade_is_not_taken_with_alibi(monkeypatch):
    """Its levels merge by LSE, and each level's ALiBi is off by its own constant per row."""
    monkeypatch.setattr(fi_backend, "plan_cascade", lambda *a: ("cascade", "wrapper"))
    monkeypatch.setattr(fi_backend, "workspace_for", lambda *a: None)
    reqs = [Request("decode", 1, 40, prefix_group=0, shared_prefix=32), Request("decode", 1, 36, prefix_group=0,
                                                                               shared_prefix=32)]
    be = make_backend("flashinfer")
    for alibi in (False, True):
        b = make_batch(reqs, dtype="float16", page_size=8, alibi=alibi)
        assert (be._cascade(b, facts_of(b)) is None) == alibi


class _Recorder:
    calls: list = []

    def __init__(self, *args, **kwargs):
        pass

    def plan(self, *args, **kwargs):
        _Recorder.calls.append((type(self).__name__, kwargs))

    def run(self, q, *args, **kwargs):
        return q.clone() if type(self).__name__ != "_Pod" else (q[:1], q[:1])


class _Decode(_Recorder):
    pass


class _Prefill(_Recorder):
    pass


class _Pod(_Recorder):
    def run(self, q_p, kv_p, q_d, kv_d, **kwargs):
        return q_p.clone(), q_d.clone()


@pytest.fixture
def fake_flashinfer(monkeypatch):
    mod = types.ModuleType("flashinfer")
    mod.BatchDecodeWithPagedKVCacheWrapper = _Decode
    mod.BatchPrefillWithPagedKVCacheWrapper = _Prefill
    mod.BatchPODWithPagedKVCacheWrapper = _Pod
    monkeypatch.setitem(sys.modules, "flashinfer", mod)
    _Recorder.calls = []
    return _Recorder.calls


@pytest.mark.parametrize("route, reqs", [("decode", DECODES), ("decode-tc", DECODES), ("fa2", PREFILLS),
                                         ("fa2", CHAINS + NONCAUSAL)])
@pytest.mark.parametrize("alibi", [False, True])
def test_plan_gets_pos_encoding_mode(fake_flashinfer, monkeypatch, route, reqs, alibi):
    monkeypatch.setattr("attnbench.backends.flashinfer_plans.WORKSPACE_BYTES", 8)
    b = make_batch(reqs, hq=6, hkv=2, dtype="float16", page_size=4, alibi=alibi)
    f = facts_of(b)
    assert route_reasons(route, f, 9) == []
    step = step_for(route, b, f, {})
    step.call()
    (_, plan), = fake_flashinfer
    assert plan.get("pos_encoding_mode", "NONE") == ("ALIBI" if alibi else "NONE")  # NONE: FlashInfer's default
    assert ("ALiBi" in step.detail) == alibi


def test_mla_refuses_alibi():
    from attnbench.backends.flashinfer_mla import mla_reasons
    from attnbench.workload.batch import BatchSpec, materialize

    spec = BatchSpec(tuple(DECODES), 4, 1, 576, "bfloat16", 16, "shuffled", alibi=True, attention="mla",
                     kv_lora_rank=512, rope_dim=64)
    why = mla_reasons(materialize(spec, 0, "cpu"), "auto")
    assert any("no ALiBi (its plan takes no pos_encoding_mode: 0.5.3 mla.py, 0.7.2.post1 mla/_batch_mla/_wrapper.py)"
               in r for r in why), why


@pytest.mark.slow
def test_every_gpu_case_is_one_its_route_accepts_and_the_refused_one_is_refused():
    """tests/test_flashinfer_alibi_gpu.py's batches: each route takes its case (a GPU failure there
    is FlashInfer's output), the refused tree is refused and FlashInfer's formula is off there by
    more than the tolerance, and right on the chains beside it."""
    from attnbench.workload.batch import materialize
    from attnbench.workload.reference import default_tolerance

    from .test_flashinfer_alibi_gpu import LINED, REFUSED, warmup_items

    for spec_str, spec, label in warmup_items():
        f = facts_of(materialize(spec, 5, "cpu"))
        route = spec_str.split("route=")[1]
        assert route_reasons(auto_route(f, 9) if route == "auto" else route, f, 9) == [], label
    tree, lined = materialize(REFUSED, 5, "cpu"), materialize(LINED, 5, "cpu")
    assert route_reasons("fa2", facts_of(tree), 9) and not route_reasons("fa2", facts_of(lined), 9)
    tol = default_tolerance(tree.dtype)
    assert compare(flashinfer_formula(tree), reference_attention(tree)[0])[0] > 3 * tol
    assert compare(flashinfer_formula(lined), reference_attention(lined)[0])[0] < 1e-5
