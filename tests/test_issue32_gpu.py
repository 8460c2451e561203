"""GPU checks of issue 32 (run on the GPU machine: ``pytest -m gpu tests/test_issue32_gpu.py -rA``).

A. The triton backend on an FP8 e4m3 cache (per-tensor and per-head scales) with a window of 48,
   head dim 64, 8 q / 2 kv heads, decodes, trees and a chunked prefill, pages 1 and 16, fp16 and
   bf16 queries, through the runner (so the stale-graph check runs on its captured graph, as in
   a real row): every row ``ok``. Before the fix every row was ``error: modified its inputs (q);
   before that: NotImplementedError: "mul_cuda" not implemented for 'Float8_e4m3fn'`` (the graph
   check multiplied the plan's FP8 caches in place; tests/test_fp8_graph_check.py).
B. FlashInfer with an ``fp8_e5m2`` cache: its fa2 kernel masks raw logits with -5e4 before the
   scale (flashinfer_routes.py says where); each route's refusal is checked against what
   FlashInfer computes when called anyway, on e4m3, e5m2 and the same e5m2 values stored
   within +-448: a refused route must be wrong, a route that runs right. The numbers are
   emitted as warnings.
C. Flex on MLA's 576-wide latent (16 and 128 heads, decodes and a mixed batch with trees) in bf16
   and fp16 against the reference: before the fix the kernel failed to build (InductorError: out
   of shared memory, 428032 > 232448 bytes).
"""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from attnbench.backend import get_backend_class
from attnbench.execute.options import RunOptions
from attnbench.execute.runner import Runner
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.kvcache import dequantize
from attnbench.workload.reference import compare, default_tolerance, reference_attention
from attnbench.workload.scenario import load_text
from attnbench.workload.trees import chain, parse_tree

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# -- A --------------------------------------------------------------------------------------
FP8_WINDOW_TREES = """
name: issue32-fp8-window-trees
seed: 3
device: cuda
model: {num_q_heads: 8, num_kv_heads: 2, head_dim: 64, dtype: DTYPE, window: 48}
kv_cache: {page_size: 16, layout: shuffled, dtype: fp8_e4m3, scale: per-tensor}
batch:
  - {kind: decode,  count: 3, context: 300}
  - {kind: prefill, count: 1, query: 37, context: 64}
  - {kind: tree,    count: 2, context: 200, tree: {choices: [[0], [1], [0, 0], [0, 1], [1, 0]]}}
  - {kind: decode,  count: 1, context: 20}
sweep:
  kv_cache.page_size: [1, 16]
  kv_cache.scale: [per-tensor, per-head]
timing: {warmup_ms: 2, measure_ms: 10}
"""


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_triton_fp8_window_trees_rows_are_ok(dtype):
    sf = load_text(FP8_WINDOW_TREES.replace("DTYPE", dtype), "issue32.yaml")
    rows = list(Runner(sf, RunOptions(backends=["triton"])).rows())
    assert len(rows) == 4
    for r in rows:
        assert r.status == "ok", (r.id.case_id, r.status, r.reason)
        assert r.timing.timing_method == "cuda-graph", (r.id.case_id, r.timing.timing_method,
                                                        r.timing.timing_note)  # the graph check ran
        assert r.correctness.rel_err < r.correctness.tolerance, (r.id.case_id, r.correctness.rel_err)


def test_graph_check_perturbs_fp8_on_cuda_and_restores_it():
    from attnbench.measure.graph_check import perturb_small_inputs

    x = (torch.randn(4096, device="cuda") * 200).clamp(-448, 448).to(torch.float8_e4m3fn)
    x[0] = 448.0
    q = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    x0, q0 = x.clone(), q.clone()
    restore = perturb_small_inputs({"q": q, "k": x}, 1 << 20)
    assert torch.isfinite(x.float()).all() and not torch.equal(x.view(torch.uint8), x0.view(torch.uint8))
    restore()
    assert torch.equal(x.view(torch.uint8), x0.view(torch.uint8)) and torch.equal(q, q0)


# -- B --------------------------------------------------------------------------------------
def _fi_requests(kind: str):
    eagle = tuple(parse_tree({"preset": "eagle-mc_sim_7b_63"}))
    decodes = [Request("decode", 1, c) for c in (1000, 77, 3000)]
    return tuple({
        "mixed": decodes + [Request("prefill", 33, 500), Request("tree", len(eagle), 777, eagle)],
        "prefill": [Request("prefill", 33, 500), Request("prefill", 64, 0)],
        "decode": decodes,
    }[kind])


def _fi_batch(kind: str, kv_dtype: str, dtype: str = "bfloat16", head_dim: int = 128):
    spec = BatchSpec(_fi_requests(kind), 32, 8, head_dim, dtype, 16, "shuffled", kv_dtype=kv_dtype)
    return materialize(spec, seed=11, device="cuda")


def _within_e4m3_range(b):
    """The same batch with its e5m2 cache quantized again so that every stored value is within
    +-448 (scale = amax / 448): the format's large exponents are then never used."""
    out = {}
    for name, cache, scale in (("k", b.k_cache, b.k_scale), ("v", b.v_cache, b.v_scale)):
        x = dequantize(cache, scale)
        s = (x.abs().amax() / 448.0).reshape(1).float()
        out[f"{name}_cache"] = (x / s).clamp(-448, 448).to(cache.dtype)
        out[f"{name}_scale"] = s
    return dataclasses.replace(b, **out, _masks={})


def _flashinfer_rel_err(route: str, batch) -> float:
    """FlashInfer's output on ``route`` against the reference, called whatever the route's
    reasons say (the wrapper built as the backend builds it)."""
    from attnbench.backends.flashinfer_plans import step_for
    from attnbench.backends.flashinfer_routes import facts_of

    out = step_for(route, batch, facts_of(batch), {}).call()
    torch.cuda.synchronize()
    return compare(out, reference_attention(batch)[0])[0]


@pytest.mark.parametrize("route, kind", [("fa2", "mixed"), ("fa2", "prefill"), ("decode-tc", "decode"),
                                         ("decode", "decode")])
def test_flashinfer_mask_refusals_match_what_flashinfer_computes(route, kind):
    """For e4m3, e5m2 (scaled to its amax: masked keys keep weight ~2^-0.5 on the fa2 kernel) and
    the same e5m2 values stored within +-448 (2^-69): a route attnbench refuses is wrong when
    FlashInfer is called anyway, a route it runs is right."""
    cls = get_backend_class("flashinfer")
    if cls.unavailable():
        pytest.skip(f"flashinfer: {cls.unavailable()}")
    from attnbench.backends.flashinfer_plans import sm_major
    from attnbench.backends.flashinfer_routes import facts_of, route_reasons

    e5 = _fi_batch(kind, "fp8_e5m2")
    cases = {"fp8_e4m3": _fi_batch(kind, "fp8_e4m3"), "fp8_e5m2": e5, "fp8_e5m2 within +-448": _within_e4m3_range(e5)}
    tol = default_tolerance(e5.dtype)
    seen = {name: (_flashinfer_rel_err(route, b), facts_of(b)) for name, b in cases.items()}
    note = f"flashinfer route {route}, {kind} batch, bf16, d128: " + "; ".join(
        f"{name} rel. err {err:.3g} (mask bits {f.mask_bits:.3g})" for name, (err, f) in seen.items())
    warnings.warn(note)
    for name, (err, f) in seen.items():
        refused = route_reasons(route, f, sm_major(e5.device))
        if refused:
            assert err > tol, f"attnbench refuses {name} but FlashInfer computed it right: " + note
        else:
            assert err < tol, f"attnbench runs {name} and FlashInfer is wrong: " + note


def test_flashinfer_e5m2_rows_are_skipped_or_right():
    """Through the backend as a run uses it (route auto): the mixed batch is a skipped row naming
    route fa2 (or runs, where FlashInfer masks with -inf), and the decodes run on one of the decode
    wrapper's routes (auto_route's choice) and match."""
    cls = get_backend_class("flashinfer")
    if cls.unavailable():
        pytest.skip(f"flashinfer: {cls.unavailable()}")
    from attnbench.backends.flashinfer_routes import fa2_mask_fill

    mixed = _fi_batch("mixed", "fp8_e5m2")
    reasons = cls().reasons(mixed)
    if fa2_mask_fill() == float("inf"):  # FlashInfer 0.7.2.post1 masks with IEEE -inf: the batch runs
        assert reasons == [], reasons
        be = cls()
        out = be.run(be.prepare(mixed))
        torch.cuda.synchronize()
        ref, _ = reference_attention(mixed)
        assert compare(out, ref)[0] < default_tolerance(mixed.dtype), "FlashInfer e5m2 mixed batch"
    else:
        assert reasons and reasons[0].startswith("route fa2: FlashInfer's fa2 kernel masks keys"), reasons
    decodes = _fi_batch("decode", "fp8_e5m2")
    be = cls()
    assert be.reasons(decodes) == []
    from attnbench.backends.flashinfer_routes import auto_route, facts_of

    plan = be.prepare(decodes)
    chosen = auto_route(facts_of(decodes), torch.cuda.get_device_capability(decodes.q.device)[0])
    assert chosen in ("decode", "decode-tc"), chosen  # e5m2 decodes: the decode wrapper, not fa2
    assert plan.mode == f"auto: {chosen}"
    out = be.run(plan)
    torch.cuda.synchronize()
    assert compare(out, reference_attention(decodes)[0])[0] < default_tolerance(decodes.dtype)


# -- C --------------------------------------------------------------------------------------
def _mla_requests(case: str):
    tree = tuple(parse_tree({"choices": [[0], [1], [0, 0], [0, 1], [1, 0]]}))
    if case.startswith("decode"):
        return tuple(Request("decode", 1, c) for c in (300, 77, 1000))
    return (Request("decode", 1, 300), Request("prefill", 40, 100), Request("tree", len(tree), 200, tree),
            Request("tree", 4, 150, tuple(chain(3))), Request("prefill", 17, 0))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case, hq", [("decode", 16), ("decode", 128), ("mixed", 16), ("mixed", 128)])
def test_flex_mla_fits_in_shared_memory_and_matches(case, hq, dtype):
    spec = BatchSpec(_mla_requests(case), hq, 1, 576, dtype, 64, "shuffled",
                     attention="mla", kv_lora_rank=512, rope_dim=64)
    batch = materialize(spec, seed=hq, device="cuda")
    be = get_backend_class("flex")()
    assert be.reasons(batch) == []
    plan = be.plan(be.convert(batch))
    assert "tiles BLOCK_M=" in plan.mode, plan.mode
    out = be.run(plan)
    torch.cuda.synchronize()
    assert out.shape == batch.out_shape and out.dtype == batch.dtype
    rel, _ = compare(out, reference_attention(batch)[0])
    assert rel < default_tolerance(batch.dtype), f"flex MLA {case} {hq} heads {dtype}: rel err {rel:.3g} ({plan.mode})"


@pytest.mark.parametrize("extra", [{}, {"sinks": True}])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["sdpa", "flex", "triton"])
def test_alibi_on_a_long_bidirectional_prefill_on_cuda(name, dtype, extra):
    """An H200 found it (random_scenarios.py --seed 12, #2): SDPA's float16 bias held ALiBi
    unshifted (up to 172.5 on a 346-token bidirectional prefill, steps of 0.125 there): rel. err
    9.4e-3 against float16's 5e-3. The bias rows are shifted now (backends/_bias.row_shifted);
    Flex's score_mod shifts the same way (its compiled scores are float32, but eager ones are not)."""
    tree = parse_tree({"choices": [[0], [1], [0, 0]]})
    reqs = (Request("prefill", 346, 0, causal=False), Request("decode", 1, 68), Request("prefill", 40, 30),
            Request("tree", len(tree), 50, tuple(tree)), Request("prefill", 30, 20, causal=False))
    spec = BatchSpec(reqs, 64, 4, 128, dtype, 16, "shuffled-within", alibi=True, **extra)
    b = materialize(spec, 5506, "cuda")
    be = get_backend_class(name)()
    if be.reasons(b):
        pytest.skip("; ".join(be.reasons(b)))
    ref, _ = reference_attention(b)
    assert compare(be.run(be.prepare(b)), ref)[0] < default_tolerance(b.dtype)
