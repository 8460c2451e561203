"""The gluon-decode route's host side on the CPU (issue 33, decode round 1): which batches it takes (and which auto
leaves to the paged route), the plan it makes (the paged plan on the kernel's tiles: 64 keys, 128 at head dim 64),
run through the paged launch on the CPU (Gluon has no interpreter) against the reference, and its launch arguments
with the kernel stood in. The kernel itself runs on a GPU: tests/test_gluon_decode_gpu.py."""
from __future__ import annotations

import pytest
import torch

from .interpreted import import_interpreted, interpret_on_cpu  # noqa: F401 (an autouse fixture)

# the shipped kernels interpreted on a CPU machine, before anything imports them compiled (alone,
# this file imported them compiled and failed on triton's "0 active drivers")
import_interpreted("attnbench.kernels.paged.kernels", "attnbench.backends.triton")

from attnbench.kernels import routes  # noqa: E402
from attnbench.kernels.decode import gluon as dec  # noqa: E402
from attnbench.backends.triton import TritonBackend  # noqa: E402
from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402
from attnbench.workload.reference import compare, reference_attention  # noqa: E402


def _decodes(*ctxs, hq=32, hkv=8, d=128, dtype="bfloat16", page_size=16, kv_dtype="fp8_e4m3", **kw):
    fp8 = dict(kv_dtype=kv_dtype, kv_scale="per-head") if kv_dtype else {}
    reqs = tuple(Request("decode", 1, c) for c in ctxs)
    return materialize(BatchSpec(reqs, hq, hkv, d, dtype=dtype, page_size=page_size, **fp8, **kw), 1)


def _first(reasons: list[str]) -> str:
    return reasons[0] if reasons else ""


def test_reasons_take_decodes_alone_and_auto_takes_fp8_ones(monkeypatch):
    """On a Hopper GPU (patched in): decodes alone (either FP8 format, scales per tensor or per head, or 16-bit),
    16-bit q, head dim 64/128, G <= 16, pages of 8, 16 or 32 keys or a multiple of 64, windows, sinks and
    soft-capping but no ALiBi; each thing it does not take says so; auto declines 16-bit caches and page 8."""
    monkeypatch.setattr(dec, "hopper", lambda device: True)
    for kv in ("fp8_e4m3", "fp8_e5m2"):
        assert dec.reasons(_decodes(100, 0, 5000, kv_dtype=kv)) == [] and not dec.declines(_decodes(100, kv_dtype=kv))
    assert dec.reasons(_decodes(100, d=64, page_size=256, dtype="float16")) == []
    assert dec.reasons(_decodes(100, hq=16, hkv=1, page_size=32)) == []  # G 16
    assert "(head dim 128, page 16, G 32)" in _first(dec.reasons(_decodes(100, hq=32, hkv=1)))
    for kw in (dict(page_size=48), dict(page_size=4), dict(d=96), dict(d=256)):
        assert "takes head dim 64/128" in _first(dec.reasons(_decodes(100, **kw))), kw
    assert dec.reasons(_decodes(100, page_size=8)) == [] and "page 8" in _first(dec.declines(_decodes(100, page_size=8)))
    for variant in (dict(window=32), dict(sinks=True), dict(softcap=30.0), dict(window=100, sinks=True, softcap=5.0)):
        assert dec.reasons(_decodes(100, **variant)) == [], variant  # the kernel's own variants
    assert "ALiBi" in _first(dec.reasons(_decodes(100, alibi=True, window=32)))
    assert dec.reasons(_decodes(100, kv_dtype=None)) == [] and "16-bit cache" in dec.declines(_decodes(100, kv_dtype=None))[0]
    assert "16-bit q" in _first(dec.reasons(_decodes(100, kv_dtype=None, dtype="float32")))
    mixed = materialize(BatchSpec((Request("decode", 1, 40), Request("prefill", 5, 0)), 8, 2, 128, dtype="bfloat16",
                                  page_size=16, kv_dtype="fp8_e4m3"), 1)
    tree = materialize(BatchSpec((Request("tree", 3, 40, (-1, 0, 0)),), 8, 2, 128, dtype="bfloat16", page_size=16,
                                 kv_dtype="fp8_e4m3"), 1)
    assert _first(dec.reasons(mixed)) == _first(dec.reasons(tree)) == \
        "the Gluon decode kernel takes decodes alone (one query token a request, no tree)"
    monkeypatch.setattr(dec, "hopper", lambda device: False)
    assert dec.reasons(_decodes(100)) == ["the Gluon decode kernel needs a Hopper GPU (sm_90)"]


@pytest.mark.slow
def test_the_route_plans_64_key_tiles_and_matches_the_reference(monkeypatch):
    """The route's plan has 64-key full tiles (its splits start on them), the rest of the paged decode config
    kept; run through the paged launch on the CPU it matches the reference; a block_nf option is refused."""
    monkeypatch.setattr(dec, "reasons", lambda batch: [])
    b = _decodes(150, 0, 1000, 63, hq=8, hkv=2, d=32, dtype="float16")
    for splits in (None, 3):
        p = TritonBackend(route="gluon-decode", splits=splits).plan(b)
        paged = TritonBackend(route="paged", splits=splits).plan(b).cfg
        assert p.cfg.block_nf == 64 and (p.cfg.block_m, p.cfg.block_n) == (paged.block_m, paged.block_n)
        assert all(int(u[4]) % 64 == 0 for u in p.units.cpu().numpy())  # kv_lo on a 64-key tile
        assert compare(routes.BY_NAME["paged"].launch(p), reference_attention(b)[0])[0] < 2e-2
    assert "sets block_nf itself" in TritonBackend(route="gluon-decode", block_nf=32).unsupported(b)[-1]
    assert TritonBackend(block_nf=32).plan(b).cfg.block_nf == 32  # auto: the paged route takes the option


@pytest.mark.slow
def test_a_windowed_plan_starts_on_the_tile_holding_the_window_and_keeps_its_variants(monkeypatch):
    """With a window, sinks and soft-capping (the variants the Gluon decode kernel takes): every unit's keys lie in
    its window's tiles (kv_lo on the 64-key tile holding the unit's ``win_lo``, which is the decode's position minus
    the window plus one), and the plan run through the paged launch on the CPU matches the reference."""
    from attnbench.kernels.shared.plan import COL

    monkeypatch.setattr(dec, "reasons", lambda batch: [])
    ctxs = (150, 0, 1000, 63, 4097)
    b = _decodes(*ctxs, hq=8, hkv=2, d=32, dtype="float16", window=100, sinks=True, softcap=8.0)
    for splits in (None, 3):
        p = TritonBackend(route="gluon-decode", splits=splits).plan(b)
        assert {k for k, v in p.feat.constexprs().items() if v} >= {"FP8", "WINDOW", "SINK", "SOFTCAP"}
        units = p.units.cpu().numpy()
        for u in units:
            win_lo = max(0, ctxs[u[COL["req"]]] - 100 + 1)
            assert u[COL["win_lo"]] == win_lo and u[COL["kv_lo"]] >= win_lo // 64 * 64
            assert u[COL["kv_lo"]] % 64 == 0 and u[COL["kv_hi"]] <= ctxs[u[COL["req"]]] + 1
        assert compare(routes.BY_NAME["paged"].launch(p), reference_attention(b)[0])[0] < 2e-2


def test_auto_selects_the_route_on_hopper_and_run_launches_it(monkeypatch):
    """On Hopper (patched in) auto selects the route for FP8 decodes and the row names it; run launches its kernel
    (a stand-in: Gluon has no interpreter), then the split merge; 16-bit decodes stay on the paged route."""
    from attnbench.kernels.decode import gluon_kernels as gk
    from attnbench.kernels.shared import launch as kl

    launches, merged = [], []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, kw))

    b = _decodes(300, 7, hq=8, hkv=2, d=64, dtype="float16")
    assert TritonBackend().plan(b).route.name == "paged"
    monkeypatch.setattr(dec, "hopper", lambda device: True)
    monkeypatch.setattr(gk, "decode_gluon_kernel", Kernel())
    monkeypatch.setattr(kl, "merge", lambda p: merged.append(p) or p.out)
    be = TritonBackend()
    p = be.plan(b)
    assert p.route.name == "gluon-decode" and p.mode.endswith("gluon-decode (Gluon decode kernel)")
    assert be.run(p) is p.out and len(launches) == 1 and merged == [p]
    assert be.plan(_decodes(300, 7, hq=8, hkv=2, d=64, dtype="float16", kv_dtype=None)).route.name == "paged"


def test_copy_layout_covers_whole_key_rows_in_16_byte_pieces():
    """``copy_below`` (and ``copy_dims``): the cp.async layout covers a key row with 16-byte pieces (16 FP8 or 8
    16-bit values a thread), the threads of a warp over whole rows, 4 warps over the tile's rows; pages at or past it
    keep the TMA boxes."""
    wide = dec.Tuning(copy_below=64, copy_dims=(64, 128))
    for d, kv, vec in ((128, "fp8_e4m3", 16), (64, "fp8_e5m2", 16), (128, None, 8), (64, None, 8)):
        lay = dec.copy_layout(_decodes(100, d=d, kv_dtype=kv, page_size=16), wide)
        assert list(lay.size_per_thread) == [1, vec] and list(lay.threads_per_warp) == [32 * vec // d, d // vec], d
        assert list(lay.warps_per_cta) == [4, 1]
        assert dec.copy_layout(_decodes(100, d=d, kv_dtype=kv, page_size=64), wide) is None
    assert dec.copy_layout(_decodes(100, page_size=16)) is None and dec.copy_layout(_decodes(100, d=64, page_size=16))
    assert dec.copy_layout(_decodes(100, d=64, page_size=16), dec.Tuning(copy_below=0)) is None


@pytest.mark.slow
def test_tiles_follow_the_head_dim(monkeypatch):
    """``TILES``: head dim 64 takes 128-key tiles, which shape the plan's full tiles and its splits; other head dims
    keep 64-key tiles; the plan run through the paged launch on the CPU matches the reference."""
    monkeypatch.setattr(dec, "reasons", lambda batch: [])
    b64 = _decodes(150, 0, 1000, 300, hq=8, hkv=2, d=64, dtype="float16")
    for splits in (None, 3):
        p = TritonBackend(route="gluon-decode", splits=splits).plan(b64)
        assert p.cfg.block_nf == 128 and dec.tile_keys(b64) == 128
        assert all(int(u[4]) % 128 == 0 for u in p.units.cpu().numpy())
        assert compare(routes.BY_NAME["paged"].launch(p), reference_attention(b64)[0])[0] < 2e-2
    assert TritonBackend(route="gluon-decode").plan(_decodes(150, d=128)).cfg.block_nf == 64


def test_the_launch_takes_the_tiles_and_the_copy_layout_of_the_batch(monkeypatch):
    """The launch's arguments, the kernel a stand-in (Gluon has no interpreter): head dim 64 takes 128-key tiles,
    pages of 16 keys the cp.async layout (``copy_layout``), pages of 64 TMA boxes (None); head dim 128 64-key tiles.
    The grid is units x KV heads."""
    from attnbench.kernels.decode import gluon_kernels as gk

    launches = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, kw))

    monkeypatch.setattr(dec, "reasons", lambda batch: [])
    monkeypatch.setattr(gk, "decode_gluon_kernel", Kernel())
    for d, page, keys, copied in ((64, 16, 128, True), (64, 64, 128, False), (128, 16, 64, False)):
        b = _decodes(300, 7, hq=8, hkv=2, d=d, page_size=page)
        p = TritonBackend(route="gluon-decode").plan(b)
        dec.launch(p)
        grid, kw = launches[-1]
        assert grid == (p.units.shape[0] * 2,) and kw["BLOCK_N"] == keys and kw["HEAD_DIM"] == d, (d, page)
        assert (kw["COPY"] is not None) == copied, (d, page)
        if copied:
            assert kw["COPY"] == dec.copy_layout(b)
