"""The Gluon prefill option's host side on the CPU (issue 33, prefill round 3): which batches it
takes, the 2-d TMA views of the caches (every key row of a page where the kernel's row formula
puts it), and that the option falls back to the prefill kernel where it cannot run (the CPU:
Gluon has no interpreter), with the reference's outputs. The kernel itself runs on a GPU:
tests/test_gluon_prefill_gpu.py."""
from __future__ import annotations

import pytest
import torch

from attnbench.backends import triton_prefill_gluon as gluon
from attnbench.workload.batch import BatchSpec, Request, materialize


@pytest.mark.parametrize("order", ["NHD", "HND"])
def test_kv_view_rows_follow_the_kernels_row_formula(order):
    spec = BatchSpec((Request("prefill", 40, 300),), 8, 2, 64, dtype="float16", page_size=128, kv_order=order,
                     layout="shuffled")
    b = materialize(spec, 3)
    for cache in (b.k_cache, b.v_cache):
        view, row_page, row_head, col_head = gluon.kv_view(cache)
        pages, page, heads, d = cache.shape
        for pg in (0, pages - 1):
            for h in range(heads):
                for slot in (0, 37, page - 1):
                    row = pg * row_page + h * row_head + slot
                    assert torch.equal(view[row, h * col_head:h * col_head + d], cache[pg, slot, h]), (order, pg, h)


def test_kv_view_refuses_a_strided_cache():
    b = materialize(BatchSpec((Request("prefill", 9, 0),), 4, 2, 64, dtype="float16", page_size=64), 1)
    assert gluon.kv_view(b.k_cache[:, :32]) is None


def test_fit_names_what_is_missing_on_the_cpu():
    b = materialize(BatchSpec((Request("prefill", 9, 0),), 4, 2, 64, dtype="float16", page_size=64), 1)

    class P:
        batch, cfg = b, None

    assert "Hopper" in gluon.fit(P())


def test_off_hopper_the_rows_mode_is_the_shipped_kernels():
    """Off Hopper (here the CPU: Gluon has no interpreter) the Gluon kernel is never a candidate: the
    default plan keeps the shipped config and the plan's mode (a row's 'ran as') stays 'interpreted'."""
    from attnbench.backends.triton_paged import TritonBackend

    prefill = materialize(BatchSpec((Request("prefill", 70, 0), Request("prefill", 90, 20)), 4, 2, 64,
                                    dtype="float16", page_size=64), 1)
    for be in (TritonBackend(), TritonBackend(prefill="lean,fold,heavy,gluon")):
        p = be.plan(prefill)
        assert p.mode == "interpreted (TRITON_INTERPRET=1)" and p.cfg.block_q != 128


def _prefills(*lens, **kw):
    spec = dict(dtype="float16", page_size=64) | kw
    return materialize(BatchSpec(tuple(Request("prefill", n, 10) for n in lens), 8, 2, 128, **spec), 1)


def test_wanted_takes_causal_prefills_of_64_tokens_or_more_and_nothing_else(monkeypatch):
    """The default plan's gate (on a Hopper GPU, patched in here): plain causal prefills of >= 64 tokens
    each with 16-bit caches, head dim 64/128 and pages of a multiple of 64; each thing the kernel does
    not measure or take turns it off."""
    monkeypatch.setattr(gluon, "hopper", lambda device: True)
    assert gluon.wanted(_prefills(64, 300))
    assert not gluon.wanted(_prefills(63, 300))  # a short chunk
    assert not gluon.wanted(materialize(BatchSpec((Request("prefill", 300, 0), Request("decode", 1, 50)), 8, 2, 128,
                                                  dtype="float16", page_size=64), 1))
    assert not gluon.wanted(materialize(BatchSpec((Request("prefill", 300, 0), Request("tree", 3, 50, (-1, 0, 0))),
                                                  8, 2, 128, dtype="float16", page_size=64), 1))
    assert not gluon.wanted(_prefills(64, 300, page_size=16))
    assert not gluon.wanted(materialize(BatchSpec((Request("prefill", 80, 0, causal=False),), 8, 2, 128,
                                                  dtype="float16", page_size=64), 1))  # bidirectional
    assert not gluon.wanted(materialize(BatchSpec((Request("prefill", 80, 0),), 8, 2, 96, dtype="float16",
                                                  page_size=64), 1))
    for variant in (dict(window=32), dict(sinks=True), dict(softcap=30.0), dict(alibi=True),
                    dict(kv_dtype="fp8_e4m3")):
        assert not gluon.wanted(_prefills(80, 100, **variant)), variant
    monkeypatch.setattr(gluon, "hopper", lambda device: False)
    assert not gluon.wanted(_prefills(64, 300))


def test_one_backend_shapes_each_page_size_for_itself(monkeypatch):
    """The per-shape cache keys on the page size (and the variants): one backend that plans the same
    query lengths at page 16 and then at page 256 (a page-size sweep) shapes the second for the Gluon
    kernel (Hopper patched in), and the first again as before."""
    from attnbench.backends.triton_paged import TritonBackend

    monkeypatch.setattr(gluon, "hopper", lambda device: True)
    be = TritonBackend()
    small, big = (_prefills(96, 300, page_size=page) for page in (16, 256))
    assert be.plan(small).cfg.block_q != 128
    assert be.plan(big).cfg.block_q == 128
    assert be.plan(small).cfg.block_q != 128
    assert be.plan(_prefills(96, 300, page_size=256, sinks=True)).cfg.block_q != 128


def test_on_hopper_a_mixed_batchs_row_says_why_not_gluons(monkeypatch):
    """On a Hopper GPU (patched in) a prefill beside a decode keeps the shipped config and kernel, and the
    row's 'ran as' gives ``unwanted``'s reason (the decode), not fit's complaint about the unit size."""
    from attnbench.backends.triton_paged import TritonBackend

    monkeypatch.setattr(gluon, "hopper", lambda device: True)
    b = materialize(BatchSpec((Request("prefill", 300, 0), Request("decode", 1, 50)), 8, 2, 128,
                              dtype="float16", page_size=64), 1)
    assert gluon.unwanted(b).startswith("a request of 1 query tokens")
    p = TritonBackend().plan(b)
    assert p.cfg.block_q != 128 and "not Gluon's: a request of 1 query tokens" in p.mode, p.mode
    assert gluon.unwanted(_prefills(64, 300)) == ""


@pytest.mark.slow
@pytest.mark.parametrize("hq,hkv,block_q", [(8, 2, 128), (32, 8, 128), (16, 2, 64), (4, 4, 128)])
def test_the_default_plan_shapes_its_units_for_the_gluon_kernel_where_wanted(monkeypatch, hq, hkv, block_q):
    """Where ``wanted`` (patched here), the default plan's units are 128 (G <= 4) or 64 tokens of one
    KV head's G query heads with 64-key tiles, which ``fit`` takes; a config the caller sets wins; the
    plan still runs (here the shipped prefill kernel, Gluon having no interpreter) and matches the
    reference."""
    from attnbench.backends.triton_paged import TritonBackend
    from attnbench.workload.reference import compare, reference_attention

    monkeypatch.setattr(gluon, "wanted", lambda batch: True)
    b = materialize(BatchSpec((Request("prefill", 150, 0), Request("prefill", 77, 40)), hq, hkv, 64,
                              dtype="float32", page_size=64), 2)
    p = TritonBackend().plan(b)
    assert (p.cfg.block_q, p.cfg.block_n) == (block_q, 64)
    assert "block_q" not in gluon.fit(p)  # (the CPU's reason: no Hopper)
    assert TritonBackend(block_m=64).plan(b).cfg.block_m == 64
    assert compare(TritonBackend().run(p), reference_attention(b)[0])[0] < 1e-4


def test_the_gluon_round_script_parses_and_names_existing_variants():
    """scripts/gpu/gpu_gluon_round.sh (one device call: the GPU tests and the timing rows) is valid bash
    and its default variants exist in scripts/dev/triton_variants.py."""
    from .scripts import round_script_variants

    rc, default, names = round_script_variants("scripts/gpu/gpu_gluon_round.sh")
    assert rc == 0
    assert default and set(default) <= names, set(default) - names
