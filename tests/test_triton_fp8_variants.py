"""FP8 caches through the paged route (issue 33's FP8 rounds 1 and 2, the kernel notes in git history (triton_notes.md)) against the float64
reference under Triton's interpreter: e4m3 and e5m2, per-tensor and per-head scales, decodes, a tree and a chunked
prefill, pages 1 and 16, with and without a sliding window, the backend's tile and split options; the decode
config's V words (``V_WORDS``: cvt words on compiled builds, shift words in the interpreter) at head dims 64 and 96
(padded lanes) and odd lengths; float16 dots take bfloat16 queries; long decodes step 64-key unmasked tiles
(``choose_config``).
"""
from __future__ import annotations


import pytest

from attnbench.kernels.paged.launch import v_words
from attnbench.kernels.shared import plan as tp
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention
from attnbench.workload.trees import from_choices

from .test_triton_backend import CHOICES, TritonBackend, need_interpreter, tree
from .interpreted import interpret_on_cpu  # noqa: F401 (an autouse fixture)

REQS = (
    Request("decode", 1, 150),  # several key tiles: the unmasked loop runs
    tree(from_choices(CHOICES), 70),
    Request("prefill", 7, 40),  # chunked prefill: the causal diagonal in the masked loop
    Request("decode", 1, 3),
)
OPTIONS = {"default": {}, "split": dict(splits=3, block_n=16), "rows16": dict(block_m=16, block_n=16, block_nf=32)}


def run_fp8(backend, *, kv_dtype="fp8_e4m3", kv_scale="per-tensor", page=16, window=None, dtype="float16", seed=0):
    need_interpreter()
    spec = BatchSpec(REQS, 4, 2, 32, dtype=dtype, page_size=page, layout="shuffled", kv_dtype=kv_dtype,
                     kv_scale=kv_scale, window=window)
    batch = materialize(spec, seed)
    assert batch.k_cache.element_size() == 1
    plan = backend.plan(batch)
    plan.out.fill_(float("nan"))  # every element must be written
    out = backend.run(plan)
    ref, _ = reference_attention(batch)
    return compare(out, ref)[0]


def test_v_words_take_the_decode_config_and_cvt_words_on_compiled_builds_only():
    """V_WORDS: 2 (one cvt.rn.f16x2 a word) for FP8 decode configs with 16-bit queries on compiled builds, 1 (shift
    words) in the interpreter, 0 for 16-bit caches, odd head dims and row blocks of > 32 rows (the tree config)."""
    b = materialize(BatchSpec((Request("decode", 1, 100),), 4, 2, 32, dtype="float16", page_size=16,
                              kv_dtype="fp8_e4m3"), 0)
    decode, tree_cfg = tp.choose_config(b), tp.choose_config(b, block_m=64)
    assert v_words(decode, b, True, False) == 2 and v_words(decode, b, True, True) == 1
    assert v_words(decode, b, False, False) == 0 and v_words(tree_cfg, b, True, False) == 0


@pytest.mark.slow
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("kv_scale", ["per-tensor", "per-head"])
@pytest.mark.parametrize("options", sorted(OPTIONS))
def test_fp8_matches_the_reference(options, kv_scale, page, window):
    for kv in ("fp8_e4m3", "fp8_e5m2"):
        rel = run_fp8(TritonBackend(**OPTIONS[options]), kv_dtype=kv, kv_scale=kv_scale, page=page, window=window)
        assert rel < 3e-3, f"{options} {kv} {kv_scale} page {page} window {window}: rel err {rel}"


def test_float16_dots_take_bfloat16_queries():
    """FP8_F16 converts bf16 queries to float16 before both dots, so the interpreter (whose bf16 ``tl.dot`` is
    wrong) computes a bf16 batch right."""
    rel = run_fp8(TritonBackend(), dtype="bfloat16", kv_scale="per-head", seed=7)
    assert rel < 2e-2, f"bf16 queries with float16 dots: rel err {rel}"


@pytest.mark.parametrize("options", sorted(OPTIONS))
@pytest.mark.parametrize("page", [1, 16])
def test_fp8_beside_every_other_variant(page, options):
    """FP8 beside every other variant at once (window, sinks, soft-cap, ALiBi, HND, per-head e4m3 scales,
    bidirectional prefill), with the tile and split options."""
    from .test_triton_variants import run_variant

    run_variant("all", page=page, seed=page, **OPTIONS[options])


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 96])
@pytest.mark.parametrize("kv_dtype,kv_scale", [("fp8_e4m3", "per-head"), ("fp8_e5m2", "per-tensor")])
@pytest.mark.parametrize("config", [{}, dict(splits=3, block_n=16), dict(block_m=16, block_n=16, block_nf=32),
                                    dict(splits=3, block_m=16, block_n=16, block_nf=32)])
def test_v_words_head_dims_and_odd_lengths(d, kv_dtype, kv_scale, config):
    """V words (decode configs: V read as int16 words of two FP8 dims, P.V as two dots joined back; the
    interpreter splits them by shifts, V_WORDS 1); head dim 96 reads 48 of 64 word lanes (padded), 64 all of
    them; odd context and query lengths (the masked tail, a page boundary inside a tile), a tree, split and
    unsplit, 16-row blocks (the tile options)."""
    need_interpreter()
    reqs = (Request("decode", 1, 97), tree(from_choices(CHOICES), 33), Request("prefill", 5, 19),
            Request("decode", 1, 1))
    spec = BatchSpec(reqs, 4, 2, d, dtype="float16", page_size=3, layout="shuffled", kv_dtype=kv_dtype,
                     kv_scale=kv_scale)
    batch = materialize(spec, d)
    be = TritonBackend(**config)
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
