"""Shared prefixes (`shared_prefix: N`): whole pages shared by the group's requests in every
page layout, the partial last page copied, the byte floor counting shared pages once, every
CPU backend equal to the reference on them, and the scenario errors."""
import pytest
import torch

from attnbench.backend import get_backend_class
from attnbench.measure.metrics import work_of
from attnbench.workload.batch import LAYOUTS, BatchSpec, Request, materialize, page_assignment
from attnbench.workload.reference import compare, default_tolerance, reference_attention
from attnbench.workload.scenario import ScenarioError, load_text
from attnbench.workload.trees import from_choices

TREE = tuple(from_choices([[0], [1], [0, 0], [1, 0], [1, 1]]))


def shared(kind, n, query, context, prefix, group, parents=None):
    return [Request(kind, query, context, parents, shared_prefix=prefix, prefix_group=group) for _ in range(n)]


# page 4: group 0 shares 3 whole pages (13 tokens: 12 on shared pages, 1 copied), group 2 exactly
# 2 pages, group 3 a prefix shorter than a page (copies only); requests without sharing between
REQS = (
    shared("decode", 3, 1, 21, 13, 0)
    + [Request("prefill", 5, 7)]
    + shared("tree", 2, len(TREE), 8, 8, 2, TREE)
    + shared("prefill", 2, 3, 6, 3, 3)
    + [Request("decode", 1, 0)]
)


def spec(layout="shuffled", page=4, reqs=REQS, **kw):
    return BatchSpec(tuple(reqs), kw.get("hq", 4), kw.get("hkv", 2), kw.get("d", 16), kw.get("dtype", "float32"), page, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_shares_whole_pages_once(layout):
    sp = spec(layout)
    pages = page_assignment(sp, torch.Generator().manual_seed(5))
    assert [len(p) for p in pages] == [sp.pages_of(r) for r in REQS]
    for members, s in ((range(0, 3), 3), (range(4, 6), 2)):
        firsts = {tuple(pages[i][:s]) for i in members}
        assert len(firsts) == 1  # the same physical pages, in the same logical order
    distinct = {p for row in pages for p in row}
    assert distinct == set(range(1, sp.num_pages))  # every page used, none twice except shared ones
    assert sp.num_pages == 1 + sum(sp.pages_of(r) for r in REQS) - (2 * 3 + 1 * 2)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shared_prefix_tokens_are_equal_and_the_rest_is_not(layout):
    b = materialize(spec(layout), seed=3)
    for members, n in ((range(0, 3), 13), (range(4, 6), 8), (range(6, 8), 3)):
        k0, v0 = b.gather_kv(members[0])
        for i in members[1:]:
            k, v = b.gather_kv(i)
            assert torch.equal(k[:n], k0[:n]) and torch.equal(v[:n], v0[:n])
            assert not torch.equal(k[n : n + 1], k0[n : n + 1])  # the request's own tokens differ


def test_unshared_layouts_are_unchanged():
    plain = BatchSpec(tuple(Request(r.kind, r.query, r.context, r.tree_parents) for r in REQS), 4, 2, 16, "float32", 4, "contiguous")
    pages = page_assignment(plain, torch.Generator().manual_seed(0))
    assert [p for row in pages for p in row] == list(range(1, plain.num_pages))


def test_minimum_bytes_count_a_shared_page_once():
    sp = spec()
    plain = BatchSpec(tuple(Request(r.kind, r.query, r.context, r.tree_parents) for r in REQS), 4, 2, 16, "float32", 4)
    per_slot = 2 * 2 * 16 * 4  # K and V, 2 KV heads, d 16, float32
    saved = (2 * 3 * 4 + 1 * 2 * 4) * per_slot  # group 0: 2 extra readers of 3 pages; group 2: 1 of 2
    assert work_of(plain).bytes - work_of(sp).bytes == saved
    assert work_of(plain).flops == work_of(sp).flops


def check(name, batch):
    be = get_backend_class(name)()
    assert be.unsupported(batch) == []
    out = be.run(be.plan(batch))
    ref, _ = reference_attention(batch)
    rel, _ = compare(out, ref)
    assert rel < default_tolerance(batch.dtype), f"{name}: rel err {rel}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reference", "sdpa", "flex"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("page", [1, 4, 16])
def test_cpu_backends_on_shared_pages(name, layout, page):
    check(name, materialize(spec(layout, page), seed=page))


def test_reference_equals_an_unshared_copy():
    """The same tokens on private pages give the same attention: the reference reads shared
    pages through the block table and nothing else."""
    b = materialize(spec("interleaved"), seed=1)
    plain_spec = BatchSpec(tuple(Request(r.kind, r.query, r.context, r.tree_parents) for r in REQS), 4, 2, 16, "float32", 4, "contiguous")
    p = materialize(plain_spec, seed=1)
    for i, r in enumerate(REQS):
        k, v = b.gather_kv(i)
        n = plain_spec.pages_of(r)
        rows = p.block_table[i, :n].long()  # contiguous private pages: one slice of the cache
        assert torch.equal(rows, torch.arange(int(rows[0]), int(rows[0]) + n))
        p.k_cache[rows[0] : rows[0] + n].view(-1, 2, 16)[: r.kv_len] = k
        p.v_cache[rows[0] : rows[0] + n].view(-1, 2, 16)[: r.kv_len] = v
    p.q.copy_(b.q)
    assert not torch.equal(p.block_table, b.block_table)
    assert torch.equal(reference_attention(b)[0], reference_attention(p)[0])


HEAD = "model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16}\nkv_cache: {page_size: 4}\nbatch:\n"


def test_scenario_groups_share_within_themselves():
    sf = load_text(HEAD + "  - {kind: decode, count: 3, context: 40, shared_prefix: 32}\n"
                   "  - {kind: decode, count: 2, context: 40, shared_prefix: 32}\n", "s.yaml")
    reqs = sf.scenario.batch_spec().requests
    assert [r.prefix_group for r in reqs] == [0, 0, 0, 1, 1] and {r.shared_prefix for r in reqs} == {32}
    pages = page_assignment(sf.scenario.batch_spec(), torch.Generator().manual_seed(0))
    assert pages[0][:8] == pages[2][:8] and pages[3][:8] == pages[4][:8] and not set(pages[0]) & set(pages[3])


@pytest.mark.parametrize(
    "group, needle",
    [
        ("{kind: decode, count: 2, context: 40, shared_prefix: 41}",
         "batch.0: shared_prefix (41) is larger than the context (40): the shared prompt is part of the cached context; lower shared_prefix or raise context"),
        ("{kind: prefill, count: 2, query: 8, shared_prefix: 4}", "batch.0: shared_prefix (4) is larger than the context (0)"),
        ("{kind: decode, context: 40, shared_prefix: -1}", "batch.0.shared_prefix: Input should be greater than or equal to 0"),
        ("{kind: decode, context: 40, compare_with: [chain]}", "batch.0: compare_with is only for kind: tree (this group is kind: decode); remove it here"),
        ("{kind: tree, context: 40, tree: {chain: 3}, compare_with: [tree]}", "batch.0.compare_with.0: 'tree' is not one of chain, decode"),
    ],
)
def test_bad_groups_get_one_message(group, needle):
    with pytest.raises(ScenarioError) as e:
        load_text(HEAD + f"  - {group}\n", "s.yaml")
    assert str(e.value).startswith(f"s.yaml: {needle}") and "\n" not in str(e.value)
