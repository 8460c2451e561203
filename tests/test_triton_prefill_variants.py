"""The prefill variants of the triton backend (issue 33's prefill round, docs/triton_notes.md)
against the float64 reference under Triton's interpreter: every ``triton-pf*`` variant of
scripts/dev/triton_variants.py (triton_prefill_kernels.py's kernel with loop-invariant in-tile
offsets, the folded score scale, the heavy-first program order, and the tile configs beside
them) on causal prefills with and without a context (odd lengths), a decode beside them,
pages 16 and 256 (and 3, where the lean offsets do not apply), shuffled pages, split and
unsplit, the HND cache order; a tree beside a prefill runs the shipped kernel. "lean,fold,heavy"
is the shipped backend's default since issue 33's defaults round (tests/test_triton_defaults.py).
"""
from __future__ import annotations


import pytest

from attnbench.backends import triton_plan as tp
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention
from attnbench.workload.trees import from_choices

from .interpreted import import_interpreted
from .test_triton_backend import CHOICES, TOL, TritonBackend, need_interpreter, tree
from .scripts import load_script

(_pk,) = import_interpreted("attnbench.backends.triton_prefill_kernels")
from attnbench.backends import triton_prefill  # noqa: E402


def _variants() -> dict:
    mod = load_script("scripts/dev/triton_variants.py", "triton_variants_h33r")
    return {cls.name: cls for cls in mod.VARIANTS if cls.name.startswith("triton-pf")}


VARIANTS = _variants()
PREFILLS = (
    Request("prefill", 70, 0),  # fresh: several row blocks, the diagonal in the masked loop
    Request("prefill", 37, 45),  # chunked: 45 cached keys below the diagonal (odd lengths)
    Request("prefill", 1, 0),
    Request("decode", 1, 100),  # a decode row beside them
)


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def calls(monkeypatch):
    """How many launches went through the prefill kernel."""
    seen = []
    real = triton_prefill.run

    def counting(p, opts):
        seen.append(opts)
        return real(p, opts)

    monkeypatch.setattr(triton_prefill, "run", counting)
    return seen


def run(backend, reqs=PREFILLS, *, page=16, dtype="float16", hq=8, hkv=2, d=32, seed=0, splits=None):
    need_interpreter()
    batch = materialize(BatchSpec(tuple(reqs), hq, hkv, d, dtype=dtype, page_size=page, layout="shuffled"), seed)
    backend.splits = splits
    plan = backend.plan(batch)
    plan.out.fill_(float("nan"))  # every element must be written
    out = backend.run(plan)
    ref, _ = reference_attention(batch)
    return compare(out, ref)[0], plan


def test_the_prefill_variants_exist_and_the_shipped_backend_runs_lean_fold_heavy():
    assert set(VARIANTS) >= {"triton-pf", "triton-pf-lean", "triton-pf-fold", "triton-pf-heavy", "triton-pf-lfh",
                             "triton-pf-lfh-2cta", "triton-pf-lfh-m64", "triton-pf-lfh-nf128"}
    # lean,fold,heavy the default since issue 33's defaults round; gluon (Hopper, where wanted) since prefill round 8
    assert TritonBackend().prefill == {"lean", "fold", "heavy", "gluon"}
    assert TritonBackend(prefill=None).prefill is None  # the one-launch kernel (triton-r3, triton-nopf)
    assert VARIANTS["triton-pf"]().prefill == frozenset()
    assert VARIANTS["triton-pf-lfh"]().prefill == {"lean", "fold", "heavy"}


def test_prefill_options_are_checked():
    assert triton_prefill.options(" lean, fold ") == {"lean", "fold"}
    with pytest.raises(ValueError, match="unknown prefill option"):
        TritonBackend(prefill="lean,fast")
    assert triton_prefill.lean_fits(16, 64) and triton_prefill.lean_fits(256, 64) and triton_prefill.lean_fits(1, 32)
    assert not triton_prefill.lean_fits(3, 64) and not triton_prefill.lean_fits(48, 64)


@pytest.mark.slow
@pytest.mark.parametrize("page", [16, 256])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_prefill_variant_matches_the_reference(name, page, calls):
    rel, plan = run(VARIANTS[name](), page=page, seed=page + len(name))
    assert rel < TOL["float16"], f"{name} page {page}: rel err {rel}"
    assert len(calls) == 1 and plan.num_merge == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["triton-pf", "triton-pf-lfh-nf128"])
def test_prefill_variant_split(name, calls):
    """3 forced splits (partial outputs and the merge kernel; contexts of several 128-key tiles)."""
    reqs = (Request("prefill", 21, 230), Request("decode", 1, 260), Request("prefill", 40, 0))
    rel, plan = run(VARIANTS[name](), reqs, page=16, seed=3, splits=3)
    assert rel < TOL["float16"], f"{name} split: rel err {rel}"
    assert plan.num_merge > 0 and len(calls) == 1


@pytest.mark.slow
@pytest.mark.parametrize("page", [3, 1])
def test_lean_falls_back_where_pages_do_not_tile(page, calls):
    """Page 3 (neither divides a 32-key tile: the shipped addressing) and page 1 (a page a row),
    in float32 (IEEE dots, 32-key tiles)."""
    rel, _ = run(VARIANTS["triton-pf-lfh"](), page=page, dtype="float32", hq=4, hkv=4, seed=page)
    assert rel < TOL["float32"], f"page {page}: rel err {rel}"
    assert len(calls) == 1


def test_hnd_cache_order(calls):
    """The HND cache ([pages, heads, slots, d]) through its strides: the lean offsets' row stride is d."""
    need_interpreter()
    batch = materialize(BatchSpec(PREFILLS, 8, 2, 32, dtype="float16", page_size=16, kv_order="HND"), 6)
    be = VARIANTS["triton-pf-lfh"]()
    out = be.run(be.plan(batch))
    assert compare(out, reference_attention(batch)[0])[0] < TOL["float16"] and len(calls) == 1


@pytest.mark.slow
def test_a_tree_beside_a_prefill_runs_the_shipped_kernel(calls):
    reqs = PREFILLS[:2] + (tree(from_choices(CHOICES), 20),)
    rel, plan = run(VARIANTS["triton-pf-lfh"](), reqs, page=16, seed=9)
    assert rel < TOL["float16"], f"mixed: rel err {rel}"
    assert plan.has_tree and not calls


def test_a_variant_batch_runs_the_shipped_kernel(calls):
    """A sliding window (an attention variant) is not the prefill kernel's: the shipped one runs."""
    need_interpreter()
    batch = materialize(BatchSpec(PREFILLS, 8, 2, 32, dtype="float16", page_size=16, window=9), 4)
    be = VARIANTS["triton-pf-lfh"]()
    out = be.run(be.plan(batch))
    assert compare(out, reference_attention(batch)[0])[0] < TOL["float16"] and not calls


@pytest.mark.slow
def test_the_issue_shape_plans_no_split():
    """The 4 x 1k prefill over 3k (issue 33) on 132 SMs: every variant's config keeps one split
    per row block (the round times the kernels, not the split heuristic); BLOCK_M 64 keeps
    64-key tiles (without ``block_n`` the long-keys rule would pick 32 and a register cap)."""
    batch = materialize(BatchSpec(tuple(Request("prefill", 1024, 3072) for _ in range(4)), 32, 8, 128,
                                  dtype="bfloat16", page_size=16), 0)
    for name, cls in VARIANTS.items():
        cfg = tp.choose_config(batch, **cls().config)
        _, merge, smax, _ = tp.build_units(batch, cfg, 132)
        assert smax == 1 and len(merge) == 0, name
        rows = 64 if name.endswith("m64") else 512 if "-gl" in name else 128  # gluon: 128 tokens x G 4
        assert cfg.block_n == 64 and cfg.block_m == rows, (name, cfg)
