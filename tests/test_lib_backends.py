"""The library backends (flash-attn, xformers, FlashInfer).

CPU tests run without the libraries: availability reasons with install hints, unsupported
reasons, the layout conversions, and the tree split (torch prefix + dense tree part + LSE
merge) against the float64 reference. GPU tests (``-m gpu``) check every available library
backend against the reference on random bf16 inputs.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from attnbench.backend import get_backend_class
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention
from attnbench.workload.trees import chain, full, random_tree

from attnbench.backends._common_libs import build_tree_split, dense_tree_part, merge_tree_split
from attnbench.backends._metadata import custom_mask_flat, flashinfer_page_layout


LIB_BACKENDS = ["flash-attn", "xformers", "flashinfer"]


def spec(requests, page=16, hq=4, hkv=2, d=32, dtype="float32", layout="shuffled", scale=None):
    return BatchSpec(
        requests=tuple(requests),
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        dtype=dtype,
        page_size=page,
        layout=layout,
        scale=scale,
    )


def tree(parents, context):
    return Request("tree", len(parents), context, tuple(parents))


def decode(context):
    return Request("decode", 1, context)


def prefill(q, context=0, causal=True):
    return Request("prefill", q, context, causal=causal)


# -- availability -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", LIB_BACKENDS)
def test_missing_library_is_unavailable_with_hint(name, monkeypatch):
    cls = get_backend_class(name)
    real = importlib.util.find_spec

    def fake(mod, *a, **k):
        return None if mod == cls.library else real(mod, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", fake)
    why = cls.unavailable()
    assert why and "not installed" in why
    assert f"attnbench[{name}]" in why


def test_importing_backends_imports_no_gpu_library():
    import sys

    for name in LIB_BACKENDS:
        get_backend_class(name)
    for lib in ("flash_attn", "xformers", "flashinfer"):
        if lib in sys.modules:
            pytest.skip(f"{lib} was imported earlier in this session")
    # the modules above imported fine without touching the libraries


# -- unsupported reasons ---------------------------------------------------------------------
def reasons(name, batch):
    return get_backend_class(name)().reasons(batch)


def test_flash_attn_page_size_and_device():
    b16 = materialize(spec([decode(40)], page=16, dtype="bfloat16"), 0)
    r = reasons("flash-attn", b16)
    assert any("page_size divisible by 256" in x for x in r)
    assert any("CUDA" in x for x in r)
    b256 = materialize(spec([decode(300)], page=256, dtype="bfloat16"), 0)
    assert not any("page_size" in x for x in reasons("flash-attn", b256))


def test_flash_attn_dtype_and_head_dim(monkeypatch):
    b = materialize(spec([decode(300)], page=256, d=64, dtype="float32"), 0)
    assert any("float16/bfloat16" in x for x in reasons("flash-attn", b))
    monkeypatch.delenv("ATTNBENCH_FA2_HDIM128_ONLY", raising=False)
    assert not any("head_dim" in x for x in reasons("flash-attn", b))
    monkeypatch.setenv("ATTNBENCH_FA2_HDIM128_ONLY", "1")
    assert any("head_dim 128 only" in x for x in reasons("flash-attn", b))
    b128 = materialize(spec([decode(300)], page=256, d=128, dtype="bfloat16"), 0)
    assert not any("head_dim" in x for x in reasons("flash-attn", b128))


def test_xformers_page_size_and_tree_shapes(monkeypatch):
    monkeypatch.delenv("ATTNBENCH_XFORMERS_TRITON_ONLY", raising=False)
    t1, t2 = full({"depth": 2, "branching": 2}), chain(3)
    b = materialize(spec([tree(t1, 20), tree(t2, 30)], page=16), 0)
    r = reasons("xformers", b)
    assert any("divisible by 64" in x for x in r)
    assert any("one tree for the whole batch" in x for x in r)
    same = materialize(spec([tree(t1, 70), tree(t1, 130), decode(50)], page=64), 0)
    r = reasons("xformers", same)
    assert not any("tree" in x or "page_size" in x for x in r), r


def test_xformers_triton_only_reasons(monkeypatch):
    """Triton-only mode: what xformers' split-K kernel takes (16-bit inputs, its head dims,
    non-tree requests of one query length, causal ones of at most 16 tokens)."""
    import attnbench.backends.xformers as xf

    monkeypatch.setattr(xf, "triton_only", lambda opted_in: True)
    t1 = full({"depth": 2, "branching": 2})
    ok = materialize(spec([tree(t1, 70), decode(50), decode(90)], page=64, d=128, dtype="bfloat16"), 0)
    assert reasons("xformers", ok) == ["xformers runs on CUDA devices only"]
    r = reasons("xformers", materialize(spec([decode(50)], page=64, d=96, dtype="float32"), 0))
    assert any("float16/bfloat16, not float32" in x for x in r) and any("head dims 16/32/64/128/256/512, got 96" in x for x in r)
    r = reasons("xformers", materialize(spec([decode(50), prefill(17, 30)], page=64, dtype="bfloat16"), 0))
    assert any("at most 16 tokens" in x for x in r)


def test_xformers_tree_needs_default_scale():
    t1 = full({"depth": 2, "branching": 2})
    b = materialize(spec([tree(t1, 70)], page=64, scale=0.1), 0)
    assert any("no scale argument" in x for x in reasons("xformers", b))


def test_flashinfer_reasons():
    b = materialize(spec([decode(40)], d=96, dtype="float32"), 0)
    r = reasons("flashinfer", b)
    assert any("head_dim" in x for x in r)
    assert any("float16/bfloat16" in x for x in r)
    ok = materialize(spec([decode(40)], d=128, dtype="bfloat16"), 0)
    assert reasons("flashinfer", ok) == ["FlashInfer runs on CUDA devices only"]


# -- layout conversions ----------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["contiguous", "shuffled", "shuffled-within", "reversed", "interleaved"])
def test_flashinfer_page_layout_addresses_the_same_slots(layout):
    b = materialize(spec([decode(37), prefill(16, 0), prefill(5, 60), tree(chain(2), 1)], page=16, layout=layout), 3)
    indptr, indices, last = flashinfer_page_layout(b)
    ps = b.page_size
    for i, r in enumerate(b.requests):
        pages = indices[indptr[i] : indptr[i + 1]].long()
        assert 1 <= last[i] <= ps
        assert (len(pages) - 1) * ps + last[i] == r.kv_len
        k = b.k_cache[pages].reshape(-1, b.num_kv_heads, b.head_dim)[: r.kv_len]
        assert torch.equal(k, b.gather_kv(i)[0])


def test_custom_mask_flat_is_row_major_per_request():
    reqs = [prefill(3, 2), tree([-1, 0, 0, 1], 5)]
    b = materialize(spec(reqs), 0)
    m = custom_mask_flat(b)
    assert m.numel() == sum(r.query * r.kv_len for r in reqs)
    assert torch.equal(m[:15].view(3, 5), b.mask(0))
    assert torch.equal(m[15:].view(4, 9), b.mask(1))


# -- the tree split (prefix + dense tree part + merge) ----------------------------------------
def torch_prefix_attention(batch, ts, softcap=None):
    """What flash-attn computes for the prefix part: tree nodes over slots 0..C-1, with LSE."""
    hq, hkv, d = batch.num_q_heads, batch.num_kv_heads, batch.head_dim
    g = hq // hkv
    outs, lses = [], []
    starts = batch.query_start
    for i in ts.reqs:
        r = batch.requests[i]
        q = batch.q[starts[i] : starts[i + 1]].double().view(r.query, hkv, g, d)
        k, v = batch.gather_kv(i)
        k, v = k[: r.context].double(), v[: r.context].double()
        s = torch.einsum("qhgd,khd->hgqk", q, k) * batch.scale
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        lse = torch.logsumexp(s, -1)  # -inf when the context is empty
        p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
        o = torch.einsum("hgqk,khd->qhgd", p, v).reshape(r.query, hq, d)
        outs.append(o)
        # mimic flash-attn: an empty row reports +inf (the merge must not trust it)
        lse = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))
        lses.append(lse.permute(2, 0, 1).reshape(r.query, hq))
    return torch.cat(outs), torch.cat(lses)


TREES = {
    "full-3ary": full({"depth": 3, "branching": 3}),
    "random": random_tree({"nodes": 25, "max_depth": 6, "max_children": 4, "seed": 7}),
    "chain": chain(6),
    "root-only": [-1],
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("gqa", [(4, 2), (4, 4), (6, 1)])
def test_tree_split_matches_reference(dtype, gqa):
    hq, hkv = gqa
    reqs = [
        tree(TREES["full-3ary"], 37),
        decode(20),
        tree(TREES["random"], 0),
        prefill(7, 9),
        tree(TREES["chain"], 64),
        tree(TREES["root-only"], 5),
    ]
    sp = BatchSpec(tuple(reqs), hq, hkv, 16, "float32", 16, "shuffled")
    b = materialize(sp, 11)
    if dtype == "float64":
        b.q, b.k_cache, b.v_cache = b.q.double(), b.k_cache.double(), b.v_cache.double()
    ts = build_tree_split(b)
    assert ts.reqs == [0, 2, 4, 5] and not ts.all_tokens
    o_pre, lse_pre = torch_prefix_attention(b, ts)
    o_t, lse_t = dense_tree_part(ts, b.q, b.k_cache, b.v_cache, b.scale)
    out = merge_tree_split(ts, o_pre.to(b.q.dtype), lse_pre.float(), o_t, lse_t)
    ref, _ = reference_attention(b)
    rel, mx = compare(out, ref[ts.tok])
    assert rel < 1e-5, (rel, mx)


@pytest.mark.parametrize("cap", [0.7, 5.0])
def test_tree_split_with_softcap_matches_reference(cap):
    reqs = [tree(TREES["full-3ary"], 37), tree(TREES["random"], 0), tree(TREES["chain"], 20)]
    b = materialize(BatchSpec(tuple(reqs), 4, 2, 16, "float32", 5, "shuffled", softcap=cap), 4)
    ts = build_tree_split(b)
    o_pre, lse_pre = torch_prefix_attention(b, ts, cap)
    o_t, lse_t = dense_tree_part(ts, b.q, b.k_cache, b.v_cache, b.scale, cap)
    out = merge_tree_split(ts, o_pre.to(b.q.dtype), lse_pre.float(), o_t, lse_t)
    rel, mx = compare(out, reference_attention(b)[0][ts.tok])
    assert rel < 1e-5, (rel, mx)
    plain, _ = dense_tree_part(ts, b.q, b.k_cache, b.v_cache, b.scale)
    assert not torch.allclose(plain, o_t)  # the cap changed the tree part (the test can fail)


def test_flash_attn_variant_reasons():
    t40 = full({"depth": 3, "branching": 3})
    def rs(reqs, **kw):
        return reasons("flash-attn", materialize(BatchSpec(tuple(reqs), 4, 2, 128, "bfloat16", 256, "shuffled", **kw), 0))
    assert any("window on tree nodes" in x for x in rs([tree(t40, 300)], window=8))
    assert not any("window" in x for x in rs([tree(chain(5), 300), decode(40)], window=8))  # chains are causal
    assert any("ALiBi" in x for x in rs([prefill(9, 5, causal=False)], alibi=True))
    assert not any("ALiBi" in x for x in rs([prefill(9, 5), decode(70)], alibi=True))
    # mixed causality runs as two varlen calls (issue 32): no reason, chains (causal rows) included
    assert rs([prefill(9, 5, causal=False), prefill(4, 3)]) == ["flash-attn 2 runs on CUDA devices only"]
    assert rs([tree(chain(5), 300), prefill(9, 5, causal=False)]) == ["flash-attn 2 runs on CUDA devices only"]
    assert rs([tree(t40, 300), prefill(9, 5, causal=False), prefill(3, 2)]) == ["flash-attn 2 runs on CUDA devices only"]
    assert not any("softcap" in x or "soft" in x for x in rs([tree(t40, 300)], softcap=30.0))
    assert any("sinks" in x for x in rs([decode(40)], sinks=True))  # no sinks in flash-attn 2
    assert any("fp8" in x.lower() for x in rs([decode(40)], kv_dtype="fp8_e4m3"))


def test_tree_split_all_tree_batch_is_whole():
    t = TREES["random"]
    b = materialize(spec([tree(t, 10), tree(t, 33)]), 1)
    ts = build_tree_split(b)
    assert ts.all_tokens and ts.no_prefix is None
    o_pre, lse_pre = torch_prefix_attention(b, ts)
    o_t, lse_t = dense_tree_part(ts, b.q, b.k_cache, b.v_cache, b.scale)
    out = merge_tree_split(ts, o_pre.float(), lse_pre.float(), o_t, lse_t)
    rel, _ = compare(out, reference_attention(b)[0])
    assert rel < 1e-5


# -- GPU: every available library backend against the reference -------------------------------
def gpu_cases(name):
    ps = {"flash-attn": 256, "xformers": 64, "flashinfer": 16}[name]
    t40 = full({"depth": 3, "branching": 3})
    trnd = random_tree({"nodes": 30, "max_depth": 7, "max_children": 4, "seed": 3})
    yield "decode", [decode(c) for c in (1000, 4095, 17, 2048)], "shuffled"
    yield "prefill", [prefill(300), prefill(77)], "contiguous"
    yield "chunked-prefill", [prefill(128, 700), prefill(64, 1500)], "shuffled"
    yield "mixed", [decode(900), prefill(96, 300), decode(40)], "interleaved"
    yield "tree-full", [tree(t40, 1200), tree(t40, 3000)], "shuffled"
    yield "tree-random", [tree(trnd, 500), tree(trnd, 2100)], "reversed"
    yield "tree-chain", [tree(chain(8), 800), tree(chain(8), 100)], "shuffled"
    yield "tree+decode", [tree(t40, 1000), decode(600), decode(3000)], "shuffled-within"
    yield "page", [decode(c) for c in (ps * 3, ps * 3 - 1, ps + 1)], "shuffled"


@pytest.mark.gpu
@pytest.mark.parametrize("name", LIB_BACKENDS)
def test_gpu_against_reference(name):
    """Each library on the cases it can read (flash-attn paged by 256, xformers by 64 and in
    Triton-only mode where its extension does not load: tests/gpu_backends.py)."""
    from .gpu_backends import gpu_backend

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    be, why = gpu_backend(name)
    if be is None:
        pytest.skip(why)
    ps = {"flash-attn": 256, "xformers": 64, "flashinfer": 16}[name]
    ran = 0
    for case, reqs, layout in gpu_cases(name):
        sp = BatchSpec(tuple(reqs), 16, 4, 128, "bfloat16", ps, layout)
        b = materialize(sp, 5, "cuda")
        be, _ = gpu_backend(name)
        if be.reasons(b):
            continue
        plan = be.prepare(b)
        out = be.run(plan)
        torch.cuda.synchronize()
        ref, _ = reference_attention(b)
        rel, mx = compare(out, ref)
        assert rel < 1.5e-2, (name, case, plan.mode, rel, mx)
        ran += 1
    assert ran > 0


def test_installed_but_not_importable_is_unavailable():
    """A library that is found but fails at import (a binary built for another torch) is an
    unavailable backend whose reason says so."""
    from attnbench.backend import Backend

    class Broken(Backend):
        name = "broken"
        library = "json"  # found on every machine
        import_modules = ("json", "attnbench_no_such_module_xyz")

        def plan(self, batch):
            return batch

        def run(self, plan):
            return plan.q

    why = Broken.unavailable()
    assert why.startswith("json does not import: ModuleNotFoundError")


def test_a_dotted_library_whose_parent_is_missing_or_fails_is_a_reason(tmp_path, monkeypatch):
    """``flash_attn.cute`` is found by importing ``flash_attn``: a missing parent is 'not installed', a
    parent whose ``__init__`` raises (flash-attn 2 built for another torch) is 'does not import'."""
    import sys

    from attnbench.backend import Backend

    pkg = tmp_path / "attnbench_broken_parent_xyz"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('undefined symbol: _ZN3c10')\n")
    (pkg / "cute.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "attnbench_broken_parent_xyz", raising=False)

    def backend(lib):
        return type("Dotted", (Backend,), {"name": "dotted", "library": lib, "install_hint": "pip install x",
                                           "plan": lambda self, b: b, "run": lambda self, p: p.q})

    assert backend("attnbench_no_such_parent_xyz.cute").unavailable() == \
        "attnbench_no_such_parent_xyz.cute not installed; install with: pip install x"
    why = backend("attnbench_broken_parent_xyz.cute").unavailable()
    assert why == "attnbench_broken_parent_xyz does not import: ImportError: undefined symbol: _ZN3c10", why
    assert backend("json.decoder").unavailable() is None
