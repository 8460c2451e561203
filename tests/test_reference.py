import math

import torch

from attnbench.workload.batch import Request
from attnbench.workload.reference import compare, merge_attention_states, reference_attention
from attnbench.workload.trees import chain

from .conftest import make_batch


def naive(batch):
    """Token-by-token float64 attention straight from docs/semantics.md, as an independent oracle."""
    out = torch.zeros(batch.q.shape, dtype=torch.float64)
    g = batch.num_q_heads // batch.num_kv_heads
    for i, r in enumerate(batch.requests):
        k, v = batch.gather_kv(i)
        anc = None
        if r.tree_parents is not None:
            anc = []
            for node in range(r.query):
                s, x = {node}, node
                while r.tree_parents[x] >= 0:
                    x = r.tree_parents[x]
                    s.add(x)
                anc.append(s)
        for t in range(r.query):
            row = batch.query_start[i] + t
            keys = [j for j in range(r.kv_len) if (j <= r.context + t if anc is None else (j < r.context or (j - r.context) in anc[t]))]
            for h in range(batch.num_q_heads):
                qv = batch.q[row, h].double()
                kk = k[keys, h // g].double()
                w = torch.softmax(kk @ qv * batch.scale, 0)
                out[row, h] = w @ v[keys, h // g].double()
    return out


def test_reference_matches_naive(mixed_requests):
    b = make_batch(mixed_requests, page_size=3)
    out, lse = reference_attention(b)
    rel, _ = compare(out, naive(b))
    assert rel < 1e-6
    assert torch.isfinite(lse).all()


def test_chain_tree_equals_prefill():
    b1 = make_batch([Request("tree", 5, 9, tuple(chain(4)))], seed=1)
    b2 = make_batch([Request("prefill", 5, 9)], seed=1)
    o1, _ = reference_attention(b1)
    o2, _ = reference_attention(b2)
    assert torch.allclose(o1, o2, atol=1e-6)


def test_merge_of_two_halves_is_the_whole():
    torch.manual_seed(0)
    q = torch.randn(3, 2, 8, dtype=torch.float64)
    k = torch.randn(20, 2, 8, dtype=torch.float64)
    v = torch.randn(20, 2, 8, dtype=torch.float64)

    def part(ks):
        s = torch.einsum("nhd,lhd->nhl", q, k[ks])
        lse = torch.logsumexp(s, -1)
        return torch.einsum("nhl,lhd->nhd", torch.softmax(s, -1), v[ks]), lse

    whole, lse_w = part(slice(0, 20))
    a, la = part(slice(0, 7))
    b, lb = part(slice(7, 20))
    m, lm = merge_attention_states(a, la, b, lb)
    assert torch.allclose(m.double(), whole, atol=1e-6)
    assert torch.allclose(lm.double(), lse_w, atol=1e-5)
    # a side that saw no keys gives the other side
    empty = torch.full_like(la, -math.inf)
    m2, _ = merge_attention_states(torch.zeros_like(a), empty, a, la)
    assert torch.allclose(m2.double(), a.double())


def test_compare_flags_nan():
    x = torch.randn(4, 2, 3)
    y = x.clone()
    y[0, 0, 0] = float("nan")
    assert compare(y, x)[0] == math.inf
    assert compare(x, x)[0] == 0.0


def test_a_mismatch_says_which_requests_and_heads_and_by_how_much():
    """check_output names the requests (kind, index) and heads over the tolerance and the worst."""
    from attnbench.execute.runner import check_output
    from attnbench.workload.batch import materialize
    from attnbench.workload.reference import reference_attention
    from attnbench.workload.scenario import load_text

    text = """
name: m
model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
kv_cache: {page_size: 4, layout: shuffled}
batch:
  - {kind: decode, count: 3, context: 19}
  - {kind: tree, count: 2, context: 7, tree: {choices: [[0], [1], [0, 0]]}}
"""
    case = load_text(text, "m.yaml").cases[0]
    batch = materialize(case.scenario.batch_spec(), 0, torch.device("cpu"))
    ref = reference_attention(batch)[0]
    out = ref.clone().to(batch.dtype)
    qsl = batch.query_start_loc.tolist()
    out[qsl[4]:qsl[5], 2] += 0.5  # the second tree (request 4), head 2
    status, reason, rel, _ = check_output(out, ref, batch, 1e-4)
    assert status == "mismatch"
    assert "over it: requests tree 4 (1 of 5), heads 2 (1 of 4)" in reason, reason
    assert "worst: request tree 4 at" in reason and "x the tolerance), head 2 at" in reason
    assert check_output(ref.clone().to(batch.dtype), ref, batch, 1e-4)[0] == "ok"
