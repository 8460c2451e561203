"""Batches that mix causal and non-causal prefills, split into one library call per causality
(attnbench/backends/_causal_groups.py; issue 32: flash-attn and xformers take one causality
per call).

CPU: random mixed batches (random values, odd lengths, shuffled pages, GQA) split by the
module; each group is run by the reference and by sdpa as ONE call of ONE causality flag (a
sub-batch built from the group's own metadata: its block-table rows, lengths, queries), its
output written back with ``put``, and the whole compared with the reference on the batch.
Then the real flash-attn and xformers plan/run code on the CPU, their library calls replaced
by a float64 emulation of what the library computes from the arguments it gets (one causality
per call, bottom-right aligned, flash-attn's window edges), so a group given the wrong flag,
rows or block table fails. GPU (``-m gpu``): the two-call path of both libraries against the
reference."""
from __future__ import annotations

import dataclasses
import sys
import types

import numpy as np
import pytest
import torch

from attnbench.backend import get_backend_class
from attnbench.backends._causal_groups import TWO_CALLS, causal_groups, put, split_requests, take
from attnbench.workload.batch import Batch, BatchSpec, Request, materialize
from attnbench.workload.reference import compare, default_tolerance, reference_attention
from attnbench.workload.trees import chain, full


def mixed_requests(seed: int, chains: bool = False, shuffle: bool = True) -> list[Request]:
    """Decodes, causal and non-causal (chunked) prefills of odd lengths, at least two of each
    prefill kind, in a random order (``shuffle``: the groups interleave in the packed batch)."""
    rng = np.random.default_rng(seed)
    reqs = [Request("decode", 1, int(rng.integers(1, 90))) for _ in range(int(rng.integers(1, 4)))]
    for causal in (True, False):
        reqs += [Request("prefill", int(rng.integers(2, 12)) * 2 + 1, int(rng.integers(0, 60)), causal=causal)
                 for _ in range(int(rng.integers(2, 4)))]
    if chains:
        reqs += [Request("tree", 6, int(rng.integers(1, 50)), tuple(chain(5)))]
    if shuffle:
        reqs = [reqs[i] for i in rng.permutation(len(reqs))]
    return reqs


def mixed_batch(seed: int, hq=6, hkv=2, d=24, page=5, dtype="float32", **kw) -> Batch:
    variants = {k: kw.pop(k) for k in ("window", "softcap") if k in kw}
    spec = BatchSpec(tuple(mixed_requests(seed, **kw)), hq, hkv, d, dtype, page, "shuffled", **variants)
    return materialize(spec, seed)


def one_flag(r: Request, causal: bool) -> Request:
    """The request as a call of causality ``causal`` computes it (only prefills carry the flag)."""
    return dataclasses.replace(r, causal=causal) if r.kind == "prefill" else r


def group_batch(batch: Batch, g) -> Batch:
    """The group as one call sees it: its requests under the call's one flag, its queries
    (``take``), its block-table rows and lengths from the group's metadata."""
    reqs = tuple(one_flag(batch.requests[i], g.causal) for i in g.reqs)
    spec = dataclasses.replace(batch.spec, requests=reqs)
    q_lens = torch.from_numpy(g.query_lens).int()
    kv_lens = torch.from_numpy(g.kv_lens).int()
    assert g.cu_q.tolist() == [0] + np.cumsum([r.query for r in reqs]).tolist()
    assert g.cu_k.tolist() == [0] + np.cumsum([r.kv_len for r in reqs]).tolist()
    return Batch(spec=spec, q=take(batch.q, g), k_cache=batch.k_cache, v_cache=batch.v_cache,
                 block_table=g.block_table, query_start_loc=g.cu_q, query_lens=q_lens,
                 context_lens=kv_lens - q_lens, kv_lens=kv_lens, scale=batch.scale)


# -- the grouping ----------------------------------------------------------------------------
def test_split_requests_groups_and_flags():
    b = materialize(BatchSpec((Request("decode", 1, 9), Request("prefill", 7, 3, causal=False),
                               Request("prefill", 5, 0), Request("prefill", 3, 2, causal=False)),
                              4, 2, 16, "float32", 5, "shuffled"), 1)
    (c, cr), (n, nr) = split_requests(b)
    assert (c, cr.tolist(), n, nr.tolist()) == (True, [0, 2], False, [1, 3])  # decodes join the causal call
    g = causal_groups(b)
    assert g[0].rows is None and g[0].tok.tolist() == [0] + list(range(8, 13))
    assert g[1].tok.tolist() == list(range(1, 8)) + list(range(13, 16))
    one = materialize(dataclasses.replace(b.spec, requests=b.spec.requests[:2]), 1)  # decode + non-causal
    assert [(f, r.tolist()) for f, r in split_requests(one)] == [(False, [0, 1])]  # one call, as before
    (only,) = causal_groups(one)
    assert only.whole and take(one.q, only) is one.q
    runs = materialize(dataclasses.replace(b.spec, requests=b.spec.requests[1:3]), 1)  # one run each
    g = causal_groups(runs)
    assert [x.rows for x in g] == [slice(7, 12), slice(0, 7)] and all(x.tok is None for x in g)
    assert take(runs.q, g[0]).data_ptr() == runs.q[7].data_ptr()  # a view, no gather


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [True, False], ids=["interleaved", "in-order"])
@pytest.mark.parametrize("seed", [3, 11, 29])
@pytest.mark.parametrize("name", ["reference", "sdpa"])
def test_groups_run_apart_match_the_whole_batch(name, seed, shuffle):
    batch = mixed_batch(seed, chains=seed == 11, shuffle=shuffle, window=9 if seed == 29 else None)
    groups = causal_groups(batch)
    assert [g.causal for g in groups] == [True, False]
    assert sorted(np.concatenate([g.reqs for g in groups]).tolist()) == list(range(batch.num_requests))
    be = get_backend_class(name)()
    out = None
    for g in groups:
        sub = group_batch(batch, g)
        out = put(out, g, be.run(be.plan(sub)), batch.q)
    rel, mx = compare(out, reference_attention(batch)[0])
    assert rel < 1e-5, (rel, mx)
    # the test can fail: one flag for the whole batch is wrong
    one = dataclasses.replace(batch.spec, requests=tuple(one_flag(r, True) for r in batch.requests))
    wrong = reference_attention(dataclasses.replace(batch, spec=one, _masks={}))[0]
    assert compare(wrong, reference_attention(batch)[0])[0] > 1e-2


# -- a float64 emulation of the libraries' calls ---------------------------------------------
def attend(q, k, v, scale, causal, left=-1, right=-1, softcap=None):
    """One request as flash-attn / xformers compute it: ``q [Lq, Hq, D]``, ``k, v [Lk, Hkv, D]``,
    causal bottom-right aligned (query i at key slot i + Lk - Lq), window edges relative to it.
    Returns ``(o [Lq, Hq, D] float64, lse [Hq, Lq], +inf on a row that sees no key)``."""
    g = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(q.shape[0])[:, None] + k.shape[0] - q.shape[0]
    j = torch.arange(k.shape[0])[None, :]
    right = 0 if causal else right
    vis = torch.ones_like(i + j, dtype=torch.bool)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("hqk,khd->qhd", torch.exp(s - lse[..., None]).nan_to_num(0.0), v)
    return o, torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))


def paged_kv(cache, table_row, kv_len):
    """A request's first ``kv_len`` key slots from ``cache [P, page, Hkv, D]``."""
    ps = cache.shape[1]
    pages = table_row[: -(-kv_len // ps)].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:kv_len]


def fake_varlen(calls):
    def varlen(q, k_cache, v_cache, cu_q, cu_k, max_q, max_k, softmax_scale, causal, return_attn_probs=False,
               block_table=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None):
        calls.append((causal, tuple(window_size), q.shape[0]))
        outs, lses = [], []
        for b in range(len(cu_q) - 1):
            lk = int(cu_k[b + 1] - cu_k[b])
            o, lse = attend(q[cu_q[b]:cu_q[b + 1]], paged_kv(k_cache, block_table[b], lk),
                            paged_kv(v_cache, block_table[b], lk), softmax_scale, causal, *window_size, softcap)
            outs.append(o)
            lses.append(lse)
        o = torch.cat(outs).to(q.dtype)
        return (o, torch.cat(lses, 1).float(), None) if return_attn_probs else o
    return varlen


@pytest.mark.parametrize("case", ["prefills", "chains", "trees", "window", "softcap"])
def test_flash_attn_two_calls_with_an_emulated_library(case, monkeypatch):
    import attnbench.backends.flash_attn as fa

    calls = []
    monkeypatch.setattr(fa, "_fns", lambda: (fake_varlen(calls), None))
    kw = {"window": {"window": 7}, "softcap": {"softcap": 3.0}}.get(case, {})
    batch = mixed_batch(5, hq=8, hkv=2, d=16, page=7, chains=case == "chains", **kw)
    if case == "trees":  # the tree split, the other requests in two calls
        t = tuple(full({"depth": 2, "branching": 2}))
        spec = dataclasses.replace(batch.spec, requests=batch.spec.requests + (Request("tree", len(t), 33, t),))
        batch = materialize(spec, 5)
    be = get_backend_class("flash-attn")()
    plan = be.plan(batch)
    assert plan.mode.endswith(f"({TWO_CALLS})"), plan.mode
    out = be.run(plan)
    rel, mx = compare(out, reference_attention(batch)[0])
    assert rel < 1e-5, (case, plan.mode, rel, mx)
    want = [(6, 0), (6, -1)] if case == "window" else [(-1, -1), (-1, -1)]
    assert len(calls) == (3 if case == "trees" else 2)  # the tree split's prefix call first
    assert [c[:2] for c in calls[-2:]] == [(True, want[0]), (False, want[1])]


class _Bias:
    """What a fake paged bias keeps: the per-request lengths, the block table and its causality."""

    def __init__(self, q_seqlen, kv_seqlen, block_tables, page_size, causal):
        self.q, self.kv, self.table, self.page_size, self.causal = q_seqlen, kv_seqlen, block_tables, page_size, causal

    @classmethod
    def from_seqlens(cls, q_seqlen, kv_seqlen, block_tables, page_size, device):
        return cls(q_seqlen, kv_seqlen, block_tables, page_size, False)


class _CausalPending:
    def __init__(self, q_seqlen, kv_padding, kv_seqlen):
        self.q, self.kv, self.padding = q_seqlen, kv_seqlen, kv_padding

    @classmethod
    def from_seqlens(cls, q_seqlen, kv_padding, kv_seqlen, device):
        return cls(q_seqlen, kv_padding, kv_seqlen)

    def make_paged(self, block_tables, page_size, paged_type):
        assert self.padding == block_tables.shape[1] * page_size
        return _Bias(self.q, self.kv, block_tables, page_size, True)


def fake_xformers(monkeypatch, calls):
    """``xformers.ops`` with the three bias types and ``memory_efficient_attention_forward``."""
    ab = types.SimpleNamespace(BlockDiagonalCausalWithOffsetPaddedKeysMask=_CausalPending,
                               PagedBlockDiagonalCausalWithOffsetPaddedKeysMask=object,
                               PagedBlockDiagonalPaddedKeysMask=_Bias)

    def forward(q, k, v, attn_bias, scale, op=None):
        calls.append(attn_bias.causal)
        _, n, hkv, g, d = q.shape
        kc, vc = k[0, :, :, 0], v[0, :, :, 0]  # the cache as one long sequence, read through the pages
        ps, out, start = attn_bias.page_size, [], 0
        for b, (lq, lk) in enumerate(zip(attn_bias.q, attn_bias.kv)):
            rows = (attn_bias.table[b, : -(-lk // ps)].long()[:, None] * ps + torch.arange(ps)).reshape(-1)[:lk]
            o, _ = attend(q[0, start:start + lq].reshape(lq, hkv * g, d), kc[rows], vc[rows], scale, attn_bias.causal)
            out.append(o)
            start += lq
        return torch.cat(out).to(q.dtype).view(1, n, hkv, g, d)

    fmha = types.ModuleType("xformers.ops.fmha")
    fmha.attn_bias = ab
    ops = types.ModuleType("xformers.ops")
    ops.fmha, ops.memory_efficient_attention_forward = fmha, forward
    root = types.ModuleType("xformers")
    root.ops = ops
    for name, mod in (("xformers", root), ("xformers.ops", ops), ("xformers.ops.fmha", fmha),
                      ("xformers.ops.fmha.attn_bias", ab)):
        monkeypatch.setitem(sys.modules, name, mod)


PAGE = 64


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [True, False], ids=["interleaved", "in-order"])
def test_xformers_two_paged_calls_with_an_emulated_library(shuffle, monkeypatch):
    calls = []
    fake_xformers(monkeypatch, calls)
    monkeypatch.delenv("ATTNBENCH_XFORMERS_TRITON_ONLY", raising=False)
    spec = BatchSpec(tuple(mixed_requests(8, shuffle=shuffle)), 8, 2, 16, "float32", PAGE, "shuffled")
    batch = materialize(spec, 8)
    be = get_backend_class("xformers")()
    plan = be.plan(batch)
    assert plan.mode == f"paged ({TWO_CALLS})"
    out = be.run(plan)
    assert calls == [True, False]
    rel, mx = compare(out, reference_attention(batch)[0])
    assert rel < 1e-5, (rel, mx)


def test_xformers_triton_only_limits_hold_per_call(monkeypatch):
    """Triton-only mode: each call takes query blocks of one length, at most 16 tokens."""
    import attnbench.backends.xformers as xf

    def rs(reqs):
        b = materialize(BatchSpec(tuple(reqs), 8, 2, 128, "bfloat16", PAGE, "shuffled"), 0)
        return get_backend_class("xformers")().reasons(b)

    cuda_only = ["xformers runs on CUDA devices only"]
    nc = [Request("prefill", 16, c, causal=False) for c in (70, 3)]
    monkeypatch.setattr(xf, "triton_only", lambda opted_in: False)
    assert rs([Request("prefill", 40, 9)] + nc) == cuda_only  # the extension's kernels: any length
    monkeypatch.setattr(xf, "triton_only", lambda opted_in: True)
    assert rs([Request("prefill", 8, 100), nc[0], Request("prefill", 8, 5), nc[1]]) == cuda_only
    r = rs([Request("prefill", 8, 100), Request("prefill", 16, 5)] + nc)
    assert len(r) == 2 and "at most 16 tokens" in r[1] and "[8, 16] in the causal call" in r[1], r
    r = rs([Request("decode", 1, 100), Request("prefill", 16, 5)] + [Request("prefill", 17, 3, causal=False)])
    assert any("in the causal call" in x for x in r) and any("[17] in the non-causal call" in x for x in r), r


# -- GPU --------------------------------------------------------------------------------------
def gpu_mixed_requests(name: str, triton_only: bool) -> list[Request]:
    """What the library takes as two calls: flash-attn any mix (chains and a branching tree
    included); xformers in Triton-only mode one query length per call, at most 16 tokens."""
    nc = [Request("prefill", n, c, causal=False) for n, c in ((16, 700), (16, 40))]
    if name == "xformers" and triton_only:
        causal = [Request("prefill", 8, c) for c in (1500, 0)]
    else:
        causal = [Request("prefill", 33, 500), Request("decode", 1, 3000), Request("prefill", 64, 0)]
    if name == "flash-attn":
        causal += [Request("tree", 8, 300, tuple(chain(7))), Request("prefill", 40, 0, causal=False)]
    return [causal[0], nc[0], *causal[1:], nc[1]]  # interleaved: the gathered path


@pytest.mark.gpu
@pytest.mark.parametrize("name,feature", [("flash-attn", "plain"), ("flash-attn", "window"), ("xformers", "plain")])
def test_two_causality_calls_on_gpu(name, feature):
    """flash-attn with a window too (each call its own window edges); xformers has no window."""
    from .gpu_backends import gpu_backend, skip_for, xformers_triton_only

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    be, why = gpu_backend(name)
    if be is None:
        pytest.skip(f"{name}: {why}")
    tonly = name == "xformers" and xformers_triton_only()
    kw = {"window": 100} if feature == "window" else {}
    spec = BatchSpec(tuple(gpu_mixed_requests(name, tonly)), 32, 8, 128, "bfloat16",
                     {"flash-attn": 256, "xformers": 64}[name], "shuffled", **kw)
    batch = materialize(spec, 21, device="cuda")
    reasons = be.reasons(batch)
    if reasons:
        skip_for(name, reasons)
    plan = be.prepare(batch)
    assert TWO_CALLS in str(plan.mode), plan.mode
    out = be.run(plan)
    torch.cuda.synchronize()
    rel, _ = compare(out, reference_attention(batch)[0])
    assert out.shape == batch.q.shape and out.dtype == batch.dtype
    assert rel < default_tolerance(batch.dtype), f"{name} {feature} ({plan.mode}): rel err {rel:.2e}"
