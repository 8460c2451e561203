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


@pytest.mark.slow
def test_flex_mode_names_the_mask_build():
    b = batch_for("plain", seed=1)
    assert make_backend("flex").prepare(b).mode.startswith("blocks block mask")
    assert make_backend("flex:mask=dense").prepare(b).mode.startswith("dense block mask")


# --- issue 32: the lists as the fused GPU kernel reads them -------------------------------------
# The Triton kernel finds batch row z's lists at (z * H + h) * stride(head axis): with the size-1
# head axis at stride 0 (numpy's x[:, None]), every row read row 0's lists. The CPU never runs
# that kernel, so these tests read the lists by its formula (attnbench/backends/_flex_audit.py).

import random  # noqa: E402

from attnbench.backends._flex_audit import (  # noqa: E402
    contiguous_strides, effective_mask, emulate_kernel, kernel_block_sets, mask_grid, stride_problems)
from attnbench.backends._flex_blocks import block_mask_from_kv_blocks, make_mask_mod  # noqa: E402
from attnbench.workload.batch import Request  # noqa: E402
from attnbench.workload.trees import random_tree  # noqa: E402

from .conftest import make_batch  # noqa: E402


def _random_requests(rng):
    reqs = []
    for _ in range(rng.randint(2, 7)):
        kind = rng.choice(["decode", "prefill", "prefill-nc", "tree", "tree"])
        ctx = rng.choice([0, 1, rng.randint(2, 70)])
        if kind == "decode":
            reqs.append(Request("decode", 1, ctx))
        elif kind == "prefill":
            reqs.append(Request("prefill", rng.randint(1, 23), ctx))
        elif kind == "prefill-nc":
            reqs.append(Request("prefill", rng.randint(1, 11), ctx, causal=False))
        else:
            n = rng.randint(1, 13)
            tree = tuple(random_tree({"nodes": n, "max_depth": min(n - 1, 4) or 0, "max_children": 3,
                                      "seed": rng.randint(0, 99)}))
            reqs.append(Request("tree", n, ctx, tree))
    return reqs


def _random_case(seed):
    rng = random.Random(seed)
    variants = {}
    if rng.random() < 0.5:
        variants["window"] = rng.randint(1, 25)
    if rng.random() < 0.3:
        variants["alibi"] = True
    hq, hkv = rng.choice([(4, 1), (6, 2), (2, 2)])
    b = make_batch(_random_requests(rng), hq=hq, hkv=hkv, d=8, page_size=rng.choice([1, 3, 5, 16]),
                   layout="shuffled", seed=seed, **variants)
    return b, rng.choice([1, 2, 4, 8, 16])


def _blocks_mask(b, block):
    qmax, lmax = int(b.host.query_lens.max()), int(b.host.kv_lens.max())
    t = row_tables(b, qmax, lmax)
    mm = make_mask_mod(t, b.window)
    return block_mask_from_kv_blocks(t, qmax, lmax, mm, block), mm, t, qmax, lmax


@pytest.mark.parametrize("seed", range(40))
def test_the_kernel_reads_lists_that_give_exactly_the_mask(seed):
    """Random mixed batches (trees, odd lengths, windows, shuffled odd pages, block sizes 1-16):
    the block-mask tensors have the strides the Triton kernel assumes, it finds each row's own
    lists, and the mask it then applies (full blocks without the mask_mod, partial ones with it,
    nothing elsewhere) is the batch's mask on every real query row."""
    b, block = _random_case(seed)
    bm, mm, t, qmax, lmax = _blocks_mask(b, block)
    assert stride_problems(bm) == []
    kp, kf = kernel_block_sets(bm, lmax, kernel=True)
    lp, lf = kernel_block_sets(bm, lmax, kernel=False)
    assert torch.equal(kp, lp) and torch.equal(kf, lf), "the kernel reads other rows' lists"
    grid = mask_grid(mm, b.num_requests, qmax, lmax)
    eff = effective_mask(bm, mm, b.num_requests, qmax, lmax, grid=grid)
    real = t.real[:, None, :, None].expand_as(eff)  # padding rows are dropped from the output
    assert torch.equal(eff[real], grid[real])
    m = _dense_masks(b, qmax, lmax)
    assert torch.equal(eff[real], m[:, None].expand_as(eff)[real])



def test_block_list_tensors_are_row_major_and_aligned():
    b, _ = _random_case(3)
    bm, *_ = _blocks_mask(b, 4)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        x = getattr(bm, name)
        assert x.dtype == torch.int32 and x.shape[1] == 1
        assert tuple(x.stride()) == contiguous_strides(x.shape), name
        assert (x.storage_offset() * x.element_size()) % 16 == 0, name


def test_a_block_mask_with_a_zero_head_stride_is_refused(monkeypatch):
    """What broke the H100 runs: refused before it reaches a kernel."""
    from attnbench.backends import _flex_blocks

    b, _ = _random_case(5)
    real = _flex_blocks.kv_block_lists

    def zero_head_stride(*a, **k):
        return tuple(torch.as_strided(x, x.shape, (x.stride(0), 0) + tuple(x.stride()[2:])) for x in real(*a, **k))

    monkeypatch.setattr(_flex_blocks, "kv_block_lists", zero_head_stride)
    with pytest.raises(RuntimeError, match="strides the kernel does not expect"):
        _blocks_mask(b, 4)


ISSUE_FEATURES = {"plain": {}, "window": dict(window=7), "sinks": dict(sinks=True), "alibi": dict(alibi=True),
                  "softcap": dict(softcap=2.0), "window+sinks+alibi": dict(window=9, sinks=True, alibi=True)}


def _issue_like_batch(feature, seed=0):
    """The H100 failure in small: trees at a longer context first, then decodes at a shorter one
    (GQA 4:1), and a prefill longer than a query block; odd pages, shuffled."""
    trees = [tuple(random_tree({"nodes": 6, "max_depth": 3, "max_children": 3, "seed": s})) for s in range(3)]
    reqs = [Request("tree", 6, 40, tr) for tr in trees]
    reqs += [Request("decode", 1, 17), Request("decode", 1, 29), Request("prefill", 11, 0), Request("tree", 6, 3, trees[0])]
    return make_batch(reqs, hq=4, hkv=1, d=16, page_size=3, seed=seed, **ISSUE_FEATURES[feature])


@pytest.mark.parametrize("mask", ["blocks", "dense"])
@pytest.mark.parametrize("feature", list(ISSUE_FEATURES))
@pytest.mark.slow
def test_the_emulated_fused_kernel_matches_the_reference_per_request(feature, mask, monkeypatch):
    monkeypatch.setattr(flex_mod, "BLOCK", 4)
    b = _issue_like_batch(feature)
    be = make_backend(f"flex:mask={mask}")
    out = emulate_kernel(be, be.prepare(b))
    ref, _ = reference_attention(b)
    starts = [0] + list(torch.tensor([r.query for r in b.requests]).cumsum(0).tolist())
    for i in range(b.num_requests):
        rel = compare(out[starts[i]:starts[i + 1]], ref[starts[i]:starts[i + 1]])[0]
        assert rel < default_tolerance(b.dtype), f"request {i} ({b.requests[i].kind}): rel err {rel:.2e}"


def test_padding_rows_do_not_shape_the_lists():
    """A decode beside a tree (Qmax 12, block 4): its padding rows no longer pull key 0 into its
    hull (a windowed decode reads only its window's blocks) nor keep its blocks partial."""
    tree = tuple(random_tree({"nodes": 12, "max_depth": 4, "max_children": 3, "seed": 1}))
    reqs = [Request("tree", 12, 40, tree), Request("decode", 1, 90)]
    for window, want_partial, want_full in ((8, {20, 22}, {21}), (None, {22}, set(range(22)))):
        b = make_batch(reqs, hq=4, hkv=1, d=8, page_size=3, **({"window": window} if window else {}))
        bm, *_ = _blocks_mask(b, 4)
        p, f = kernel_block_sets(bm, int(b.host.kv_lens.max()))
        assert set(p[1, 0, 0].nonzero().flatten().tolist()) == want_partial, window
        assert set(f[1, 0, 0].nonzero().flatten().tolist()) == want_full, window
        assert not (p[1, 0, 1:] | f[1, 0, 1:]).any()  # query blocks of padding rows only read nothing
