"""The Gluon MLA option's host side on the CPU (issue 33, MLA round 2): which batches its plan shapes for the
kernel (bf16/fp16 decodes of DeepSeek-V3's latent row on a Hopper GPU), why the others keep the Triton MLA
kernel, the plan it makes (64-row units, 64-key tiles, splits for one program an SM, 16-bit partials), that
it is on by default and changes nothing off Hopper, and that its plan, run by the Triton MLA kernel (Gluon
has no interpreter), matches the reference. The kernel itself runs on a GPU: tests/test_gluon_mla_gpu.py."""
from __future__ import annotations

import pytest
import torch

from .interpreted import import_interpreted, interpret_on_cpu  # noqa: F401 (an autouse fixture)

_kernels, _paged = import_interpreted("attnbench.kernels.mla.kernels", "attnbench.backends.triton")

from attnbench.kernels.mla import plan as triton_mla  # noqa: E402
from attnbench.kernels.mla import gluon as mg  # noqa: E402
from attnbench.kernels.shared import plan as tp  # noqa: E402
from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402
from attnbench.workload.reference import compare, reference_attention  # noqa: E402
from attnbench.workload.trees import chain  # noqa: E402

TritonBackend = _paged.TritonBackend
INTERPRETED = _kernels.INTERPRETED and _paged.triton_mode() == "interpreted"


def mla(reqs, hq=128, *, dtype="bfloat16", page=64, rank=512, rope=64, kv_dtype=None, seed=0):
    spec = BatchSpec(tuple(reqs), hq, 1, rank + rope, dtype, page, "shuffled", attention="mla", kv_lora_rank=rank,
                     rope_dim=rope, **({"kv_dtype": kv_dtype} if kv_dtype else {}))
    return materialize(spec, seed)


DECODES = tuple(Request("decode", 1, c) for c in (1000, 63, 1, 65))


@pytest.fixture
def on_hopper(monkeypatch):
    monkeypatch.setattr(mg, "hopper", lambda device: True)


def _first(reasons: list[str]) -> str:
    return reasons[0] if reasons else ""


def test_reasons_take_16_bit_decodes_and_mtp_chains_of_deepseeks_latent_row(on_hopper):
    """On Hopper: 16-bit decodes and MTP chains of kv_lora_rank 512 / rope_dim 64, at any head count, pages of 8,
    16, 32 keys or a multiple of 64; each thing it does not take is a reason in words."""
    for hq in (128, 16, 1, 96):
        assert mg.reasons(mla(DECODES, hq)) == [], hq
    for page in (8, 16, 32, 64, 128):
        assert mg.reasons(mla(DECODES, page=page)) == [], page
    assert mg.reasons(mla(DECODES, dtype="float16")) == []
    for page in (4, 48):
        assert f"(page {page})" in _first(mg.reasons(mla(DECODES, page=page))), page
    assert "16-bit q" in _first(mg.reasons(mla(DECODES, dtype="float32")))
    assert "16-bit q" in _first(mg.reasons(mla(DECODES, kv_dtype="fp8_e4m3")))
    assert "(kv_lora_rank 256, rope_dim 64)" in _first(mg.reasons(mla(DECODES, rank=256)))
    assert "(kv_lora_rank 512, rope_dim 32)" in _first(mg.reasons(mla(DECODES, rope=32)))
    mtp = (Request("tree", 3, 100, tuple(chain(2))), Request("decode", 1, 5), Request("tree", 2, 0, tuple(chain(1))))
    assert all(mg.reasons(mla(mtp, hq)) == [] for hq in (128, 64, 16, 96))  # MTP chains
    assert mg.reasons(mla((Request("tree", 1, 100, (-1,)),))) == []  # a one-node tree: a decode
    why = "the Gluon MLA kernel takes decodes and MTP chains"
    assert _first(mg.reasons(mla(DECODES + (Request("tree", 3, 100, (-1, 0, 0)),)))).startswith(why)  # branching
    assert _first(mg.reasons(mla(DECODES + (Request("tree", 3, 100, tuple(chain(2)), tree_dynamic=True),)))) \
        .startswith(why)
    assert _first(mg.reasons(mla(DECODES + (Request("prefill", 5, 9),)))).startswith(why)


def test_off_hopper_auto_runs_the_triton_mla_route():
    """Off Hopper (the CPU here) auto plans and runs the Triton MLA kernel; route=gluon-mla refuses the batch."""
    b = mla(DECODES)
    assert mg.reasons(b) == ["the Gluon MLA kernel needs a Hopper GPU (sm_90)"]
    p = TritonBackend().plan(b)
    assert p.route.name == "mla" and p.mode.endswith("; mla (Triton MLA kernel)") and p.cfg.block_m == 128
    assert TritonBackend(route="gluon-mla").unsupported(b)[-1] == \
        "route gluon-mla: the Gluon MLA kernel needs a Hopper GPU (sm_90)"


def test_auto_takes_the_route_and_route_mla_keeps_the_triton_kernel(on_hopper):
    """On Hopper auto plans decodes for the Gluon kernel (thirteenth session: faster at 128 and 16 heads);
    ``route=mla`` keeps the Triton MLA kernel's wide config, and its row names that kernel."""
    p = TritonBackend().plan(mla(DECODES))
    assert p.cfg.block_m == 64 and p.cfg.value_chunks == 1
    off = TritonBackend(route="mla").plan(mla(DECODES))
    assert off.route.name == "mla" and off.cfg.block_m == 128 and "gluon" not in off.mode


@pytest.mark.slow
@pytest.mark.parametrize("hq,units_per_request", [(128, 2), (16, 1)])
def test_the_plan_is_shaped_for_the_kernel(on_hopper, monkeypatch, hq, units_per_request):
    """64-row units (two a 128-head decode, one a 16-head one), 64-key tiles, splits for one program an SM on
    132 SMs (8 x 16k at 128 heads: 8 splits, 128 programs), 16-bit partials, one value program a unit."""
    monkeypatch.setattr(tp, "num_sms", lambda device: 132)
    b = mla(tuple(Request("decode", 1, 16384) for _ in range(8)), hq)
    p = TritonBackend().plan(b)
    assert p.route.name == "gluon-mla" and p.mode.endswith("gluon-mla (Gluon MLA kernel)"), p.mode
    assert (p.cfg.block_m, p.cfg.block_n, p.cfg.value_chunks, p.cfg.waves) == (64, 64, 1, 1)
    units = p.units.cpu().numpy()
    assert len(units) <= 132 and len({(u[0], u[1]) for u in units}) == 8 * units_per_request
    assert (units[:, 3] % 64 == 0).all() and (units[:, 2] == min(hq, 64)).all()
    assert p.num_merge and p.po.dtype == torch.bfloat16
    monkeypatch.setattr(mg, "HALF_PARTIALS", False)
    assert TritonBackend().plan(b).po.dtype == torch.float32


def test_refused_batches_run_the_triton_mla_route_and_a_forced_route_skips_them(on_hopper):
    """A batch the route does not take keeps the Triton MLA route's own config; forced, it is skipped with the
    route's reasons; tile options are refused by the route (it sets them)."""
    branching = mla((Request("tree", 3, 100, (-1, 0, 0)),) * 2)
    p = TritonBackend().plan(branching)
    assert p.route.name == "mla" and p.cfg == TritonBackend(route="mla").plan(branching).cfg
    assert "takes decodes and MTP chains" in TritonBackend(route="gluon-mla").unsupported(branching)[-1]
    assert TritonBackend().plan(mla((Request("tree", 3, 100, tuple(chain(2))),), 16)).route.name == "gluon-mla"
    assert TritonBackend().plan(mla(DECODES, page=48)).route.name == "mla"
    assert "sets block_m itself" in TritonBackend(route="gluon-mla", block_m=16).unsupported(mla(DECODES, 16))[-1]


@pytest.mark.slow
def test_the_kernels_plan_through_the_triton_kernel_matches_the_reference(on_hopper):
    """The option's units and merge rows (forced splits too), run by the Triton MLA kernel under the
    interpreter (the Gluon kernel reads the same units), give the reference's output."""
    if not INTERPRETED:
        pytest.skip("triton was imported compiled in this process")
    b = mla((Request("decode", 1, 300), Request("decode", 1, 0), Request("decode", 1, 129)), 16, dtype="float16",
            page=16, seed=3)
    for splits in (None, 3):
        p = TritonBackend(splits=splits).plan(b)
        assert p.route.name == "gluon-mla" and p.cfg.block_m == 64
        p.out.fill_(float("nan"))
        out = triton_mla.launch(p)  # the CPU: the Triton MLA kernel over the same units
        assert not torch.isnan(out).any()
        assert compare(out, reference_attention(b)[0])[0] < 3e-3
        assert (p.num_merge > 0) == (splits == 3)


@pytest.mark.parametrize("hq,page", [(128, 64), (16, 16)])
def test_the_launch_binds_every_kernel_argument_and_its_descriptors(on_hopper, monkeypatch, hq, page):
    """``mla.gluon.launch`` with the kernel replaced by a recorder (no GPU here): one program a unit, every
    argument of ``mla_gluon_kernel`` bound by position or name, q's and the cache's rows as [rows, 576] with
    boxes of the nope and rope columns ([64, 512] / [64, 64] for q, [min(page, 64), ...] for the cache)."""
    pytest.importorskip("triton.experimental.gluon")
    import inspect

    from attnbench.kernels.mla import gluon_kernels as gk

    names = gk.mla_gluon_kernel.arg_names
    seen = {}

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                bound = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                           for n in names + ["num_warps"]]).bind(*args, **kw)
                seen.update(grid=grid, **bound.arguments)
            return launch

    monkeypatch.setattr(gk, "mla_gluon_kernel", Recorder())
    b = mla(DECODES, hq, page=page)
    p = TritonBackend(splits=2).plan(b)
    assert p.route.name == "gluon-mla" and p.num_merge
    mg.launch(p)
    assert set(names) <= set(seen) and seen["grid"] == (p.units.shape[0],)
    box = min(page, 64)
    rows = {"q_desc": (len(DECODES) * hq, [64, 512]), "qr_desc": (len(DECODES) * hq, [64, 64]),
            "kv_desc": (b.k_cache.shape[0] * page, [box, 512]), "kr_desc": (b.k_cache.shape[0] * page, [box, 64])}
    for name, (n, block) in rows.items():
        d = seen[name]
        assert list(d.shape) == [n, 576] and list(d.strides) == [576, 1] and list(d.block_shape) == block, name
    assert (seen["H"], seen["PAGE"], seen["BLOCK_N"], seen["UNIT_COLS"]) == (hq, page, 64, 8)
    assert seen["PO"] is p.po and seen["PL"] is p.pl and seen["QSTART"] is p.qstart and seen["UNITS"] is p.units
    assert seen["stride_o"] == 512 and seen["stride_por"] == 512 and seen["stride_pls"] == p.pl.stride(0)


@pytest.mark.slow
def test_mtp_chains_are_planned_as_causal_chunks_and_match_the_reference(on_hopper):
    """MTP chains (and a decode beside them) at 128 heads: each 64-row unit is one token's heads, planned causal
    (column 7 = 0) with its key end at its own token (context + its index + 1), so the Gluon kernel masks
    nothing but the end; the same units run by the Triton MLA kernel under the interpreter (its causal rule)
    give the reference's output, split and not."""
    if not INTERPRETED:
        pytest.skip("triton was imported compiled in this process")
    reqs = (Request("tree", 3, 100, tuple(chain(2))), Request("decode", 1, 70), Request("tree", 2, 33, tuple(chain(1))))
    b = mla(reqs, 128, dtype="float16", page=16, seed=5)
    p = TritonBackend().plan(b)
    assert p.route.name == "gluon-mla" and p.cfg.block_m == 64
    units = p.units.cpu().numpy()
    unsplit = units[units[:, 5] < 0]
    assert (units[:, 7] == 0).all()
    assert unsplit[:, 4].tolist() == [101, 101, 102, 102, 103, 103, 71, 71, 34, 34, 35, 35]
    for splits in (None, 2):
        p = TritonBackend(splits=splits).plan(b)
        p.out.fill_(float("nan"))
        out = triton_mla.launch(p)  # the CPU: the Triton MLA kernel over the same units
        assert not torch.isnan(out).any()
        assert compare(out, reference_attention(b)[0])[0] < 3e-3


@pytest.mark.slow
def test_mtp_chains_at_16_heads_share_units_and_match_the_reference(on_hopper):
    """At 16 heads a 64-row unit holds several tokens of a chain (the kernel then masks each row at its own
    token's end: ROW_LIMITS); the unit's key end is its last token's. Run by the Triton MLA kernel under the
    interpreter (its causal rule, the same units), split and not, the reference's output."""
    if not INTERPRETED:
        pytest.skip("triton was imported compiled in this process")
    reqs = (Request("tree", 5, 90, tuple(chain(4))), Request("decode", 1, 7), Request("tree", 3, 64, tuple(chain(2))))
    b = mla(reqs, 16, dtype="float16", page=8, seed=6)
    p = TritonBackend().plan(b)
    assert p.route.name == "gluon-mla" and (p.units.cpu().numpy()[:, 7] == 0).all()
    assert p.units.cpu().numpy()[:, 4].tolist() == [94, 95, 8, 67]  # rows 0-63 / 64-79 of the 5-token chain, ...
    for splits in (None, 3):
        p = TritonBackend(splits=splits).plan(b)
        p.out.fill_(float("nan"))
        out = triton_mla.launch(p)
        assert not torch.isnan(out).any()
        assert compare(out, reference_attention(b)[0])[0] < 3e-3
