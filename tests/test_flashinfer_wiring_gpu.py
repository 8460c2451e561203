"""GPU checks of the FlashInfer routes issue 32 wired (run on the GPU machine:
``pytest -m gpu tests/test_flashinfer_wiring_gpu.py -rA``). Each case goes through the backend
as a run uses it (``flashinfer:route=...``: its reasons must be empty, then plan, run) and is
compared with the float64 reference on random inputs; tests/test_flashinfer_wiring.py checks on
the CPU what attnbench hands FlashInfer.

- ``persistent`` (``BatchAttention``) with an FP8 e4m3 cache: ``k_scale``/``v_scale`` at run
  (a missing ``k_scale`` scales every logit by 1/k_scale, ~100x; a missing ``v_scale`` the output).
- ``pod`` with a window, with FP8 (``k_scale`` in ``plan``'s ``sm_scale`` for both groups, ``v_scale``
  on the assembled output: POD's own ``run`` scales only the decodes), with the decodes first
  (vLLM's order), and with non-causal prefills (``causal_p=False``).
- ``fa2`` with sinks on FP8 (the sink wrapper: ``k_scale`` folded into its ``sm_scale`` argument).
- The e5m2 refusals of ``persistent`` and ``pod`` (they share the fa2 kernel's masking): called
  anyway, FlashInfer must be wrong there, and right on the same values stored within +-448.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from attnbench.backend import get_backend_class, make_backend
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, default_tolerance, reference_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PREFILLS = (Request("prefill", 96, 400), Request("prefill", 130, 0), Request("prefill", 33, 1000))
DECODES = tuple(Request("decode", 1, c) for c in (1500, 77, 600, 3000))
NONCAUSAL = (Request("prefill", 70, 200, causal=False), Request("prefill", 40, 0, causal=False))
HEADS = {64: (32, 8), 128: (32, 8), 256: (16, 8)}


def _spec(reqs, head_dim=128, **kw) -> BatchSpec:
    hq, hkv = HEADS[head_dim]
    return BatchSpec(tuple(reqs), hq, hkv, head_dim, "bfloat16", 16, "shuffled", **kw)


#: (route, label, spec) of every case below: scripts/gpu/flashinfer_warmup.py --tests builds their kernels
PERSISTENT = {f"fp8-d{d}-{kind}": _spec(reqs, d, kv_dtype="fp8_e4m3", **extra)
              for d in (64, 128, 256)
              for kind, reqs, extra in (("mixed", PREFILLS + DECODES, {}), ("noncausal", NONCAUSAL, {}),
                                        ("softcap", PREFILLS + DECODES, {"softcap": 30.0}))
              if kind != "softcap" or d == 128}
POD = {
    "prefills-first": _spec(PREFILLS + DECODES),
    "decodes-first": _spec(DECODES + PREFILLS),
    "window": _spec(PREFILLS + DECODES, window=128),
    "window-decodes-first": _spec(DECODES + PREFILLS, window=128),
    "fp8": _spec(PREFILLS + DECODES, kv_dtype="fp8_e4m3"),
    "fp8-decodes-first": _spec(DECODES + PREFILLS, kv_dtype="fp8_e4m3"),
    "fp8-window": _spec(PREFILLS + DECODES, kv_dtype="fp8_e4m3", window=128),
    "fp8-d64": _spec(PREFILLS + DECODES, 64, kv_dtype="fp8_e4m3"),
    "fp8-d256": _spec(PREFILLS + DECODES, 256, kv_dtype="fp8_e4m3"),
    "noncausal-prefills": _spec(NONCAUSAL + DECODES),
}
SINKS = {
    "decodes": _spec(DECODES, kv_dtype="fp8_e4m3", sinks=True),
    "decodes-window": _spec(DECODES, kv_dtype="fp8_e4m3", sinks=True, window=128),
    "mixed": _spec(PREFILLS + DECODES, kv_dtype="fp8_e4m3", sinks=True),
    "mixed-window": _spec(PREFILLS + DECODES, kv_dtype="fp8_e4m3", sinks=True, window=128),
}


def warmup_items() -> list[tuple[str, BatchSpec, str]]:
    """(backend spec, batch spec, label) of this file's cases, for scripts/gpu/flashinfer_warmup.py."""
    out = [(f"flashinfer:route={route}", spec, f"wiring/{route}-{label}")
           for route, cases in (("persistent", PERSISTENT), ("pod", POD), ("fa2", SINKS)) for label, spec in cases.items()]
    return out + [("flashinfer:route=auto", SINKS["decodes"], "wiring/auto-sinks-fp8-decodes")]


def _available():
    cls = get_backend_class("flashinfer")
    if cls.unavailable():
        pytest.skip(f"flashinfer: {cls.unavailable()}")


def _through_backend(route: str, spec: BatchSpec, seed: int = 7):
    """The route's output for a batch of ``spec`` against the reference: (rel. err, mode, tolerance)."""
    _available()
    batch = materialize(spec, seed=seed, device="cuda")
    be = make_backend(f"flashinfer:route={route}")
    assert be.reasons(batch) == [], be.reasons(batch)
    plan = be.prepare(batch)
    out = be.run(plan)
    torch.cuda.synchronize()
    assert out.shape == batch.out_shape and out.dtype == batch.dtype
    rel, _ = compare(out, reference_attention(batch)[0])
    return rel, plan.mode, default_tolerance(batch.dtype)


@pytest.mark.parametrize("case", sorted(PERSISTENT))
def test_persistent_on_fp8(case):
    rel, mode, tol = _through_backend("persistent", PERSISTENT[case])
    assert rel < tol, f"persistent {case} ({mode}): rel err {rel:.3g}"


@pytest.mark.parametrize("case", sorted(POD))
def test_pod(case):
    rel, mode, tol = _through_backend("pod", POD[case])
    assert rel < tol, f"pod {case} ({mode}): rel err {rel:.3g}"
    assert ("decodes first" in mode) == ("decodes-first" in case)
    assert ("v_scale on the output" in mode) == ("fp8" in case)


@pytest.mark.parametrize("case", sorted(SINKS))
def test_sink_wrapper_on_fp8(case):
    rel, mode, tol = _through_backend("fa2", SINKS[case])
    assert rel < tol, f"fa2 sinks {case} ({mode}): rel err {rel:.3g}"
    assert "sink wrapper, k_scale in its sm_scale" in mode


def test_auto_runs_fp8_decodes_with_sinks_on_the_sink_wrapper():
    """route auto: XQA is refused on FP8, so fa2's sink wrapper (before issue 32: a skipped row)."""
    rel, mode, tol = _through_backend("auto", SINKS["decodes"])
    assert mode.startswith("auto: fa2") and rel < tol, (mode, rel)


@pytest.mark.parametrize("route", ["persistent", "pod"])
def test_e5m2_refusals_match_what_flashinfer_computes(route):
    """The amax-scaled e5m2 cache is refused (masked keys keep weight ~2^-0.5); called anyway
    FlashInfer must be wrong. The same values stored within +-448 run and are right."""
    _available()
    from attnbench.backends.flashinfer_plans import sm_major, step_for
    from attnbench.backends.flashinfer_routes import facts_of, route_reasons

    from .test_issue32_gpu import _within_e4m3_range

    e5 = materialize(_spec(PREFILLS + DECODES, kv_dtype="fp8_e5m2"), seed=11, device="cuda")
    seen = {}
    for name, b in (("fp8_e5m2", e5), ("fp8_e5m2 within +-448", _within_e4m3_range(e5))):
        out = step_for(route, b, facts_of(b), {}).call()
        torch.cuda.synchronize()
        seen[name] = (compare(out, reference_attention(b)[0])[0], route_reasons(route, facts_of(b), sm_major(b.device)))
    note = f"flashinfer route {route}: " + "; ".join(f"{n} rel. err {e:.3g}" for n, (e, _) in seen.items())
    warnings.warn(note)
    tol = default_tolerance(e5.dtype)
    for name, (err, refused) in seen.items():
        assert (err > tol) if refused else (err < tol), f"{name}: refused={bool(refused)}; " + note
