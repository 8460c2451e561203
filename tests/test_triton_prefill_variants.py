"""The prefill route (issue 33's prefill round, the kernel notes in git history (triton_notes.md): kernels/prefill/kernels.py's kernel with
loop-invariant in-tile offsets, the folded score scale and the heavy-first program order) against the float64
reference under Triton's interpreter, with the backend's tile and split options: causal prefills with and without a
context (odd lengths), a decode beside them, pages 16 and 256 (and 3, where the lean offsets do not apply),
shuffled pages, split and unsplit, the HND cache order; auto leaves a tree or a variant beside a prefill to the
paged route, and a forced prefill route refuses them.
"""
from __future__ import annotations


import pytest

from attnbench.kernels.shared import plan as tp
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, reference_attention
from attnbench.workload.trees import from_choices

from .interpreted import import_interpreted
from .test_triton_backend import CHOICES, TOL, TritonBackend, need_interpreter, tree

(_pk,) = import_interpreted("attnbench.kernels.prefill.kernels")
from attnbench.kernels.prefill import launch as triton_prefill  # noqa: E402
from .interpreted import interpret_on_cpu  # noqa: F401 (an autouse fixture)


# the backend's tile options beside the route (the prefill round's configs: 2 programs an SM, one warpgroup each,
# 128-key unmasked tiles)
OPTIONS = {"default": {}, "2cta": dict(num_stages=2), "m64": dict(block_m=64, block_n=64, num_warps=4),
           "nf128": dict(block_nf=128, num_stages=2)}
PREFILLS = (
    Request("prefill", 70, 0),  # fresh: several row blocks, the diagonal in the masked loop
    Request("prefill", 37, 45),  # chunked: 45 cached keys below the diagonal (odd lengths)
    Request("prefill", 1, 0),
    Request("decode", 1, 100),  # a decode row beside them
)


@pytest.fixture
def calls(monkeypatch):
    """How many launches went through the prefill kernel."""
    seen = []
    real = _pk.prefill_attention_kernel

    class Counting:
        def __getitem__(self, grid):
            seen.append(grid)
            return real[grid]

    monkeypatch.setattr(_pk, "prefill_attention_kernel", Counting())
    return seen


def run(backend, reqs=PREFILLS, *, page=16, dtype="float16", hq=8, hkv=2, d=32, seed=0):
    need_interpreter()
    batch = materialize(BatchSpec(tuple(reqs), hq, hkv, d, dtype=dtype, page_size=page, layout="shuffled"), seed)
    plan = backend.plan(batch)
    plan.out.fill_(float("nan"))  # every element must be written
    out = backend.run(plan)
    ref, _ = reference_attention(batch)
    return compare(out, ref)[0], plan


def test_auto_takes_prefills_and_lean_fits_tiles_inside_a_page():
    batch = materialize(BatchSpec(PREFILLS, 8, 2, 32, dtype="float16", page_size=16), 0)
    assert TritonBackend().plan(batch).route.name == "prefill"
    assert TritonBackend(route="paged").plan(batch).route.name == "paged"
    assert triton_prefill.lean_fits(16, 64) and triton_prefill.lean_fits(256, 64) and triton_prefill.lean_fits(1, 32)
    assert not triton_prefill.lean_fits(3, 64) and not triton_prefill.lean_fits(48, 64)


@pytest.mark.parametrize("page", [16, 256])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_prefill_route_matches_the_reference(name, page, calls):
    rel, plan = run(TritonBackend(route="prefill", **OPTIONS[name]), page=page, seed=page + len(name))
    assert rel < TOL["float16"], f"{name} page {page}: rel err {rel}"
    assert len(calls) == 1 and plan.num_merge == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["default", "nf128"])
def test_prefill_route_split(name, calls):
    """3 forced splits (partial outputs and the merge kernel; contexts of several 128-key tiles)."""
    reqs = (Request("prefill", 21, 230), Request("decode", 1, 260), Request("prefill", 40, 0))
    rel, plan = run(TritonBackend(splits=3, **OPTIONS[name]), reqs, page=16, seed=3)
    assert rel < TOL["float16"], f"{name} split: rel err {rel}"
    assert plan.num_merge > 0 and len(calls) == 1


@pytest.mark.slow
@pytest.mark.parametrize("page", [3, 1])
def test_lean_falls_back_where_pages_do_not_tile(page, calls):
    """Page 3 (neither divides a 32-key tile: the shipped addressing) and page 1 (a page a row),
    in float32 (IEEE dots, 32-key tiles)."""
    rel, _ = run(TritonBackend(), page=page, dtype="float32", hq=4, hkv=4, seed=page)
    assert rel < TOL["float32"], f"page {page}: rel err {rel}"
    assert len(calls) == 1


def test_hnd_cache_order(calls):
    """The HND cache ([pages, heads, slots, d]) through its strides: the lean offsets' row stride is d."""
    need_interpreter()
    batch = materialize(BatchSpec(PREFILLS, 8, 2, 32, dtype="float16", page_size=16, kv_order="HND"), 6)
    be = TritonBackend()
    out = be.run(be.plan(batch))
    assert compare(out, reference_attention(batch)[0])[0] < TOL["float16"] and len(calls) == 1


def test_a_tree_beside_a_prefill_runs_the_paged_route(calls):
    reqs = PREFILLS[:2] + (tree(from_choices(CHOICES), 20),)
    rel, plan = run(TritonBackend(), reqs, page=16, seed=9)
    assert rel < TOL["float16"], f"mixed: rel err {rel}"
    assert plan.has_tree and plan.route.name == "paged" and not calls
    batch = materialize(BatchSpec(tuple(reqs), 8, 2, 32, dtype="float16", page_size=16), 9)
    assert TritonBackend(route="prefill").unsupported(batch) == ["route prefill: the Triton prefill kernel takes no tree"]


def test_a_variant_batch_runs_the_paged_route(calls):
    """A sliding window (an attention variant) is not the prefill kernel's: the paged one runs."""
    need_interpreter()
    batch = materialize(BatchSpec(PREFILLS, 8, 2, 32, dtype="float16", page_size=16, window=9), 4)
    be = TritonBackend()
    out = be.run(be.plan(batch))
    assert compare(out, reference_attention(batch)[0])[0] < TOL["float16"] and not calls
    assert "(a sliding window)" in TritonBackend(route="prefill").unsupported(batch)[0]


@pytest.mark.slow
def test_the_issue_shape_plans_no_split():
    """The 4 x 1k prefill over 3k (issue 33) on 132 SMs: every option set's config keeps one split
    per row block (the round times the kernels, not the split heuristic); BLOCK_M 64 keeps
    64-key tiles (without ``block_n`` the long-keys rule would pick 32 and a register cap)."""
    batch = materialize(BatchSpec(tuple(Request("prefill", 1024, 3072) for _ in range(4)), 32, 8, 128,
                                  dtype="bfloat16", page_size=16), 0)
    from attnbench.kernels.prefill import gluon

    for name, options in {**OPTIONS, "gluon": gluon.config_args(batch)}.items():
        cfg = tp.choose_config(batch, **options)
        _, merge, smax, _ = tp.build_units(batch, cfg, 132)
        assert smax == 1 and len(merge) == 0, name
        rows = 64 if name == "m64" else 512 if name == "gluon" else 128  # gluon: 128 tokens x G 4
        assert cfg.block_n == 64 and cfg.block_m == rows, (name, cfg)
