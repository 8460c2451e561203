"""Flex's BlockMask built from per-block KV indices (attnbench/backends/_flex_blocks.py): the
block lists agree with the mask (every visible key in a listed block, every full block wholly
visible), and the flex backend matches the reference with small blocks (so full, partial and
empty blocks all occur) for every variant, layout and odd page size, in both mask builds. On the CPU Flex's unfused path applies the mask_mod to every entry (it
ignores the block lists), so the lists are checked on their own here; the GPU script runs the
fused kernel, which skips what the lists leave out."""
import pytest
import torch

from attnbench.backend import make_backend
from attnbench.backends import flex as flex_mod
from attnbench.backends._flex_blocks import kv_block_lists, row_tables
from attnbench.workload.reference import compare, default_tolerance, reference_attention

from .test_variants import FEATURES, batch_for


def _dense_masks(batch, qmax, lmax):
    out = torch.zeros(batch.num_requests, qmax, lmax, dtype=torch.bool)
    for i, r in enumerate(batch.requests):
        out[i, : r.query, : r.kv_len] = batch.mask(i)
    return out


@pytest.mark.parametrize("feature", ["plain", "window1", "window4", "all"])
@pytest.mark.parametrize("block", [1, 2, 4, 16])
def test_block_lists_cover_the_mask_and_full_blocks_are_full(feature, block):
    b = batch_for(feature, seed=3)
    qmax, lmax = int(b.host.query_lens.max()), int(b.host.kv_lens.max())
    t = row_tables(b, qmax, lmax)
    kv_num, kv_idx, full_num, full_idx = kv_block_lists(t, lmax, block, block)
    nqb, nkb = -(-qmax // block), -(-lmax // block)
    listed = torch.zeros(b.num_requests, nqb, nkb, dtype=torch.bool)
    full = torch.zeros_like(listed)
    for bi in range(b.num_requests):
        for qb in range(nqb):
            listed[bi, qb, kv_idx[bi, 0, qb, : kv_num[bi, 0, qb]].long()] = True
            full[bi, qb, full_idx[bi, 0, qb, : full_num[bi, 0, qb]].long()] = True
    assert not (listed & full).any()  # a block is partial or full, never both
    m = _dense_masks(b, qmax, lmax)
    pad = torch.zeros(b.num_requests, nqb * block, nkb * block, dtype=torch.bool)
    pad[:, :qmax, :lmax] = m
    blocks = pad.view(b.num_requests, nqb, block, nkb, block)
    seen = blocks.any(4).any(2)
    assert not (seen & ~(listed | full)).any(), "a visible key in a block no list names"
    rows_real = torch.zeros(b.num_requests, nqb * block, dtype=torch.bool)
    rows_real[:, :qmax] = t.real
    for bi, qb, kb in full.nonzero().tolist():
        real = rows_real[bi, qb * block:(qb + 1) * block]
        assert blocks[bi, qb, real, kb].all(), (bi, qb, kb)
    if block == 1:  # with one-key blocks the partial lists are exactly the mask, minus full ones
        assert listed.sum() + full.sum() >= m.sum()


@pytest.mark.slow
@pytest.mark.parametrize("mask", ["blocks", "dense"])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_flex_matches_the_reference_with_small_blocks(feature, mask, monkeypatch):
    monkeypatch.setattr(flex_mod, "BLOCK", 4)
    b = batch_for(feature, seed=11)
    be = make_backend(f"flex:mask={mask}")
    assert be.reasons(b) == []
    out = be.run(be.prepare(b))
    ref, _ = reference_attention(b)
    assert compare(out, ref)[0] < default_tolerance(b.dtype)


@pytest.mark.slow
@pytest.mark.parametrize("layout, page_size", [("contiguous", 1), ("reversed", 5), ("interleaved", 3)])
def test_flex_all_features_in_other_layouts(layout, page_size, monkeypatch):
    monkeypatch.setattr(flex_mod, "BLOCK", 8)
    b = batch_for("all", layout=layout, page_size=page_size, seed=page_size)
    be = make_backend("flex")
    ref, _ = reference_attention(b)
    assert compare(be.run(be.prepare(b)), ref)[0] < default_tolerance(b.dtype)


def test_flex_mode_names_the_mask_build():
    b = batch_for("plain", seed=1)
    assert make_backend("flex").prepare(b).mode.startswith("blocks block mask")
    assert make_backend("flex:mask=dense").prepare(b).mode.startswith("dense block mask")
