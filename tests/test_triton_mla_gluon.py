"""The Gluon MLA option's host side on the CPU (issue 33, MLA round 2): which batches its plan shapes for the
kernel (bf16/fp16 decodes of DeepSeek-V3's latent row on a Hopper GPU), why the others keep the Triton MLA
kernel, the plan it makes (64-row units, 64-key tiles, splits for one program an SM, 16-bit partials), that
it is on by default and changes nothing off Hopper, and that its plan, run by the Triton MLA kernel (Gluon
has no interpreter), matches the reference. The kernel itself runs on a GPU: tests/test_gluon_mla_gpu.py."""
from __future__ import annotations

import pytest
import torch

from .interpreted import import_interpreted

_kernels, _paged = import_interpreted("attnbench.backends.triton_mla_kernels", "attnbench.backends.triton_paged")

from attnbench.backends import triton_mla  # noqa: E402
from attnbench.backends import triton_mla_gluon as mg  # noqa: E402
from attnbench.backends import triton_plan as tp  # noqa: E402
from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402
from attnbench.workload.reference import compare, reference_attention  # noqa: E402
from attnbench.workload.trees import chain  # noqa: E402

TritonBackend = _paged.TritonBackend
INTERPRETED = _kernels.INTERPRETED and _paged.triton_mode() == "interpreted"


@pytest.fixture(autouse=True)
def _interpret():
    """The CPU runs the shipped kernels under Triton's interpreter (tests/interpreted.py): alone,
    this file imported them compiled and failed on triton's "0 active drivers". A patch of its
    own: a test's monkeypatch.undo() leaves it set."""
    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "1")
        yield


def mla(reqs, hq=128, *, dtype="bfloat16", page=64, rank=512, rope=64, kv_dtype=None, seed=0):
    spec = BatchSpec(tuple(reqs), hq, 1, rank + rope, dtype, page, "shuffled", attention="mla", kv_lora_rank=rank,
                     rope_dim=rope, **({"kv_dtype": kv_dtype} if kv_dtype else {}))
    return materialize(spec, seed)


DECODES = tuple(Request("decode", 1, c) for c in (1000, 63, 1, 65))


@pytest.fixture
def on_hopper(monkeypatch):
    monkeypatch.setattr(mg, "hopper", lambda device: True)


@pytest.mark.slow
def test_wanted_takes_16_bit_decodes_of_deepseeks_latent_row_alone(on_hopper):
    for hq in (128, 16, 1, 96):
        assert mg.unwanted(mla(DECODES, hq)) == "", hq
    for page in (64, 128, 256, 8, 16, 32):
        assert mg.wanted(mla(DECODES, page=page)), page
    assert mg.wanted(mla(DECODES, dtype="float16"))
    for page in (1, 4, 48, 96):
        assert mg.unwanted(mla(DECODES, page=page)).startswith(f"page {page}"), page
    assert mg.unwanted(mla(DECODES, dtype="float32")).startswith("not a 16-bit q")
    assert mg.unwanted(mla(DECODES, kv_dtype="fp8_e4m3")).startswith("not a 16-bit q")
    assert mg.unwanted(mla(DECODES, rank=256)) == "kv_lora_rank 256, rope_dim 64 (it takes 512 and 64)"
    assert mg.unwanted(mla(DECODES, rope=32)).startswith("kv_lora_rank 512, rope_dim 32")
    mtp = DECODES + (Request("tree", 3, 100, tuple(chain(2))),)
    assert all(mg.unwanted(mla(mtp, hq)) == "" for hq in (128, 64, 16, 96))  # MTP chains
    assert mg.unwanted(mla((Request("tree", 1, 100, (-1,)),))) == ""  # a one-node tree: a decode
    why = "not a batch of decodes and MTP chains"
    assert mg.unwanted(mla(DECODES + (Request("tree", 3, 100, (-1, 0, 0)),))).startswith(why)  # a branching tree
    assert mg.unwanted(mla(DECODES + (Request("tree", 3, 100, tuple(chain(2)), tree_dynamic=True),))).startswith(why)
    assert mg.unwanted(mla(DECODES + (Request("prefill", 5, 9),))).startswith(why)


def test_off_hopper_the_option_changes_nothing():
    """Off Hopper (the CPU here) the plan is the shipped one and the row's mode says nothing more."""
    b = mla(DECODES)
    assert mg.unwanted(b) == "not a Hopper GPU"
    shipped, gluon = TritonBackend().plan(b), TritonBackend(mla_gluon=True).plan(b)
    assert shipped.cfg == gluon.cfg and shipped.mode == gluon.mode and not gluon.gluon
    assert "Hopper" in mg.fit(gluon)


def test_the_option_is_on_by_default_and_false_keeps_the_triton_kernel(on_hopper):
    """On Hopper the default plans decodes for the Gluon kernel (thirteenth session: faster at 128 and 16 heads);
    ``mla_gluon=False`` keeps the Triton MLA kernel's wide config, and its row says nothing of Gluon's."""
    p = TritonBackend().plan(mla(DECODES))
    assert p.cfg.block_m == 64 and p.cfg.value_chunks == 1
    off = TritonBackend(mla_gluon=False).plan(mla(DECODES))
    assert not off.gluon and off.cfg.block_m == 128 and "Gluon" not in off.mode and "gluon" not in off.mode


@pytest.mark.slow
@pytest.mark.parametrize("hq,units_per_request", [(128, 2), (16, 1)])
def test_the_plan_is_shaped_for_the_kernel(on_hopper, monkeypatch, hq, units_per_request):
    """64-row units (two a 128-head decode, one a 16-head one), 64-key tiles, splits for one program an SM on
    132 SMs (8 x 16k at 128 heads: 8 splits, 128 programs), 16-bit partials, one value program a unit."""
    monkeypatch.setattr(tp, "num_sms", lambda device: 132)
    b = mla(tuple(Request("decode", 1, 16384) for _ in range(8)), hq)
    p = TritonBackend(mla_gluon=True).plan(b)
    assert p.gluon and mg.RAN in p.mode, p.mode
    assert (p.cfg.block_m, p.cfg.block_n, p.cfg.value_chunks, p.cfg.waves) == (64, 64, 1, 1)
    units = p.units.cpu().numpy()
    assert len(units) <= 132 and len({(u[0], u[1]) for u in units}) == 8 * units_per_request
    assert (units[:, 3] % 64 == 0).all() and (units[:, 2] == min(hq, 64)).all()
    assert p.num_merge and p.po.dtype == torch.bfloat16
    monkeypatch.setattr(mg, "HALF_PARTIALS", False)
    assert TritonBackend(mla_gluon=True).plan(b).po.dtype == torch.float32


def test_refused_batches_say_why_on_hopper(on_hopper):
    """A batch the option does not take keeps the backend's own MLA config, and the row says why."""
    be = TritonBackend(mla_gluon=True)
    branching = mla((Request("tree", 3, 100, (-1, 0, 0)),) * 2)
    p = be.plan(branching)
    assert not p.gluon and p.cfg == TritonBackend(mla_gluon=False).plan(branching).cfg
    assert "Triton MLA kernel, not Gluon's MLA kernel: not a batch of decodes and MTP chains" in p.mode, p.mode
    assert be.plan(mla((Request("tree", 3, 100, tuple(chain(2))),), 16)).gluon
    assert "page 16" not in be.plan(mla(DECODES, page=16)).mode
    assert "page 48" in be.plan(mla(DECODES, page=48)).mode
    assert "kv_lora_rank 256" in be.plan(mla(DECODES, rank=256)).mode
    b = mla(DECODES, 16)
    set_by_caller = triton_mla.plan(b, 4, True, gluon=True, block_m=16)  # the caller's config wins
    assert set_by_caller.cfg.block_m == 16 and "64-row units" in set_by_caller.mode


@pytest.mark.slow
def test_the_kernels_plan_through_the_triton_kernel_matches_the_reference(on_hopper):
    """The option's units and merge rows (forced splits too), run by the Triton MLA kernel under the
    interpreter (the Gluon kernel reads the same units), give the reference's output."""
    if not INTERPRETED:
        pytest.skip("triton was imported compiled in this process")
    b = mla((Request("decode", 1, 300), Request("decode", 1, 0), Request("decode", 1, 129)), 16, dtype="float16",
            page=16, seed=3)
    for splits in (None, 3):
        p = TritonBackend(mla_gluon=True, splits=splits).plan(b)
        assert p.gluon and p.cfg.block_m == 64
        p.gluon = False  # the CPU: the Triton MLA kernel
        p.out.fill_(float("nan"))
        out = triton_mla.run(p)
        assert not torch.isnan(out).any()
        assert compare(out, reference_attention(b)[0])[0] < 3e-3
        assert (p.num_merge > 0) == (splits == 3)


def test_the_round_script_parses_and_names_existing_variants():
    """scripts/gpu/gpu_gluon_mla_round.sh (one device call: the GPU tests and the timing rows) is valid bash and
    its default variants exist in scripts/dev/triton_variants.py (the -f32 one too)."""
    from .scripts import round_script_variants

    rc, default, names = round_script_variants("scripts/gpu/gpu_gluon_mla_round.sh")
    assert rc == 0 and "triton-mla-gluon" in default
    assert set(default) <= names and "triton-mla-gluon-f32" in names, set(default) - names


@pytest.mark.parametrize("hq,page", [(128, 64), (16, 16)])
def test_the_launch_binds_every_kernel_argument_and_its_descriptors(on_hopper, monkeypatch, hq, page):
    """``triton_mla_gluon.run`` with the kernel replaced by a recorder (no GPU here): one program a unit, every
    argument of ``mla_gluon_kernel`` bound by position or name, q's and the cache's rows as [rows, 576] with
    boxes of the nope and rope columns ([64, 512] / [64, 64] for q, [min(page, 64), ...] for the cache)."""
    pytest.importorskip("triton.experimental.gluon")
    import inspect

    from attnbench.backends import gluon_mla_kernels as gk

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
    p = TritonBackend(mla_gluon=True, splits=2).plan(b)
    assert p.gluon and p.num_merge
    mg.run(p)
    assert set(names) - {"EARLY_PV"} <= set(seen) and seen["grid"] == (p.units.shape[0],)
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
    assert p.gluon and p.cfg.block_m == 64
    units = p.units.cpu().numpy()
    unsplit = units[units[:, 5] < 0]
    assert (units[:, 7] == 0).all()
    assert unsplit[:, 4].tolist() == [101, 101, 102, 102, 103, 103, 71, 71, 34, 34, 35, 35]
    for splits in (None, 2):
        p = TritonBackend(splits=splits).plan(b)
        p.gluon = False  # the CPU: the Triton MLA kernel
        p.out.fill_(float("nan"))
        out = triton_mla.run(p)
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
    assert p.gluon and (p.units.cpu().numpy()[:, 7] == 0).all()
    assert p.units.cpu().numpy()[:, 4].tolist() == [94, 95, 8, 67]  # rows 0-63 / 64-79 of the 5-token chain, ...
    for splits in (None, 3):
        p = TritonBackend(splits=splits).plan(b)
        p.gluon = False
        p.out.fill_(float("nan"))
        out = triton_mla.run(p)
        assert not torch.isnan(out).any()
        assert compare(out, reference_attention(b)[0])[0] < 3e-3
