"""GPU checks of FlashInfer's ALiBi as issue 32 wired it (``pos_encoding_mode="ALIBI"`` on the
routes decode, decode-tc and fa2; attnbench/backends/flashinfer_alibi.py says why exactly
those, and why not pod). Run on the GPU machine: ``bash scripts/gpu/validate.sh --lanes tests=flashinfer_alibi_gpu``.

- Each case goes through the backend as a run uses it (its reasons must be empty, then plan, run)
  and is compared with the float64 reference on random inputs. 24 query heads over 8 KV heads:
  a head count that is not a power of two (the slopes' second series) and a GQA group of 3.
- A refused case (ALiBi on a branching tree) is refused naming FlashInfer's formula, and called
  anyway through the route's step it is wrong, while the same batch with chains is right.
- FlashInfer's own slopes (``flashinfer.utils.get_alibi_slopes``: no wrapper takes the caller's)
  equal attnbench's within float32 rounding for 1..256 heads.

JIT modules (head dim 128, bf16, page 16), each with ALiBi: the CUDA-core decode module, the fa2
prefill module (decode-tc plans it too; every mask mode, so also the chains with a window, folded
into the custom mask); the cases named ``window`` add fa2's sliding-window module, those named
``e5m2`` fa2's module for an e5m2 cache: 4 in all, 2 without those.
tests/test_flashinfer_alibi.py checks on the CPU that every case here is one its route accepts.
"""
from __future__ import annotations

import pytest
import torch

from attnbench.backend import make_backend
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.reference import compare, default_tolerance, reference_attention
from attnbench.workload.trees import chain

from .test_flashinfer_wiring_gpu import _available, _through_backend

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CHAIN = tuple(chain(7))  # 8 nodes in a line: positions are rows
BRANCHING = (-1, 0, 0, 1, 1, 2, 2, 3)
DECODES = tuple(Request("decode", 1, c) for c in (1500, 77, 600, 3000))
PREFILLS = (Request("prefill", 96, 400), Request("prefill", 130, 0), Request("prefill", 33, 1000))
NONCAUSAL = (Request("prefill", 70, 200, causal=False), Request("prefill", 40, 0, causal=False))
CHAINS = tuple(Request("tree", len(CHAIN), c, CHAIN) for c in (700, 40))


def _spec(reqs, **kw) -> BatchSpec:
    return BatchSpec(tuple(reqs), 24, 8, 128, "bfloat16", 16, "shuffled", alibi=True, **kw)


#: (route, label) -> spec of every case run below; scripts/gpu/flashinfer_warmup.py --tests builds them
CASES = {
    ("decode", "decodes"): _spec(DECODES),
    ("decode-tc", "decodes"): _spec(DECODES),
    ("auto", "decodes"): _spec(DECODES),  # decode-tc
    ("fa2", "causal-prefills"): _spec(PREFILLS + DECODES),
    ("fa2", "noncausal-prefills"): _spec(NONCAUSAL),
    ("fa2", "chains-custom-mask"): _spec(CHAINS + PREFILLS + DECODES),
    ("fa2", "mixed-causality-custom-mask"): _spec(NONCAUSAL + PREFILLS),
    ("auto", "mixed"): _spec(PREFILLS + DECODES),  # fa2: persistent and fa3 have no ALiBi
    ("fa2", "window"): _spec(PREFILLS + DECODES, window=128),
    ("fa2", "window-chains"): _spec(CHAINS + PREFILLS, window=100),  # the window folded into the custom mask
    ("decode-tc", "window-decodes"): _spec(DECODES, window=128),  # fa2's window module (decode-tc plans it)
    ("fa2", "e5m2"): _spec(PREFILLS + DECODES, kv_dtype="fp8_e5m2"),  # the scale before the mask: no mask limit
    ("decode-tc", "e5m2-decodes"): _spec(DECODES, kv_dtype="fp8_e5m2"),  # the same module
}
REFUSED = _spec(tuple(Request("tree", len(BRANCHING), c, BRANCHING) for c in (500, 40)))
LINED = _spec(tuple(Request("tree", len(CHAIN), c, CHAIN) for c in (500, 40)))


def warmup_items() -> list[tuple[str, BatchSpec, str]]:
    """(backend spec, batch spec, label) of this file's cases, for scripts/gpu/flashinfer_warmup.py."""
    return [(f"flashinfer:route={route}", spec, f"alibi/{route}-{label}") for (route, label), spec in CASES.items()]


@pytest.mark.parametrize("route, label", sorted(CASES), ids=[f"{r}-{lb}" for r, lb in sorted(CASES)])
def test_flashinfer_alibi_matches_the_reference(route, label):
    rel, mode, tol = _through_backend(route, CASES[route, label], seed=5)
    assert "ALiBi" in mode and not mode.startswith("auto: cascade"), mode
    assert rel < tol, f"flashinfer {route} {label} ({mode}): rel err {rel:.3g}"


def test_flashinfer_alibi_refusal_on_a_branching_tree_is_what_flashinfer_computes():
    """Refused naming FlashInfer's formula; run anyway (fa2, custom mask, ALiBi) it is wrong; the
    same batch with the tree replaced by a chain is right (same kernel, same module)."""
    _available()
    from attnbench.backends.flashinfer_plans import step_for
    from attnbench.backends.flashinfer_routes import facts_of

    tree = materialize(REFUSED, seed=5, device="cuda")
    why = make_backend("flashinfer").reasons(tree)
    assert any("variants.cuh" in r and "C + depth" in r for r in why), why
    lined = materialize(LINED, seed=5, device="cuda")
    err = {}
    for name, b in (("branching", tree), ("chain", lined)):
        out = step_for("fa2", b, facts_of(b), {}).call()
        torch.cuda.synchronize()
        err[name] = compare(out, reference_attention(b)[0])[0]
    tol = default_tolerance(tree.dtype)
    assert err["branching"] > tol and err["chain"] < tol, err


def test_flashinfer_alibi_slopes_are_attnbench_slopes():
    _available()
    from flashinfer.utils import get_alibi_slopes

    from attnbench.workload.masks import alibi_slopes

    for h in range(1, 257):
        theirs, ours = get_alibi_slopes(h).double(), alibi_slopes(h).double()
        assert theirs.shape == ours.shape and torch.allclose(theirs, ours, rtol=1e-5, atol=0), h
