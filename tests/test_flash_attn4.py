"""The FlashAttention-4 backend (``flash-attn4``): what a CPU can check without the library.

The tables its tree ``mask_mod`` reads are built on the CPU here and the ``mask_mod``'s predicate
(``_fa4_mask.visible``, the arithmetic the CuTe DSL version runs) is evaluated on every
(request, query, key) and on the padding reads the kernel may make, against the batch's masks
(docs/semantics.md "Visibility"); the call's arguments per route; the skip reasons. GPU tests
(``-m gpu``) run each route against the float64 reference.
"""
from __future__ import annotations

import pytest
import torch

from attnbench.backend import get_backend_class, make_backend
from attnbench.backends._fa4_mask import KEY_PAD, ROW_PAD, build_tables, visible
from attnbench.backends.flash_attn4 import UNSPLIT, call_args
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.trees import chain, full, random_tree

T40 = full({"depth": 3, "branching": 3})
TRND = random_tree({"nodes": 30, "max_depth": 7, "max_children": 4, "seed": 3})


def tree(parents, context):
    return Request("tree", len(parents), context, tuple(parents))


def decode(context):
    return Request("decode", 1, context)


def prefill(q, context=0, causal=True):
    return Request("prefill", q, context, causal=causal)


def batch(reqs, page=16, dtype="float32", hq=4, hkv=2, d=16, **kw):
    return materialize(BatchSpec(tuple(reqs), hq, hkv, d, dtype, page, "shuffled", **kw), 0)


BATCHES = {
    "trees+decode": [tree(T40, 50), decode(37), tree(TRND, 5), decode(1)],
    "mixed causality": [prefill(9, 5, causal=False), prefill(4, 3), decode(20)],
    "tree at context 0 and 1": [tree((-1, 0, 0, 1), 0), tree(chain(3), 1), prefill(7)],
    "dynamic-free chain + tree": [tree(chain(6), 12), tree(TRND, 40)],
}


@pytest.mark.parametrize("window", [None, 1, 3, 17])
@pytest.mark.parametrize("name", sorted(BATCHES))
def test_mask_mod_predicate_is_the_semantic_mask(name, window):
    b = batch(BATCHES[name], window=window)
    tables = build_tables(b)
    for i, r in enumerate(b.requests):
        q = torch.arange(r.query)[:, None]
        kv = torch.arange(r.kv_len)[None, :]
        got = visible(tables, torch.full_like(q, i), q, kv)
        assert torch.equal(got, b.mask(i)), (name, window, i)


def test_mask_mod_reads_stay_inside_the_tables():
    """The kernel may evaluate rows past a request's queries and keys up to one tile past its
    keys: every such read indexes inside the tables (and padding rows see nothing)."""
    b = batch(BATCHES["trees+decode"], window=4)
    tables = build_tables(b)
    qpad = tables.rows.shape[2]
    assert qpad >= max(r.query for r in b.requests) + ROW_PAD
    for i, r in enumerate(b.requests):
        q = torch.arange(qpad)[:, None]
        kv = torch.arange(r.kv_len + KEY_PAD)[None, :]
        off, base = tables.rows[3][i, q].long(), tables.rows[2][i, q].long()
        idx = off + kv - base
        assert int(idx.min()) >= 0 and int(idx.max()) < tables.seen.numel(), i
        pad_rows = visible(tables, torch.full_like(q, i), q, kv)[r.query:]
        assert not pad_rows.any()


def test_routes_and_their_arguments():
    route, mode, kw, aux = call_args(batch([decode(40), decode(7)]), 9)
    assert route == "paged causal" and kw["causal"] is True and kw["num_splits"] == 1 and not aux
    assert UNSPLIT in mode and "GQA packed" in mode and "page 16" in mode
    assert kw["page_table"].dtype == torch.int32 and kw["seqused_k"].dtype == torch.int32
    assert kw["max_seqlen_k"] == 41 and kw["max_seqlen_q"] == 1
    route, mode, kw, aux = call_args(batch([prefill(9, 5), tree(chain(4), 30)], window=8, sinks=True, softcap=5.0), 9)
    assert route == "paged causal" and kw["window_size"] == (7, 0) and UNSPLIT not in mode
    assert kw["softcap"] == 5.0 and kw["learnable_sink"].dtype == torch.float32
    route, _, kw, aux = call_args(batch([prefill(9, 5, causal=False)]), 9)
    assert route == "paged non-causal" and kw["causal"] is False
    route, _, kw, aux = call_args(batch([prefill(9, 5, causal=False)], window=3), 9)
    assert route == "paged tree mask_mod" and len(aux) == 5 and kw["causal"] is False
    route, _, kw, aux = call_args(batch(BATCHES["trees+decode"]), 9)
    assert route == "paged tree mask_mod" and kw["aux_tensors"] is aux
    assert all(t.dtype == torch.int32 and t.is_contiguous() for t in aux)
    assert call_args(batch([decode(40)]), 10)[2]["num_splits"] == 0  # the library's heuristic on SM100
    assert call_args(batch([decode(40)]), 8)[2]["num_splits"] == 1


def test_reasons_name_the_library_limit():
    be = make_backend("flash-attn4")
    cpu = be.reasons(batch([decode(40)]))
    assert "FlashAttention-4 runs on CUDA devices only" in cpu
    assert "FlashAttention-4 takes float16/bfloat16, not float32" in cpu
    fp8 = be.reasons(batch([decode(40)], dtype="bfloat16", kv_dtype="fp8_e4m3"))
    assert any("FP8 is only supported on SM100" in r and "interface.py" in r for r in fp8)
    assert any("ALiBi" in r for r in be.reasons(batch([decode(40)], dtype="bfloat16", alibi=True)))
    assert any("multiple of 8 and at most 256" in r for r in be.reasons(batch([decode(40)], dtype="bfloat16", d=12)))
    assert any("multiples of 16" in r and "flash_fwd_sm90.py" in r
               for r in be.reasons(batch([decode(40)], dtype="bfloat16", d=40)))
    assert not any("multiples of 16" in r for r in be.reasons(batch([decode(40)], dtype="bfloat16", d=64)))


def test_missing_library_names_the_install():
    cls = get_backend_class("flash-attn4")
    why = cls.unavailable()
    if why is None:
        pytest.skip("flash-attn-4 is installed here")
    assert "not installed" in why or "does not import" in why
    assert "attnbench[flash-attn4]" in cls.install_hint and "fetch_wheels.sh" in cls.install_hint


# -- GPU: every route against the float64 reference -------------------------------------------
def gpu_cases():
    for page in (16, 256):
        yield f"decode p{page}", [decode(c) for c in (1000, 4095, 17, 2048)], page, {}
        yield f"prefill+chunked p{page}", [prefill(300), prefill(77, 700), decode(900)], page, {}
        yield f"tree+decode p{page}", [tree(T40, 1000), decode(600), tree(TRND, 3000), decode(3)], page, {}
        yield f"tree window p{page}", [tree(TRND, 500), decode(300), prefill(33, 200)], page, {"window": 40}
    yield "mixed causality", [prefill(96, 300, causal=False), prefill(64), decode(40)], 64, {}
    yield "odd lengths, sinks, softcap", [decode(1), decode(257), tree(T40, 129), prefill(130, 3)], 16, \
        {"sinks": True, "softcap": 20.0}
    yield "window decode", [decode(c) for c in (5000, 100, 2049)], 128, {"window": 512}
    yield "non-causal", [prefill(100, 20, causal=False), prefill(7, 0, causal=False)], 16, {}


@pytest.mark.gpu
@pytest.mark.parametrize("trees", ["mask", "split"])
@pytest.mark.parametrize("case", [c[0] for c in gpu_cases()])
@pytest.mark.parametrize("gqa", [(16, 4), (8, 8)])
def test_gpu_against_reference(case, gqa, trees):
    from attnbench.workload.reference import compare, reference_attention

    from .gpu_backends import gpu_backend, skip_for

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    be, why = gpu_backend("flash-attn4")
    if be is None:
        pytest.skip(why)
    be = make_backend(f"flash-attn4:trees={trees}")
    _, reqs, page, kw = next(c for c in gpu_cases() if c[0] == case)
    b = materialize(BatchSpec(tuple(reqs), gqa[0], gqa[1], 128, "bfloat16", page, "shuffled", **kw), 5, "cuda")
    if be.reasons(b):
        skip_for("flash-attn4", be.reasons(b))
    plan = be.prepare(b)
    out = be.run(plan)
    torch.cuda.synchronize()
    ref, _ = reference_attention(b)
    rel, mx = compare(out, ref)
    assert rel < 1.5e-2, (case, plan.mode, rel, mx)



# -- Flex on its FLASH backend (flex:kernel=flash) ------------------------------------------------
@pytest.mark.slow
def test_flex_flash_option_and_reasons():
    be = make_backend("flex:kernel=flash")
    assert be.option("kernel") == "flash" and make_backend("flex").option("kernel") == "triton"
    if get_backend_class("flash-attn4").unavailable():
        assert "FlashAttention-4" in be.why_unavailable()
    rs = be.reasons(batch([decode(40)]))
    assert any("needs a CUDA GPU" in r for r in rs) and any("float16/bfloat16" in r for r in rs)
    rs = be.reasons(batch([decode(40)], dtype="bfloat16", d=8))
    assert any("at least 16" in r for r in rs)
    assert not any("head dims" in r for r in be.reasons(batch([decode(40)], dtype="bfloat16", d=128)))
    assert make_backend("flex").reasons(batch([decode(40)])) == []  # the Triton route is unchanged
    # trees: taken on the GPU as on flex's Triton kernel (int32 row tables)
    tree_batch = batch([tree(T40, 100), decode(40)], dtype="bfloat16", d=128)
    assert not any("tree" in r for r in be.reasons(tree_batch))
    # a lone decode: refused with what the H200 showed, and only there (sinks run: the LSE test below)
    assert any("[1, 1]" in r for r in be.reasons(batch([decode(40)], dtype="bfloat16", d=128)))
    two = batch([decode(40), decode(9)], dtype="bfloat16", d=128, sinks=True)
    assert not any("[1, 1]" in r or "sink" in r for r in be.reasons(two))
    assert make_backend("flex").reasons(batch([decode(40)], dtype="bfloat16", d=128)) == []


def test_flex_flash_lse_base_is_read_from_torch(monkeypatch, request):
    """torch before pytorch#181824 multiplies the FLASH backend's natural-log LSE by ln 2: lse_scale
    undoes it there and is 1 where flex_attention reads the FLASH statistics as natural-log."""
    import inspect
    import math

    from attnbench.backends import _flex_flash

    _flex_flash.lse_scale.cache_clear()
    request.addfinalizer(_flex_flash.lse_scale.cache_clear)  # the next reader sees this torch again
    monkeypatch.setattr(inspect, "getsource", lambda obj: "def flex_attention(...):\n    stats_are_log2=...\n")
    assert _flex_flash.lse_scale() == 1.0
    _flex_flash.lse_scale.cache_clear()
    monkeypatch.setattr(inspect, "getsource", lambda obj: "def flex_attention(...):\n    lse = lse * ln2\n")
    assert _flex_flash.lse_scale() == pytest.approx(1 / math.log(2))


@pytest.mark.parametrize("window", [None, 3])
def test_sinks_weigh_the_lse_in_its_true_base(window):
    """The sink correction of flex's run, fed the LSE as torch 2.11's FLASH backend returned it (times
    ln 2): the plan's lse_scale gives the reference back; without it the rows are off (rel. err
    0.22-0.37 on the H200's gpt-oss decodes, the same error as here)."""
    import math

    from attnbench.workload.reference import compare, reference_attention

    b = batch([decode(40), tree(T40, 21), decode(7)], sinks=True, window=window)
    be = make_backend("flex")
    p = be.prepare(b)
    ref, _ = reference_attention(b)
    real = p.fn

    def as_torch_2_11(*a, **kw):
        o, aux = real(*a, **kw)
        return o, getattr(aux, "lse", aux) * math.log(2)

    p.fn = as_torch_2_11
    assert compare(be.run(p), ref)[0] > 0.05  # the bug, seen
    p.lse_scale = 1 / math.log(2)
    assert compare(be.run(p), ref)[0] < 1e-5  # undone: float32 on the CPU


@pytest.mark.gpu
@pytest.mark.parametrize("case", [c[0] for c in gpu_cases()])
def test_gpu_flex_flash_against_reference(case):
    from attnbench.workload.reference import compare, reference_attention

    from .gpu_backends import skip_for

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    be = make_backend("flex:kernel=flash")
    if be.why_unavailable():
        pytest.skip(be.why_unavailable())
    _, reqs, page, kw = next(c for c in gpu_cases() if c[0] == case)
    b = materialize(BatchSpec(tuple(reqs), 16, 4, 128, "bfloat16", page, "shuffled", **kw), 5, "cuda")
    if be.reasons(b):
        skip_for("flex:kernel=flash", be.reasons(b))
    plan = be.prepare(b)
    assert "BACKEND=FLASH" in plan.mode
    out = be.run(plan)
    torch.cuda.synchronize()
    ref, _ = reference_attention(b)
    rel, mx = compare(out, ref)
    assert rel < 1.5e-2, (case, plan.mode, rel, mx)


@pytest.mark.gpu
def test_gpu_rows_are_graph_timed_and_pass_the_stale_graph_check():
    """Through the runner, as a run times them: FlashAttention-4's and Flex-FLASH's rows are
    graph-timed and their replays follow a change of the queries (measure/graph_check.py; CuTe
    DSL launches were reported to escape capture elsewhere): ok rows, timed by cuda-graph, or a
    skip naming why the library cannot run here."""
    import textwrap

    from attnbench.execute.options import RunOptions
    from attnbench.execute.runner import Runner
    from attnbench.workload.scenario import load_text

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    text = textwrap.dedent("""
        name: fa4-graphs
        seed: 3
        device: cuda
        model: {num_q_heads: 16, num_kv_heads: 4, head_dim: 128, dtype: bfloat16}
        kv_cache: {page_size: 16, layout: shuffled}
        batch:
          - {kind: decode, count: 3, context: 1000}
          - {kind: tree, count: 2, context: 700, tree: {choices: [[0], [1], [0, 0], [0, 1], [1, 0]]}}
        sweep:
          kv_cache.page_size: [16, 256]
        timing: {warmup_ms: 5, measure_ms: 20, min_runs: 5}
        """)
    names = ["flash-attn4", "flex:kernel=flash"]
    rows = list(Runner(load_text(text, "fa4.yaml", []), RunOptions(backends=names)).rows())
    assert rows
    for r in rows:
        if r.status == "skipped":
            assert r.reason and ("not installed" in r.reason or "FlashAttention-4" in r.reason), r.reason
            continue
        assert r.status == "ok", (r.id.backend, r.status, r.reason)
        assert r.timing.timing_method == "cuda-graph", (r.id.backend, r.timing.timing_method)


# -- trees=split: the prefix/suffix route, with FlashAttention-4's call stood in on the CPU ----------
def fake_fa4(q, k_cache, v_cache, *, cu_seqlens_q, seqused_k, page_table, causal, softmax_scale,
             window_size=(None, None), softcap=0.0, learnable_sink=None, return_lse=False, **_):
    """flash_attn_varlen_func's paged forward as its docstring and interface.py define it, in
    float64: bottom-right causal, window (left, right), soft-cap, a natural-log sink per head;
    returns (out, lse [H, total_q])."""
    n, hq, d = q.shape
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(n, hq, d, dtype=q.dtype)
    lse = torch.full((hq, n), float("-inf"), dtype=torch.float32)
    for b in range(len(seqused_k)):
        q0, q1, lk = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(seqused_k[b])
        pages = page_table[b, : -(-lk // page)].long() if lk else page_table[b, :0].long()
        k = k_cache[pages].reshape(-1, hkv, d)[:lk].double().repeat_interleave(hq // hkv, 1)
        v = v_cache[pages].reshape(-1, hkv, d)[:lk].double().repeat_interleave(hq // hkv, 1)
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].double(), k) * softmax_scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        qpos = torch.arange(q1 - q0)[:, None] + lk - (q1 - q0)
        kpos = torch.arange(lk)[None, :]
        left, right = window_size
        right = 0 if causal else right
        ok = torch.ones(q1 - q0, lk, dtype=torch.bool)
        if right is not None:
            ok &= kpos <= qpos + right
        if left is not None:
            ok &= kpos >= qpos - left
        s = s.masked_fill(~ok, float("-inf"))
        if learnable_sink is not None:
            s = torch.cat([s, learnable_sink.double()[:, None, None].expand(hq, q1 - q0, 1)], -1)
            v = torch.cat([v, torch.zeros(1, hq, d, dtype=v.dtype)], 0)
        m = torch.logsumexp(s, -1)
        p = torch.exp(s - m[..., None]).nan_to_num(0.0)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", p, v).to(q.dtype)
        lse[:, q0:q1] = m.float()
    return out, (lse if return_lse else None)


@pytest.mark.parametrize("variant", [{}, {"sinks": True}, {"softcap": 3.0}, {"sinks": True, "softcap": 3.0}])
def test_trees_split_route_matches_the_reference(variant):
    from attnbench.backends._fa4_split import plan_split, run_split
    from attnbench.workload.reference import compare, reference_attention

    reqs = [tree(T40, 50), decode(37), tree(TRND, 0), prefill(9, 5, causal=False), prefill(4, 3)]
    b = batch(reqs, dtype="float32", **variant)
    be = make_backend("flash-attn4:trees=split")
    assert not [r for r in be.unsupported(b) if "trees=split" in r]
    route, _, kw, aux = call_args(b, 9)
    p = plan_split(b, kw)
    out = run_split(p, fake_fa4, b.q, b.k_cache, b.v_cache)
    rel, _ = compare(out, reference_attention(b)[0])
    assert rel < 1e-4, (variant, rel)


def test_trees_split_refuses_windows_on_trees():
    be = make_backend("flash-attn4:trees=split")
    rs = be.unsupported(batch([tree(T40, 50), decode(3)], dtype="bfloat16", window=8))
    assert any("trees=split" in r and "C + depth" in r for r in rs)
    assert not [r for r in make_backend("flash-attn4").unsupported(batch([tree(T40, 50)], dtype="bfloat16", window=8))
                if "trees=split" in r]
    chains = batch([tree(chain(5), 30), decode(37)], dtype="bfloat16", window=8)  # a causal prefill: runs
    assert not [r for r in be.unsupported(chains) if "trees=split" in r] and call_args(chains, 9)[0] == "paged causal"
