"""The mla route's plans (issue 33's MLA round 1, the kernel notes in git history (triton_notes.md)) against the float64 reference under
Triton's interpreter: the backend's tile and split options, and the plan's own config (two programs a unit each
with half the value dims, 128-row units, an unpipelined masked tail, splits sized in waves, 16-bit partials) on
16 and 128 heads
with decodes of odd lengths, an MTP chain, a tree and a chunked prefill, pages 1, 16 and 64 of
a shuffled cache, split and unsplit. Since issue 33's defaults round the shipped backend takes m128 + value halves for
more than 64 heads (triton_mla.default_config; tests/test_triton_defaults.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from .interpreted import import_interpreted

_kernels, _paged = import_interpreted("attnbench.kernels.mla.kernels", "attnbench.backends.triton")

from attnbench.kernels.mla import plan as triton_mla  # noqa: E402
from attnbench.workload.batch import BatchSpec, Request, materialize  # noqa: E402
from attnbench.workload.reference import compare, reference_attention  # noqa: E402
from attnbench.workload.trees import chain, from_choices  # noqa: E402
from .interpreted import interpret_on_cpu  # noqa: F401 (an autouse fixture)

ROOT = Path(__file__).resolve().parent.parent
INTERPRETED = _kernels.INTERPRETED and _paged.triton_mode() == "interpreted"
TOL = {"float32": 1e-4, "float16": 3e-3}
TREE = tuple(from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]))
REQS = (
    Request("decode", 1, 301),  # several unmasked tiles, an odd end
    Request("tree", len(TREE), 45, TREE),
    Request("decode", 1, 3),  # shorter than one tile
    Request("tree", 3, 130, tuple(chain(2))),  # MTP: a chain of 2 drafts after the verified token
    Request("prefill", 5, 9),  # chunked prefill: the causal diagonal in the masked loop
    Request("decode", 1, 64),  # exactly one page of 64
)


M128 = dict(max_block_m=128, value_chunks=2, tail_stages=1)  # 128-row units, value halves, an unpipelined tail


def mla_batch(hq, page, *, dtype="float16", reqs=REQS, seed=0):
    spec = BatchSpec(tuple(reqs), hq, 1, 48, dtype, page, "shuffled", attention="mla", kv_lora_rank=32, rope_dim=16)
    return materialize(spec, seed)


def check(plan_fn, batch):
    """Plan with ``plan_fn``, run, compare with the reference; every output element written."""
    if not INTERPRETED:
        pytest.skip("triton was imported compiled in this process (tests/test_mla_triton.py re-runs itself)")
    plan = plan_fn(batch)
    assert isinstance(plan, triton_mla.MlaPlan)
    plan.out.fill_(float("nan"))
    out = triton_mla.launch(plan)
    rel, _ = compare(out, reference_attention(batch)[0])
    assert rel < TOL[batch.spec.dtype], f"rel err {rel}"
    return plan


@pytest.mark.slow
@pytest.mark.parametrize("hq", [16, 128])
@pytest.mark.parametrize("options", [{}, dict(splits=3), dict(block_m=16, block_n=32), dict(num_stages=3, splits=2),
                                     dict(block_m=32, num_warps=8)])
def test_the_mla_routes_options_match_the_reference(options, hq):
    """route=mla with the backend's tile and split options (the Triton MLA kernel's config overrides), 16 and 128
    heads, pages 1, 16 and 64 of a shuffled cache."""
    for page in (1, 16, 64):
        batch = mla_batch(hq, page, seed=page, reqs=SHORT if hq == 128 else REQS)
        be = _paged.TritonBackend(route="mla", **options)
        plan = check(be.plan, batch)
        assert plan.route.name == "mla" and plan.cfg.block_m == options.get("block_m", plan.cfg.block_m)


SHORT = (REQS[0], REQS[3])  # 128 heads: a decode and an MTP chain (the merge runs a program a row)


@pytest.mark.slow
@pytest.mark.parametrize("cfg, hq, page", [
    (dict(value_chunks=2), 16, 16),
    (M128, 16, 64),
    (dict(M128, half_partials=True), 128, 1),
    (dict(block_m=32, value_chunks=2, half_partials=True), 16, 1),
    (dict(value_chunks=2, num_stages=3), 16, 16),
])
def test_split_keys_merge_both_value_halves(cfg, hq, page):
    """Forced splits: each split's partial rows written by both value programs, the LSE by the
    first; the merge reads them back (float32 or 16-bit partials)."""
    batch = mla_batch(hq, page, seed=hq + page, reqs=SHORT if hq == 128 else REQS)
    plan = check(lambda b: triton_mla.plan(b, 4, True, 3, **cfg), batch)
    assert plan.num_merge > 0 and int((plan.units[:, 5] >= 0).sum()) > 0
    assert plan.po.dtype == (batch.dtype if cfg.get("half_partials") else plan.pl.dtype)


@pytest.mark.slow
def test_float32_takes_both_halves_exactly():
    batch = mla_batch(128, 16, dtype="float32", seed=5, reqs=SHORT)
    check(lambda b: triton_mla.plan(b, 4, True, 2, **M128), batch)


def test_waves_round_splits_down():
    """The shipped rule rounds up (8 decodes, 2 row blocks: 17 splits, 272 programs on 132
    SMs); ``waves`` keeps the programs within waves x SMs, the value programs counted."""
    b = mla_batch(128, 64, reqs=[Request("decode", 1, 16384)] * 8)
    shipped = triton_mla.choose_config(b)
    assert shipped.block_m == 64 and triton_mla.split_want(shipped, 132, 16) == 17
    v = triton_mla.choose_config(b, block_m=128, value_chunks=2, num_warps=8, waves=1)
    assert triton_mla.split_want(v, 132, 8) == 8  # 8 units x 2 value programs x 8 splits = 128 <= 132
    assert triton_mla.split_want(triton_mla.choose_config(b, value_chunks=2, waves=2), 132, 8) == 16
    with pytest.raises(ValueError):
        triton_mla.choose_config(b, value_chunks=4)


def test_waves_bound_the_programs_of_long_decodes():
    """Plan only: 8 decodes of 2k keys at 128 heads, one 128-row unit each, two value programs:
    ``waves`` 2 on 64 SMs gives 8 splits (128 programs), 1 wave on 8 SMs none; each row's
    splits tile its keys from 0 without gaps."""
    batch = mla_batch(128, 64, reqs=[Request("decode", 1, 2047 + i) for i in range(8)])
    for sms, waves, want in ((64, 2, 8), (8, 1, 1)):
        cfg = triton_mla.choose_config(batch, max_block_m=128, value_chunks=2, waves=waves)
        assert (cfg.block_m, cfg.num_warps) == (128, 8)
        units, merge, smax = triton_mla.build_units(batch, cfg, sms=sms, splits=None)
        assert smax == want and len(units) * cfg.value_chunks <= max(waves * sms, 16)
        spans = {}
        for b, row0, nrows, k0, k1, split, prow0, kind in units.tolist():
            assert (row0, nrows) == (0, 128)
            spans.setdefault(b, []).append((k0, k1))
        for b, sp in spans.items():
            sp.sort()
            assert sp[0][0] == 0 and sp[-1][1] == 2048 + b and all(x[1] == y[0] for x, y in zip(sp, sp[1:]))


def test_round_scenario_has_the_four_cases():
    """scripts/gpu/scenarios/triton-mla-16k.yaml (the GPU call's cases): decodes and MTP chains at
    16k, 16 and 128 heads."""
    from attnbench.workload.scenario import load

    cases = load(ROOT / "scripts/gpu/scenarios/triton-mla-16k.yaml").cases
    assert sorted(c.scenario.model.num_q_heads for c in cases) == [16, 16, 128, 128]
