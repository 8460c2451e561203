"""ALiBi on FlashInfer (``pos_encoding_mode="ALIBI"``; read in 0.5.3 and 0.7.2.post1): which routes
compute attnbench's ALiBi (docs/semantics.md "ALiBi") and why the others cannot. Pure logic over
the batch's facts, no FlashInfer import, so it is tested on the CPU; docs/backends.md (footnote 21)
links each file. The files named below are the same in both releases except ``attention.py``
(0.7.2.post1: ``attention/_core.py``).

What FlashInfer computes (``include/flashinfer/attention/variants.cuh``, ``DefaultAttention``
with ``use_alibi``): ``logits * sm_scale + slope[qo_head] * (kv_idx - qo_idx)``, where ``kv_idx``
is the key's slot in its request (0..kv_len-1) and ``qo_idx`` the query's row in the request
(0..qo_len-1; the decode kernel passes 0, ``decode.cuh``); the head is the query head (with GQA,
query head h reads KV head h // G, as here). The scale is applied there, before the mask
(``sm_scale_log2`` is plain ``log2 e`` with ALiBi), so the fa2 kernel's mask limit (a masked
key's logit -5e4 before the scale, ``flashinfer_routes.py``) does not arise with ALiBi.
attnbench adds ``slope_h * (j - p)`` with key position j and query position p. For prefills and
decodes (causal or not) and chains, slot j is position j and p = C + row, so the two differ by
``slope * C`` for every key of a row: a constant per row, which the softmax does not see
(attnbench never reads FlashInfer's LSE here, and the cascade, which merges by LSE, is not taken
with ALiBi). A branching tree node sits at position C + depth but FlashInfer reads its row: not
a constant, so refused. The slopes are FlashInfer's own (``get_alibi_slopes`` in ``utils.py``,
handed to the kernel by every wrapper's ``run``; no argument takes the caller's): the same
construction as attnbench's for every head count, computed by float32 powers (relative
difference below 3e-6 for 1..256 heads; tests/test_flashinfer_alibi_gpu.py compares them).

Routes: ``decode``, ``decode-tc`` and ``fa2`` take it (their ``plan`` has ``pos_encoding_mode``
and their kernels instantiate ``DefaultAttention<..., use_alibi>``); not ``pod``, whose ``plan``
takes ``pos_encoding_mode`` but whose kernel drops it (``csrc/batch_pod.cu`` instantiates both
groups' ``DefaultAttention`` with ``use_alibi_bias=false``, and
``batch_pod_customize_config.jinja`` fixes ``POS_ENCODING_MODE`` to ``kNone``: no ALiBi, no error;
on an H200 both ALiBi POD GPU tests crashed their pytest worker, 2026-11-27), not
``fa3`` (``hopper/variants.cuh`` has no ALiBi; ``utils.py is_fa3_backend_supported`` refuses any
``pos_encoding_mode``), ``persistent`` (``BatchAttention.plan`` fixes ``PosEncodingMode["NONE"]``,
``attention.py``) or ``xqa`` (``trtllm_batch_decode_with_kv_cache`` has no ALiBi argument).
Not with soft-cap (``DefaultAttention`` adds ALiBi before the tanh, and multiplies by
``sm_scale`` again inside it) nor with sinks (the sink variant has no logits transform).
"""
from __future__ import annotations

SRC = "https://github.com/flashinfer-ai/flashinfer/blob/v0.5.3/"
VARIANTS = "include/flashinfer/attention/variants.cuh"

#: the routes whose FlashInfer entry point has no ALiBi (0.5.3 and 0.7.2.post1), and where that shows
NO_ALIBI = {
    "fa3": "FlashInfer's fa3 kernels have no ALiBi (0.5.3 and 0.7.2.post1: "
           "include/flashinfer/attention/hopper/variants.cuh: DefaultAttention takes only a soft-cap flag; "
           "utils.py is_fa3_backend_supported refuses any pos_encoding_mode but NONE)",
    "persistent": "FlashInfer's BatchAttention has no ALiBi (0.5.3 attention.py, 0.7.2.post1 attention/_core.py: plan "
                  "takes no pos_encoding_mode and builds its module with PosEncodingMode NONE)",
    "pod": "FlashInfer's POD kernel has no ALiBi (0.5.3 and 0.7.2.post1: csrc/batch_pod.cu instantiates both groups' "
           "DefaultAttention with use_alibi_bias=false and batch_pod_customize_config.jinja fixes "
           "POS_ENCODING_MODE to kNone: plan's pos_encoding_mode is dropped, no error)",
    "xqa": "FlashInfer's XQA decode has no ALiBi (0.5.3 and 0.7.2.post1: decode.py trtllm_batch_decode_with_kv_cache "
           "and xqa.py take no slopes or pos_encoding_mode)",
}
#: the routes that hand ``pos_encoding_mode="ALIBI"`` to their wrapper's ``plan``
ALIBI_ROUTES = ("decode", "decode-tc", "fa2")


def pos_encoding_mode(alibi: bool) -> str:
    """What the wrappers' ``plan(pos_encoding_mode=...)`` gets."""
    return "ALIBI" if alibi else "NONE"


def alibi_reasons(route: str, f) -> list[str]:
    """Why ``route`` cannot compute the ALiBi of a batch with facts ``f`` ([] = it can, or the
    batch has no ALiBi). Each reason names FlashInfer's limit, the releases whose source shows it
    (0.5.3 and 0.7.2.post1) and its file."""
    if not f.alibi:
        return []
    name = f"route {route}"
    if route in NO_ALIBI:
        return [f"{name}: {NO_ALIBI[route]}"]
    out = []
    if f.branching_trees:
        out.append(f"{name}: FlashInfer's ALiBi adds slope * (kv_idx - qo_idx) on a request's key slot and "
                   f"query row (0.5.3 and 0.7.2.post1: {VARIANTS}, DefaultAttention's logits transform); "
                   "a branching tree node sits at position C + depth, not at its row, so its ALiBi is not "
                   "slope * (j - p) (chains are)")
    if f.softcap is not None:
        out.append(f"{name}: FlashInfer adds ALiBi before the soft-cap's tanh and applies sm_scale twice "
                   f"with both (0.5.3 and 0.7.2.post1: {VARIANTS}, DefaultAttention's logits transform); "
                   "attnbench adds it after the cap")
    if f.sinks and route == "fa2":
        out.append(f"{name}: FlashInfer's attention-sink variant (0.5.3 and 0.7.2.post1: AttentionSink in "
                   "jit/attention/variants.py, which has no logits transform) has no ALiBi")
    return out
