"""The FP8 variants of the triton backend (issue 33's FP8 round, docs/triton_notes.md) against
the float64 reference under Triton's interpreter: every ``triton-f8*`` variant of
scripts/dev/triton_variants.py (float16 dots, V converted before its transpose, the larger
unmasked tile, one more stage) on an FP8 cache (e4m3 and e5m2, per-tensor and per-head scales)
with decodes, a tree and a chunked prefill, pages 1 and 16, with and without a sliding window,
split and unsplit. The kernel options stay off in the shipped backend until measured.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention
from attnbench.workload.trees import from_choices

from .test_triton_backend import CHOICES, TritonBackend, need_interpreter, tree

ROOT = Path(__file__).resolve().parent.parent


def _variants() -> dict:
    spec = importlib.util.spec_from_file_location("triton_variants_h33", ROOT / "scripts/dev/triton_variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {cls.name: cls for cls in mod.VARIANTS if cls.name.startswith("triton-f8")}


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


def test_the_fp8_variants_exist_and_the_shipped_backend_keeps_them_off():
    assert set(VARIANTS) >= {"triton-f8h", "triton-f8v", "triton-f8hv", "triton-f8hv-nf64", "triton-f8hv-st4",
                             "triton-f8hv-w2", "triton-f8h-m128"}
    be = TritonBackend()
    assert not be.fp8_f16 and not be.v_pairs
    assert VARIANTS["triton-f8hv"]().fp8_f16 and VARIANTS["triton-f8hv"]().v_pairs


@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("kv_scale", ["per-tensor", "per-head"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_fp8_variant_matches_the_reference(name, kv_scale, page, window):
    rel = run_fp8(VARIANTS[name](), kv_scale=kv_scale, page=page, window=window, seed=page)
    assert rel < 3e-3, f"{name} {kv_scale} page {page} window {window}: rel err {rel}"


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


@pytest.mark.parametrize("config", [{}, dict(splits=3, block_n=16)])
@pytest.mark.parametrize("page", [1, 16])
def test_fp8_options_with_every_feature(page, config):
    """Both FP8 options beside every other variant at once (window, sinks, soft-cap, ALiBi, HND,
    per-head e4m3 scales, bidirectional prefill), split and unsplit."""
    from .test_triton_variants import run_variant

    run_variant("all", page=page, seed=page, fp8_f16=True, v_pairs=True, **config)
