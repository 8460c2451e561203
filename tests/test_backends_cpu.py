"""Every backend that runs on the CPU, against the reference, on random inputs: trees, odd
lengths, every page layout, page sizes down to 1, GQA and MHA, several dtypes."""
import pytest

from attnbench.backend import get_backend_class
from attnbench.workload.batch import LAYOUTS, Request
from attnbench.workload.reference import compare, default_tolerance, reference_attention
from attnbench.workload.trees import chain, from_choices, random_tree

from .conftest import make_batch

TREE = tuple(from_choices([[0], [1], [0, 0], [0, 1], [1, 0]]))
RANDOM_TREE = tuple(random_tree({"nodes": 11, "max_depth": 4, "max_children": 3, "seed": 2}))
BIG_TREE = tuple(random_tree({"nodes": 150, "max_depth": 10, "max_children": 4, "seed": 7}))  # three ancestor words

BATCHES = {
    "decode": [Request("decode", 1, c) for c in (0, 1, 17, 63)],
    "prefill": [Request("prefill", 9, 0), Request("prefill", 1, 0), Request("prefill", 16, 0)],
    "chunked": [Request("prefill", 7, 33), Request("prefill", 3, 5)],
    "tree": [Request("tree", len(TREE), 21, TREE), Request("tree", len(RANDOM_TREE), 0, RANDOM_TREE)],
    "chain": [Request("tree", 5, 13, tuple(chain(4)))],
    "big-tree": [Request("tree", len(BIG_TREE), 37, BIG_TREE), Request("tree", 70, 3, tuple(chain(69))),
                 Request("decode", 1, 5)],
    "dynamic-tree": [Request("tree", len(TREE), 21, TREE, True), Request("decode", 1, 7),
                     Request("tree", len(RANDOM_TREE), 3, RANDOM_TREE, True)],
    "mixed": [
        Request("decode", 1, 37),
        Request("prefill", 13, 20),
        Request("tree", len(TREE), 11, TREE),
        Request("prefill", 5, 0),
        Request("tree", len(RANDOM_TREE), 30, RANDOM_TREE),
    ],
}

CPU_BACKENDS = ["sdpa", "flex", "reference"]


def check(name, batch):
    be = get_backend_class(name)()
    assert be.reasons(batch) == []
    out = be.run(be.plan(batch))
    ref, _ = reference_attention(batch)
    assert out.shape == batch.q.shape and out.dtype == batch.dtype
    rel, _ = compare(out, ref)
    assert rel < default_tolerance(batch.dtype), f"{name}: rel err {rel}"
    return rel


@pytest.mark.slow
@pytest.mark.parametrize("name", CPU_BACKENDS)
@pytest.mark.parametrize("kind", list(BATCHES))
def test_backend_matches_reference(name, kind):
    check(name, make_batch(BATCHES[kind], page_size=4, seed=hash(kind) % 1000))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sdpa", "flex"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_layouts_and_page_sizes(name, layout, page_size):
    check(name, make_batch(BATCHES["mixed"], page_size=page_size, layout=layout, seed=page_size))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sdpa", "flex"])
@pytest.mark.parametrize("hq, hkv", [(4, 4), (8, 2), (6, 1)])
def test_gqa_groups(name, hq, hkv):
    check(name, make_batch(BATCHES["mixed"], hq=hq, hkv=hkv, d=16))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sdpa", "flex"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit(name, dtype):
    rel = check(name, make_batch(BATCHES["mixed"], dtype=dtype, d=64))
    assert rel > 0  # 16-bit inputs, computed in 16 bits: some rounding must show


def test_uniform_batches_use_unmasked_sdpa():
    from attnbench.backends.sdpa import SdpaBackend

    dec = make_batch([Request("decode", 1, 40)] * 3)
    assert SdpaBackend().plan(dec).mask is None
    pre = make_batch([Request("prefill", 8, 0)] * 2)
    p = SdpaBackend().plan(pre)
    assert p.mask is None and p.is_causal
    check("sdpa", dec)
    check("sdpa", pre)


def test_a_wrong_backend_is_caught():
    """The check is not vacuous: a backend that ignores the tree mask fails it."""
    import dataclasses

    b = make_batch(BATCHES["tree"])
    causal = tuple(Request("prefill", r.query, r.context) for r in BATCHES["tree"])
    same_data_causal = dataclasses.replace(b, spec=dataclasses.replace(b.spec, requests=causal), _masks={})
    be = get_backend_class("sdpa")()
    plan = be.plan(same_data_causal)
    ref, _ = reference_attention(b)
    rel, _ = compare(be.run(plan), ref)
    assert rel > 1e-2
