"""The FlashInfer cascade route's page layout, checked on the CPU: the two levels it hands to
FlashInfer, computed here in float64 (level 0 unmasked, level 1 under FlashInfer's
bottom-right causal rule or the custom mask) and merged by LSE, equal the reference."""
import pytest
import torch

from attnbench.backend import canonical_spec, make_backend
from attnbench.backends.flashinfer_cascade import CASCADE_ENV, cascade_layout, unique_mask_flat
from attnbench.workload.batch import LAYOUTS, BatchSpec, Request, materialize
from attnbench.workload.reference import merge_attention_states, reference_attention
from attnbench.workload.trees import from_choices

TREE = tuple(from_choices([[0], [1], [0, 0], [1, 0], [1, 1]]))


def group(kind, n, query, context, prefix, gid, parents=None):
    return [Request(kind, query, context, parents, shared_prefix=prefix, prefix_group=gid) for _ in range(n)]


DECODES = group("decode", 3, 1, 21, 13, 0) + group("prefill", 2, 4, 9, 8, 1)
TREES = group("tree", 2, len(TREE), 10, 10, 0, TREE) + group("decode", 2, 1, 30, 17, 1)


def attend(q, k, v, mask, scale):
    """q [M, Hq, D], k/v [L, Hkv, D], mask [M, L] -> (o [M, Hq, D], lse [M, Hq]) in float64."""
    g = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(g, 1)
    v = v.double().repeat_interleave(g, 1)
    s = torch.einsum("mhd,lhd->hml", q.double(), k) * scale
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("hml,lhd->mhd", torch.exp(s - lse[..., None]), v)
    return o, lse.transpose(0, 1)


def level_kv(batch, level, seg):
    ps = batch.page_size
    a, b = int(level.kv_indptr[seg]), int(level.kv_indptr[seg + 1])
    pages = level.kv_indices[a:b].long()
    n = (b - a - 1) * ps + int(level.last_page_len[seg])
    flat = lambda c: c[pages].reshape(-1, batch.num_kv_heads, batch.head_dim)[:n]  # noqa: E731
    return flat(batch.k_cache), flat(batch.v_cache)


def emulate(batch, layout):
    out = []
    for lv, name in ((layout.shared, "shared"), (layout.unique, "unique")):
        o = torch.zeros(batch.num_tokens, batch.num_q_heads, batch.head_dim, dtype=torch.float64)
        lse = torch.zeros(batch.num_tokens, batch.num_q_heads, dtype=torch.float64)
        flat_mask = unique_mask_flat(batch, layout) if name == "unique" else None
        used = 0
        for seg in range(len(lv.qo_indptr) - 1):
            q0, q1 = int(lv.qo_indptr[seg]), int(lv.qo_indptr[seg + 1])
            k, v = level_kv(batch, lv, seg)
            m, l = q1 - q0, k.shape[0]
            if name == "shared":
                mask = torch.ones(m, l, dtype=torch.bool)
            elif batch.requests[seg].tree_parents is not None:
                mask = flat_mask[used : used + m * l].view(m, l)
            else:  # FlashInfer's causal rule, bottom-right aligned on this level's keys
                mask = torch.arange(l)[None, :] <= (l - m + torch.arange(m))[:, None]
            used += m * l if name == "unique" else 0
            o[q0:q1], lse[q0:q1] = attend(batch.q[q0:q1], k, v, mask, batch.scale)
        out.append((o, lse))
    (o0, s0), (o1, s1) = out
    return merge_attention_states(o1, s1.float(), o0, s0.float())[0]


@pytest.mark.slow
@pytest.mark.parametrize("reqs", [DECODES, TREES], ids=["decode+chunked", "trees+decodes"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("page", [1, 4, 8])  # every group shares at least one whole page
def test_two_levels_equal_the_reference(reqs, layout, page):
    batch = materialize(BatchSpec(tuple(reqs), 4, 2, 16, "float32", page, layout), seed=page)
    lay = cascade_layout(batch)
    assert lay is not None
    # level 0 holds each group's shared pages once; level 1 each request's own pages
    assert int(lay.shared.kv_indptr[-1]) == sum(batch.spec.shared_pages(batch.requests[m[0]])
                                              for m in batch.spec.prefix_groups().values())
    assert int(lay.shared.qo_indptr[-1]) == int(lay.unique.qo_indptr[-1]) == batch.num_tokens
    ref, _ = reference_attention(batch)
    err = (emulate(batch, lay).float() - ref).norm() / ref.norm()
    assert err < 1e-5


def test_cascade_applies_only_where_every_request_shares_pages(monkeypatch):
    spec = lambda reqs, page=4: materialize(BatchSpec(tuple(reqs), 4, 2, 16, "float32", page), 0)  # noqa: E731
    assert cascade_layout(spec([Request("decode", 1, 30)] * 2)) is None  # nothing shared
    assert cascade_layout(spec(DECODES + [Request("decode", 1, 30)])) is None  # one request outside
    split = group("decode", 1, 1, 21, 13, 0) + group("decode", 1, 1, 21, 13, 1) + group("decode", 1, 1, 21, 13, 0)
    assert cascade_layout(spec(split)) is None  # a group's requests not consecutive
    assert cascade_layout(spec(group("decode", 2, 1, 21, 3, 0))) is None  # a prefix shorter than a page
    assert cascade_layout(spec(DECODES)) is not None
    monkeypatch.setenv(CASCADE_ENV, "0")  # the option's default, recorded in the identity
    assert make_backend("flashinfer").option("cascade") == "off"
    assert canonical_spec("flashinfer") == "flashinfer:cascade=off"
    monkeypatch.setenv(CASCADE_ENV, "1")
    assert make_backend("flashinfer").option("cascade") == "on"
    assert canonical_spec("flashinfer") == "flashinfer"
