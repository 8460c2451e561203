"""The FP8 variants of the triton backend (issue 33's FP8 rounds 1 and 2, docs/triton_notes.md)
against the float64 reference under Triton's interpreter: every ``triton-f8*`` variant of
scripts/dev/triton_variants.py and round 2's ``triton-r1`` / ``-s8r`` / ``-s6`` (float16 dots, V
converted before its transpose, V read as int16 words of two FP8 dims, the larger unmasked tile,
one more stage, forced splits, the fused merge) on an FP8 cache (e4m3 and e5m2, per-tensor and
per-head scales) with decodes, a tree and a chunked prefill, pages 1 and 16, with and without a
sliding window, split and unsplit; round 2's ``v_words`` also at head dims 64 and 96 (padded
lanes) and odd lengths. Shipped: float16 dots on for FP8 caches (round 1's measurement), the
other options off; long decodes step 64-key unmasked tiles (``choose_config``).
"""
from __future__ import annotations


import pytest

from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention
from attnbench.workload.trees import from_choices

from attnbench.backends import triton_plan as tp

from .test_triton_backend import CHOICES, TritonBackend, need_interpreter, tree
from .scripts import load_script


def _variants() -> dict:
    mod = load_script("scripts/dev/triton_variants.py", "triton_variants_h33")
    round2 = ("triton-r1", "triton-s8r", "triton-s6")  # FP8 round 2's plan-level variants
    return {cls.name: cls for cls in mod.VARIANTS if cls.name.startswith("triton-f8") or cls.name in round2}


VARIANTS = _variants()
REQS = (
    Request("decode", 1, 150),  # several key tiles: the unmasked loop runs
    tree(from_choices(CHOICES), 70),
    Request("prefill", 7, 40),  # chunked prefill: the causal diagonal in the masked loop
    Request("decode", 1, 3),
)


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def run_fp8(backend, *, kv_dtype="fp8_e4m3", kv_scale="per-tensor", page=16, window=None, dtype="float16",
            splits=None, seed=0):
    need_interpreter()
    spec = BatchSpec(REQS, 4, 2, 32, dtype=dtype, page_size=page, layout="shuffled", kv_dtype=kv_dtype,
                     kv_scale=kv_scale, window=window)
    batch = materialize(spec, seed)
    assert batch.k_cache.element_size() == 1
    if splits is not None:
        backend.splits = splits
    plan = backend.plan(batch)
    plan.out.fill_(float("nan"))  # every element must be written
    out = backend.run(plan)
    ref, _ = reference_attention(batch)
    return compare(out, ref)[0]


def test_the_fp8_variants_exist_and_the_shipped_defaults():
    """Shipped: float16 dots on (round 1: faster and more accurate everywhere measured), V pairs
    off, V words by the config (None: decode configs, tests/test_triton_defaults.py); round 1's
    shipped kernel stays reachable as ``triton-r1`` (with the other pre-defaults-round options)."""
    assert set(VARIANTS) >= {"triton-f8h", "triton-f8v", "triton-f8hv", "triton-f8hv-nf64", "triton-f8hv-st4",
                             "triton-f8hv-w2", "triton-f8h-m128", "triton-r1", "triton-f8h-nf32", "triton-f8h-nf64",
                             "triton-f8w", "triton-f8w-nf32", "triton-f8w-s8", "triton-f8w-s16", "triton-f8w-fm",
                             "triton-s8r", "triton-s6", "triton-f8h-nf64s2"}
    be = TritonBackend()
    assert be.fp8_f16 and not be.v_pairs and be.v_words is None
    assert VARIANTS["triton-f8hv"]().fp8_f16 and VARIANTS["triton-f8hv"]().v_pairs
    r1 = VARIANTS["triton-r1"]()
    assert not r1.fp8_f16 and r1.config == {"block_nf": 0, "fp8_split": 1} and r1.v_words is False
    assert VARIANTS["triton-f8w"]().v_words


@pytest.mark.slow
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("kv_scale", ["per-tensor", "per-head"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_fp8_variant_matches_the_reference(name, kv_scale, page, window):
    rel = run_fp8(VARIANTS[name](), kv_scale=kv_scale, page=page, window=window, seed=page)
    assert rel < 3e-3, f"{name} {kv_scale} page {page} window {window}: rel err {rel}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["triton-f8h", "triton-f8hv"])
def test_fp8_variant_e5m2_split(name):
    """e5m2 (another conversion), every row block cut into 3 splits (partials and the merge)."""
    rel = run_fp8(VARIANTS[name](), kv_dtype="fp8_e5m2", kv_scale="per-head", splits=3, seed=5)
    assert rel < 3e-3, f"{name} e5m2 split: rel err {rel}"


def test_float16_dots_take_bfloat16_queries():
    """``fp8_f16`` converts bf16 queries to float16 before both dots, so the interpreter (whose
    bf16 ``tl.dot`` is wrong) computes a bf16 batch right: the option is live, not a no-op."""
    rel = run_fp8(VARIANTS["triton-f8hv"](), dtype="bfloat16", kv_scale="per-head", seed=7)
    assert rel < 2e-2, f"bf16 queries with float16 dots: rel err {rel}"


@pytest.mark.slow
@pytest.mark.parametrize("config", [{}, dict(splits=3, block_n=16)])
@pytest.mark.parametrize("page", [1, 16])
def test_fp8_options_with_every_feature(page, config):
    """Both FP8 options beside every other variant at once (window, sinks, soft-cap, ALiBi, HND,
    per-head e4m3 scales, bidirectional prefill), split and unsplit."""
    from .test_triton_variants import run_variant

    run_variant("all", page=page, seed=page, fp8_f16=True, v_pairs=True, **config)
    run_variant("all", page=page, seed=page + 1, v_words=True, **config)
    run_variant("all", page=page, seed=page + 2, v_words=True, k_words=True, **config)


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 96])
@pytest.mark.parametrize("kv_dtype,kv_scale", [("fp8_e4m3", "per-head"), ("fp8_e5m2", "per-tensor")])
@pytest.mark.parametrize("config", [{}, dict(splits=3, block_n=16), dict(block_m=16, block_n=16, block_nf=32),
                                    dict(k_words=True), dict(k_words=True, splits=3, block_m=16, block_n=16, block_nf=32)])
def test_v_words_head_dims_and_odd_lengths(d, kv_dtype, kv_scale, config):
    """``v_words``: V read as int16 words (two FP8 dims each), P.V as two dots joined back; head
    dim 96 reads 48 of 64 word lanes (padded), 64 all of them; odd context and query lengths (the
    masked tail, a page boundary inside a tile), a tree, split and unsplit, 16-row blocks. ``k_words``:
    K too, the scores as two half-width dots (q's even and odd dims), in both loops."""
    need_interpreter()
    reqs = (Request("decode", 1, 97), tree(from_choices(CHOICES), 33), Request("prefill", 5, 19),
            Request("decode", 1, 1))
    spec = BatchSpec(reqs, 4, 2, d, dtype="float16", page_size=3, layout="shuffled", kv_dtype=kv_dtype,
                     kv_scale=kv_scale)
    batch = materialize(spec, d)
    be = TritonBackend(v_words=True, **config)
    plan = be.plan(batch)
    plan.out.fill_(float("nan"))
    rel = compare(be.run(plan), reference_attention(batch)[0])[0]
    assert rel < 3e-3, f"v_words d {d} {kv_dtype} {config}: rel err {rel}"


def _long_decodes(kv_dtype, d=128, ctx=(2100, 2051)):
    spec = BatchSpec(tuple(Request("decode", 1, c) for c in ctx), 4, 1, d, dtype="float16", page_size=16,
                     layout="shuffled", kv_dtype=kv_dtype, kv_scale="per-head" if kv_dtype else "per-tensor")
    return materialize(spec, 11)


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", [None, "fp8_e4m3"])
def test_long_decodes_step_64_key_tiles(kv_dtype):
    """Round 2's default: decode-sized row blocks with >= LONG_KEYS keys (d 128, 16-bit queries)
    run the unmasked loop in 64-key tiles, the masked tail in 32; right on the CPU, odd lengths."""
    need_interpreter()
    batch = _long_decodes(kv_dtype)
    be = TritonBackend()
    plan = be.plan(batch)
    assert (plan.cfg.block_n, plan.cfg.block_nf) == (32, 64)
    assert (plan.units[:, tp.COL["kv_lo"]] % 64 == 0).all()  # splits start on the unmasked loop's tiles
    plan.out.fill_(float("nan"))
    rel = compare(be.run(plan), reference_attention(batch)[0])[0]
    assert rel < 3e-3, f"long decodes {kv_dtype}: rel err {rel}"


def test_the_64_key_rule_stays_off_elsewhere():
    """Short decodes, other head dims, float32 queries and ``block_nf=0`` keep block_nf = block_n."""
    assert tp.choose_config(_long_decodes(None, ctx=(2046, 100))).block_nf == 32  # 2047 keys
    assert tp.choose_config(_long_decodes(None, d=64)).block_nf == 32
    assert tp.choose_config(_long_decodes(None), block_nf=0).block_nf == 32
    spec = BatchSpec((Request("decode", 1, 2100),), 4, 1, 128, dtype="float32", page_size=16)
    cfg = tp.choose_config(materialize(spec, 0))
    assert cfg.block_nf == cfg.block_n
