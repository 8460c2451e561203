"""The gluon-prefill route's host side on the CPU (issue 33, prefill round 3): which batches it takes (and which
auto leaves to the Triton prefill route), the 2-d TMA views of the caches (every key row of a page where the
kernel's row formula puts it), and its plan, run through the Triton prefill launch on the CPU (Gluon has no
interpreter) against the reference. The kernel itself runs on a GPU: tests/test_gluon_prefill_gpu.py."""
from __future__ import annotations

import pytest
import torch

from .interpreted import import_interpreted, interpret_on_cpu  # noqa: F401 (an autouse fixture)

# the shipped kernels interpreted on a CPU machine, before anything imports them compiled (alone,
# this file imported them compiled and failed on triton's "0 active drivers")
import_interpreted("attnbench.kernels.paged.kernels", "attnbench.backends.triton")

from attnbench.backends.triton import TritonBackend  # noqa: E402
from attnbench.kernels import routes  # noqa: E402
from attnbench.kernels.prefill import gluon  # noqa: E402
from attnbench.kernels.shared.gluon import kv_view  # noqa: E402
from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402


@pytest.mark.parametrize("order", ["NHD", "HND"])
def test_kv_view_rows_follow_the_kernels_row_formula(order):
    spec = BatchSpec((Request("prefill", 40, 300),), 8, 2, 64, dtype="float16", page_size=128, kv_order=order,
                     layout="shuffled")
    b = materialize(spec, 3)
    for cache in (b.k_cache, b.v_cache):
        view, row_page, row_head, col_head = kv_view(cache)
        pages, page, heads, d = cache.shape
        for pg in (0, pages - 1):
            for h in range(heads):
                for slot in (0, 37, page - 1):
                    row = pg * row_page + h * row_head + slot
                    assert torch.equal(view[row, h * col_head:h * col_head + d], cache[pg, slot, h]), (order, pg, h)


def test_kv_view_refuses_a_strided_cache():
    b = materialize(BatchSpec((Request("prefill", 9, 0),), 4, 2, 64, dtype="float16", page_size=64), 1)
    assert kv_view(b.k_cache[:, :32]) is None


def _prefills(*lens, **kw):
    spec = dict(dtype="float16", page_size=64) | kw
    return materialize(BatchSpec(tuple(Request("prefill", n, 10) for n in lens), 8, 2, 128, **spec), 1)


def _takes(batch) -> bool:
    """Whether auto takes the route for ``batch``."""
    return not gluon.reasons(batch) and not gluon.declines(batch)


def test_off_hopper_auto_runs_the_triton_prefill_route():
    """Off Hopper (here the CPU) auto runs the Triton prefill kernel on its own plan and the row says so;
    route=gluon-prefill refuses the batch."""
    prefill = materialize(BatchSpec((Request("prefill", 70, 0), Request("prefill", 90, 20)), 4, 2, 64,
                                    dtype="float16", page_size=64), 1)
    p = TritonBackend().plan(prefill)
    assert p.route.name == "prefill" and p.cfg.block_q != 128
    assert p.mode == "interpreted (TRITON_INTERPRET=1); prefill (Triton prefill kernel)"
    assert TritonBackend(route="gluon-prefill").unsupported(prefill) == \
        ["route gluon-prefill: the Gluon prefill kernel needs a Hopper GPU (sm_90)"]


def test_auto_takes_causal_prefills_of_64_tokens_or_more_and_nothing_else(monkeypatch):
    """On a Hopper GPU (patched in): plain causal prefills of >= 64 tokens each (shorter ones: declined, the route
    can take them) with 16-bit caches, head dim 64/128 and pages of a multiple of 64; each thing the kernel does
    not take is a reason."""
    monkeypatch.setattr(gluon, "hopper", lambda device: True)
    assert _takes(_prefills(64, 300))
    assert not gluon.reasons(_prefills(63, 300)) and "63 query tokens" in gluon.declines(_prefills(63, 300))[0]
    assert not _takes(materialize(BatchSpec((Request("prefill", 300, 0), Request("decode", 1, 50)), 8, 2, 128,
                                            dtype="float16", page_size=64), 1))
    assert gluon.reasons(materialize(BatchSpec((Request("prefill", 300, 0), Request("tree", 3, 50, (-1, 0, 0))),
                                               8, 2, 128, dtype="float16", page_size=64), 1))
    assert gluon.reasons(_prefills(64, 300, page_size=16))
    assert gluon.reasons(materialize(BatchSpec((Request("prefill", 80, 0, causal=False),), 8, 2, 128,
                                               dtype="float16", page_size=64), 1))  # bidirectional
    assert gluon.reasons(materialize(BatchSpec((Request("prefill", 80, 0),), 8, 2, 96, dtype="float16",
                                               page_size=64), 1))
    for variant in (dict(window=32), dict(sinks=True), dict(softcap=30.0), dict(alibi=True),
                    dict(kv_dtype="fp8_e4m3")):
        assert gluon.reasons(_prefills(80, 100, **variant)), variant
    monkeypatch.setattr(gluon, "hopper", lambda device: False)
    assert gluon.reasons(_prefills(64, 300)) == ["the Gluon prefill kernel needs a Hopper GPU (sm_90)"]


def test_one_backend_shapes_each_page_size_for_itself(monkeypatch):
    """The route is selected per shape and layout, which key on the page size (and the variants): one backend
    that plans the same query lengths at page 16 and then at page 256 (a page-size sweep) shapes the second for
    the Gluon kernel (Hopper patched in), and the first again as before."""
    monkeypatch.setattr(gluon, "hopper", lambda device: True)
    be = TritonBackend()
    small, big = (_prefills(96, 300, page_size=page) for page in (16, 256))
    assert be.plan(small).cfg.block_q != 128
    assert be.plan(big).cfg.block_q == 128 and be.plan(big).route.name == "gluon-prefill"
    assert be.plan(small).cfg.block_q != 128
    assert be.plan(_prefills(96, 300, page_size=256, sinks=True)).cfg.block_q != 128


@pytest.mark.slow
@pytest.mark.parametrize("hq,hkv,block_q", [(8, 2, 128), (32, 8, 128), (16, 2, 64), (4, 4, 128)])
def test_the_routes_plan_shapes_its_units_for_the_gluon_kernel(monkeypatch, hq, hkv, block_q):
    """The route's units are 128 (G <= 4) or 64 tokens of one KV head's G query heads with 64-key tiles, which
    ``fit`` takes; tile options are refused; the plan run through the Triton prefill launch (Gluon having no
    interpreter) matches the reference."""
    from attnbench.workload.reference import compare, reference_attention

    monkeypatch.setattr(gluon, "reasons", lambda batch: [])
    b = materialize(BatchSpec((Request("prefill", 150, 0), Request("prefill", 77, 40)), hq, hkv, 64,
                              dtype="float32", page_size=64), 2)
    p = TritonBackend(route="gluon-prefill").plan(b)
    assert (p.cfg.block_q, p.cfg.block_n) == (block_q, 64) and gluon.fit(p) == ""
    assert TritonBackend(block_m=64).plan(b).cfg.block_m == 64
    assert "sets block_m itself" in TritonBackend(route="gluon-prefill", block_m=64).unsupported(b)[-1]
    assert compare(routes.BY_NAME["prefill"].launch(p), reference_attention(b)[0])[0] < 1e-4
