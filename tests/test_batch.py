import pytest
import torch

from attnbench.workload.batch import LAYOUTS, BatchSpec, Request, page_assignment, request_mask
from attnbench.workload.trees import chain

from .conftest import make_batch

REQS = [Request("decode", 1, 37), Request("prefill", 13, 20), Request("tree", 3, 5, (-1, 0, 0))]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_use_every_page_once_and_keep_page_0_free(layout):
    spec = BatchSpec(tuple(REQS), 4, 2, 16, "float32", 4, layout)
    pages = page_assignment(spec, torch.Generator().manual_seed(3))
    flat = [p for r in pages for p in r]
    assert sorted(flat) == list(range(1, spec.num_pages))
    assert [len(p) for p in pages] == [spec.pages_of(r) for r in REQS]


def test_layout_shapes():
    spec = BatchSpec(tuple(REQS), 4, 2, 16, "float32", 4, "contiguous")
    g = torch.Generator().manual_seed(0)
    assert page_assignment(spec, g) == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19], [20, 21]]
    rev = page_assignment(BatchSpec(tuple(REQS), 4, 2, 16, "float32", 4, "reversed"), g)
    assert rev[0][:3] == [21, 20, 19]
    inter = page_assignment(BatchSpec(tuple(REQS), 4, 2, 16, "float32", 4, "interleaved"), g)
    assert inter[0][:2] == [1, 4] and inter[1][:2] == [2, 5] and inter[2] == [3, 6]
    within = page_assignment(BatchSpec(tuple(REQS), 4, 2, 16, "float32", 4, "shuffled-within"), g)
    assert sorted(within[1]) == list(range(11, 20)) and within[1] != list(range(11, 20))


def test_materialize_is_deterministic_random_and_never_zero():
    a = make_batch(REQS, seed=5)
    b = make_batch(REQS, seed=5)
    c = make_batch(REQS, seed=6)
    assert torch.equal(a.q, b.q) and torch.equal(a.k_cache, b.k_cache) and torch.equal(a.block_table, b.block_table)
    assert not torch.equal(a.q, c.q)
    for t in (a.q, a.k_cache, a.v_cache):
        assert (t != 0).float().mean() > 0.99  # random everywhere, null page and tails too
    assert a.block_table.dtype == torch.int32
    assert a.block_table[2, 2:].eq(0).all()  # unused entries hold the null page
    assert a.query_start_loc.tolist() == [0, 1, 14, 17]
    assert a.kv_lens.tolist() == [38, 33, 8]


def test_gather_kv_follows_the_block_table():
    b = make_batch(REQS, page_size=3)
    k, v = b.gather_kv(1)
    ps = 3
    for j in (0, 4, 32):
        page = b.block_table[1, j // ps].item()
        assert torch.equal(k[j], b.k_cache[page, j % ps])
        assert torch.equal(v[j], b.v_cache[page, j % ps])


def test_masks():
    m = request_mask(Request("prefill", 3, 2))
    assert m.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    # a chain tree is exactly the prefill mask
    assert torch.equal(request_mask(Request("tree", 4, 7, tuple(chain(3)))), request_mask(Request("prefill", 4, 7)))
    t = request_mask(Request("tree", 3, 2, (-1, 0, 0)))
    assert t.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]


def test_positions_of_tree_nodes():
    b = make_batch([Request("tree", 6, 10, (-1, 0, 0, 1, 1, 2))])
    assert b.positions(0).tolist() == [10, 11, 11, 12, 12, 12]


def test_describe_counts_requests_by_what_it_shows():
    """Dynamic trees of one size but different shapes read as one run of requests."""
    from attnbench.workload.spec import BatchSpec, Request, describe

    trees = [Request("tree", 4, 4096, parents, True) for parents in ((-1, 0, 0, 1), (-1, 0, 1, 2), (-1, 0, 0, 0))]
    spec = BatchSpec(num_q_heads=4, num_kv_heads=2, head_dim=16, dtype="float32", page_size=16, layout="contiguous",
                     requests=tuple(trees + [Request("decode", 1, 4096)] * 2 + [Request("prefill", 37, 64)]))
    assert describe(spec) == "3 dynamic tree(4)@4k + 2 decode@4k + 1 prefill 37@64"
