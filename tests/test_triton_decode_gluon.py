"""The Gluon decode option's host side on the CPU (issue 33, decode round 1): which batches it takes, the plan it
makes (the shipped plan on the kernel's tiles: 64 keys, 128 at head dim 64) and that it falls back to the shipped
kernel where the Gluon kernel cannot run (the CPU: Gluon has no interpreter), with the reference's outputs. The
kernel itself runs on a GPU: tests/test_gluon_decode_gpu.py."""
from __future__ import annotations

import pytest
import torch

from .interpreted import import_interpreted

# the shipped kernels interpreted on a CPU machine, before anything imports them compiled
import_interpreted("attnbench.backends.triton_kernels", "attnbench.backends.triton_paged")

from attnbench.backends import triton_decode_gluon as dec  # noqa: E402
from attnbench.backends.triton_paged import TritonBackend  # noqa: E402
from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402
from attnbench.workload.reference import compare, reference_attention  # noqa: E402


@pytest.fixture(autouse=True)
def _interpret():
    """The CPU runs the shipped kernels under Triton's interpreter (tests/interpreted.py): alone,
    this file imported them compiled and failed on triton's "0 active drivers". A patch of its
    own: a test's monkeypatch.undo() leaves it set."""
    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "1")
        yield


def _decodes(*ctxs, hq=32, hkv=8, d=128, dtype="bfloat16", page_size=16, kv_dtype="fp8_e4m3", **kw):
    fp8 = dict(kv_dtype=kv_dtype, kv_scale="per-head") if kv_dtype else {}
    reqs = tuple(Request("decode", 1, c) for c in ctxs)
    return materialize(BatchSpec(reqs, hq, hkv, d, dtype=dtype, page_size=page_size, **fp8, **kw), 1)


@pytest.mark.slow
def test_unwanted_takes_fp8_decodes_alone_and_says_why_not_otherwise(monkeypatch):
    """On a Hopper GPU (patched in): decodes alone over an FP8 cache (either format, scales per tensor or per head),
    16-bit q, head dim 64/128, G <= 16, pages of 16 or 32 keys or a multiple of 64, windows, sinks and
    soft-capping but no ALiBi; each thing it does not take says so; 16-bit caches only with FP8_ONLY off."""
    monkeypatch.setattr(dec, "hopper", lambda device: True)
    for kv in ("fp8_e4m3", "fp8_e5m2"):
        assert dec.wanted(_decodes(100, 0, 5000, kv_dtype=kv))
    assert dec.wanted(_decodes(100, d=64, page_size=256, dtype="float16"))
    assert dec.wanted(_decodes(100, hq=16, hkv=1, page_size=32))  # G 16
    assert dec.unwanted(_decodes(100, hq=32, hkv=1)).startswith("head dim 128, page 16, G 32")
    for kw in (dict(page_size=48), dict(page_size=8), dict(d=96), dict(d=256)):  # page 8: slower (MIN_PAGE)
        assert dec.unwanted(_decodes(100, **kw)).startswith("head dim"), kw
    for variant in (dict(window=32), dict(sinks=True), dict(softcap=30.0), dict(window=100, sinks=True, softcap=5.0)):
        assert dec.wanted(_decodes(100, **variant)), variant  # the kernel's own variants
    assert dec.unwanted(_decodes(100, alibi=True)).startswith("ALiBi")
    assert dec.unwanted(_decodes(100, alibi=True, window=32)).startswith("ALiBi")
    assert dec.unwanted(_decodes(100, kv_dtype=None)) == "not a 16-bit q over an FP8 cache"
    assert dec.unwanted(_decodes(100, kv_dtype=None, dtype="float32")) == "not a 16-bit q over an FP8 cache"
    monkeypatch.setattr(dec, "FP8_ONLY", False)
    assert dec.wanted(_decodes(100, kv_dtype=None))
    assert dec.unwanted(_decodes(100, kv_dtype=None, dtype="float32")).startswith("not a 16-bit q with")
    mixed = materialize(BatchSpec((Request("decode", 1, 40), Request("prefill", 5, 0)), 8, 2, 128, dtype="bfloat16",
                                  page_size=16, kv_dtype="fp8_e4m3"), 1)
    tree = materialize(BatchSpec((Request("tree", 3, 40, (-1, 0, 0)),), 8, 2, 128, dtype="bfloat16", page_size=16,
                                 kv_dtype="fp8_e4m3"), 1)
    assert dec.unwanted(mixed) == dec.unwanted(tree) == "not decodes alone"
    monkeypatch.setattr(dec, "hopper", lambda device: False)
    assert dec.unwanted(_decodes(100)) == "not a Hopper GPU"


@pytest.mark.slow
def test_the_option_plans_64_key_tiles_and_falls_back_on_the_cpu(monkeypatch):
    """Where wanted (patched here) the plan's full tiles are 64 keys (its splits start on them), the rest of the
    shipped decode config kept; on the CPU the shipped kernel runs the plan and matches the reference."""
    monkeypatch.setattr(dec, "wanted", lambda batch: True)
    b = _decodes(150, 0, 1000, 63, hq=8, hkv=2, d=32, dtype="float16")
    for splits in (None, 3):
        be = TritonBackend(decode="gluon", splits=splits)
        p = be.plan(b)
        shipped = TritonBackend(splits=splits).plan(b).cfg
        assert p.cfg.block_nf == 64 and (p.cfg.block_m, p.cfg.block_n) == (shipped.block_m, shipped.block_n)
        assert all(int(u[4]) % 64 == 0 for u in p.units.cpu().numpy())  # kv_lo on a 64-key tile
        assert not p.gluon_decode and "Hopper" in dec.fit(p)
        assert compare(be.run(p), reference_attention(b)[0])[0] < 2e-2
    assert TritonBackend(decode="gluon", block_nf=32).plan(b).cfg.block_nf == 32  # a config the caller sets wins


@pytest.mark.slow
def test_a_windowed_plan_starts_on_the_tile_holding_the_window_and_keeps_its_variants(monkeypatch):
    """With a window, sinks and soft-capping (the variants the Gluon decode kernel takes): every unit's keys lie in
    its window's tiles (kv_lo on the 64-key tile holding the unit's ``win_lo``, which is the decode's position minus
    the window plus one), and the plan the shipped kernel runs on the CPU matches the reference."""
    from attnbench.backends.triton_plan import COL

    monkeypatch.setattr(dec, "wanted", lambda batch: True)
    ctxs = (150, 0, 1000, 63, 4097)
    b = _decodes(*ctxs, hq=8, hkv=2, d=32, dtype="float16", window=100, sinks=True, softcap=8.0)
    for splits in (None, 3):
        be = TritonBackend(decode="gluon", splits=splits)
        p = be.plan(b)
        assert {k for k, v in p.feat.constexprs().items() if v} >= {"FP8", "WINDOW", "SINK", "SOFTCAP"}
        units = p.units.cpu().numpy()
        for u in units:
            win_lo = max(0, ctxs[u[COL["req"]]] - 100 + 1)
            assert u[COL["win_lo"]] == win_lo and u[COL["kv_lo"]] >= win_lo // 64 * 64
            assert u[COL["kv_lo"]] % 64 == 0 and u[COL["kv_hi"]] <= ctxs[u[COL["req"]]] + 1
        assert compare(be.run(p), reference_attention(b)[0])[0] < 2e-2


def test_a_plan_the_kernel_fits_is_run_by_it_then_merged(monkeypatch):
    """The plan decides once whether the Gluon decode kernel runs it (the row's 'ran as' names it) and run launches
    it, then the split merge (here fit and the launch are stand-ins: Gluon has no interpreter); a plan fit refuses
    runs the shipped kernel and matches the reference; off Hopper the row says nothing more."""
    from attnbench.backends import triton_launch

    calls, merged = [], []
    b = _decodes(300, 7, hq=8, hkv=2, d=64, dtype="float16")
    assert TritonBackend(decode="gluon").plan(b).mode == "interpreted (TRITON_INTERPRET=1)"
    monkeypatch.setattr(dec, "hopper", lambda device: True)
    monkeypatch.setattr(dec, "fit", lambda p: "")
    monkeypatch.setattr(dec, "run", lambda p: calls.append(p))
    monkeypatch.setattr(triton_launch, "merge", lambda p, pdl=False: merged.append(p) or p.out)
    be = TritonBackend(decode="gluon")
    p = be.plan(b)
    assert p.gluon_decode and p.mode.endswith("gluon decode kernel")
    assert be.run(p) is p.out and calls == [p] and merged == [p]
    monkeypatch.undo()
    monkeypatch.setattr(dec, "hopper", lambda device: True)
    monkeypatch.setattr(dec, "fit", lambda p: "not here")
    be.forget_shapes()
    p = be.plan(b)
    assert not p.gluon_decode and "shipped kernel, not Gluon's decode kernel: not here" in p.mode, p.mode
    assert compare(be.run(p), reference_attention(b)[0])[0] < 2e-2


def test_the_option_is_checked():
    with pytest.raises(ValueError, match="decode 'gl'"):
        TritonBackend(decode="gl")


def test_pages_under_copy_below_are_copied_in_16_byte_pieces_of_whole_rows(monkeypatch):
    """``COPY_BELOW`` (and ``COPY_DIMS``): the cp.async layout covers a key row with 16-byte pieces (16 FP8 or 8
    16-bit values a thread), the threads of a warp over whole rows, 4 warps over the tile's rows; pages at or past it
    keep the TMA boxes."""
    monkeypatch.setattr(dec, "COPY_BELOW", 64)
    monkeypatch.setattr(dec, "COPY_DIMS", (64, 128))
    for d, kv, vec in ((128, "fp8_e4m3", 16), (64, "fp8_e5m2", 16), (128, None, 8), (64, None, 8)):
        lay = dec.copy_layout(_decodes(100, d=d, kv_dtype=kv, page_size=16))
        assert list(lay.size_per_thread) == [1, vec] and list(lay.threads_per_warp) == [32 * vec // d, d // vec], d
        assert list(lay.warps_per_cta) == [4, 1]
        assert dec.copy_layout(_decodes(100, d=d, kv_dtype=kv, page_size=64)) is None
    monkeypatch.setattr(dec, "COPY_DIMS", (64,))
    assert dec.copy_layout(_decodes(100, page_size=16)) is None and dec.copy_layout(_decodes(100, d=64, page_size=16))
    monkeypatch.setattr(dec, "COPY_BELOW", 0)
    assert dec.copy_layout(_decodes(100, d=64, page_size=16)) is None


@pytest.mark.slow
def test_tiles_follow_the_head_dim(monkeypatch):
    """``TILES``: a head dim's own tile size (128 keys for head dim 64 where set) shapes the plan's full tiles and
    its splits; other head dims keep 64-key tiles; the plan run on the CPU matches the reference."""
    monkeypatch.setattr(dec, "wanted", lambda batch: True)
    monkeypatch.setattr(dec, "TILES", {64: 128})
    b64 = _decodes(150, 0, 1000, 300, hq=8, hkv=2, d=64, dtype="float16")
    for splits in (None, 3):
        p = TritonBackend(decode="gluon", splits=splits).plan(b64)
        assert p.cfg.block_nf == 128 and dec.tile_keys(b64) == 128
        assert all(int(u[4]) % 128 == 0 for u in p.units.cpu().numpy())
        assert compare(TritonBackend(decode="gluon", splits=splits).run(p), reference_attention(b64)[0])[0] < 2e-2
    assert TritonBackend(decode="gluon").plan(_decodes(150, d=128)).cfg.block_nf == 64


def test_run_launches_with_the_tiles_and_the_copy_layout_of_the_batch(monkeypatch):
    """``run``'s launch arguments, the kernel a stand-in (Gluon has no interpreter): head dim 64 takes 128-key tiles,
    pages of 16 keys the cp.async layout (``copy_layout``), pages of 64 TMA boxes (None); head dim 128 64-key tiles.
    The grid is units x KV heads."""
    from attnbench.backends import gluon_decode_kernels as gk

    launches = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, kw))

    monkeypatch.setattr(dec, "hopper", lambda device: True)
    monkeypatch.setattr(dec, "fit", lambda p: "")
    monkeypatch.setattr(gk, "decode_gluon_kernel", Kernel())
    for d, page, keys, copied in ((64, 16, 128, True), (64, 64, 128, False), (128, 16, 64, False)):
        b = _decodes(300, 7, hq=8, hkv=2, d=d, page_size=page)
        p = TritonBackend(decode="gluon").plan(b)
        dec.run(p)
        grid, kw = launches[-1]
        assert grid == (p.units.shape[0] * 2,) and kw["BLOCK_N"] == keys and kw["HEAD_DIM"] == d, (d, page)
        assert (kw["COPY"] is not None) == copied, (d, page)
        if copied:
            assert kw["COPY"] == dec.copy_layout(b)
